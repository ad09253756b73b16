"""The faults of everyday machines (issue 33), through the command line as a user meets them.

- Two commands on one directory: a grid (both engines), a run, an extraction into one store. The second is
  refused with one line naming the first (pid, host) and what to do, no traceback, nothing of the first's
  touched; a command killed with ``kill -9`` leaves a lock the next command takes over (and says so), and the
  grid it finishes holds the numbers of the same grid run alone.
- A small file system (a real tmpfs where the tests run as root, else a faked full disk) under extract, store
  import, partition, train, grid and report: one line naming the path and the space it needs, no temporary
  files left, and the same command succeeds once there is space.
- Names that are paths (``..``, ``/``, a leading dot, 300 characters, ...) for store import, extract and grid:
  one line naming the option, nothing made.

The lock and the disk writes themselves are tested in tests/test_ownership.py and tests/test_disk.py; grid TOML
files in tests/grids/test_toml.py and tests/test_cli_fuzz.py.
"""
from __future__ import annotations

import csv
import logging
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from fedcache.ownership import LOCK
from tests.conftest import BACKBONE
from tests.faults import (TOY_CLI, cli_process, deny_writes_in, holder_pid, kill_all, leftovers, one_error_line, read_only,
                          run_cli, wait_until)

DATA = ["-d", "test-toy", "-b", BACKBONE]
HOST = socket.gethostname()


def _results(grid: Path) -> list[dict]:
    """A grid's results.csv without its timings (the one column two runs of one grid differ in)."""
    with open(grid / "results.csv", newline="") as fh:
        return sorted(({k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)),
                      key=lambda r: r["run_dir"])


# ---- two commands on one directory -----------------------------------------------------------------------
# Rounds enough, each slowed down, that the first command is still running when the second has started and been
# refused. Slowed: on an idle machine the first grid could otherwise write its tables and let
# go of the directory before the second had even started Python (the test then killed a grid that held nothing).
SLOW_GRID = """
import sys, time
import fedcache.federate.driver as driver
from fedcache.cli import main
close, delay = driver.close_round, float(sys.argv.pop(1))
sys.argv[0] = "fedcache"  # the holder's record names the command as the plain CLI's does
def slow(*a, **k):
    time.sleep(delay)
    return close(*a, **k)
driver.close_round = slow
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["batched", "processes"])
def test_two_grids_started_together_one_runs_and_a_killed_one_is_taken_over(engine, toy_store, tmp_path, capsys, caplog):
    out = tmp_path / "g"
    argv = ["grid", "--store", toy_store, *DATA, "-m", "fedavg,fedproto", "--partition", "iid", "--clients", "2",
            "--rounds", "150", "--engine", engine, "-o", out]
    a, b = cli_process(argv, None, SLOW_GRID, "0.05"), cli_process(argv, None, SLOW_GRID, "0.05")
    try:
        wait_until(lambda: a.poll() is not None or b.poll() is not None, 180)
        loser = a if a.poll() is not None else b
        winner = b if loser is a else a
        _, err = loser.communicate()
        assert loser.returncode == 1 and "Traceback" not in err, err
        line = one_error_line(err)
        assert line.startswith(f"error: the grid directory {out} is in use by another fedcache command: "
                               f"pid {winner.pid} on {HOST} (`fedcache grid "), line
        assert f"kill {winner.pid}" in line and "choose another --out" in line
        assert winner.poll() is None and holder_pid(out) == winner.pid, "the first grid let go before the test killed it"
    finally:
        kill_all(a), kill_all(b)  # kill -9 of the grid and its workers: its lock file stays behind
    assert holder_pid(out) == winner.pid

    with caplog.at_level(logging.WARNING):
        code, err = run_cli(argv, capsys)  # the same command again: takes the directory over, resumes, finishes
    assert code == 0, err
    assert f"was left locked by pid {winner.pid} on {HOST}" in caplog.text and "taking it over" in caplog.text
    assert not (out / LOCK).exists() and leftovers(out) == []

    alone = tmp_path / "alone"
    assert run_cli([*argv[:-1], alone], capsys)[0] == 0
    assert _results(out) == _results(alone)  # no cell holds numbers another writer mixed in


@pytest.mark.slow
def test_a_second_train_on_a_running_out_is_refused_and_a_killed_one_is_taken_over(toy_store, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    argv = ["train", "--store", toy_store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "2", "--out", out]
    first = cli_process([*argv, "--rounds", "2000"])
    try:
        wait_until(lambda: holder_pid(out) == first.pid and (out / "config.json").exists(), 120, first)
        config = (out / "config.json").read_bytes()
        for extra in ([], ["--resume"], ["--overwrite"]):  # --overwrite must not clear the running command's files
            code, err = run_cli([*argv, "--rounds", "2000", *extra], capsys)
            line = one_error_line(err)
            assert code == 1 and line.startswith(f"error: the run directory {out} is in use by another fedcache "
                                                 f"command: pid {first.pid} on {HOST}"), err
            assert f"(kill {first.pid}: finished work is kept and the same command with --resume continues it)" in line
        assert (out / "config.json").read_bytes() == config and first.poll() is None
    finally:
        kill_all(first)
    assert (out / LOCK).exists()
    with caplog.at_level(logging.WARNING):
        code, err = run_cli([*argv, "--rounds", "2", "--overwrite"], capsys)
    assert code == 0, err
    assert f"the run directory {out} was left locked by pid {first.pid}" in caplog.text
    assert (out / "summary.json").exists() and not (out / LOCK).exists() and leftovers(out) == []


# The extraction, slowed down before each entry's rows: it holds that entry's lock meanwhile.
SLOW_EXTRACT = """
import sys, time, tests.conftest
import fedcache.extract.runner as runner
from fedcache.cli import main
fill = runner._fill_chunks
def slow(*a, **k):
    print("writing", flush=True)
    time.sleep(float(sys.argv[1]))
    return fill(*a, **k)
