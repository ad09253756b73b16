"""Running a grid (fedcache/grids/run.py): one row per cell in results.csv and table.md, a re-run skips finished
cells and redoes unfinished ones, a different grid in the same directory is refused naming what differs, and
errors are one line."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.federate.rundir import load_checkpoint
from fedcache.table import Table
from tests.conftest import BACKBONE


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


def test_rerun_skips_finished_cells_and_redoes_unfinished_ones(toy_grid, toy_store, tmp_path):
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)  # a grid moved (to a larger disk, say) is the same grid where it is now
    before = Table.from_csv(out / "results.csv").to_records()
    victim = out / "cells" / "fedproto__partition=dirichlet__clients=3__alpha=5__rounds=3__seed=1"
    (victim / "summary.json").unlink()
    (victim / "checkpoint.pt").unlink()  # no checkpoint: the cell starts over
    marker = out / "cells" / "fedavg__partition=dirichlet__clients=3__alpha=0.5__rounds=3__seed=0" / "marker"
    marker.write_text("finished cells are not touched")
    from fedcache.api import grid

    ran, plans = [], []
    table = grid(config=None, store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto",
                 sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out,
                 on_cell=lambda done, total, row: ran.append(row["run_dir"]), on_plan=plans.append)
    assert ran == [str(victim.relative_to(out))]
    assert plans[0] == f"resuming {out}: 7 of 8 cells finished before, 1 to train (none from a checkpoint)"
    assert marker.exists() and json.loads((out / "grid.json").read_text())["out"] == str(out)
    # The redone cell is deterministic: the table is the same as before, and the cell's numbers and weights those
    # of its first run, bit for bit (accuracies alone, of a few test rows, pass runs that differ).
    assert [r["mean_accuracy"] for r in table] == [r["mean_accuracy"] for r in before]
    first = toy_grid / victim.relative_to(out)
    summaries = [{k: v for k, v in json.loads((c / "summary.json").read_text()).items() if k != "seconds"}
                 for c in (first, victim)]
    assert summaries[0] == summaries[1]
    was, now = (load_checkpoint(c / "checkpoint.pt")["runs"][0] for c in (first, victim))
    for part in ("server", "clients"):
        assert was[part].keys() == now[part].keys()
        assert all(torch.equal(was[part][n], now[part][n]) for n in was[part]), part


def test_a_finished_grid_run_again_tells_on_plan_what_it_found(toy_grid, toy_store, tmp_path):
    """A re-run of a grid whose cells had all finished called neither callback: a notebook's progress said nothing.
    Its plan is what it found; on_cell, as on any re-run, is told only of cells this call trains (none). No cell's
    file is written again (the grid's results.csv and table.md are, from them)."""
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    from fedcache.api import grid

    for p in (out / "cells").rglob("*"):
        os.utime(p, ns=(10**18, 10**18))  # long before now: a file written again has another mtime
    files = lambda: {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (out / "cells").rglob("*") if p.is_file()}
    before = files()
    ran, plans = [], []
    table = grid(config=None, store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto",
                 sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out,
                 on_cell=lambda done, total, row: ran.append((done, total)), on_plan=plans.append)
    assert plans == [f"resuming {out}: 8 of 8 cells finished before, none to train (their results are read back)"]
    assert ran == [] and len(table) == 8 and files() == before


def test_a_grid_interrupted_before_any_cell_finished_says_it_resumes(toy_grid, toy_store, tmp_path):
    """Stopped before its first cell finished, a re-run said nothing of resuming (only "grid started", as a fresh
    grid): it counts the cells that continue from a checkpoint."""
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    for summary in (out / "cells").glob("*/summary.json"):  # as stopped in their last round, checkpoints kept
        summary.unlink()
    (out / "cells" / "fedproto__partition=dirichlet__clients=3__alpha=5__rounds=3__seed=1" / "checkpoint.pt").unlink()
    from fedcache.api import grid

    plans = []
    grid(config=None, store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto",
         sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out,
         on_plan=plans.append)
    assert plans[0] == f"resuming {out}: 0 of 8 cells finished before, 8 to train (7 from their last checkpoints)"


def test_a_resumed_grid_says_grid_started_after_the_engine_s_plan(toy_grid, toy_store, tmp_path, capsys):
    """A fresh grid prints its engine's plan, then "grid started"; a re-run printed "grid started" between its
    "resuming" line and the plan."""
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    (out / "cells" / "fedproto__partition=dirichlet__clients=3__alpha=5__rounds=3__seed=1" / "summary.json").unlink()
    capsys.readouterr()
    assert main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg,fedproto",
                 "--partition", "dirichlet", "--clients", "3", "--alpha", "0.5,5", "--rounds", "3", "--seeds", "0,1",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"resuming {out}: 7 of 8 cells") and err[1].startswith("batched engine: "), err
    assert err[2] == "grid started", err


