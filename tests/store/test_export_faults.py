"""`store export` when its write fails (a full disk, a file-size limit): one error line, exit code 1, no part of a
file left, an older file of that name as it was; and the space it checks for first is about the file's size.

HDF5 2.0 segfaulted the process once one of its writes had failed (after the error line), so the failures run in
a process of their own here: a crash is a return code, not a lost test session."""
from __future__ import annotations

import os
import re
import resource
import subprocess
import sys

import numpy as np
import pytest

from fedcache import disk
from fedcache.store.feature_store import FeatureStore
from fedcache.store.interchange import import_file
from tests.faults import ROOT, leftovers, one_error_line, run_cli

ROWS, DIM = 3000, 128
OLD = b"an older export, to be kept"
# The CLI, with the check of the free space before writing turned off: as if another process took the space
# after it (a full disk mid-export).
UNCHECKED_CLI = ("import sys\nimport fedcache.disk\nfedcache.disk.check_space = lambda *a, **k: None\n"
                 "from fedcache.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def _store(tmp_path, zeros: float = 0.0):
    """A store of one imported dataset (train and test), its features ``zeros`` exact zeros (a ReLU's are most)."""
    rng = np.random.default_rng(0)
    split = {}
    for name in ("train", "test"):
        features = rng.normal(size=(ROWS, DIM)).astype(np.float32)
        features[rng.random(features.shape) < zeros] = 0
        split |= {f"{name}__features": features, f"{name}__labels": rng.integers(0, 5, ROWS)}
    np.savez(tmp_path / "feats.npz", **split)
    store = tmp_path / "store.zarr"
    import_file(FeatureStore(store), tmp_path / "feats.npz", "mine", "enc")
    return store


def _export(store, out, *head: str, **run) -> subprocess.CompletedProcess:
    argv = ["store", "export", "-d", "mine", "-b", "enc", "--store", str(store), "-o", str(out), "--overwrite"]
    return subprocess.run([sys.executable, *(head or ["-m", "fedcache.cli"]), *argv], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), FEDCACHE_DEBUG=""), timeout=120, **run)


def _refused_cleanly(done: subprocess.CompletedProcess, out) -> str:
    """The error line of an export that failed as it should (no crash, nothing of it left, the old file kept)."""
    assert done.returncode == 1, (done.returncode, done.stderr)  # -11: the segfault
    assert "Traceback" not in done.stderr and "Driver write request failed" not in done.stderr, done.stderr
    assert leftovers(out.parent) == [] and out.read_bytes() == OLD
    line = one_error_line(done.stderr)
    assert str(out) in line, line
    return line