runner._fill_chunks = slow
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_a_second_extraction_of_the_same_entries_is_refused_or_waits(toy_store, tmp_path, capsys):
    store = tmp_path / "s.zarr"
    argv = ["extract", *DATA, "--store", store, "--workers", "0"]
    first = cli_process(argv, None, SLOW_EXTRACT, "1.5")
    try:
        assert first.stdout.readline().strip() == "writing", first.stderr.read()
        code, err = run_cli(argv, capsys)
        line = one_error_line(err)
        assert code == 1 and "is being written by another process: " in line, err
        assert f"pid {first.pid} on {HOST}" in line and "--wait" in line
        code, err = run_cli([*argv, "--wait", "120"], capsys)  # queues behind it, entry by entry
        assert code == 0, err
        _, err = first.communicate(timeout=120)
        assert first.returncode == 0 and "Traceback" not in err, err
    finally:
        kill_all(first)
    assert run_cli(["store", "verify", "--store", store], capsys)[0] == 0
    from fedcache.store.feature_store import FeatureStore

    for split in ("train", "test"):  # the same features as one extraction alone
        got, want = (FeatureStore(s).read("test-toy", split, BACKBONE) for s in (store, toy_store))
        np.testing.assert_array_equal(got.features, want.features)
        np.testing.assert_array_equal(got.labels, want.labels)


# ---- a small file system ---------------------------------------------------------------------------------
def _import_file(path: Path) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, train__features=rng.normal(size=(600, 16)).astype(np.float32), train__labels=np.arange(600) % 3,
             train__domains=np.zeros(600, int))
    return path


def _commands(toy_store: Path, toy_grid: Path, tmp: Path, disk: Path) -> dict[str, tuple]:
    """command -> (its argv, what to set up on the disk first, a check once it succeeded)."""
    run = ["--partition", "iid", "--clients", "2", "--rounds", "3"]

    def copy_store():
        shutil.copytree(toy_store, disk / "s.zarr")

    return {
        "extract": (["extract", *DATA, "--store", disk / "s.zarr", "--workers", "0"], None,
                    ["store", "verify", "--store", disk / "s.zarr"]),
        "store import": (["store", "import", _import_file(tmp / "mine.npz"), "-d", "mine", "-b", "enc", "--store",
                          disk / "s.zarr"], None, ["store", "verify", "--store", disk / "s.zarr"]),
        "partition": (["partition", "--store", disk / "s.zarr", *DATA, "--partition", "dirichlet", "--clients", "4",
                       "--alpha", "0.7", "--seed", "9"], copy_store, ["store", "verify", "--store", disk / "s.zarr"]),
        "train": (["train", "--store", toy_store, *DATA, "-m", "fedavg", *run, "--out", disk / "run"], None,
                  ["report", disk / "run", "-o", tmp / "report"]),
        "grid": (["grid", "--store", toy_store, *DATA, "-m", "fedavg,fedproto", *run, "-o", disk / "g"], None,
                 ["report", disk / "g", "-o", tmp / "report"]),
        "grid processes": (["grid", "--store", toy_store, *DATA, "-m", "fedavg,fedproto", *run, "--engine", "processes",
                            "-o", disk / "g"], None, ["report", disk / "g", "-o", tmp / "report"]),
        "report": (["report", toy_grid, "-o", disk / "report"], None, None),
    }


# Free bytes to leave: none (the first file), and some (a few files written, then one that does not fit), on the
# tmpfs and on the faked disk (which counts the bytes written, not the blocks they take: about half of each command's).
LEAVE = {"extract": (60_000, 9_000), "store import": (30_000, 20_000), "partition": (30_000, 30_000), "train": (10_000, 6_000),
         "grid": (20_000, 300_000), "grid processes": (100_000, 0), "report": (40_000, 100_000)}


@pytest.mark.parametrize("leave", ["none", "some"])
@pytest.mark.parametrize("command", sorted(LEAVE))
def test_a_full_disk_is_one_line_and_the_same_command_then_succeeds(command, leave, tight_disk, toy_store, toy_grid,
                                                                     tmp_path, capsys):
    if command == "grid processes" and not tight_disk.real:
        pytest.skip("the cells run in worker processes, which the faked disk (this process's) does not reach")
    argv, setup, after = _commands(toy_store, toy_grid, tmp_path, tight_disk.path)[command]
    if setup:
        setup()
    tight_disk.leave(0 if leave == "none" else LEAVE[command][not tight_disk.real])
    code, err = run_cli(argv, capsys)
    line = one_error_line(err)
    assert code == 1 and line.startswith("error: no space left on the disk for "), err
    assert f" {tight_disk.path}/" in line and ("it needs" in line or "quota" in line), line
    assert "free some space" in line, line
    assert ".partial" not in line and ".tmp" not in line, line  # a staging file, gone by now, is not what to look for
    assert command != "report" or "the last report there (if any) is kept" in line, line
    assert command == "train" or "--resume" not in line, line  # only train has --resume
    assert "grid" not in line or command.startswith("grid"), line  # a run's advice is of the run, not of grids
    assert leftovers(tight_disk.path) == []
    tight_disk.free_up()
    # The same command (a run stopped after a checkpoint continues from it, as the line says)
    code, err = run_cli(argv + (["--resume"] if command == "train" and "--resume" in line else []), capsys)
    assert code == 0, err
    if after:  # what it wrote reads back whole
        assert run_cli(after, capsys)[0] == 0