def _left_by_a_killed_worker(cell, via: int) -> None:
    """A worker's lock in ``cell``, as one killed while it trained there leaves it: its record, no flock; an empty
    checkpoint.pt.tmp, as a kill in the middle of a checkpoint leaves one."""
    import socket

    from fedcache.ownership import LOCK, Holder

    grid = Holder(2**22 + 1, socket.gethostname(), "fedcache grid -o g", "2026-01-01T00:00:00+00:00", via=via)
    (cell / LOCK).write_text(grid.to_text())
    (cell / "checkpoint.pt.tmp").write_bytes(b"")


def test_a_rerun_in_one_process_clears_what_killed_workers_left_in_their_cells(toy_grid, toy_store, tmp_path, caplog):
    """A killed worker leaves its cell's lock and its half-written files, in the cell a re-run resumes and in one
    that had finished. A re-run training its cells in its own process (--jobs 1, the batched engine) takes each
    over as it starts, and says so."""
    import logging

    from fedcache.api import grid

    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    resumed = out / "cells" / "fedproto__partition=dirichlet__clients=3__alpha=5__rounds=3__seed=1"
    (resumed / "summary.json").unlink()
    finished = out / "cells" / "fedavg__partition=dirichlet__clients=3__alpha=0.5__rounds=3__seed=0"
    _left_by_a_killed_worker(resumed, 2**22 + 2)
    _left_by_a_killed_worker(finished, 2**22 + 3)
    with caplog.at_level(logging.WARNING):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto", seeds=[0, 1], out=out,
             sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, jobs=1)
    assert not list(out.glob("cells/*/.fedcache.lock")) and not list(out.glob("cells/*/*.tmp"))
    assert (resumed / "summary.json").exists() and (finished / "checkpoint.pt").exists()
    said = sorted(r.getMessage() for r in caplog.records if "taking it over" in r.getMessage())
    assert [l.split(",")[0] for l in said] == [f"the run directory {finished} was left locked by pid {2**22 + 3}",
                                               f"the run directory {resumed} was left locked by pid {2**22 + 2}"], said


def test_a_cell_whose_lock_is_held_is_left_as_it_is(tmp_path):
    """The lock of a cell still held (a worker of a grid killed outright, ending): its holder may be writing the
    file its .tmp becomes. A cell whose lock was left, and one without a lock (a grid killed in its own process:
    every writer of a cell holds its lock, so nobody writes it), is cleared, and so is a batch's folder (its
    checkpoint.pt.tmp)."""
    from fedcache.grids.cell import clear_killed
    from fedcache.ownership import LOCK
    from tests.faults import held_elsewhere

    left, held, unlocked = (tmp_path / "cells" / name for name in ("left", "held", "unlocked"))
    batch = tmp_path / "batches" / "0123456789abcdef"
    left.mkdir(parents=True)
    unlocked.mkdir()
    batch.mkdir(parents=True)
    _left_by_a_killed_worker(left, 2**22 + 2)
    (unlocked / "checkpoint.pt.tmp").write_bytes(b"")
    (batch / "checkpoint.pt.tmp").write_bytes(b"")
    with held_elsewhere(held):
        (held / "checkpoint.pt.tmp").write_bytes(b"")
        clear_killed(tmp_path)
        assert (held / LOCK).exists() and (held / "checkpoint.pt.tmp").exists()
    assert not (left / LOCK).exists() and not (left / "checkpoint.pt.tmp").exists()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == [
        held.relative_to(tmp_path) / "checkpoint.pt.tmp"]


def test_a_rerun_locks_only_the_folders_a_killed_writer_left_something_in(tmp_path, monkeypatch):
    """Every run_cells (each halving rung, the test stage) cleared every cell, finished ones too: a lock taken and
    a record written per cell, seconds a rung on NFS with thousands of cells. Only a folder with a lock file or a
    temporary file in it is locked; a stray file beside the cells is no folder (on Python 3.10, glob("*/") gave
    files too, and locking one raised FileExistsError)."""
    import fedcache.grids.cell as cell
    from fedcache.ownership import hold

    finished, left = tmp_path / "cells" / "finished", tmp_path / "cells" / "left"
    finished.mkdir(parents=True)
    left.mkdir()
    (finished / "summary.json").write_text("{}")
    (left / "checkpoint.pt.tmp").write_bytes(b"")
    (tmp_path / "batches").mkdir()
    for stray in (tmp_path / "cells" / "notes.txt", tmp_path / "batches" / "notes.txt"):
        stray.write_text("a user's")
    held = []

    def spy(folder, *args, **kwargs):
        held.append(folder)
        return hold(folder, *args, **kwargs)

    monkeypatch.setattr(cell, "hold", spy)
    cell.clear_killed(tmp_path)
    assert held == [left] and not (left / "checkpoint.pt.tmp").exists()


