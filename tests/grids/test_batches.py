"""`fedcache grid --engine batched` equals `--engine processes`: every cell's files, results.csv and table.md."""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from fedcache.api import grid
from fedcache.cli import main
from fedcache.federate.rundir import load_checkpoint
from fedcache.table import Table

from tests.conftest import BACKBONE

SWEEP = {"partition": "dirichlet", "clients": [3, 4], "alpha": [0.5, 5], "rounds": 3, "lr": [0.003, 0.03]}


def run_both(toy_store, tmp_path, methods, sweep, **kw):
    outs = {}
    for engine in ("processes", "batched"):
        outs[engine] = tmp_path / engine
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=methods, sweep=sweep, seeds=[0, 1],
             out=outs[engine], engine=engine, **kw)
    return outs["processes"], outs["batched"]


def stop_after_round(monkeypatch, writer=None, at=1):
    """Interrupt the next grid as Ctrl-C would, right after its checkpoint of round ``at``: a batch's (``writer`` the
    driver, by default) or a cell's own (``fedcache.federate.rundir``, where the cells train in this process).
    Returns what it patched, to be put back."""
    from fedcache.federate import driver

    writer = writer or driver
    save = writer.save_checkpoint

    def save_then_stop(path, ck):
        save(path, ck)
        if ck["rnd"] == at:
            raise KeyboardInterrupt

    monkeypatch.setattr(writer, "save_checkpoint", save_then_stop)
    return save


def assert_same_cells(a, b):
    """Same rows (but the seconds), same table.md, and per cell the same config, per-client accuracies in every
    metrics line, and final state bit for bit: a stacked cell computes its own run's numbers."""
    rows_a, rows_b = (Table.from_csv(o / "results.csv").to_records() for o in (a, b))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    assert strip(rows_a) == strip(rows_b)
    assert (a / "table.md").read_text() == (b / "table.md").read_text()
    for row in rows_a:
        ca, cb = a / row["run_dir"], b / row["run_dir"]
        assert json.loads((ca / "config.json").read_text()) == json.loads((cb / "config.json").read_text())
        lines = [[json.loads(l) for l in (c / "metrics.jsonl").read_text().splitlines()] for c in (ca, cb)]
        assert [(l["round"], l["per_client"], l["bytes_up"]) for l in lines[0]] == [(l["round"], l["per_client"], l["bytes_up"]) for l in lines[1]]
        ka, kb = (load_checkpoint(c / "checkpoint.pt")["runs"][0] for c in (ca, cb))
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
    plans = []
    a, b = run_both(toy_store, tmp_path, ["fedavg", "solo"], {**SWEEP, "fraction": [0.5, 1]}, on_plan=plans.append)
    assert plans[-1].startswith("batched engine: 64 cells in 32 batches (16 x 2 fedavg, 16 x 2 solo)")
    assert_same_cells(a, b)
    assert not (b / "batches").exists()  # a finished batch leaves only its cells


def test_batched_fedprox_grid_with_a_mu_axis_equals_the_process_grid(toy_store, tmp_path):
    sweep = {"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3, "mu": [0.01, 1]}
    plans = []
    a, b = run_both(toy_store, tmp_path, ["fedprox"], sweep, on_plan=plans.append)
    assert plans[-1].startswith("batched engine: 8 cells in 4 batches (4 x 2 fedprox)") and "own runs" not in plans[-1]
    assert_same_cells(a, b)


def test_batched_fedproto_grid_with_a_lam_axis_equals_the_process_grid(toy_store, tmp_path):
    """fedproto's own head, the mlp head: its BatchNorm statistics stack too."""
    sweep = {"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3, "lam": [0.3, 1]}
    plans = []
    a, b = run_both(toy_store, tmp_path, ["fedproto"], sweep, on_plan=plans.append)
    assert plans[-1].startswith("batched engine: 8 cells in 4 batches (4 x 2 fedproto)") and "own runs" not in plans[-1]
    assert_same_cells(a, b)


def test_batched_fedpcl_grid_with_tau_and_clients_axes_equals_the_process_grid(toy_store, tmp_path):
    """The grid stacks the tau values of one partition and seed first (cells of 3 and 4 clients in one stack, whose
    prototype sets it pads to the cell with the most clients, are tested in tests/federate/test_stacked.py)."""
    sweep = {"partition": "dirichlet", "clients": [3, 4], "alpha": 0.5, "rounds": 3, "tau": [0.07, 0.5],
             "noise": "gaussian"}
    plans = []
    a, b = run_both(toy_store, tmp_path, ["fedpcl"], sweep, on_plan=plans.append)
    assert plans[-1].startswith("batched engine: 8 cells in 4 batches (4 x 2 fedpcl)") and "own runs" not in plans[-1]
    assert_same_cells(a, b)


def test_batched_fedntd_grid_with_optimizer_and_method_axes_equals_the_process_grid(toy_store, tmp_path, caplog):
    """beta (per row) and SGD's momentum (per federation) share a stack; tau (not per row) does not."""
    # batch_size 4: several steps per round, or momentum (reset every round) would never act
    sweep = {"partition": "dirichlet", "clients": 3, "alpha": 0.5, "rounds": 2, "batch_size": 4, "optimizer": "sgd",
             "lr": 0.05, "weight_decay": 0.01, "beta": [0.3, 1], "tau": [1, 3], "momentum": [0, 0.9]}
    outs, plans = {}, []
    with caplog.at_level(logging.INFO, logger="fedcache"):
        for engine in ("processes", "batched"):
            outs[engine] = tmp_path / engine
            grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedntd"], sweep=sweep, seeds=[0],
                 out=outs[engine], engine=engine, on_plan=plans.append)
    assert plans[-1].startswith("batched engine: 8 cells in 2 batches (2 x 4 fedntd)")
    logged = [r.getMessage() for r in caplog.records]
    assert plans[0].startswith("processes engine: 8 cells") and all(p in logged for p in plans)  # each engine's logged
    assert_same_cells(outs["processes"], outs["batched"])


def test_the_grid_says_how_it_grouped_cells_and_runs_the_others_alone(toy_store, tmp_path, capsys):
    out = tmp_path / "g"
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedprox,pfedme",
                 "--partition", "dirichlet", "--alpha", "0.5,5", "--clients", "3", "--rounds", "2", "--set", "lr=0.01,0.1",
                 "--seeds", "0,1", "--engine", "batched", "--max-batch-cells", "3", "--out", str(out)])
    captured = capsys.readouterr()
    printed = " ".join((captured.out + captured.err).split())  # one line, however the console wrapped it
    assert code == 0
    assert ("batched engine: 8 cells in 4 batches (4 x 2 fedprox), at most 3 cells per batch; "
            "8 cells as their own runs: pfedme does not declare that its runs can train stacked (8)") in printed
    assert "trained 16 cells in" in printed and "cells per minute (batched engine)" in printed
    assert len(Table.from_csv(out / "results.csv")) == 16