# Free bytes to leave for `fedcache shard` (real tmpfs, faked disk): a shard's Zarr metadata (no file named by Zarr),
# an entry of the first client, the partition record of the second client.
SHARD_LEAVE = {"metadata": (16_384, None), "entry": (65_536, 20_000), "partition": (300_000, 60_000)}


@pytest.mark.parametrize("where", sorted(SHARD_LEAVE))
def test_a_full_disk_while_sharding_is_one_line_of_out_and_the_same_command_then_succeeds(where, tight_disk, toy_store,
                                                                                          capsys):
    """The shards are written in OUT/.partial, removed when the disk fills: the line named a file in that folder
    (gone by then), some lines advised that "the chunks written so far are kept" (nothing is), and Zarr's metadata
    write was "no space left on the disk ([Errno 28] No space left on device)", naming nothing."""
    leave = SHARD_LEAVE[where][not tight_disk.real]
    if leave is None:
        pytest.skip("the faked disk does not reach Zarr's own writes: the next test fakes that one")
    out = tight_disk.path / "sh"
    argv = ["shard", "--store", toy_store, *DATA, "--partition", "iid", "--clients", "2", "-o", out]
    tight_disk.leave(leave)
    code, err = run_cli(argv, capsys)
    line = one_error_line(err)
    assert code == 1 and line.startswith("error: no space left on the disk for "), err
    assert f" {out}/" in line or f" {out}:" in line, line
    assert ".partial" not in line and "kept" not in line and line.endswith("which shards again from the start"), line
    assert not out.exists() or list(out.iterdir()) == []
    tight_disk.free_up()
    code, err = run_cli(argv, capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["client-000", "client-001", "server"]


def test_a_full_disk_in_a_shard_s_zarr_metadata_is_one_line_naming_out(toy_store, tmp_path, capsys, monkeypatch):
    """Zarr writes a shard's attributes itself, and its OSError names no file."""
    import errno

    import fedcache.flower.shard as shard

    made = shard._new_store

    def full_at_the_second(path, info):
        if info.client == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return made(path, info)

    monkeypatch.setattr(shard, "_new_store", full_at_the_second)
    out = tmp_path / "sh"
    argv = ["shard", "--store", toy_store, *DATA, "--partition", "iid", "--clients", "2", "-o", out]
    code, err = run_cli(argv, capsys)
    line = one_error_line(err)
    assert code == 1 and line.startswith(f"error: no space left on the disk for the shards in {out}: "), line
    assert line.endswith("which shards again from the start") and not out.exists()
    monkeypatch.setattr(shard, "_new_store", made)
    assert run_cli(argv, capsys)[0] == 0


def test_a_file_size_limit_is_one_line_and_the_same_command_then_succeeds(toy_store, tmp_path, capsys):
    """EFBIG (FAT32's 4 GB, `ulimit -f`) on a run's first checkpoint: one line, and no run left behind that neither a
    re-run nor --resume would take (as a full disk leaves none)."""
    import resource
    import subprocess
    import sys

    argv = ["train", "--store", toy_store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "2", "--rounds", "3"]
    assert run_cli(argv + ["--out", tmp_path / "first"], capsys)[0] == 0  # its partition stored, its file sizes known
    size = {f.name: f.stat().st_size for f in (tmp_path / "first").iterdir()}
    limit = (size["config.json"] + size["checkpoint.pt"]) // 2
    assert size["config.json"] < limit < size["checkpoint.pt"]
    limited = subprocess.run(
        [sys.executable, "-c", TOY_CLI, *map(str, argv + ["--out", tmp_path / "run"])], capture_output=True, text=True,
        cwd=Path(__file__).resolve().parents[1], preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    line = one_error_line(limited.stderr)
    assert limited.returncode == 1 and "Traceback" not in limited.stderr, limited.stderr
    assert line.startswith(f"error: cannot write the checkpoint {tmp_path}/run/checkpoint.pt: it is larger than the "
                           "largest file allowed there"), line
    assert "free some space" not in line and "or raise `ulimit -f`" in line, line
    assert leftovers(tmp_path / "run") == []
    code, err = run_cli(argv + ["--out", tmp_path / "run"] + (["--resume"] if "--resume" in line else []), capsys)
    assert code == 0, err


# ---- names that are paths ------------------------------------------------------------------------------------
HOSTILE = {"..": "directories, not names", ".": "directories, not names", "/": "path separator",
           "a/b": "path separator", "../x": "path separator", "a\\b": "path separator", ".hidden": "hidden",
           "x" * 300: "at most 255", "é" * 130: "at most 255", "": "empty", " a": "space", "a\nb": "control character",
           "a,b": "comma", "__x": "Zarr keeps"}


@pytest.mark.parametrize("name", list(HOSTILE), ids=[repr(n)[:24] for n in HOSTILE])
def test_a_name_that_is_a_path_is_refused_where_it_enters(name, toy_store, tmp_path, capsys):
    why = HOSTILE[name]
    store = tmp_path / "s.zarr"
    src = _import_file(tmp_path / "f.npz")
    for option, argv in (("--dataset", ["store", "import", src, "-d", name, "-b", "enc", "--store", store]),
                         ("--backbone", ["store", "import", src, "-d", "mine", "-b", name, "--store", store]),
                         ("--name", ["extract", *DATA, "--name", name, "--store", store, "--workers", "0"])):
        code, err = run_cli(argv, capsys)
        line = one_error_line(err)
        if name == "":  # the command line refuses an empty argument before an option reads it
            option, why = f"an empty argument after {argv[argv.index(name) - 1]}", "unset shell variable"
        assert code in (1, 2) and option in line and why in line, (argv, err)
        assert not store.exists(), argv  # nothing made
    grids = [("--dataset (data.dataset)", why, ["-d", name, "-b", BACKBONE])] if name else \
        [("an empty argument after -d", "", ["-d", name, "-b", BACKBONE])]
    if name.strip() == name and "," not in name and name:  # a list is split at commas, each name stripped
        grids.append(("--backbones (data.backbones)", why, ["-d", "test-toy", "-b", name]))
    for option, said, data in grids:
        out = tmp_path / "g"
        code, err = run_cli(["grid", "--store", toy_store, *data, "-m", "fedavg", "--rounds", "1", "-o", out], capsys)
        line = one_error_line(err)
        assert code in (1, 2) and option in line and said in line, err
        assert not out.exists() or sorted(p.name for p in out.iterdir()) == ["grid.json"]


def test_a_backbone_name_that_is_a_path_makes_no_store(tmp_path, capsys):
    for name in ("..", "../x", "/"):
        code, err = run_cli(["extract", "-d", "test-toy", "-b", name, "--store", tmp_path / "s.zarr"], capsys)
        assert code in (1, 2) and "backbone" in one_error_line(err).lower(), err
        assert not (tmp_path / "s.zarr").exists()


def test_a_grid_cell_s_folder_name_fits_a_file_system_and_stays_its_own():
    from fedcache.grids.spec import CELL_NAME_MAX, Cell

    long = "x" * 300
    cells = [Cell("fedavg", 0, (("set.note", long + end),)) for end in ("a", "b")] + \
            [Cell("fedavg", 0, (("set.note", "../../etc"),)), Cell("fedavg", 0, (("set.note", "/"),))]
    names = [c.name for c in cells]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name) <= CELL_NAME_MAX and "/" not in name and name not in (".", "..") and not name.startswith(".")
    assert names[0].startswith("fedavg__set.note=xxx")


def test_a_torn_file_of_a_run_or_a_grid_cell_is_one_line_naming_it(toy_store, tmp_path, capsys):
    """An older fedcache wrote summary.json and config.json in place, and a user may edit them: a re-run that read
    a torn one stopped with a JSONDecodeError traceback; it is one line naming the file and how to go on."""
    grid = ["grid", "--store", toy_store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "2", "--rounds", "1", "--set", "lr=0.1,0.01", "-o", tmp_path / "g"]
    assert run_cli(grid, capsys)[0] == 0
    summary = next((tmp_path / "g" / "cells").glob("*lr=0.1*")) / "summary.json"
    summary.write_text(summary.read_text()[:20])
    code, err = run_cli(grid, capsys)
    line = one_error_line(err)
    assert code == 1 and f"{summary} is damaged (not JSON" in line and "delete the cell's folder" in line, line
    shutil.rmtree(summary.parent)
    assert run_cli(grid, capsys)[0] == 0  # as the line says: that cell trains again
    # A finished cell's config.json and cell.json, which the report reads: the grid said "nothing to train".
    for record in ("config.json", "cell.json"):
        path = summary.parent / record
        kept = path.read_text()
        path.write_text("xx" if record == "config.json" else "")
        code, err = run_cli(grid, capsys)
        line = one_error_line(err)
        assert code == 1 and f"{path} is damaged (not JSON" in line and "delete the cell's folder" in line, line
        path.write_text(kept)
    for name, advice in (("grid.json", "delete it, and the grid takes the options it is given now"),
                         ("features/meta.json", "delete the folder")):
        path = tmp_path / "g" / name
        kept = path.read_text()
        path.write_text(kept[:15])
        code, err = run_cli(grid, capsys)
        line = one_error_line(err)
        assert code == 1 and f"{path} is damaged (not JSON" in line and advice in line, line
        path.write_text(kept)
    train = ["train", "--store", toy_store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "2", "--rounds", "1", "-o", tmp_path / "r"]
    assert run_cli(train, capsys)[0] == 0
    (tmp_path / "r" / "config.json").write_text("{")
    code, err = run_cli(train + ["--resume"], capsys)
    line = one_error_line(err)
    assert code == 1 and "config.json is damaged (not JSON" in line and f"delete the folder {tmp_path / 'r'}" in line, line


def test_a_torn_diverged_json_of_a_tested_cell_is_one_line_naming_it(toy_store, tmp_path, capsys):
    """A --select grid's test stage names the chosen value that diverged by its diverged.json's error: a torn one
    stopped the grid with a JSONDecodeError traceback."""
    out = tmp_path / "g"
    grid = ["grid", "--store", toy_store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "2", "--rounds", "1",
            "--subsample", "0.5", "--set", "lr=0.1,0.01", "--select", "lr", "-o", out]
    assert run_cli(grid, capsys)[0] == 0
    cell = next((out / "test" / "cells").iterdir())
    (cell / "diverged.json").write_text('{"error": "lo')  # a re-run reads the cell as diverged, and its error
    code, err = run_cli(grid, capsys)
    line = one_error_line(err)
    assert code == 1 and f"{cell / 'diverged.json'} is damaged (not JSON" in line, line
    assert f"delete the cell's folder {cell}" in line, line
    shutil.rmtree(cell)
    assert run_cli(grid, capsys)[0] == 0  # as the line says: that cell is tested again


@pytest.mark.parametrize("spec", [["data"], {"data": 3}], ids=["spec a list", "a section a number"])
def test_a_hand_edited_config_json_spec_is_one_line_in_the_report(spec, toy_store, tmp_path, capsys):
    """The report reads a run's options from config.json's spec (Run.option): a spec that is not an object of
    objects stopped it with an AttributeError traceback ('list' object has no attribute 'get')."""
    import json

    run = tmp_path / "r"
    train = ["train", "--store", toy_store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "2", "--rounds", "1",
             "-o", run]
    assert run_cli(train, capsys)[0] == 0
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "spec": spec}))
    code, err = run_cli(["report", run, "-o", tmp_path / "rep"], capsys)
    line = one_error_line(err)
    assert code == 1 and f"{run / 'config.json'} is damaged (its \"spec\"" in line and f"delete the folder {run}" in line, line
    assert not (tmp_path / "rep" / "report.html").exists()