TOY_ARGV = ["-d", "test-toy", "-b", BACKBONE, "-m", "fedavg,fedproto", "--partition", "dirichlet", "--clients", "3",
            "--alpha", "0.5,5", "--rounds", "3", "--seeds", "0,1"]


@pytest.mark.parametrize("engine", ["batched", "processes"])
def test_a_rerun_in_one_process_waits_for_a_cell_s_live_holder_then_refuses(engine, toy_grid, toy_store, tmp_path,
                                                                             capsys, monkeypatch):
    """A worker of a grid killed outright (kill -9) may still be writing its cell as the same grid command starts
    again: the grid's own lock is free, and a re-run training its cells in its own process (--jobs 1) trained that
    cell too, clearing it under the worker (two writers of one checkpoint). It waits for the cell's holder, then
    refuses in one line naming it; the cell is left to its holder."""
    import fedcache.grids.cell as cell
    from tests.faults import held_elsewhere, one_error_line, run_cli

    monkeypatch.setattr(cell, "CELL_WAIT", 0.5)
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    name = "fedproto__partition=dirichlet__clients=3__alpha=5__rounds=3__seed={}"
    held, other = (out / "cells" / name.format(s) for s in (1, 0))
    for pending in (held, other):  # two of one stack in the batched engine
        (pending / "summary.json").unlink()
        (pending / "checkpoint.pt").unlink()
    (held / "theirs").write_text("the live holder's file")
    argv = ["grid", "--store", toy_store, *TOY_ARGV, "--jobs", "1", "--engine", engine, "--out", out]
    with held_elsewhere(held) as holder:
        code, err = run_cli(argv, capsys)
        assert code == 1 and one_error_line(err).startswith(f"error: the run directory {held} is in use by another "
                                                            f"fedcache command (waited 0.5 s): pid {holder.pid} "), err
        assert (held / "theirs").read_text() == "the live holder's file" and not (held / "summary.json").exists()
    assert run_cli(argv, capsys)[0] == 0  # its holder gone, the same command trains the cell
    assert (held / "summary.json").exists() and not list(out.glob("cells/*/.fedcache.lock"))


@pytest.mark.parametrize("engine", [["--engine", "batched", "--max-batch-cells", "1"], ["--engine", "processes"]])
def test_a_rerun_waits_for_a_batch_s_live_holder_then_refuses(engine, toy_grid, toy_store, tmp_path, capsys,
                                                              monkeypatch):
    """A worker of a grid killed outright may still be training a batch as the grid starts again, grouping its
    cells otherwise (a lower --max-batch-cells, the processes engine). The batch's cells are locked only as it
    starts: the re-run skipped the held batch without a word and trained its cells under the worker writing them.
    It waits for the batch's holder, then refuses in one line naming the batch; its cells are left to it."""
    import fedcache.grids.cell as cell
    from fedcache.grids.batches import batch_id
    from tests.faults import held_elsewhere, one_error_line, run_cli

    monkeypatch.setattr(cell, "CELL_WAIT", 0.5)
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    name = "fedproto__partition=dirichlet__clients=3__alpha=5__rounds=3__seed={}"
    stacked = [out / "cells" / name.format(s) for s in (0, 1)]
    for pending in stacked:
        (pending / "summary.json").unlink()
        (pending / "checkpoint.pt").unlink()
        (pending / "theirs").write_text("the live holder's file")
    batch = out / "batches" / batch_id([c.name for c in stacked])
    argv = ["grid", "--store", toy_store, *TOY_ARGV, "--jobs", "1", *engine, "--out", out]
    with held_elsewhere(batch) as holder:
        code, err = run_cli(argv, capsys)
        assert code == 1 and one_error_line(err).startswith(f"error: the batch {batch} is in use by another fedcache "
                                                            f"command (waited 0.5 s): pid {holder.pid} "), err
        assert all((c / "theirs").exists() and not (c / "summary.json").exists() for c in stacked)
    assert run_cli(argv, capsys)[0] == 0  # its holder gone, the same command trains the cells
    assert all((c / "summary.json").exists() for c in stacked)