@pytest.mark.parametrize("level", ["info", "warning"])
def test_the_plan_is_said_once_whatever_the_log_shows(toy_store, tmp_path, capsys, monkeypatch, level):
    """With FEDCACHE_LOG=info the plan (and every step the library says) printed twice: logged, then printed."""
    monkeypatch.setenv("FEDCACHE_LOG", level)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a shell: the command's own stderr handler
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition",
                 "iid", "--clients", "2", "--rounds", "1", "--set", "lr=0.1,0.01", "--out", str(tmp_path / "g")])
    err = capsys.readouterr().err
    assert code == 0 and err.count("batched engine: 2 cells in 1 batch") == 1, err
    assert ("INFO fedcache.grids.batches: batched engine:" in err) == (level == "info")


def test_the_batched_engine_is_the_default(toy_store, tmp_path, capsys):
    """Batched is the default: the grid benchmark measured it faster in every trial (docs/performance.md)."""
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg,fedprox", "--partition",
                 "iid", "--clients", "2", "--rounds", "1", "--set", "lr=0.1,0.01", "--out", str(tmp_path / "g")])
    out, err = capsys.readouterr()
    assert code == 0 and "(batched engine)" in out
    # The plan is one line however narrow the console: a log keeps it whole.
    plan = err.splitlines()[0]  # before any progress line
    assert plan.startswith("batched engine: 4 cells in 2 batches (2 fedavg, 2 fedprox), at most") and plan.endswith("per batch")


def test_a_finished_grid_run_again_says_it_had_nothing_to_train(toy_store, tmp_path, capsys):
    args = ["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
            "--clients", "2", "--rounds", "1", "--set", "lr=0.1,0.01", "--out", str(tmp_path / "g")]
    assert main(args) == 0
    assert "nothing to train" not in capsys.readouterr().out
    shutil.rmtree(tmp_path / "g" / "features")  # a user's, to free the disk: re-run for the table, not a new copy
    table = (tmp_path / "g" / "table.md").read_text()
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing to train: every cell of this grid had finished in" in out and "cells per minute" not in out
    assert not (tmp_path / "g" / "features").exists() and (tmp_path / "g" / "table.md").read_text() == table


@pytest.mark.slow
def test_batched_batches_in_worker_processes_equal_the_batches_in_process(toy_store, tmp_path):
    """--jobs 2: the batches train side by side in worker processes of one torch thread, each method's cells
    spread over the two workers (one batch per method with --jobs 1); every cell equals the in-process grid's."""
    sweep = {"partition": "dirichlet", "clients": 3, "rounds": 2, "lr": [0.003, 0.01, 0.03, 0.1]}
    outs, plans = {}, {}
    for jobs in (1, 2):
        outs[jobs], plans[jobs] = tmp_path / f"jobs{jobs}", []
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=sweep,
             seeds=[0], out=outs[jobs], engine="batched", jobs=jobs, on_plan=plans[jobs].append)
    assert plans[2][0].startswith("batched engine: 8 cells in 4 batches (2 x 2 fedavg, 2 x 2 fedprox)")
    assert "2 at a time, each in a worker process" in plans[2][0]
    assert plans[1][0].startswith("batched engine: 8 cells in 2 batches (4 fedavg, 4 fedprox)")
    assert "worker process" not in " ".join(plans[1])
    assert_same_cells(outs[1], outs[2])
    # Two cells per batch: four batches finish side by side, and none removes the folder another still uses.
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=sweep,
         seeds=[0], out=tmp_path / "pairs", engine="batched", jobs=2, max_batch_cells=2)
    assert_same_cells(outs[1], tmp_path / "pairs")
    assert not (outs[2] / "batches").exists() and not (tmp_path / "pairs" / "batches").exists()
    # One cell per batch is no stack: each runs as its own run, and the plan says why.
    plans[0] = []
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=sweep,
         seeds=[0], out=tmp_path / "singles", engine="batched", jobs=2, max_batch_cells=1, on_plan=plans[0].append)
    assert "8 cells as their own runs: the limit of 1 cell per batch (8)" in plans[0][0]
    assert_same_cells(outs[1], tmp_path / "singles")