# ---- permission denied -------------------------------------------------------------------------------------
def test_a_report_of_a_read_only_directory_says_to_give_out(toy_grid, tmp_path, capsys, monkeypatch):
    """A colleague's grid, read-only to this user: the report reads it and writes where --out says. Without --out
    the line named "the run directory (or give --out)" as if it were an option."""
    import os

    from tests.test_paths import deny_writes_below

    theirs = tmp_path / "theirs"
    shutil.copytree(toy_grid, theirs)
    before = sorted(p.relative_to(theirs) for p in theirs.rglob("*"))
    theirs.chmod(0o555)
    try:
        if os.access(theirs, os.W_OK):  # root writes anywhere: the check is what os.access answers for a user
            deny_writes_below(monkeypatch, theirs)
        code, err = run_cli(["report", theirs], capsys)
        assert code == 2 and one_error_line(err) == (
            f"error: cannot write the report into {theirs}: no permission to write in {theirs}; its runs are only "
            "read, so give --out DIR, a directory you can write to, for the report"), err
        code, err = run_cli(["report", theirs, "-o", tmp_path / "mine"], capsys)
        assert code == 0 and (tmp_path / "mine" / "report.html").exists(), err
    finally:
        theirs.chmod(0o755)
    assert sorted(p.relative_to(theirs) for p in theirs.rglob("*")) == before  # no .report.lock, no figures