def test_axes_in_another_order_resume_the_same_cells(toy_grid, toy_store, tmp_path, monkeypatch):
    """A grid file whose [set] lines moved is the same grid: nothing trains again under other folder names (and
    nothing is built for cells that do not train)."""
    import fedcache.grids.run as run
    from fedcache.api import grid

    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    monkeypatch.setattr(run, "instantiate", lambda *a: pytest.fail("a method built for a finished cell"))
    ran = []
    table = grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto", seeds=[0, 1], out=out,
                 sweep={"rounds": 3, "alpha": [0.5, 5], "clients": 3, "partition": "dirichlet"},
                 on_cell=lambda done, total, row: ran.append(row["run_dir"]))
    assert ran == [] and len(list((out / "cells").iterdir())) == len(table) == 8
    assert list(json.loads((out / "grid.json").read_text())["sweep"]) == ["partition", "clients", "alpha", "rounds"]


def test_a_method_the_data_cannot_serve_is_refused_before_any_cell_trains(toy_store, tmp_path):
    """clip-zs needs a text tower, which the toy backbone lacks: said before fedavg's cells train, not after."""
    from fedcache.api import grid

    out = tmp_path / "grid"
    with pytest.raises(ConfigError, match="clip-zs needs a backbone with a text tower"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,clip-zs", seeds=[0], out=out,
             sweep={"rounds": 1, "partition": "iid", "clients": 2})
    assert not out.exists()  # not even the plan: the corrected call starts afresh


@pytest.mark.parametrize("engine, jobs", [("batched", 1), ("processes", 1), pytest.param("processes", 2, marks=pytest.mark.slow)])
def test_a_cell_that_diverges_is_marked_and_the_others_finish(engine, jobs, toy_store, tmp_path, caplog):
    """An lr too large for one cell does not end an overnight grid: its row says diverged, its error is kept, and
    a re-run reads it as done. Its advice names the lr as the grid's caller gave it (sweep['lr'], in this process
    or a worker's), not as train's settings['lr']."""
    from fedcache.api import grid

    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0, 1], out=tmp_path / "g",
              sweep={"rounds": 2, "partition": "iid", "clients": 2, "lr": ["0.1", "1e300"]}, engine=engine, jobs=jobs)
    table = grid(**kw)
    lost = [r for r in table if r.get("diverged")]
    assert [r["lr"] for r in lost] == [1e300, 1e300] and all(r["mean_accuracy"] is not None for r in table if r not in lost)
    # The round it diverged in, said beside it: lr=1e300 blows up in the first.
    assert [r["diverged_round"] for r in lost] == [1, 1]
    assert "| fedavg | " in (tmp_path / "g" / "table.md").read_text()
    assert "diverged (2 seeds in round 1)" in (tmp_path / "g" / "table.md").read_text()
    from fedcache.reports import write_report

    assert "(every seed diverged in round 1)" in write_report(tmp_path / "g").markdown.read_text()
    error = json.loads((tmp_path / "g" / lost[0]["run_dir"] / "diverged.json").read_text())["error"]
    assert "NaN/inf" in error and "lower the learning rate (sweep['lr']=...)" in error, error
    assert "2 cells of 4 diverged" in caplog.text and "in a new directory (out='DIR')" in caplog.text
    ran = []
    grid(**kw, on_cell=lambda done, total, row: ran.append(row))
    assert ran == []


@pytest.mark.parametrize("engine, jobs, key", [("batched", 1, "lr"), pytest.param("processes", 2, "optim.lr", marks=pytest.mark.slow)])
def test_a_diverged_cell_names_an_lr_from_the_grid_file_by_the_file(engine, jobs, key, toy_store, tmp_path, capsys):
    """A grid file's [set] lr that diverged was advised as sweep['lr'] to fedcache.grid(config=...), and as
    --set lr on the command line: its user wrote it in the file. One the command line gave over the file is named
    as the command line gave it (--set optim.lr)."""
    from fedcache.api import grid

    toml = tmp_path / "grid.toml"
    toml.write_text(f'store = "{toy_store}"\ndataset = "test-toy"\nbackbones = ["{BACKBONE}"]\nmethods = ["fedavg"]\n'
                    f'seeds = [0]\nengine = "{engine}"\njobs = {jobs}\n'
                    f'[set]\n"{key}" = ["0.1", "1e300"]\nrounds = 2\npartition = "iid"\nclients = 2\n')

    def advice(out) -> str:
        (cell,) = (c for c in (out / "cells").iterdir() if (c / "diverged.json").exists())
        return json.loads((cell / "diverged.json").read_text())["error"].split("; ")[-1]

    said = f"training diverged from finite inputs: lower the learning rate (grid file {toml}'s [set] {key}=...)."
    grid(config=toml, out=tmp_path / "api")
    assert advice(tmp_path / "api") == said
    assert main(["grid", "--config", str(toml), "--out", str(tmp_path / "cli")]) == 0
    assert advice(tmp_path / "cli") == said
    assert main(["grid", "--config", str(toml), "--out", str(tmp_path / "set"), "--set", f"{key}=1e300"]) == 0
    assert advice(tmp_path / "set") == f"training diverged from finite inputs: lower the learning rate (--set {key}=...)."
    capsys.readouterr()