@pytest.mark.parametrize("fmt", ["h5", "npz"])
def test_an_export_past_the_file_size_limit_is_one_line(tmp_path, fmt):
    store, out = _store(tmp_path), tmp_path / "out" / f"feats.{fmt}"
    out.parent.mkdir()
    out.write_bytes(OLD)
    limit = 256 << 10  # `ulimit -f`: the file takes about 3 MB
    done = _export(store, out, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert "ulimit -f" in _refused_cleanly(done, out)


@pytest.mark.parametrize("fmt", ["h5", "npz"])
def test_an_export_onto_a_disk_that_fills_as_it_writes_is_one_line(tmp_path, small_disk, fmt):
    store, out = _store(tmp_path), small_disk("1m") / f"feats.{fmt}"
    out.write_bytes(OLD)
    line = _refused_cleanly(_export(store, out, "-c", UNCHECKED_CLI), out)
    assert "no space left on the disk for the export" in line, line


def test_an_h5_export_that_finds_the_disk_full_leaves_nothing_and_runs_once_there_is_room(tmp_path, fake_disk, capsys,
                                                                                         monkeypatch):
    """The same in this process, on the faked full disk (any machine): its writes go through os.write."""
    store, where = _store(tmp_path), tmp_path / "disk"
    where.mkdir()
    out = where / "feats.h5"
    out.write_bytes(OLD)
    full = fake_disk(where, 200 << 10)
    monkeypatch.setattr(disk, "check_space", lambda *a, **k: None)  # the space went after the check
    argv = ["store", "export", "-d", "mine", "-b", "enc", "--store", store, "-o", out, "--overwrite"]
    code, err = run_cli(argv, capsys)
    assert code == 1 and "no space left on the disk for the export" in one_error_line(err), err
    assert leftovers(where) == [] and out.read_bytes() == OLD
    full.free = 1 << 40
    assert run_cli(argv, capsys)[0] == 0
    assert FeatureStore(store).read("mine", "train", "enc").features.shape == (ROWS, DIM)


@pytest.mark.parametrize("zeros", [0.72, 0.0], ids=["relu", "dense"])
@pytest.mark.parametrize("fmt", ["h5", "npz"])
def test_the_space_an_export_checks_for_is_about_the_size_of_its_file(tmp_path, fake_disk, capsys, fmt, zeros):
    """efficientnet-lite0's features are 72% zeros: taken as incompressible, an export needing 13 MB was refused
    as needing 61 MB."""
    store = _store(tmp_path, zeros)
    argv = ["store", "export", "-d", "mine", "-b", "enc", "--store", store, "-o"]
    assert run_cli([*argv, tmp_path / f"free.{fmt}"], capsys)[0] == 0
    size = (tmp_path / f"free.{fmt}").stat().st_size
    room = tmp_path / "room"
    room.mkdir()
    fake = fake_disk(room, int(size * 1.15))
    code, err = run_cli([*argv, room / f"fits.{fmt}"], capsys)
    assert code == 0, err
    fake.free = size // 2
    code, err = run_cli([*argv, room / f"short.{fmt}"], capsys)
    said = re.search(r"it needs about ([\d.]+) (kB|MB)", one_error_line(err))
    need = float(said[1]) * {"kB": 1e3, "MB": 1e6}[said[2]]
    assert code == 1 and 0.85 < need / size < 1.15, (need, size)


# The CLI, Ctrl-C pressed as HDF5 writes (in its call to the file's write).
INTERRUPTED_CLI = ("import os, signal, sys\nfrom fedcache.store.exporting import _Sink\nwrite = _Sink.write\n"
                   "def interrupted(sink, data):\n    os.kill(os.getpid(), signal.SIGINT)\n    return write(sink, data)\n"
                   "_Sink.write = interrupted\nfrom fedcache.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def test_ctrl_c_during_an_h5_export_stops_it_once_hdf5_has_closed_the_file(tmp_path):
    """Its KeyboardInterrupt, raised in a call HDF5 makes to write, would be a failed write (the crash): Ctrl-C waits
    for the block being written, then the export stops as any interrupted command does."""
    store, out = _store(tmp_path), tmp_path / "out" / "feats.h5"
    out.parent.mkdir()
    out.write_bytes(OLD)
    # SIGINT as a terminal's command has it: a test run started in the background of a script hands it down
    # ignored, which the export rightly leaves ignored.
    terminal = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    done = _export(store, out, "-c", terminal + INTERRUPTED_CLI)
    assert done.returncode == 130 and "interrupted: no part of the export was written" in done.stderr, done.stderr
    assert leftovers(out.parent) == [] and out.read_bytes() == OLD


@pytest.mark.parametrize("handler, code", [("signal.SIG_IGN", 0), ("lambda *a: None", 1)])
def test_a_signal_its_handler_does_not_raise_for_never_leaves_a_short_file(tmp_path, handler, code):
    """An ignored SIGINT (a command started in the background by a script) is not held: the export completes whole.
    A handler that returns (an application's) was held, so the file is short: refused, not renamed into place."""
    store, out = _store(tmp_path), tmp_path / "out" / "feats.h5"
    out.parent.mkdir()
    out.write_bytes(OLD)
    done = _export(store, out, "-c", f"import signal\nsignal.signal(signal.SIGINT, {handler})\n" + INTERRUPTED_CLI)
    assert done.returncode == code, (done.returncode, done.stderr)
    assert leftovers(out.parent) == []
    if code:
        assert "the export was stopped by SIGINT before it was complete" in one_error_line(done.stderr)
        assert out.read_bytes() == OLD
    else:
        import h5py

        with h5py.File(out) as f:
            table = FeatureStore(store, create=False).read("mine", "train", "enc")
            assert np.array_equal(f["train/features"][:], table.features)


def test_what_hdf5_writes_after_a_failed_write_is_held_where_it_reads(tmp_path, fake_disk):
    from fedcache.store.exporting import _Sink

    fake_disk(tmp_path, 4)
    with _Sink(tmp_path / "f") as sink:
        assert sink.write(b"abcdefgh") == 8  # 4 bytes fit: HDF5 is told all 8 were written
        sink.seek(2)
        sink.write(b"XY")
        sink.seek(0)
        assert sink.read(10) == b"abXYefgh\0\0" and sink.stopped
        with pytest.raises(OSError) as kept:
            sink.raise_kept()
    assert disk.is_full(kept.value) and (tmp_path / "f").read_bytes() == b"abcd"


def test_an_export_onto_an_existing_file_is_refused_unless_overwrite(tmp_path, capsys, monkeypatch):
    """An earlier export (or any file) at --out was replaced without a word; it is refused before the store is read,
    and replaced with --overwrite."""
    store, out = _store(tmp_path), tmp_path / "feats.npz"
    out.write_bytes(OLD)
    argv = ["store", "export", "-d", "mine", "-b", "enc", "--store", store, "-o", out]
    read = []
    monkeypatch.setattr(FeatureStore, "read_splits", lambda *a, **k: read.append(a) or pytest.fail("read"))
    code, err = run_cli(argv, capsys)
    assert code == 2 and read == [] and out.read_bytes() == OLD, err
    assert one_error_line(err) == f"error: {out} already exists; pass --overwrite to replace it, or choose another --out"
    monkeypatch.undo()
    assert run_cli([*argv, "--overwrite"], capsys)[0] == 0
    assert set(np.load(out)) >= {"train__features", "test__features"}


@pytest.mark.parametrize("name, said", [("feats.csv", "from '.csv'"), ("feats", "from a name without a suffix")])
def test_an_export_whose_format_its_name_does_not_tell_says_so(tmp_path, capsys, name, said):
    """It said "--format must be one of h5, npz, got ''" to a user who gave no --format."""
    store, out = _store(tmp_path), tmp_path / name
    code, err = run_cli(["store", "export", "-d", "mine", "-b", "enc", "--store", store, "-o", out], capsys)
    assert code == 2 and not out.exists()
    assert one_error_line(err) == (f"error: {out}: cannot tell the format {said}; name a .h5 or .npz file with --out, "
                                   "or give --format h5 or --format npz")
    assert run_cli(["store", "export", "-d", "mine", "-b", "enc", "--store", store, "-o", out, "--format", "npz"],
                   capsys)[0] == 0 and out.exists()