def test_a_finished_batch_leaves_the_shared_batches_folder_to_the_grid(toy_store, tmp_path, monkeypatch):
    """Batches finish side by side in workers: one that removed the emptied batches/ folder itself raced
    another doing the same (FileNotFoundError). Only the grid, after every batch, removes it."""
    from fedcache.grids import batches as sweep

    monkeypatch.setattr(sweep, "_remove_if_empty", lambda path: None)
    out = tmp_path / "g"
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0],
         sweep={"partition": "iid", "clients": 2, "rounds": 1, "lr": [0.01, 0.1]}, out=out, engine="batched", jobs=1)
    assert (out / "batches").is_dir() and not any((out / "batches").iterdir())


# ---- which cells share a batch (grids.batches._key), checked for every option and setting ----------------
def _other(typ, default):
    """A value of this (annotated) type other than ``default``; None where there is none to offer."""
    from fedcache.config import base_type, choices as choices_of

    choices = choices_of(typ)
    if choices:
        return next(c for c in choices if c != default)
    base = base_type(typ)
    if base is bool:
        return not default
    if base is int:
        return (default or 1) + 1
    if base is float:
        return default / 2 if default else 0.5
    return None


# Run options that may differ within a batch: optim.preset's settings apply per federation (one optimizer block
# each; its optimizer kind is in the key, checked below); --no-batch keeps a cell out of every batch; the partition,
# seed and fraction are each federation's own (its data, plans and sampling), and decide which cells draw alike.
PER_FEDERATION_OPTIONS = {"optim.preset", "engine.batched"}
DRAW_OPTIONS = {"schedule.seed", "schedule.fraction"}
OTHER_VALUES = {"data.dataset": "other", "data.backbones": ("b1", "b2"), "data.store": "other.zarr",
                "partition.scheme": "dirichlet", "engine.device": "cpu"}
PER_ROW_OPTIM = ("lr", "momentum", "weight_decay", "betas", "eps")


@pytest.mark.parametrize("method", ["solo", "fedavg", "fedprox", "fedntd", "fedrep", "fedproto", "fst-cbdg", "fedpcl"])
def test_cells_share_a_batch_only_where_every_difference_is_applied_per_federation(method):
    """Every recorded run option, every method setting and every optimizer setting changed alone: the
    grouping key changes, unless the stack applies that setting per federation (the optimizer's lr, decay,
    momentum, betas, eps; the method's per-row and per-run settings). So a field added to the spec, a method or the
    optimizer is either in the key or declared per row or run, and never silently taken from a batch's first cell."""
    import dataclasses

    from fedcache.config import fields_of
    from fedcache.federate.optim_config import OPTIMIZER_PRESETS
    from fedcache.federate.stacking import stacking_of
    from fedcache.heads import HEADS
    from fedcache.spec import MethodSpec, RunSpec, method_class, options
    from fedcache.grids.batches import _draws, _key, _why_alone

    base = RunSpec.of(store="s.zarr", dataset="d", backbones="b", method=method)
    declared = stacking_of(method_class(method))
    assert declared is not None
    key = _key(base)
    for o in options():
        if not o.opt.recorded or o.key in ("method.name", "engine.name"):
            continue  # not part of a run; the method (first in the key) and its settings are checked below
        if o.key in PER_FEDERATION_OPTIONS or (o.key == "head.name" and len(method_class(method).heads) == 1):
            continue  # (a method of one head: fedpcl's projection head is all it runs with)
        heads = [h for h in HEADS.names() if h != base.head.name]
        value = {**OTHER_VALUES, "head.name": heads[0]}.get(o.key, _other(o.type, base.get(o.key)))
        assert value is not None, f"no other value of {o.key} to try: add one to OTHER_VALUES"
        cfg = base.replace(**{o.key: value})
        if o.key in DRAW_OPTIONS or o.key.startswith("partition."):
            assert _key(cfg) == key and _draws(cfg) != _draws(base), o.key
        else:
            assert _key(cfg) != key, f"cells differing in {o.key} would share a batch"
    assert _why_alone(base.replace(batched=False)) == "--no-batch trains each client alone"
    for preset, optim in OPTIMIZER_PRESETS.items():  # a preset's settings apply per federation, its optimizer kind is the key's
        cfg = base.replace(preset=preset)
        assert (_key(cfg) == key) == (optim.optimizer == base.optim.optimizer), preset
    params = base.method.params
    for name, typ in fields_of(type(params)).items():
        other = dataclasses.replace(params, **{name: _other(typ, getattr(params, name))})
        same = _key(dataclasses.replace(base, method=MethodSpec(method, other))) == key
        assert same == (name in declared.varying), (
            f"{method} {name}: " + ("per row or run, yet in the key" if same is False else "not per row or run, yet not in the key"))
    for name in PER_ROW_OPTIM:
        value = (0.5, 0.9) if name == "betas" else _other(fields_of(type(base.optim))[name], getattr(base.optim, name))
        assert _key(dataclasses.replace(base, optim=dataclasses.replace(base.optim, **{name: value}))) == key, name
    sgd = "adam" if base.optim.optimizer == "sgd" else "sgd"
    assert _key(dataclasses.replace(base, optim=dataclasses.replace(base.optim, optimizer=sgd))) != key


