"""`fedcache grid --engine batched` equals `--engine processes`: every cell's files, results.csv and table.md."""
from __future__ import annotations

import json

import pytest
import torch

from fedcache.api import grid
from fedcache.cli import main
from fedcache.table import Table

from .conftest import BACKBONE

SWEEP = {"partition": "dirichlet", "clients": [3, 4], "alpha": [0.5, 5], "rounds": 3, "lr": [0.003, 0.03]}


def run_both(toy_store, tmp_path, methods, sweep, **kw):
    outs = {}
    for engine in ("processes", "batched"):
        outs[engine] = tmp_path / engine
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=methods, sweep=sweep, seeds=[0, 1],
             out=outs[engine], engine=engine, **kw)
    return outs["processes"], outs["batched"]


def assert_same_cells(a, b):
    """Same rows (but the seconds), same table.md, and per cell the same config, per-client accuracies in every
    metrics line, and final state bit for bit: the grid stacks only cells that draw the same mini-batches."""
    rows_a, rows_b = (Table.from_csv(o / "results.csv").to_records() for o in (a, b))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    assert strip(rows_a) == strip(rows_b)
    assert (a / "table.md").read_text() == (b / "table.md").read_text()
    for row in rows_a:
        ca, cb = a / row["run_dir"], b / row["run_dir"]
        assert json.loads((ca / "config.json").read_text()) == json.loads((cb / "config.json").read_text())
        lines = [[json.loads(l) for l in (c / "metrics.jsonl").read_text().splitlines()] for c in (ca, cb)]
        assert [(l["round"], l["per_client"], l["bytes_up"]) for l in lines[0]] == [(l["round"], l["per_client"], l["bytes_up"]) for l in lines[1]]
        ka, kb = (torch.load(c / "checkpoint.pt", weights_only=True) for c in (ca, cb))
        assert set(ka) == set(kb)
        for key in ("rnd", "params_up", "bytes_up", "bytes_down", "senders"):
            assert ka[key] == kb[key], key
        sa, sb = ({k: v for k, v in json.loads((c / "summary.json").read_text()).items() if k != "seconds"} for c in (ca, cb))
        assert sa == sb
        for part in ("server", "clients"):
            assert set(ka[part]) == set(kb[part])
            for n in ka[part]:
                assert torch.equal(ka[part][n], kb[part][n]), (row["run_dir"], part, n)


@pytest.mark.slow
def test_batched_grid_equals_the_process_grid(toy_store, tmp_path):
    a, b = run_both(toy_store, tmp_path, ["fedavg", "solo"], {**SWEEP, "fraction": [0.5, 1]})
    assert_same_cells(a, b)
    assert not (b / "batches").exists()  # a finished batch leaves only its cells