def test_a_grid_or_a_run_is_never_written_into_a_store_or_another_grid(toy_grid, toy_store, tmp_path):
    """Into another grid's cells/ a report of that grid counted the new cells as its own; into a store, its files
    sat among the store's."""
    from fedcache.api import grid, train

    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0],
              sweep={"rounds": 1, "partition": "iid", "clients": 2})
    for out, where in ((toy_grid / "cells" / "mine", f"inside the grid directory {toy_grid}"),
                       (toy_store / "runs", f"inside the feature store {toy_store}")):
        with pytest.raises(ConfigError, match=f"^out='{out}' is {where}(, which writes its cells itself)?; choose a directory outside it"):
            grid(**kw, out=out)
        assert not out.exists()
    with pytest.raises(ConfigError, match="inside the feature store"):
        train(toy_store, "test-toy", BACKBONE, "fedavg", rounds=1, clients=2, partition="iid", out=toy_store / "run")
    assert not (toy_store / "run").exists()


def test_a_different_grid_in_the_same_directory_is_refused(toy_grid, toy_store):
    from fedcache.api import grid

    with pytest.raises(ConfigError, match="different grid"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0], out=toy_grid)


def test_a_different_grid_names_an_option_as_the_command_line_gave_it(toy_store, tmp_path, capsys):
    """The command line was told the Python keyword: `differs in reduction_factor (3 there, 2 here)`."""
    args = ["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
            "--clients", "2", "--subsample", "0.5", "--rounds", "3", "--set", "lr=0.1,0.01,0.001", "--select", "lr",
            "--prune", "halving", "--out", str(tmp_path / "g")]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["--reduction-factor", "2"]) == 2
    assert "differs in --reduction-factor (3 there, 2 here)" in " ".join(capsys.readouterr().err.split())



def test_a_different_grid_says_where_to_choose_another_out(toy_store, tmp_path, capsys):
    """Its out from a grid file is that file's key there; from the command line, --out (it said `another out`)."""
    toml = tmp_path / "grid.toml"
    toml.write_text(f'store = "{toy_store}"\ndataset = "test-toy"\nbackbones = ["{BACKBONE}"]\nmethods = ["fedavg"]\n'
                    f'out = "{tmp_path / "g"}"\nseeds = [0]\n[set]\npartition = "iid"\nclients = 2\nrounds = 1\n')
    assert main(["grid", "--config", str(toml)]) == 0
    capsys.readouterr()
    assert main(["grid", "--config", str(toml), "--rounds", "2"]) == 2
    assert capsys.readouterr().err.rstrip().endswith(f"or another out in grid file {toml}")
    assert main(["grid", "--config", str(toml), "--rounds", "2", "--out", str(tmp_path / "g")]) == 2
    assert "or another --out" in capsys.readouterr().err

def test_a_different_grid_names_the_keys_that_differ(toy_grid, toy_store):
    from fedcache.api import grid

    with pytest.raises(ConfigError, match=r"differs in methods \(fedavg,fedproto there, fedavg here\), alpha \(0.5,5 there, 0.5 here\);"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0, 1], out=toy_grid,
             sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5], "rounds": 3})