def test_an_interrupted_batched_grid_continues_its_batch_from_the_checkpoint_to_the_same_cells(toy_store, tmp_path, monkeypatch):
    """Interrupted after round 1 of its first batch, the grid re-run with the same options continues that batch
    from batches/<id>/checkpoint.pt (not from round 0) and ends with the cells of an uninterrupted grid; the same
    --out with another grid is refused while the batch's checkpoint is there."""
    from fedcache.errors import ConfigError
    from fedcache.federate import driver

    sweep = {"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3, "mu": [0.01, 1]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], seeds=[0], engine="batched")
    grid(out=tmp_path / "whole", sweep=sweep, **kw)
    save, load, loaded = driver.save_checkpoint, driver.load_checkpoint, []

    stop_after_round(monkeypatch)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        grid(out=out, sweep=sweep, **kw)
    (ck,) = (out / "batches").glob("*/checkpoint.pt")
    assert torch.load(ck, weights_only=True)["rnd"] == 1
    with pytest.raises(ConfigError, match="holds a different grid"):
        grid(out=out, sweep={**sweep, "mu": [0.01, 0.1]}, **kw)
    monkeypatch.setattr(driver, "save_checkpoint", save)
    monkeypatch.setattr(driver, "load_checkpoint", lambda path: loaded.append(path) or load(path))
    grid(out=out, sweep=sweep, **kw)
    assert loaded == [ck]  # the interrupted batch continued; the other batch started fresh
    assert_same_cells(tmp_path / "whole", out)
    assert not (out / "batches").exists()


def test_the_process_engine_refuses_to_restart_what_an_interrupted_batch_holds(toy_store, tmp_path, monkeypatch):
    """Resumed with --engine processes, an interrupted batched grid trained its batch's cells again from round 0 and
    left batches/<id>/checkpoint.pt behind. It is refused in one line, writes nothing, and the batched engine then
    continues the batch; with batches/ deleted, the process engine trains the grid whole."""
    import shutil

    from fedcache.errors import ConfigError
    from fedcache.federate import driver

    sweep = {"partition": "iid", "clients": 3, "rounds": 3, "mu": [0.01, 1]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], seeds=[0], sweep=sweep)
    grid(out=tmp_path / "whole", **kw)
    save = driver.save_checkpoint
    out = tmp_path / "g"
    stop_after_round(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        grid(out=out, engine="batched", **kw)
    monkeypatch.setattr(driver, "save_checkpoint", save)
    (ck,) = (out / "batches").glob("*/checkpoint.pt")
    before = sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock")
    with pytest.raises(ConfigError, match=r"2 cells of this grid stopped part-way in the batched engine.*engine='batched', "
                                          r"or delete .*batches to train them again from round 0 with engine='processes'"):
        grid(out=out, engine="processes", **kw)
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock") == before and ck.exists()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    grid(out=out, engine="batched", **kw)
    assert_same_cells(tmp_path / "whole", out)
    shutil.rmtree(copy / "batches")
    grid(out=copy, engine="processes", **kw)
    assert_same_cells(tmp_path / "whole", copy)


def test_an_interrupted_batch_continues_where_the_grid_now_groups_its_cells_otherwise(toy_store, tmp_path, monkeypatch, caplog):
    """Re-run with a larger --max-batch-cells (or more free memory), the interrupted batch still continues from its
    checkpoint; with a smaller one it no longer fits: its folder is said and removed, its cells train from round 0.
    Either way the cells equal an uninterrupted grid's, and batches/ is gone at the end."""
    from fedcache.federate import driver

    sweep = {"partition": "iid", "clients": 3, "rounds": 3, "mu": [0.01, 0.1, 1], "lr": [0.003, 0.03]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], seeds=[0], sweep=sweep)
    grid(out=tmp_path / "whole", **kw)
    save, load = driver.save_checkpoint, driver.load_checkpoint

    for again, continued in ((None, True), (2, False)):
        out, loaded = tmp_path / f"again{again}", []
        stop_after_round(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            grid(out=out, max_batch_cells=4, **kw)  # two batches of 3 cells; the first is interrupted
        (ck,) = (out / "batches").glob("*/checkpoint.pt")
        monkeypatch.setattr(driver, "save_checkpoint", save)
        monkeypatch.setattr(driver, "load_checkpoint", lambda path: loaded.append(path) or load(path))
        caplog.clear()
        grid(out=out, max_batch_cells=again, **kw)
        assert loaded == ([ck] if continued else [])
        assert ("grouped otherwise now" in caplog.text) != continued
        assert_same_cells(tmp_path / "whole", out)
        assert not (out / "batches").exists()


def test_an_interrupted_stack_of_a_large_head_continues_from_its_checkpoint(toy_store, tmp_path, monkeypatch):
    """A stack checkpointed where its head stacked (a GPU, an older fedcache) continues as a stack on a CPU that
    would run such cells alone: its rounds are not trained again."""
    from fedcache.federate import driver
    from fedcache.grids import batches

    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedproto"], seeds=[0],
              sweep={"partition": "iid", "clients": 3, "rounds": 3, "lr": [0.003, 0.03, 0.3]})
    grid(out=tmp_path / "whole", **kw)
    save, load, loaded = driver.save_checkpoint, driver.load_checkpoint, []

    stop_after_round(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        grid(out=tmp_path / "g", **kw)
    (ck,) = (tmp_path / "g" / "batches").glob("*/checkpoint.pt")
    monkeypatch.setattr(driver, "save_checkpoint", save)
    monkeypatch.setattr(driver, "load_checkpoint", lambda path: loaded.append(path) or load(path))
    monkeypatch.setattr(batches, "LARGEST_STACKED_HEAD_ON_CPU", 0)
    plans: list[str] = []
    grid(out=tmp_path / "g", on_plan=plans.append, **kw)
    assert plans[0].endswith(": 0 of 3 cells finished before, 3 to train (each from its last checkpoint)")
    assert loaded == [ck] and plans[1].startswith("batched engine: 3 cells in 1 batch (3 fedproto)")
    assert_same_cells(tmp_path / "whole", tmp_path / "g")


def test_a_batch_interrupted_while_its_cells_are_written_continues_from_its_checkpoint(toy_store, tmp_path, monkeypatch):
    """The batch's checkpoint stays until every cell's files are written: interrupted at the first cell, the re-run
    continues from the last round's checkpoint instead of training the batch again, to the same cells."""
    from fedcache.federate import driver
    from fedcache.federate.rundir import RunDir

    sweep_ = {"partition": "iid", "clients": 3, "rounds": 2, "mu": [0.01, 1]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], seeds=[0], sweep=sweep_)
    grid(out=tmp_path / "whole", **kw)
    finish, load, loaded = RunDir.finish, driver.load_checkpoint, []

    def stop(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(RunDir, "finish", stop)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        grid(out=out, **kw)
    monkeypatch.setattr(RunDir, "finish", finish)
    monkeypatch.setattr(driver, "load_checkpoint", lambda path: loaded.append(path) or load(path))
    grid(out=out, **kw)
    assert len(loaded) == 1
    assert_same_cells(tmp_path / "whole", out)
    assert not (out / "batches").exists()


def test_cells_alone_in_their_partition_and_seed_stack_across_partitions_and_seeds(toy_store, tmp_path):
    """One cell per partition and seed (alpha x seeds): no two draw the same mini-batches, so they stack across
    partitions and seeds, each with its own run's numbers. (The toy store is too small for the rounding that
    cut steps caused to show here; tests/federate/test_stacked.py is the guard of that.)"""
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedproto"], seeds=[0, 1],
              sweep={"partition": "dirichlet", "alpha": [0.5, 5], "clients": 3, "rounds": 2})
    plans: list[str] = []
    grid(out=tmp_path / "b", engine="batched", on_plan=plans.append, **kw)
    grid(out=tmp_path / "p", engine="processes", **kw)
    assert plans[0].startswith("batched engine: 8 cells in 2 batches (4 fedavg, 4 fedproto)") and "own runs" not in plans[0]
    assert_same_cells(tmp_path / "p", tmp_path / "b")


