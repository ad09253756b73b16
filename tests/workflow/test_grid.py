"""fedcache grid: the cartesian product, resumption, parallel workers, results.csv and table.md."""
from __future__ import annotations

import json
import shutil

import pytest

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.spec import parse_axes as parse_sweep
from fedcache.grids import GridSpec, cells, load_toml, summary_markdown
from fedcache.table import Table

from .conftest import BACKBONE


def test_cells_are_the_cartesian_product(tmp_path):
    spec = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg", "fedprox"], out=tmp_path,
                    seeds=[0, 1, 2], sweep=parse_sweep(["lr=1e-3,1e-2", "alpha=0.1,1"]))
    grid = cells(spec)
    assert len(grid) == 2 * 2 * 2 * 3
    assert len({c.name for c in grid}) == len(grid)
    assert grid[0].name == "fedavg__lr=1e-3__alpha=0.1__seed=0"


def test_bad_grid_options_say_how_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="--method"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path, sweep={"method": ["x"]})
    with pytest.raises(ConfigError, match="key=v1,v2"):
        parse_sweep(["lr"])
    bad = tmp_path / "g.toml"
    bad.write_text('dataset = "d"\nmethod = ["fedavg"]\n')
    with pytest.raises(ConfigError, match="unknown key.*method"):
        load_toml(bad)


def test_grid_writes_one_row_per_run_and_a_table(toy_grid):
    table = Table.from_csv(toy_grid / "results.csv")
    assert len(table) == 2 * 2 * 2
    assert set(table.column("method")) == {"fedavg", "fedproto"} and set(table.column("seed")) == {0, 1}
    assert all(0 <= a <= 100 for a in table.column("mean_accuracy"))
    assert all(r == 3 for r in table.column("rounds"))
    md = (toy_grid / "table.md").read_text()
    header = next(l for l in md.splitlines() if l.startswith("| method"))
    assert "alpha=0.5" in header and "alpha=5" in header
    # One best (bold) entry per setting column.
    body = [l for l in md.splitlines() if l.startswith("| fed")]
    assert sum(l.count("**") // 2 for l in body) >= 2


def test_table_marks_the_best_mean_of_each_column():
    rows = [{"method": m, "lr": lr, "seed": s, "mean_accuracy": acc} for m, lr, s, acc in
            [("a", "1", 0, 50.0), ("a", "1", 1, 60.0), ("b", "1", 0, 70.0), ("b", "1", 1, 70.0),
             ("a", "2", 0, 90.0), ("a", "2", 1, 80.0), ("b", "2", 0, 10.0), ("b", "2", 1, 20.0)]]
    md = summary_markdown(Table(rows))
    assert "| a | 55.00 (7.07) | **85.00 (7.07)** |" in md  # sample std (ddof=1) over seeds, as the papers print
    assert "| b | **70.00 (0.00)** | 15.00 (7.07) |" in md
    assert "sample std, ddof=1" in md


def test_rerun_skips_finished_cells_and_redoes_unfinished_ones(toy_grid, toy_store, tmp_path):
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    spec = json.loads((out / "grid.json").read_text())
    spec["out"] = str(out)
    (out / "grid.json").write_text(json.dumps(spec))
    before = Table.from_csv(out / "results.csv").to_records()
    victim = out / "cells" / "fedproto__partition=dirichlet__clients=3__alpha=5__rounds=3__seed=1"
    (victim / "summary.json").unlink()
    (victim / "checkpoint.pt").unlink()  # no checkpoint: the cell starts over
    marker = out / "cells" / "fedavg__partition=dirichlet__clients=3__alpha=0.5__rounds=3__seed=0" / "marker"
    marker.write_text("finished cells are not touched")
    from fedcache.api import grid

    ran = []
    table = grid(config=None, store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto",
                 sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out,
                 on_cell=lambda done, total, row: ran.append(row["run_dir"]))
    assert ran == [str(victim.relative_to(out))]
    assert marker.exists()
    # The redone cell is deterministic: the table is the same as before.
    assert [r["mean_accuracy"] for r in table] == [r["mean_accuracy"] for r in before]


def test_a_different_grid_in_the_same_directory_is_refused(toy_grid, toy_store):
    from fedcache.api import grid

    with pytest.raises(ConfigError, match="different grid"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0], out=toy_grid)