def test_a_grid_and_a_run_never_share_a_directory(toy_grid, toy_store, tmp_path):
    """A grid written into a run's directory mixed its cells with the run in reports, and the other way round."""
    from fedcache.api import grid, train

    run = tmp_path / "run"
    train(toy_store, "test-toy", BACKBONE, "fedavg", rounds=1, clients=2, partition="iid", out=run)
    with pytest.raises(ConfigError, match=f"{run} holds a run of `fedcache train` \\(config.json\\), not a grid"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0], out=run)
    with pytest.raises(ConfigError, match=f"{toy_grid} holds a grid \\(grid.json\\), not a run"):
        train(toy_store, "test-toy", BACKBONE, "fedavg", rounds=1, clients=2, partition="iid", out=toy_grid)
    cell = next((toy_grid / "cells").iterdir())  # the grid writes its cells itself, a stack of them at once
    with pytest.raises(ConfigError, match=f"^out='{cell}' is inside the grid directory {toy_grid}, which writes its cells itself"):
        train(toy_store, "test-toy", BACKBONE, "fedavg", rounds=1, clients=2, partition="iid", out=cell, overwrite=True)


def test_slow_steps_before_the_first_cell_are_said_before_the_plan(toy_store, tmp_path, capsys, monkeypatch):
    """Reading a large store and making its partitions left a grid silent for its first half minute; each step is
    a line where it took ``progress.SLOW_STEP`` seconds or more (0 here), before the plan and the "grid started"
    line, which a grid refused by its partitions must not print."""
    from fedcache import progress

    monkeypatch.setattr(progress, "SLOW_STEP", 0.0)
    assert main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition",
                 "dirichlet", "--alpha", "0.5,5", "--clients", "3", "--rounds", "1", "--out", str(tmp_path / "slow")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"shared features ready in \d+\.\d s: 84 rows \([\d.]+ kB\) of test-toy on {BACKBONE} read from "
                        rf"{re.escape(str(toy_store))} into {re.escape(str(tmp_path / 'slow' / 'features'))}", err[0]), err
    assert re.fullmatch(r"partitions ready in \d+\.\d s: 2 partitions, 1 method checked", err[1]), err
    assert err[2].startswith("batched engine: ") and err[3] == "grid started", err


def test_a_slow_step_goes_to_a_log_file(toy_store, tmp_path):
    """`fedcache grid ... 2> grid.log` under FEDCACHE_LOG=info: the step is in the log once, as its INFO record (it
    was printed beside it too)."""
    code = ("import sys; from fedcache import progress; progress.SLOW_STEP = 0.0\n"
            "from fedcache.cli.root import _console_script; sys.argv[0] = 'fedcache'; _console_script()")
    log = tmp_path / "grid.log"
    with open(log, "w") as fh:
        subprocess.run([sys.executable, "-c", code, "grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE,
                        "-m", "fedavg", "--partition", "iid", "--clients", "2", "--rounds", "1", "--out", str(tmp_path / "g")],
                       stdout=subprocess.DEVNULL, stderr=fh, env={**os.environ, "FEDCACHE_LOG": "info"}, check=True)
    lines = log.read_text().splitlines()
    (said,) = [line for line in lines if "shared features ready in " in line]
    assert said.startswith("INFO fedcache.grids.run: shared features ready in "), lines
    # torch's import (seconds under load) said while it runs, before the grid's first line
    assert lines.index("loading torch ...") < lines.index(said), lines
    assert [line.split(": ", 1)[0] for line in lines if "partitions ready in " in line] == ["INFO fedcache.grids.run"]


def test_grid_cli_errors_are_one_line(tmp_path, capsys):
    code = main(["grid", "--store", str(tmp_path / "none.zarr"), "-d", "x", "-b", "y", "-m", "fedavg", "--out", str(tmp_path / "g")])
    assert code == 2 and "no feature store" in capsys.readouterr().err
    code = main(["grid", "-d", "x", "-b", "y", "--out", str(tmp_path / "g")])
    assert code == 2 and "--method" in capsys.readouterr().err


def test_a_bad_grid_option_or_file_is_refused_before_torch_loads(tmp_path):
    """`fedcache grid` loaded torch (seconds, `loading torch ...` on a busy machine) before it read its options: a
    bad --select or --prune, --prune without --select, or a bad grid file is now its one line, torch not imported."""
    bad_file = tmp_path / "bad.toml"
    bad_file.write_text('methods = ["fedavg"\n')
    # SLOW_STEP out of reach: a loaded machine said `loading torch ...` first, while torch was never imported
    code = ("import sys; from fedcache import progress; progress.SLOW_STEP = 1e9\n"
            "from fedcache.cli import main; *grid, bad_file = sys.argv[1:]\n"
            "bads = ['--select', 'lr'], ['--prune', 'sometimes'], ['--prune', 'halving'], ['--config', bad_file]\n"
            "for bad in bads:\n"
            "    assert main(['grid', *grid, *bad]) == 2\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, "--store", str(tmp_path / "s.zarr"), "-d", "x", "-b", "y", "-m",
                           "fedavg", "--out", str(tmp_path / "g"), str(bad_file)], capture_output=True, text=True)
    lines = done.stderr.splitlines()
    assert done.returncode == 0 and done.stdout.strip() == "False", (done.stdout, done.stderr)
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), lines
    assert "--select=lr" in lines[0] and "--prune" in lines[1] and "cuts the candidates" in lines[2], lines
    assert "not valid TOML" in lines[3], lines