def test_a_read_only_store_is_read_and_a_write_into_it_is_one_line(toy_store, tmp_path, capsys, monkeypatch):
    """A store another user made (read-only to this one): a run reads it as it is, and an extraction that has
    something to write said "Permission denied: .../.locks/<entry>.create.lock (FEDCACHE_DEBUG=1 shows where it
    happened)", naming neither the store nor what to do."""
    store = tmp_path / "theirs.zarr"
    shutil.copytree(toy_store, store)
    part = ["--partition", "iid", "--clients", "2"]
    assert run_cli(["partition", "--store", store, *DATA, *part], capsys)[0] == 0  # its owner made the partition
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    read_only(store)
    try:
        deny_writes_in(monkeypatch, store)
        code, err = run_cli(["train", "--store", store, *DATA, "-m", "fedavg", *part, "--rounds", "1",
                             "-o", tmp_path / "run"], capsys)
        assert code == 0, err
        code, err = run_cli(["extract", *DATA, "--store", store, "--workers", "0", "--name", "mine"], capsys)
        line = one_error_line(err)
        assert code == 1 and line.startswith(f"error: cannot write in the feature store {store} (no permission to "
                                             f"write {store}/.locks/"), line
        assert line.endswith("use a store you can write to (--store, or FEDCACHE_STORE), or have its owner run this "
                             "command; reading a complete store needs no write permission"), line
    finally:
        for p in [store, *store.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_a_new_partition_in_a_store_on_a_read_only_mount_says_how_to_make_it(toy_store, tmp_path, capsys, monkeypatch):
    """A read-only mount refuses with EROFS, which is no PermissionError: the partition's own advice (have its owner
    make it once) was skipped for the store-wide one, "reading a complete store needs no write permission". (Not in
    the test above, whose listing of the store raced Zarr's clean-up of the refused write's staging file.)"""
    import errno

    store = tmp_path / "mounted.zarr"
    shutil.copytree(toy_store, store)
    deny_writes_in(monkeypatch, store, errno.EROFS)
    code, err = run_cli(["train", "--store", store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "3",
                         "--seed", "9872", "--rounds", "1"], capsys)  # a seed no other test stored a partition of
    line = one_error_line(err)
    assert code == 1 and line.startswith("error: cannot store the new partition ") and "Read-only file system" in line
    assert line.endswith("have its owner make the partition once (`fedcache partition` with this run's partition "
                         "options and seed)"), line


def test_a_new_store_in_a_read_only_folder_is_one_line_saying_so(tmp_path, capsys, monkeypatch):
    """It said "... is not a fedcache feature store: [Errno 13] Permission denied", as if a store were there."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        deny_writes_in(monkeypatch, ro)
        code, err = run_cli(["extract", *DATA, "--store", ro / "s.zarr", "--workers", "0"], capsys)
    finally:
        ro.chmod(0o755)
    line = one_error_line(err)  # said before any work where the folder's mode says so; as root, by making it
    assert code == 1 and line.startswith(f"error: cannot make the feature store {ro / 's.zarr'} (no permission to write "), err
    assert line.endswith("); give a --store (or FEDCACHE_STORE) in a folder you can write to"), err
    assert list(ro.iterdir()) == []


# Root reads every file; without the two capabilities that let it (setpriv, util-linux) it is refused as a user is.
AS_A_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def _as_a_user(argv: list[str], script: str | None = None) -> tuple[int, str, str]:
    """(exit code, stderr, stdout) of ``fedcache argv`` (or ``script``, ``TOY_CLI`` say) in a process of its own that
    file permissions bind, also as root."""
    import os
    import subprocess
    import sys

    from tests.faults import ROOT

    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("root reads every file, and there is no setpriv here to drop that")
    prefix = AS_A_USER if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDCACHE_DEBUG": "", "COLUMNS": "1000"}  # a line per entry
    head = ["-c", script] if script else ["-m", "fedcache.cli"]
    done = subprocess.run([*prefix, sys.executable, *head, *map(str, argv)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    return done.returncode, done.stderr, done.stdout


def test_a_store_group_this_user_cannot_read_is_not_called_damaged(toy_store, tmp_path):
    """Another user's store made under a strict umask: its entries group unreadable here was "damaged: delete
    .../entries/zarr.json and fedcache writes it again", advice that would lose that user's store."""
    store = tmp_path / "theirs.zarr"
    shutil.copytree(toy_store, store)
    (store / "entries" / "zarr.json").chmod(0)
    try:
        code, err, _ = _as_a_user(["store", "ls", "--store", store])
    finally:
        (store / "entries" / "zarr.json").chmod(0o644)
    line = one_error_line(err)
    assert code == 1 and line.startswith(f"error: cannot read the feature store {store} (no permission to read "), line
    assert "damaged" not in line and "delete" not in line, line


def _restore(path: Path) -> None:
    path.chmod(0o755 if path.is_dir() else 0o644)


# One case in make test, the others (over 20 s each on a 2-core machine) in make test-slow.
@pytest.mark.parametrize("refused", ["a chunk file", pytest.param("an array's zarr.json", marks=pytest.mark.slow),
                                     pytest.param("the entry's folder", marks=pytest.mark.slow)])
def test_an_entry_this_user_cannot_read_is_named_so_not_damaged(refused, toy_store, tmp_path):
    """Another user's entry (made under a strict umask, or chmod-ed) unreadable here: a run said it was "damaged
    ... Re-create it ... or remove it with `fedcache store rm`", and `store verify --repair` removed it."""
    from fedcache.store.feature_store import FeatureStore

    store = tmp_path / "theirs.zarr"
    shutil.copytree(toy_store, store)
    entry = next(e for e in FeatureStore(store).entries() if e.key["split"] == "train")
    folder = store / "entries" / entry.entry_id
    target = {"a chunk file": folder / "features" / "c" / "0" / "0", "an array's zarr.json": folder / "labels" / "zarr.json",
              "the entry's folder": folder}[refused]
    target.chmod(0)
    try:
        code, err, _ = _as_a_user(["train", "--store", store, *DATA, "-m", "fedavg", "--partition", "iid", "--clients", "2",
                                   "--rounds", "1", "-o", tmp_path / "run"])
        extracted, extract_err, _ = _as_a_user(["extract", *DATA, "--store", store, "--workers", "0"], TOY_CLI)
        checked, summary, listed = _as_a_user(["store", "verify", "--repair", "--store", store])
    finally:
        _restore(target)
    import pwd

    file = target if target.is_file() else folder / "zarr.json"
    # Its folder unreadable, what it holds is unknown: it was labelled "key unreadable"; now whose it is, who can help.
    label = f"(data unknown, owned by {pwd.getpwuid(folder.stat().st_uid).pw_name})" if target == folder else ""
    for code, err in ((code, err), (extracted, extract_err)):  # extract said "already complete", or replaced it
        line = one_error_line(err)
        assert code == 1 and line.startswith(f"error: cannot read the feature store {store} (entry {entry.entry_id} {label}"), line
        assert line.endswith(f": no permission to read {file}); have its owner make it readable (chmod -R a+rX)"), line
    assert checked == 1 and f"{entry.entry_id} " in listed and f": unreadable (no permission to read {file})" in listed
    assert label.strip("()") in listed and "key unreadable" not in listed + err, listed
    assert "1 entry not readable by this user" in summary and "damaged" not in listed + summary, listed + summary
    assert FeatureStore(store).verify(FeatureStore(store).info(entry.entry_id))[0] == "ok"  # --repair left it


def test_a_format_1_chunk_this_user_cannot_read_is_named_so(tmp_path):
    """Zarr reads a format-1 entry's chunks: one unreadable here was "damaged (cannot be decoded (PermissionError"."""
    from tests.store.test_store_format import EXTRACTED, V1

    store = tmp_path / "old.zarr"
    shutil.copytree(V1, store)
    chunk = store / "entries" / EXTRACTED / "features" / "c" / "1" / "0"
    chunk.chmod(0)
    try:
        code, summary, listed = _as_a_user(["store", "verify", "--store", store])
    finally:
        _restore(chunk)
    assert code == 1 and f"{EXTRACTED} extracted/train/all tiny: unreadable (no permission to read {chunk})" in listed, listed
    assert "damaged" not in listed + summary, listed + summary


# What a method that uses class-text embeddings reads (fedcache/federate/text.py), its error said as the CLI does.
READ_TEXT = ("import sys, tests.conftest\nfrom fedcache.store.feature_store import FeatureStore\ntry:\n"
             "    FeatureStore(sys.argv[1], create=False).read_text(sys.argv[2], tests.conftest.TOY_CLASSES)\n"
             "except Exception as exc:\n    sys.exit(f'error: {type(exc).__name__}: {exc}')\n")


# One case in make test, the other (over 20 s on a 2-core machine) in make test-slow.
@pytest.mark.parametrize("refused", [pytest.param("its embeddings' chunk", marks=pytest.mark.slow),
                                     pytest.param("its zarr.json", marks=pytest.mark.slow)])
def test_text_embeddings_this_user_cannot_read_are_named_so_not_damaged(refused, tmp_path):
    """A CLIP backbone's class-text embeddings unreadable here: `store verify` called them damaged and --repair removed
    them, an extraction wrote over them, a read said they were damaged (or, their zarr.json refused, never extracted)."""
    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.store.feature_store import TEXT, FeatureStore

    store, clip = tmp_path / "theirs.zarr", "tiny-clip-random"
    extract(ExtractConfig(dataset="test-toy", backbones=[clip], store=store, splits=("test",), domains=["light"], workers=0))
    eid = next(e for e, a in FeatureStore(store).text_entries() if a["key"]["template_set"] == "single")  # READ_TEXT's
    folder = store / TEXT / eid
    target = {"its embeddings' chunk": folder / "embeddings" / "c" / "0" / "0" / "0", "its zarr.json": folder / "zarr.json"}[refused]
    before = target.read_bytes()
    target.chmod(0)
    try:
        read, read_err, _ = _as_a_user([store, clip], READ_TEXT)
        extracted, extract_err, _ = _as_a_user(["extract", "-d", "test-toy", "-b", clip, "--splits", "test", "--domains",
                                                "light", "--store", store, "--workers", "0"], TOY_CLI)
        checked, summary, listed = _as_a_user(["store", "verify", "--repair", "--store", store])
    finally:
        _restore(target)
    what = {"its embeddings' chunk": f"{clip} text embeddings, single templates",
            "its zarr.json": "text embeddings, backbone unknown"}[refused]
    assert read == 1 and one_error_line(read_err) == (
        f"error: UnreadableEntryError: cannot read the feature store {store} (text entry {eid} ({what}): no permission "
        f"to read {target}); have its owner make it readable (chmod -R a+rX)"), read_err
    line = one_error_line(extract_err)
    assert extracted == 1 and line == f"error: cannot read the feature store {store} (text entry {eid} ({what}): no " \
                                      f"permission to read {target}); have its owner make it readable (chmod -R a+rX)", line
    assert checked == 1 and f"{eid} {what}: unreadable (no permission to read {target})" in listed, listed
    assert "1 entry not readable by this user" in summary and "damaged" not in listed + summary, listed + summary
    assert target.read_bytes() == before and FeatureStore(store).verify_text(eid) == ("ok", "")  # left as it was


@pytest.fixture(scope="module")
def two_backbones(tmp_path_factory) -> Path:
    """A store of a backbone with a text tower and one without."""
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("two") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE, "tiny-clip-random"], store=path, workers=0))
    return path