@pytest.mark.slow
def test_parallel_workers_give_the_same_results_as_one_process(toy_store, tmp_path, capsys):
    toml = tmp_path / "grid.toml"
    toml.write_text(f'store = "{toy_store}"\ndataset = "test-toy"\nbackbones = ["{BACKBONE}"]\n'
                    'methods = ["fedavg", "fedproto"]\nseeds = [0, 1]\n[set]\nrounds = 2\nclients = 2\nlr = ["0.01", "0.1"]\n')
    code = main(["grid", "--config", str(toml), "--jobs", "2", "--out", str(tmp_path / "par")])
    assert code == 0, capsys.readouterr().err
    assert "results.csv" in capsys.readouterr().out
    code = main(["grid", "--config", str(toml), "--jobs", "1", "--out", str(tmp_path / "seq")])
    assert code == 0
    par = Table.from_csv(tmp_path / "par" / "results.csv")
    seq = Table.from_csv(tmp_path / "seq" / "results.csv")
    assert len(par) == 8
    assert par.column("mean_accuracy") == seq.column("mean_accuracy")
    assert par.column("bytes_up") == seq.column("bytes_up")


def test_grid_cli_errors_are_one_line(tmp_path, capsys):
    code = main(["grid", "--store", str(tmp_path / "none.zarr"), "-d", "x", "-b", "y", "-m", "fedavg", "--out", str(tmp_path / "g")])
    assert code == 1 and "no feature store" in capsys.readouterr().err
    code = main(["grid", "-d", "x", "-b", "y", "--out", str(tmp_path / "g")])
    assert code == 2 and "--method" in capsys.readouterr().err


def test_a_grid_refuses_features_that_changed_since_it_started(toy_grid, toy_store, tmp_path):
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    spec = json.loads((out / "grid.json").read_text())
    spec["out"] = str(out)
    (out / "grid.json").write_text(json.dumps(spec))
    meta = json.loads((out / "features" / "meta.json").read_text())
    meta["train"]["entry_ids"][0] = "0" * 16  # as if that entry had been re-extracted since
    (out / "features" / "meta.json").write_text(json.dumps(meta))
    from fedcache.api import grid

    with pytest.raises(ConfigError, match="changed since the grid"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto",
             sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out)


def test_workers_train_on_the_memory_mapped_features_without_copying_them(toy_grid):
    import numpy as np

    from fedcache.federate.data import FederatedData
    from fedcache.grids.features import read_features

    train_t, test_t = read_features(toy_grid / "features")
    assert isinstance(train_t.features, np.memmap) and train_t.features.dtype == np.float32
    data = FederatedData.from_tables(train_t, test_t, [np.arange(len(train_t))], [np.arange(len(test_t))])
    assert np.shares_memory(data.x_train.numpy(), train_t.features)  # the tensor is a view of the mapped file
    assert np.shares_memory(data.x_test.numpy(), test_t.features)


def _option_names(command) -> set[str]:
    return {o for p in command.params for o in p.opts + p.secondary_opts}


def test_every_train_option_is_a_grid_option_under_the_same_name():
    import typer.main

    from fedcache.cli import GRID_SKIPS, app

    commands = typer.main.get_command(app).commands
    train, grid = commands["train"], commands["grid"]
    skipped = {o for p in train.params if p.name in GRID_SKIPS for o in p.opts + p.secondary_opts}
    assert _option_names(train) - skipped <= _option_names(grid)
    assert skipped == {"--resume", "--no-resume", "--engine", "--overwrite", "--no-overwrite", "--track-dir"}


def test_the_issue_s_grid_command_runs_with_train_options_as_axes(toy_store, tmp_path, capsys):
    out = tmp_path / "g"
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg,fedproto",
                 "--partition", "domain", "--few-shot", "5", "--rounds", "2", "--set", "lr=0.001,0.01",
                 "--seeds", "0,1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = Table.from_csv(out / "results.csv").to_records()
    assert len(rows) == 2 * 2 * 2 and {r["rounds"] for r in rows} == {2}
    md = (out / "table.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| method"))
    assert "lr=0.001" in header and "lr=0.01" in header and "rounds" not in header  # only axes label columns
    caption = md.splitlines()[0]
    assert all(f in caption for f in ("rounds=2", "partition=domain", "few_shot=5", "test-toy", "seeds 0,1"))
    # Printed as table.md holds it: a log (console 160 wide) must not wrap a long row or caption.
    printed = capsys.readouterr().out.splitlines()
    assert max(map(len, md.splitlines())) > 160 and all(line in printed for line in md.splitlines()), printed
    # Without --clients a domain partition gives one client per domain (test-toy has two).
    config = json.loads(next((out / "cells").glob("*/config.json")).read_text())
    assert config["partition"]["request"]["n_clients"] == 2