def test_the_grids_cells_function_stays_a_function_once_the_engines_are_imported():
    """fedcache.grids imports its engines when a grid runs, not when it is imported: a submodule of the name of its
    ``cells`` function, imported with them, replaced that function on the package (`fedcache.grids.cells(spec)`
    became a module)."""
    import fedcache.grids.run  # noqa: F401  (the engines, and the modules they import)
    from fedcache.grids import cells

    assert callable(cells) and cells.__module__ == "fedcache.grids.spec"


def test_a_directory_holds_runs_once_a_cell_finished_checkpointed_or_diverged(tmp_path):
    """What keeps another grid out of a --out: a refused start's cell.json alone does not."""
    from fedcache.grids.run import holds_runs

    cell = tmp_path / "validation" / "cells" / "fedavg__lr=1e30__seed=0"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text("{}")
    assert not holds_runs(tmp_path)
    for name in ("diverged.json", "checkpoint.pt", "summary.json"):
        (cell / name).write_text("{}")
        assert holds_runs(tmp_path), name
        (cell / name).unlink()


def test_a_resumed_grid_with_its_axes_given_in_another_order_says_each_cell_as_it_logs_it(toy_store, tmp_path, capsys,
                                                                                          caplog):
    """The progress line named a cell's axes in the order the command gave them, the log in the order the grid began
    with (its folders' names): one cell said two ways."""
    import logging

    from fedcache.api import grid

    def stop(done, total, row):
        raise KeyboardInterrupt

    out = tmp_path / "g"
    with pytest.raises(KeyboardInterrupt):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", seeds=[0], out=out, on_cell=stop,
             sweep={"partition": "dirichlet", "clients": 3, "rounds": 1, "lr": [0.1, 0.01], "alpha": [0.5, 5]})
    with caplog.at_level(logging.INFO, logger="fedcache.grids"):
        code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--seeds", "0",
                     "--partition", "dirichlet", "--clients", "3", "--rounds", "1", "--set", "alpha=0.5,5", "--set",
                     "lr=0.1,0.01", "--out", str(out)])
    err = capsys.readouterr().err
    logged = dict(re.fullmatch(r"cell (\d+)/4 finished: (.+)", r.getMessage()).groups() for r in caplog.records
                  if r.name == "fedcache.grids" and r.getMessage().startswith("cell "))
    assert code == 0 and all(text.startswith("fedavg lr=") for text in logged.values()), logged
    shown = re.findall(r"^grid (\d+)/4 \(\d+%\) (?:ETA|in) \S+ (.+)$", err, re.M)
    assert shown and all(text == logged[n] for n, text in shown), (shown, logged)


def test_a_full_disk_advises_the_same_grid_command_or_call_again(toy_store, tmp_path, monkeypatch, capsys):
    """A grid on a full disk advises running it again, which takes up its cells (a cell's own advice speaks of
    train's --resume): "the same grid command" on the command line, "the same grid call" to fedcache.grid."""
    import fedcache
    import fedcache.grids.run as grid_run
    from fedcache.errors import DiskFullError

    def full(*_args, **_kwargs):
        raise DiskFullError("no space left on the disk for the checkpoint c.pt", "the cell's own advice")

    monkeypatch.setattr(grid_run, "run_cells", full)
    kept = "finished cells are kept, the others continue from their last checkpoint"
    with pytest.raises(DiskFullError) as err:
        fedcache.grid(toy_store, "test-toy", BACKBONE, "fedavg", sweep={"rounds": 1}, out=tmp_path / "api")
    assert str(err.value) == f"no space left on the disk for the checkpoint c.pt; free some space and run the same grid call again: {kept}"
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--rounds", "1",
                 "--out", str(tmp_path / "cli")])
    assert code == 1 and f"free some space and run the same grid command again: {kept}" in capsys.readouterr().err


def _fails_in_a_cell() -> list:
    from fedcache.grids.cell import failing_as

    with failing_as("the cell cells/x"):
        raise RuntimeError("boom\nits second line")