def test_on_a_cpu_cells_of_a_large_head_run_as_their_own_runs(toy_store, tmp_path, monkeypatch):
    """A head of more than LARGEST_STACKED_HEAD_ON_CPU parameters trains faster alone on a CPU than in a stack
    (benchmarks/grid_speed.py --heads): its cells run as their own runs and the plan says why; the others stack;
    every cell has its own run's numbers. The bound is set here between the toy store's linear and MLP heads."""
    from fedcache.grids import batches
    from fedcache.grids.features import read_features

    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedproto"], seeds=[0, 1],
              sweep={"partition": "dirichlet", "alpha": [0.5, 5], "clients": 3, "rounds": 2})
    grid(out=tmp_path / "p", engine="processes", **kw)
    tables = read_features(tmp_path / "p" / "features")
    linear, mlp = batches.head_parameters("linear", tables), batches.head_parameters("mlp", tables)
    assert linear < mlp
    monkeypatch.setattr(batches, "LARGEST_STACKED_HEAD_ON_CPU", (linear + mlp) // 2)
    plans: list[str] = []
    grid(out=tmp_path / "b", engine="batched", on_plan=plans.append, **kw)
    assert plans[0].startswith("batched engine: 4 cells in 1 batch (4 fedavg)")
    assert plans[0].endswith(f"4 cells as their own runs: a head of {mlp:,} parameters trains faster alone on a CPU (4)")
    assert_same_cells(tmp_path / "p", tmp_path / "b")


def test_a_cell_with_nothing_to_stack_with_runs_as_its_own_run(toy_store, tmp_path):
    """Cells alone in their group (here: one per method) are not stacks of one: they run as their own runs, and
    the plan says why; their numbers are the process engine's."""
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], seeds=[0],
              sweep={"partition": "iid", "clients": 2, "rounds": 2})
    plans: list[str] = []
    grid(out=tmp_path / "b", engine="batched", on_plan=plans.append, **kw)
    grid(out=tmp_path / "p", engine="processes", **kw)
    assert plans == ["batched engine: no cells to stack; 2 cells as their own runs: no other cell of its method and "
                     "settings to stack with (2)"]
    assert not (tmp_path / "b" / "batches").exists()
    assert_same_cells(tmp_path / "p", tmp_path / "b")