def test_a_different_grid_names_the_keys_that_differ(toy_grid, toy_store):
    from fedcache.api import grid

    with pytest.raises(ConfigError, match=r"differs in methods \(fedavg,fedproto there, fedavg here\), alpha \(0.5,5 there, 0.5 here\);"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0, 1], out=toy_grid,
             sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5], "rounds": 3})


def _children(pid: int) -> set[int]:
    import os

    kids = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                if entry.isdigit() and int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.add(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_parallel_grid_and_its_workers(toy_store, tmp_path, sig):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "grid"
    cmd = [sys.executable, "-m", "fedcache.cli", "grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE,
           "-m", "fedavg,fedprox,fedproto,solo", "--rounds", "100000", "--partition", "iid", "--clients", "2",
           "--jobs", "2", "--engine", "processes", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        _signal_mid_grid(proc, out, getattr(signal, sig))
    finally:
        if proc.poll() is None:  # a failed test must not leave a grid running
            for pid in _children(proc.pid) | {proc.pid}:
                os.kill(pid, signal.SIGKILL)


def _signal_mid_grid(proc, out, sig):
    import time

    deadline = time.monotonic() + 120
    while not (out / "cells").exists() or len(list((out / "cells").glob("*/metrics.jsonl"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
        time.sleep(0.2)
    workers = _children(proc.pid)
    assert len(workers) >= 2
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert time.monotonic() - t0 < 15
    time.sleep(0.5)
    assert not [w for w in workers if _alive(w)]


def _grid_process(toy_store, out, *options):
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "fedcache.cli", "grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE,
           "--partition", "iid", "--clients", "2", "-o", str(out), *options]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))


def _wait_for(proc, ready, seconds=120):
    import time

    deadline = time.monotonic() + seconds
    while not ready():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "timeout"
        time.sleep(0.2)


def _wait_for_exit(workers, seconds=5.0):
    import time

    deadline = time.monotonic() + seconds
    while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)]


def _kill_tree(proc):
    import os
    import signal

    if proc.poll() is None:  # a failed test must not leave a grid running
        for pid in _children(proc.pid) | {proc.pid}:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
def test_a_stopped_parallel_grid_keeps_finished_cells_and_resumes_the_others(toy_store, tmp_path):
    """Short cells finish while long ones train; SIGTERM then leaves the finished ones finished and the long
    ones checkpointed, so a re-run skips the first and resumes the second."""
    import signal

    out = tmp_path / "grid"
    proc = _grid_process(toy_store, out, "-m", "fedavg,fedprox", "--rounds", "2,100000", "--jobs", "2",
                         "--engine", "processes")
    try:
        finished = lambda: list((out / "cells").glob("*rounds=2*/summary.json"))  # noqa: E731
        started = lambda: list((out / "cells").glob("*rounds=100000*/checkpoint.pt"))  # noqa: E731
        _wait_for(proc, lambda: (out / "cells").exists() and len(finished()) == 2 and len(started()) == 2)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_tree(proc)
    assert proc.returncode == 130 and "Traceback" not in err and "re-run the same command to resume" in err, err
    _wait_for_exit(workers)  # the issue's bound: the workers are gone within a few seconds of the parent
    assert len(finished()) == 2 and len(started()) == 2
    assert not list((out / "cells").glob("*rounds=100000*/summary.json"))


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
def test_a_signal_stops_the_batched_engine_with_its_batch_checkpointed(toy_store, tmp_path):
    """The batched engine trains stacked cells (one batch: in the grid's own process): Ctrl-C stops it within seconds,
    exit 130, and the batch's checkpoint is on disk for the re-run."""
    import signal
    import time

    out = tmp_path / "grid"
    proc = _grid_process(toy_store, out, "-m", "fedavg", "--rounds", "100000", "--seeds", "0", "--set", "lr=0.01,0.1",
                         "--jobs", "2", "--engine", "batched")
    try:
        _wait_for(proc, lambda: any((out / "batches").glob("*/*.pt")) if (out / "batches").exists() else False)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_tree(proc)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert time.monotonic() - t0 < 15
    assert any((out / "batches").glob("*/*.pt")) and not list((out / "cells").glob("*/summary.json"))