def _clip_text(store: Path, template_set: str = "single") -> tuple[str, Path]:
    from fedcache.store.feature_store import TEXT, FeatureStore

    eid = next(e for e, a in FeatureStore(store).text_entries() if a["key"]["template_set"] == template_set)
    return eid, store / TEXT / eid


@pytest.mark.parametrize("fault", ["unreadable", pytest.param("damaged", marks=pytest.mark.slow)])
def test_sharding_names_the_backbone_whose_text_embeddings_it_cannot_read(fault, two_backbones, tmp_path):
    """`fedcache shard` copied class-text embeddings unchecked (damaged ones into every shard) and, refused one, said
    only "cannot read the feature store ... (no permission to read FILE)", not what that file is."""
    store = tmp_path / "theirs.zarr"
    shutil.copytree(two_backbones, store)
    eid, folder = _clip_text(store)
    chunk = folder / "embeddings" / "c" / "0" / "0" / "0"
    if fault == "damaged":
        chunk.write_bytes(chunk.read_bytes()[:-4] + b"\xff\xff\xff\xff")
    chunk.chmod(0 if fault == "unreadable" else 0o644)
    try:
        code, err, _ = _as_a_user(["shard", "--store", store, "-d", "test-toy", "-b", "tiny-clip-random", "--partition",
                                   "iid", "--clients", "2", "--out", tmp_path / "shards"], TOY_CLI)
    finally:
        _restore(chunk)
    line = one_error_line(err)
    assert code == 1 and f"text entry {eid} (tiny-clip-random text embeddings, single templates)" in line, line
    assert ("no permission to read" if fault == "unreadable" else "is damaged") in line, line