def test_cells_of_one_partition_and_seed_stack_together_and_lone_cells_join_across_draws():
    """Cells that draw alike stack together (their batch steps no longer than each of them); the cells alone in
    their draws form batches of their own, and one such cell left over joins the smallest batch with room."""
    from fedcache.grids.batches import _parts

    alone: dict = {}
    assert _parts({"a": [1, 2, 3], "b": [4, 5], "c": [6], "d": [7]}, 10, [], alone) == [[1, 2, 3], [4, 5], [6, 7]]
    assert _parts({"a": [1, 2, 3], "b": [4, 5], "c": [6]}, 10, [], alone) == [[1, 2, 3], [4, 5, 6]]
    assert not alone
    assert _parts({"a": [1, 2, 3, 4, 5]}, 2, [], alone) == [[1, 2], [3, 4]] and alone == {5: "the limit of 2 cells per batch"}
    alone = {}
    assert _parts({"a": [1, 2], "c": [6]}, 2, [], alone) == [[1, 2]] and alone == {6: "the limit of 2 cells per batch"}
    alone = {}
    assert _parts({"c": [6]}, 5, [], alone) == [] and alone == {6: "no other cell of its method and settings to stack with"}
    # Cut to size (a share of the group per worker), though the limit would hold them all.
    alone = {}
    assert _parts({d: [d] for d in range(6)}, 10, [], alone, size=3) == [[0, 1, 2], [3, 4, 5]] and not alone
    # An odd pool leaves no cell alone for the size: the limit alone sends one off.
    assert _parts({d: [d] for d in range(3)}, 10, [], alone, size=2) == [[0, 1, 2]] and not alone
    assert _parts({"a": [1, 2, 3]}, 10, [], alone, size=2) == [[1, 2, 3]] and not alone
    # A started batch continues as it was; what is left of its draws joins the lone cells.
    alone = {}
    assert _parts({"a": [1, 2, 3], "b": [4]}, 10, [[1, 2]], alone) == [[1, 2], [3, 4]] and not alone



def test_a_torn_runs_json_of_an_interrupted_batch_is_one_line_and_its_advice_works(toy_store, tmp_path, monkeypatch):
    """A batch's runs.json cut short (a crash while it was written by an older fedcache, a hand edit) met by the re-run:
    one line naming it and what to do, and doing that trains the batch's cells again to the uninterrupted numbers."""
    import shutil

    from fedcache.errors import DamagedFileError

    kw, runs = _a_batch_stopped_after_round_1(toy_store, tmp_path, monkeypatch)
    runs.write_text('["fedavg')
    with pytest.raises(DamagedFileError, match=rf"{runs} is damaged .*delete the folder {runs.parent} and run the grid "
                                               r"again"):
        grid(out=tmp_path / "g", **kw)
    shutil.rmtree(runs.parent)
    grid(out=tmp_path / "g", **kw)
    assert_same_cells(tmp_path / "whole", tmp_path / "g")


def test_the_process_engine_removes_the_batch_folder_of_the_cells_it_trains(toy_store, tmp_path, monkeypatch, caplog):
    """A batched grid interrupted as it wrote its cells' files (the first finished, the second not) left the batch's
    checkpoint of its last round; re-run with --engine processes (not refused: one of the batch's cells finished), the
    second cell trained by itself, and the batch's folder stayed, never read again by the grid that left it, but
    continued by a later batched run once its cells were to train again (their folders deleted, as a damaged cell's
    message asks): from a checkpoint of their last round, with none of their metrics, it stopped in an IndexError.
    The process engine removes the folder of a batch whose cells it trains, saying so; the cells then train again
    from round 0 to an uninterrupted grid's."""
    import shutil

    from fedcache.federate import driver
    from fedcache.federate.rundir import RunDir

    sweep_ = {"partition": "iid", "clients": 3, "rounds": 2, "mu": [0.01, 1]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], seeds=[0], sweep=sweep_)
    grid(out=tmp_path / "whole", **kw)
    finish, load, loaded = RunDir.finish, driver.load_checkpoint, []

    def finish_one(self, *args):
        monkeypatch.setattr(RunDir, "finish", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        return finish(self, *args)

    monkeypatch.setattr(RunDir, "finish", finish_one)
    out = tmp_path / "g"
    with pytest.raises(KeyboardInterrupt):
        grid(out=out, engine="batched", **kw)
    monkeypatch.setattr(RunDir, "finish", finish)
    assert len(list((out / "cells").glob("*/summary.json"))) == 1 and list((out / "batches").glob("*/checkpoint.pt"))
    caplog.clear()
    grid(out=out, engine="processes", **kw)
    assert not (out / "batches").exists(), sorted((out / "batches").rglob("*"))
    assert "the process engine trains as their own runs now" in caplog.text
    assert_same_cells(tmp_path / "whole", out)
    for cell in (out / "cells").iterdir():
        shutil.rmtree(cell)
    monkeypatch.setattr(driver, "load_checkpoint", lambda path: loaded.append(path) or load(path))
    grid(out=out, engine="batched", **kw)
    assert loaded == []
    assert_same_cells(tmp_path / "whole", out)


def _killed_as_its_batch_folder_is_removed(monkeypatch, out, **kw):
    """A batched grid killed after every cell of its batch was written, before the batch's folder was removed."""
    import shutil

    rmtree = shutil.rmtree

    def kill(path, *args, **kwargs):
        if path.parent == out / "batches":
            raise KeyboardInterrupt
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", kill)
    with pytest.raises(KeyboardInterrupt):
        grid(out=out, engine="batched", **kw)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert len(list((out / "cells").glob("*/summary.json"))) == 2 and list((out / "batches").glob("*/checkpoint.pt"))


@pytest.mark.parametrize("engine", ["batched", "processes"])
def test_a_batch_left_by_a_grid_killed_after_its_cells_finished_is_not_continued_once_they_train_again(
        toy_store, tmp_path, monkeypatch, caplog, engine):
    """Killed after its batch's cells were all written but before the batch's folder went, a grid left a checkpoint of
    the batch's last round that no run read (every cell had finished). Once the cells' folders were deleted (as a
    damaged cell's message asks), a batched re-run continued the batch from that checkpoint, with none of the cells'
    metrics lines (an IndexError, or cells without their rounds), and the process engine refused to train them. The
    batch is said and removed, and its cells train again from round 0 to an uninterrupted grid's files."""
    import shutil

    from fedcache.federate import driver

    sweep_ = {"partition": "iid", "clients": 3, "rounds": 2, "mu": [0.01, 1]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], seeds=[0], sweep=sweep_)
    grid(out=tmp_path / "whole", engine="batched", **kw)
    out = tmp_path / "g"
    _killed_as_its_batch_folder_is_removed(monkeypatch, out, **kw)
    for cell in (out / "cells").iterdir():
        shutil.rmtree(cell)
    load, loaded = driver.load_checkpoint, []
    monkeypatch.setattr(driver, "load_checkpoint", lambda path: loaded.append(path) or load(path))
    caplog.clear()
    grid(out=out, engine=engine, **kw)
    assert loaded == [] and f"is ahead of the run folder {out / 'cells'}/fedprox__" in caplog.text
    assert not (out / "batches").exists()
    assert_same_cells(tmp_path / "whole", out)
    strip = lambda d: {k: v for k, v in d.items() if k != "seconds"}  # the only figure a run cannot repeat
    for cell in (tmp_path / "whole" / "cells").iterdir():
        again = out / "cells" / cell.name
        assert [strip(json.loads(l)) for l in (cell / "metrics.jsonl").read_text().splitlines()] == \
               [strip(json.loads(l)) for l in (again / "metrics.jsonl").read_text().splitlines()]
        assert strip(json.loads((cell / "summary.json").read_text())) == strip(json.loads((again / "summary.json").read_text()))