def test_batched_fedprox_grid_with_a_mu_axis_equals_the_process_grid(toy_store, tmp_path):
    sweep = {"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3, "mu": [0.01, 1]}
    a, b = run_both(toy_store, tmp_path, ["fedprox"], sweep)
    assert_same_cells(a, b)


def test_batched_fedproto_grid_with_a_lam_axis_equals_the_process_grid(toy_store, tmp_path):
    sweep = {"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3, "lam": [0.3, 1], "head": "projection"}
    plans = []
    a, b = run_both(toy_store, tmp_path, ["fedproto"], sweep, on_plan=plans.append)
    assert plans[-1].startswith("batched engine: 8 cells in 4 batches (2 fedproto, 2 fedproto, 2 fedproto, 2 fedproto)") and "own runs" not in plans[-1]
    assert_same_cells(a, b)


def test_batched_fedpcl_grid_with_tau_and_clients_axes_equals_the_process_grid(toy_store, tmp_path):
    """The grid stacks the tau values of one partition and seed (cells of 3 and 4 clients in one stack, whose
    prototype sets it pads to the cell with the most clients, are tested in tests/federate/test_batched.py)."""
    sweep = {"partition": "dirichlet", "clients": [3, 4], "alpha": 0.5, "rounds": 3, "tau": [0.07, 0.5],
             "noise": "gaussian"}
    plans = []
    a, b = run_both(toy_store, tmp_path, ["fedpcl"], sweep, on_plan=plans.append)
    assert plans[-1].startswith("batched engine: 8 cells in 4 batches (2 fedpcl, 2 fedpcl, 2 fedpcl, 2 fedpcl)") and "own runs" not in plans[-1]
    assert_same_cells(a, b)


def test_the_grid_says_how_it_grouped_cells_and_runs_the_others_alone(toy_store, tmp_path, capsys):
    out = tmp_path / "g"
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedprox,fedproto",
                 "--partition", "dirichlet", "--alpha", "0.5,5", "--clients", "3", "--rounds", "2", "--set", "lr=0.01,0.1",
                 "--seeds", "0,1", "--engine", "batched", "--max-batch-cells", "3", "--out", str(out)])
    captured = capsys.readouterr()
    printed = " ".join((captured.out + captured.err).split())  # one line, however the console wrapped it
    assert code == 0
    assert ("batched engine: 8 cells in 4 batches (2 fedprox, 2 fedprox, 2 fedprox, 2 fedprox), at most 3 cells per batch; "
            "8 cells as their own runs: the mlp head's BatchNorm statistics would round differently in a stack (8)") in printed
    assert "trained 16 cells in" in printed and "cells per minute (batched engine)" in printed
    assert len(Table.from_csv(out / "results.csv")) == 16


def test_the_batched_engine_is_the_default(toy_store, tmp_path, capsys):
    """Batched is the default: the grid benchmark measured it faster in every trial (docs/performance.md)."""
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg,fedprox", "--partition",
                 "iid", "--clients", "2", "--rounds", "1", "--set", "lr=0.1,0.01", "--out", str(tmp_path / "g")])
    out, err = capsys.readouterr()
    assert code == 0 and "(batched engine)" in out
    # The plan is one line however narrow the console: a log keeps it whole.
    plan = err.splitlines()[1]
    assert plan.startswith("batched engine: 4 cells in 2 batches (2 fedavg, 2 fedprox), at most") and plan.endswith("per batch")


def test_batched_batches_in_worker_processes_equal_the_batches_in_process(toy_store, tmp_path):
    """--jobs 2: the batches (one per method here) train side by side in worker processes of one torch thread;
    the grouping does not depend on --jobs, so every cell equals the in-process grid's."""
    sweep = {"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 2}
    outs, plans = {}, {}
    for jobs in (1, 2):
        outs[jobs], plans[jobs] = tmp_path / f"jobs{jobs}", []
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=sweep,
             seeds=[0], out=outs[jobs], engine="batched", jobs=jobs, on_plan=plans[jobs].append)
    assert "2 batches at a time, each in a worker process" in " ".join(plans[2])
    assert "worker process" not in " ".join(plans[1])
    assert_same_cells(outs[1], outs[2])
    # One cell per batch: four batches finish side by side, and none removes the folder another still uses.
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=sweep,
         seeds=[0], out=tmp_path / "singles", engine="batched", jobs=2, max_batch_cells=1)
    assert_same_cells(outs[1], tmp_path / "singles")
    assert not (outs[2] / "batches").exists() and not (tmp_path / "singles" / "batches").exists()


def test_a_finished_batch_leaves_the_shared_batches_folder_to_the_grid(toy_store, tmp_path, monkeypatch):
    """Batches finish side by side in workers: one that removed the emptied batches/ folder itself raced
    another doing the same (FileNotFoundError). Only the grid, after every batch, removes it."""
    from fedcache import sweep

    monkeypatch.setattr(sweep, "_remove_if_empty", lambda path: None)
    out = tmp_path / "g"
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0],
         sweep={"partition": "iid", "clients": 2, "rounds": 1}, out=out, engine="batched", jobs=1)
    assert (out / "batches").is_dir() and not any((out / "batches").iterdir())