# Over 20 s on a 2-core machine: in make test-slow (CI runs both), so that make test stays under 10 minutes.
@pytest.mark.slow
def test_another_backbones_unreadable_text_entry_is_not_what_a_run_lacks(two_backbones, tmp_path):
    """A CLIP backbone's text entry this user may not read (its key unknown): every run on the other backbone, even
    fedavg, stopped on it, and a method that needs text was told about it instead of that its backbone has none."""
    store = tmp_path / "theirs.zarr"
    shutil.copytree(two_backbones, store)
    _, folder = _clip_text(store)
    (folder / "zarr.json").chmod(0)
    run = ["train", "--store", store, "-d", "test-toy", "--partition", "iid", "--clients", "2", "--rounds", "1"]
    try:
        plain = _as_a_user([*run, "-b", BACKBONE, "-m", "fedavg"], TOY_CLI)
        texts = _as_a_user([*run, "-b", BACKBONE, "-m", "clip-zs"], TOY_CLI)
        sharded = _as_a_user(["shard", "--store", store, "-d", "test-toy", "-b", BACKBONE, "--partition", "iid",
                              "--clients", "2", "--out", tmp_path / "shards"], TOY_CLI)
        its_own = _as_a_user([*run, "-b", "tiny-clip-random", "-m", "clip-zs"], TOY_CLI)  # it may be this one's
    finally:
        _restore(folder / "zarr.json")
    assert plain[0] == 0 and sharded[0] == 0, plain[1] + sharded[1]
    line = one_error_line(texts[1])
    assert texts[0] == 2 and line.startswith("error: clip-zs needs a backbone with a text tower") and "extract" in line, line
    line = one_error_line(its_own[1])
    assert its_own[0] == 1 and "(text embeddings, backbone unknown): no permission to read" in line, line