def test_a_batch_records_its_cells_as_plain_json_and_an_older_record_still_continues(toy_store, tmp_path, monkeypatch,
                                                                                     caplog):
    """runs.json names each stacked cell by its fields (method, seed, setting), not by Python's text of the Cell; a
    batch an older fedcache recorded so still continues from its checkpoint, to an uninterrupted grid's numbers."""
    import logging

    from fedcache.grids.spec import Cell

    kw, runs = _a_batch_stopped_after_round_1(toy_store, tmp_path, monkeypatch)
    recorded = json.loads(runs.read_text())
    fixed = {"partition": "iid", "clients": "3", "rounds": "3"}
    assert recorded == [{"method": "fedavg", "seed": 0, "setting": {**fixed, "lr": lr}} for lr in ("0.003", "0.03")]
    runs.write_text(json.dumps([str(Cell(r["method"], r["seed"], tuple(r["setting"].items()))) for r in recorded]))
    with caplog.at_level(logging.INFO, logger="fedcache"):
        grid(out=tmp_path / "g", **kw)
    assert "resuming fedavg after round 1" in caplog.text and "interrupted batch" not in caplog.text
    assert_same_cells(tmp_path / "whole", tmp_path / "g")


@pytest.mark.slow
def test_cells_finishing_together_are_each_logged_once_with_a_rising_count_as_progress_says_them(toy_store, tmp_path,
                                                                                                 capsys, caplog):
    """Batches of two side by side in two workers: their cells finish together. Each is logged once, counted 1..N in
    order, named by the axes its grid varies (the method and seed alone named a batch's cells alike), and a progress
    line (a log file's, where no bar is drawn) names the cell of its count in the same words."""
    import logging
    import re

    with caplog.at_level(logging.INFO, logger="fedcache.grids"):
        code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition",
                     "iid", "--clients", "2", "--rounds", "1", "--set", "lr=0.1,0.01", "--seeds", "0,1", "--jobs", "2",
                     "--engine", "batched", "--max-batch-cells", "2", "--out", str(tmp_path / "g")])
    err = capsys.readouterr().err
    assert code == 0 and "2 x 2 fedavg" in err
    logged = [re.fullmatch(r"cell (\d+)/4 finished: (.+)", r.getMessage()) for r in caplog.records
              if r.name == "fedcache.grids" and r.getMessage().startswith("cell ")]
    assert [m[1] for m in logged] == ["1", "2", "3", "4"], caplog.text
    assert sorted(m[2].split(":")[0] for m in logged) == sorted(
        f"fedavg lr={lr} seed {seed}" for lr in ("0.1", "0.01") for seed in (0, 1))
    shown = re.findall(r"^grid (\d+)/4 \(\d+%\) (?:ETA|in) \S+ (.+)$", err, re.M)
    assert shown and all(text == dict(m.groups() for m in logged)[n] for n, text in shown), (shown, caplog.text)