@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_cell_s_own_error_is_one_line_naming_it_and_a_re_run_trains_only_it(toy_store, tmp_path, monkeypatch,
                                                                              capsys, engine):
    """A cell (or its batch) that raised an error of no fedcache kind (a bug, memory run out) stopped the grid with
    a traceback naming neither the cell nor what was kept. One line names it and the error, the grid exits non-zero,
    and the same command run again trains only what did not finish."""
    from fedcache.grids import batches, cell

    argv = ["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg,fedproto", "--partition",
            "iid", "--clients", "2", "--rounds", "1", "--seeds", "0,1", "--engine", engine, "--jobs", "1",
            "--out", str(tmp_path / "g")]
    train, run_batch = cell.train, batches.run_batch

    def bug(*args, **kwargs):
        raise RuntimeError("a method's bug\nwhose second line")

    monkeypatch.setattr(batches, "run_batch", lambda batch, *a: bug() if next(iter(batch)).method == "fedproto"
                        else run_batch(batch, *a))
    monkeypatch.setattr(cell, "train", lambda cfg, **kw: bug() if kw["run_name"].startswith("fedproto") else train(cfg, **kw))
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    what = "the batch of cells/fedproto__" if engine == "batched" else "the cell cells/fedproto__"
    (said,) = [l for l in err.splitlines() if l.startswith("error:")]
    assert re.fullmatch(rf"error: {what}\S+( and 1 other cell)? failed: RuntimeError: a method's bug \(FEDCACHE_DEBUG=1 "
                        r"shows where it happened\); finished cells are kept, and the same grid command run again trains "
                        r"this one again", said), err
    kept = {p.parent.name for p in (tmp_path / "g" / "cells").glob("*/summary.json")}
    assert kept == {f"fedavg__partition=iid__clients=2__rounds=1__seed={s}" for s in (0, 1)}
    monkeypatch.setattr(batches, "run_batch", run_batch)
    monkeypatch.setattr(cell, "train", train)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "2 of 4 cells finished before, 2 to train" in err
    assert len(list((tmp_path / "g" / "cells").glob("*/summary.json"))) == 4


def test_a_cell_s_own_error_reaches_the_grid_from_a_worker_as_its_one_line():
    from fedcache.errors import CellFailedError
    from fedcache.grids.pool import Workers

    with Workers(1) as workers, pytest.raises(CellFailedError, match=r"^the cell cells/x failed: RuntimeError: boom \("):
        list(workers.run([(_fails_in_a_cell, ())]))


def test_a_grid_that_trained_cells_after_a_report_says_the_report_lacks_them(toy_store, tmp_path, capsys):
    """A report made while the grid ran stayed as it was once the grid finished, and the grid's last line ("`fedcache
    report DIR` makes the HTML report") did not say the one there was partial."""
    import os
    import shutil

    from fedcache.cli import main
    from fedcache.reports import write_report

    out = tmp_path / "g"
    argv = ["grid", "--store", toy_store, "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
            "--clients", "2", "--rounds", "1", "--seeds", "0,1", "--out", out]
    assert main([str(a) for a in argv]) == 0
    shutil.rmtree(next((out / "cells").glob("*seed=1")))  # as if still to train when the report was made
    write_report(out)
    os.utime(out / "report.html", (1, 1))  # made before the cell below finished, whatever the clock's resolution
    def last_line() -> str:
        capsys.readouterr()
        assert main([str(a) for a in argv]) == 0
        return " ".join(capsys.readouterr().out.split())  # the console wraps its lines

    for _ in range(2):  # trains seed 1; then nothing, the report still lacking it
        assert last_line().endswith("writes the HTML report anew (the report.html there lacks the cells trained since)")
    write_report(out)
    assert last_line().endswith("` makes the HTML report")


@pytest.mark.parametrize("flag, value", [("--seeds", "0,,1"), ("--alpha", "0.1,"), ("--method", "fedavg,,fedprox")])
def test_an_empty_value_between_a_grid_option_s_commas_is_refused(flag, value, toy_store, tmp_path, capsys):
    """`--seeds 0,,1` ran seeds 0 and 1 without a word, where `--set lr=0.1,,1` is refused: a value left out by
    mistake."""
    from tests.faults import one_error_line, run_cli

    argv = ["grid", "--store", toy_store, "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "dirichlet",
            "--clients", "2", "--rounds", "1", flag, value, "--out", tmp_path / "g"]
    code, err = run_cli(argv, capsys)
    assert code == 2 and one_error_line(err) == f"error: {flag} {value}: an empty value between commas; write v1,v2"
    assert not (tmp_path / "g").exists()
