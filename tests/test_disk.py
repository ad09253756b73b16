"""Writing on a full disk (fedcache/disk.py): every shape a full disk takes is recognised, the one line names the
file, what it needs and what is free, and a failed write leaves the file as it was with no temporary file."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch

from fedcache import disk
from fedcache.errors import DiskFullError, FedcacheError
from fedcache.federate.rundir import append_line, load_checkpoint, save_checkpoint
from tests.faults import fill, free_up, leftovers


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EDQUOT, "Disk quota exceeded"),
                                 OSError("1000000 requested and 262112 written"), OSError("Not enough free space to write 34800640 bytes"),
                                 OSError(5, "Can't write data (file write failed: errno = 28, error message = 'No space left on device')"),
                                 OSError(errno.EFBIG, "File too large"),
                                 OSError(5, "Driver write request failed (file write failed: errno = 27, error message = 'File too large')")])
def test_every_shape_of_a_full_disk_is_recognised(exc):
    assert disk.is_full(exc)


@pytest.mark.parametrize("exc", [OSError(errno.EACCES, "Permission denied"), FileNotFoundError(2, "x"), ValueError("no"),
                                 RuntimeError("unexpected pos 960 vs 854")])
def test_other_errors_are_not_a_full_disk(exc):
    assert not disk.is_full(exc)


def test_the_message_names_the_file_the_need_and_the_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "free_bytes", lambda path: 2_000)
    err = disk.full_error(tmp_path / "run" / "checkpoint.pt", "the checkpoint", 34_800_640)
    assert isinstance(err, FedcacheError) and isinstance(err, OSError)
    assert str(err) == (f"no space left on the disk for the checkpoint {tmp_path}/run/checkpoint.pt: it needs about 34.8 MB, "
                        "2.0 kB is free there; free some space and run the same command again")
    assert str(err.advised("continue with --resume")).endswith("is free there; continue with --resume")
    quota = disk.full_error(tmp_path / "x", "the file", 10, exc=OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert "your disk quota is reached" in str(quota)


def test_a_file_size_limit_is_said_as_one_with_advice_that_fits(tmp_path):
    """EFBIG (FAT32's 4 GB, `ulimit -f`): not a full disk, so the advice is not to free space; the rest holds."""
    err = disk.full_error(tmp_path / "e.h5", "the export", 10, exc=OSError(errno.EFBIG, "File too large"))
    assert str(err) == (f"cannot write the export {tmp_path}/e.h5: it is larger than the largest file allowed there (the "
                        "file system's limit, 4 GB on FAT32, say, or the shell's `ulimit -f`); write to a file system that "
                        "allows larger files (or raise `ulimit -f`) and run the same command again")
    assert "(or raise `ulimit -f`), then continue" in str(err.advised("free some space, then continue"))


def test_a_write_that_does_not_fit_leaves_the_old_file_and_no_temporary_one(tmp_path, fake_disk):
    path = tmp_path / "config.json"
    path.write_text("old")
    fake_disk(tmp_path, 10)
    with pytest.raises(DiskFullError, match=f"for the run file {path}: it needs about 1.0 kB"):
        disk.write_text(path, "x" * 1000, "the run file")
    assert path.read_text() == "old" and leftovers(tmp_path) == []


def test_a_checkpoint_is_checked_against_the_free_space_before_a_byte_is_written(tmp_path, fake_disk, monkeypatch):
    ck = {"rnd": 3, "seconds": 1.0, "runs": [{"server": {"w": torch.zeros(100)}}], "engine": {}}
    save_checkpoint(tmp_path / "checkpoint.pt", ck)
    written = []
    real_write = os.write
    fake = fake_disk(tmp_path, 300)
    monkeypatch.setattr(os, "write", lambda fd, data: written.append(len(data)) or real_write(fd, data))
    with pytest.raises(DiskFullError, match=r"the checkpoint .*checkpoint.pt: it needs about \d.\d kB, 300 B is free"):
        save_checkpoint(tmp_path / "checkpoint.pt", {**ck, "rnd": 4})
    assert written == [] and fake.free == 300
    assert load_checkpoint(tmp_path / "checkpoint.pt")["rnd"] == 3 and leftovers(tmp_path) == []


def test_a_torn_write_of_a_checkpoint_is_removed(tmp_path, fake_disk, monkeypatch):
    monkeypatch.setattr(disk, "check_space", lambda *a, **k: None)  # as if the estimate had passed
    fake_disk(tmp_path, 500)
    with pytest.raises(DiskFullError, match="checkpoint.pt"):
        save_checkpoint(tmp_path / "checkpoint.pt", {"rnd": 1, "seconds": 0.0, "runs": [{"w": torch.zeros(1000)}], "engine": {}})
    assert list(tmp_path.iterdir()) == []


def test_a_metrics_line_that_does_not_fit_is_cut_back(tmp_path, fake_disk):
    log = tmp_path / "metrics.jsonl"
    append_line(log, {"round": 1, "accuracy": 50.0})
    fake_disk(tmp_path, 10)
    with pytest.raises(DiskFullError, match="metrics.jsonl"):
        append_line(log, {"round": 2, "accuracy": 51.0, "per_client": list(range(50))})
    assert log.read_text() == '{"round": 1, "accuracy": 50.0}\n'  # no torn line


def test_numpy_s_short_write_becomes_one_line_and_the_partial_files_go(tmp_path, fake_disk):
    folder = tmp_path / "features"
    folder.mkdir()
    fake_disk(tmp_path, 1000)
    with pytest.raises(DiskFullError, match="the shared features"):
        with disk.on_full_disk(folder, "the shared features", 40_128, remove=[folder]):
            np.save(folder / "train.npy", np.zeros(10_000, np.float32))
    assert not folder.exists()


def test_torch_s_zip_writer_on_a_full_disk_is_recognised(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "free_bytes", lambda path: 0)
    with pytest.raises(DiskFullError, match="x.pt"):
        with disk.on_full_disk(tmp_path / "x.pt", "the file"):
            raise RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 960 vs 854")
    monkeypatch.setattr(disk, "free_bytes", lambda path: 10 << 30)
    with pytest.raises(RuntimeError):  # with room on the disk, it is some other error: not hidden
        with disk.on_full_disk(tmp_path / "x.pt", "the file"):
            raise RuntimeError("unexpected pos 960 vs 854")


def test_a_real_small_file_system(small_disk):
    where = small_disk("1m")
    (where / "config.json").write_text("old")
    fill(where, 0)
    with pytest.raises(DiskFullError, match="config.json: it needs about 20.0 kB, 0 B is free there"):
        disk.write_text(where / "config.json", "x" * 20_000, "the run file")
    assert (where / "config.json").read_text() == "old" and leftovers(where) == []
    with pytest.raises(DiskFullError):
        disk.append(where / "metrics.jsonl", b"x" * 20_000, "the log")
    assert (where / "metrics.jsonl").read_bytes() == b""
    free_up(where)
    disk.write_text(where / "config.json", "x" * 20_000, "the run file")
    assert len((where / "config.json").read_text()) == 20_000


def test_a_full_disk_advises_the_same_command_or_call_again(tmp_path):
    """A full disk said "run the same command again" to a Python caller, whose grid or train is a call."""
    from fedcache.disk import full_error
    from fedcache.wording import flag_names, keyword_names

    with keyword_names():
        assert "free some space and run the same call again" in str(full_error(tmp_path / "f", "the file"))
    with flag_names():
        assert "free some space and run the same command again" in str(full_error(tmp_path / "f", "the file"))


def test_a_full_disk_s_advice_names_what_to_run_again_and_what_is_kept():
    """One sentence for every caller's advice (a grid's, an extraction's): only what it runs and keeps differ."""
    from fedcache.wording import flag_names, keyword_names

    with flag_names():
        assert disk.again() == "free some space and run the same command again"
        assert disk.again("grid", "its cells are kept") == "free some space and run the same grid command again: its cells are kept"
    with keyword_names():
        assert disk.again(kept="the batches are kept") == "free some space and run the same call again: the batches are kept"


@pytest.mark.slow
def test_a_checkpoint_is_streamed_to_its_file_not_made_whole_in_memory_first(tmp_path):
    """Serialised into memory first, a checkpoint took as much again as the states it holds (1.9 GB more for
    3,000 clients' fedproto heads) at the peak of every round."""
    import subprocess
    import sys

    code = ("import torch; from fedcache.federate.rundir import save_checkpoint, load_checkpoint\n"
            "peak = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) // 1024\n"
            "ck = {'rnd': 1, 'seconds': 0.0, 'runs': [{'w': torch.ones(64 << 20)}], 'engine': {}}; before = peak()\n"
            f"save_checkpoint({str(tmp_path / 'checkpoint.pt')!r}, ck); grown = peak() - before\n"
            f"assert torch.equal(load_checkpoint({str(tmp_path / 'checkpoint.pt')!r})['runs'][0]['w'], ck['runs'][0]['w'])\n"
            "print(grown)")
    grown_mb = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grown_mb < 64, grown_mb  # the checkpoint is 256 MB


@pytest.mark.parametrize("errno_", [errno.ENOSPC, errno.EIO])
def test_a_disk_that_fills_while_a_checkpoint_streams_out_is_said_as_a_full_disk(tmp_path, monkeypatch, errno_):
    """torch's zip writer, its write failed, raised its own "unexpected pos": the raw error of a full disk with space
    left once the temporary file was gone (h_rev37). The previous checkpoint stays, and no temporary file."""
    ck = {"rnd": 1, "seconds": 0.0, "runs": [{"w": torch.zeros(300_000)}], "engine": {}}
    save_checkpoint(tmp_path / "checkpoint.pt", ck)
    real, written = os.write, [0]

    def write(fd, data):
        written[0] += 1
        if written[0] >= 1:  # the first: torch's writer then fails again, and says so
            raise OSError(errno_, os.strerror(errno_))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(DiskFullError if errno_ == errno.ENOSPC else OSError) as err:
        save_checkpoint(tmp_path / "checkpoint.pt", {**ck, "rnd": 2})
    assert isinstance(err.value, OSError) or "checkpoint.pt" in str(err.value)
    monkeypatch.setattr(os, "write", real)
    assert load_checkpoint(tmp_path / "checkpoint.pt")["rnd"] == 1 and leftovers(tmp_path) == []


def test_ctrl_c_while_a_checkpoint_streams_out_waits_for_the_file(tmp_path, monkeypatch):
    """Raised inside torch.save's write into the file object, the KeyboardInterrupt was a failed write inside torch's
    C++ writer (a train seen hung, growing to 24 GB, after a Ctrl-C). It now waits until the checkpoint is whole."""
    import signal

    ck = {"rnd": 1, "seconds": 0.0, "runs": [{"w": torch.zeros(300_000)}], "engine": {}}
    save_checkpoint(tmp_path / "checkpoint.pt", ck)
    real, sent = disk.FdFile.write, []

    def write(self, data):
        if not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return real(self, data)

    monkeypatch.setattr(disk.FdFile, "write", write)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(tmp_path / "checkpoint.pt", {**ck, "rnd": 2})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sent and load_checkpoint(tmp_path / "checkpoint.pt")["rnd"] == 2 and leftovers(tmp_path) == []