def _a_batch_stopped_after_round_1(toy_store, tmp_path, monkeypatch):
    """A two-cell fedavg grid trained whole into whole/, and stopped after round 1 in g/: its keywords and the
    stopped batch's runs.json."""
    sweep = {"partition": "iid", "clients": 3, "rounds": 3, "lr": [0.003, 0.03]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0], sweep=sweep)
    grid(out=tmp_path / "whole", **kw)
    stop_after_round(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        grid(out=tmp_path / "g", **kw)
    monkeypatch.undo()
    (runs,) = (tmp_path / "g" / "batches").glob("*/runs.json")
    return kw, runs


def test_the_plan_says_one_cell_alone_in_the_singular():
    """`1 cell as their own runs: ...`."""
    from fedcache.grids.batches import Grouping

    plan = Grouping(batches=[["a", "b"]], alone={"c": "why"}, methods=["fedavg"], per_cell_bytes={}, limit=5).describe()
    assert plan == "batched engine: 2 cells in 1 batch (2 fedavg), at most 5 cells per batch; 1 cell as its own run: why (1)"


@pytest.mark.parametrize("stopped_after", [1, 3])
def test_a_damaged_metrics_line_of_a_stopped_batch_s_cell_keeps_the_batch_unless_its_results_need_that_line(
        toy_store, tmp_path, monkeypatch, caplog, stopped_after):
    """A batch stopped after round 1 of 3, one of its cells' metrics line of that round damaged: the batch was
    dropped as if the cell's folder had been deleted, and its cells trained again from round 0. It continues from
    its checkpoint, the cell's readable lines kept and its lost round said. Stopped after the last round (before
    its cells were finished), the batch is dropped, and said so: trained again, the cell has that line back."""
    from fedcache.federate import driver

    sweep = {"partition": "iid", "clients": 3, "rounds": 3, "lr": [0.003, 0.03]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0], sweep=sweep)
    grid(out=tmp_path / "whole", **kw)
    save, load, loaded = driver.save_checkpoint, driver.load_checkpoint, []

    def save_then_stop(path, ck):
        save(path, ck)
        if ck["rnd"] == stopped_after:
            raise KeyboardInterrupt

    monkeypatch.setattr(driver, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        grid(out=tmp_path / "g", **kw)
    monkeypatch.setattr(driver, "save_checkpoint", save)
    (ck,) = (tmp_path / "g" / "batches").glob("*/checkpoint.pt")
    cell = sorted((tmp_path / "g" / "cells").iterdir())[0]
    lines = (cell / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["round"] == stopped_after
    (cell / "metrics.jsonl").write_text("\n".join([*lines[:-1], lines[-1][:20]]) + "\n")
    monkeypatch.setattr(driver, "load_checkpoint", lambda path: loaded.append(path) or load(path))
    caplog.set_level(logging.WARNING, logger="fedcache")
    grid(out=tmp_path / "g", **kw)
    whole = [json.loads(l) for l in (tmp_path / "whole" / "cells" / cell.name / "metrics.jsonl").read_text().splitlines()]
    again = [json.loads(l) for l in (cell / "metrics.jsonl").read_text().splitlines()]
    if stopped_after == 3:
        assert loaded == [] and "is ahead of" not in caplog.text
        assert f"whose metrics line in {cell / 'metrics.jsonl'} is damaged: trained again, the cell has that line back" in caplog.text
        assert_same_cells(tmp_path / "whole", tmp_path / "g")
        return
    assert loaded == [ck] and "interrupted batch" not in caplog.text
    assert f"{cell / 'metrics.jsonl'} lacked readable metrics lines of rounds [1]" in caplog.text
    assert "miss them: delete its folder and run the same grid call again to have them" in caplog.text
    assert [(l["round"], l["per_client"]) for l in again] == [(l["round"], l["per_client"]) for l in whole[1:]]
    rows = [Table.from_csv(o / "results.csv").to_records() for o in (tmp_path / "whole", tmp_path / "g")]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in rows[0]] == \
           [{k: v for k, v in r.items() if k != "seconds"} for r in rows[1]]


@pytest.mark.parametrize("lost", ["damaged", "missing"])
@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_finished_cell_whose_last_metrics_line_is_damaged_or_deleted_trains_again_on_either_engine(
        toy_store, tmp_path, caplog, engine, lost):
    """A grid killed between a cell's checkpoint of its last round and its summary.json, that round's metrics line
    damaged: continued, the cell was scored again from the checkpoint but lacked that line for good (its report
    said it was cut short). Either engine trains it again from round 0, said, as a batched grid trains the batch
    of such a cell again: its files equal an uninterrupted grid's. A line deleted, or the whole file (one cell each),
    lacks as much: they continued without it (or without any line), "lacked readable metrics lines"."""
    sweep = {"partition": "iid", "clients": 3, "rounds": 3, "lr": [0.003, 0.03]}
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0], sweep=sweep,
              engine=engine)
    grid(out=tmp_path / "whole", **kw)
    grid(out=tmp_path / "g", **kw)
    cells = sorted((tmp_path / "g" / "cells").iterdir())  # both: the batched engine stacks them
    for k, cell in enumerate(cells):
        lines = (cell / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[-1])["round"] == 3
        if lost == "damaged":
            (cell / "metrics.jsonl").write_text("\n".join([*lines[:-1], lines[-1][:20]]) + "\n")
        elif k == 0:
            (cell / "metrics.jsonl").unlink()
        else:
            (cell / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")
        (cell / "summary.json").unlink()
    caplog.set_level(logging.WARNING, logger="fedcache")
    grid(out=tmp_path / "g", **kw)
    for cell in cells:
        assert f"its checkpoint is of the round it stops at (3), whose metrics line in {cell / 'metrics.jsonl'} is " \
               f"{lost}; it trains again from round 0, which writes that line back" in caplog.text
        assert (cell / "metrics.jsonl").read_text().count("\n") == len(lines)
    assert "lacked readable metrics lines" not in caplog.text
    assert_same_cells(tmp_path / "whole", tmp_path / "g")


@pytest.mark.parametrize("lines, said", [
    (['{"round": 1}', '{"round": 2}', '{"rou'], "damaged"),  # the last line torn in place
    (['{"round": 1}', '{"round": 2}'], "missing"),  # the last line deleted
    (['{"round": 1}', 'xx', '{"round": 3}'], "missing"),  # an earlier line damaged, the last one deleted
    (None, "missing"),  # the whole log deleted
])
def test_a_lost_last_line_is_said_damaged_only_where_an_unreadable_line_ends_the_log(tmp_path, lines, said):
    from fedcache.grids.cell import lost_how

    if lines is not None:
        (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert lost_how(tmp_path) == said