@pytest.mark.parametrize("refused", ["zarr.json", "a chunk file"])
def test_a_partial_entry_whose_done_flags_this_user_cannot_read_is_named_so(refused, tmp_path):
    """An unfinished entry of another user's store, its done flags unreadable here: `store ls` said "damaged" (and
    `store verify` "partial", as if nothing were wrong)."""
    from tests.store.test_store_format import PARTIAL, V1

    store = tmp_path / "old.zarr"
    shutil.copytree(V1, store)
    target = store / "entries" / PARTIAL / "done" / {"zarr.json": "zarr.json", "a chunk file": "c/0"}[refused]
    target.chmod(0)
    try:
        code, _, listed = _as_a_user(["store", "ls", "--store", store])
        checked, summary, verified = _as_a_user(["store", "verify", "--store", store])
    finally:
        _restore(target)
    row = next(line.strip() for line in listed.splitlines() if line.strip().startswith(PARTIAL))
    assert code == 0 and row.endswith("unreadable (see `store verify`)"), listed
    assert checked == 1 and f"{PARTIAL} extracted/test/all tiny: unreadable (no permission to read {target})" in verified
    assert "1 entry not readable by this user" in summary and "damaged" not in listed + verified + summary, verified


def test_the_faked_refusals_and_full_disk_see_a_path_opened_relative_to_a_folder(tmp_path, monkeypatch, fake_disk):
    """``os.open(name, ..., dir_fd=fd)`` opens ``name`` in the folder ``fd`` is open on (shutil.rmtree opens so):
    ``deny_writes_in`` and the faked full disk took ``name`` relative to the working directory, so a write there
    was let through, and one in the working directory refused in its stead."""
    import errno
    import os

    denied, full = tmp_path / "denied", tmp_path / "full"
    denied.mkdir(), full.mkdir()
    monkeypatch.chdir(tmp_path)
    deny_writes_in(monkeypatch, denied)
    fake_disk(full, 0)
    at = os.open(denied, os.O_RDONLY)
    try:
        with pytest.raises(PermissionError):
            os.open("made", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=at)
        with pytest.raises(PermissionError):
            os.mkdir("made", dir_fd=at)
    finally:
        os.close(at)
    at = os.open(full, os.O_RDONLY)
    try:
        fd = os.open("file", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=at)
    finally:
        os.close(at)
    try:
        with pytest.raises(OSError) as exc:
            os.write(fd, b"x")
        assert exc.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.close(os.open(tmp_path / "denied-not", os.O_WRONLY | os.O_CREAT, 0o644))  # outside: written
