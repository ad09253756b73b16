"""Lock files in a store that several Unix users share."""
import os

import pytest

from fedcache.errors import EntryLockedError, StoreError
from fedcache.store.locks import exclusive_lock, shared_lock


@pytest.fixture
def group_umask():
    old = os.umask(0o002)
    yield
    os.umask(old)


def test_a_lock_file_follows_the_umask(tmp_path, group_umask):
    with shared_lock(tmp_path / "r.lock", "a run"):
        pass
    with exclusive_lock(tmp_path / "w.lock", "an import"):
        pass
    # 0o664: another member of the store's group can open it to lock it and to write who holds it
    assert {(tmp_path / f).stat().st_mode & 0o777 for f in ("r.lock", "w.lock")} == {0o664}


@pytest.fixture
def not_writable(monkeypatch):
    """``open(path, O_RDWR)`` refused for the lock files, as for another user's 0644 file (tests may run as
    root, which the permission bits would not stop)."""
    real = os.open

    def fake(path, flags, *args, **kwargs):
        if str(path).endswith(".lock") and flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake)


def test_another_user_s_lock_file_still_locks(tmp_path, not_writable):
    path = tmp_path / "w.lock"
    path.write_text("")
    with exclusive_lock(path, "an import"):
        with pytest.raises(EntryLockedError, match="an import is being written by another process; "):
            with exclusive_lock(path, "an import"):
                pass
        with pytest.raises(EntryLockedError, match="being written"):
            with shared_lock(path, "an import"):
                pass
    assert path.read_text() == ""  # no record written where it could not be; none named in the refusal
    with exclusive_lock(path, "an import"):  # released
        pass


def test_a_refusal_does_not_name_a_killed_writer(tmp_path):
    """A writer killed with -9 leaves its record; the lock is now held by a reader, which records nothing."""
    import subprocess
    import sys

    from fedcache.ownership import Holder

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "w.lock"
    path.write_text(Holder(dead.pid, Holder.me().host, "fedcache import ...", Holder.me().started).to_text())
    with shared_lock(path, "an import"):
        with pytest.raises(EntryLockedError) as refused:
            with exclusive_lock(path, "an import"):
                pass
    assert f"pid {dead.pid}" not in str(refused.value) and "being written by another process; " in str(refused.value)


def test_no_lock_file_and_no_permission_to_make_one_says_so(tmp_path, not_writable):
    with pytest.raises(PermissionError):
        with exclusive_lock(tmp_path / "w.lock", "an import"):
            pass


def test_a_file_system_that_cannot_lock_a_read_only_file_says_what_to_do(tmp_path, not_writable, monkeypatch):
    """NFS emulates flock with POSIX locks: an exclusive one on a descriptor open read-only fails (EBADF)."""
    import errno
    import fcntl

    real = fcntl.flock

    def nfs(fd, op):
        if op & fcntl.LOCK_EX:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", nfs)
    path = tmp_path / "w.lock"
    path.write_text("")
    with pytest.raises(StoreError, match=r"cannot lock .*w\.lock: another user's lock file .*\(chmod g\+w"):
        with exclusive_lock(path, "an import"):
            pass


def test_a_store_and_a_run_made_under_a_group_umask_are_group_writable(tmp_path, group_umask):
    """Another member of the group resumes an entry or a run one user started: it writes into their chunk
    files, their run's files, their locks."""
    from fedcache.api import train
    from fedcache.extract.runner import ExtractConfig, extract

    store = tmp_path / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=store, workers=0))
    train(store=store, dataset="test-toy", backbones="tiny-timm-random", method="fedavg", rounds=2, clients=2,
          out=tmp_path / "run")
    made = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(made) > 20
    assert [str(p.relative_to(tmp_path)) for p in made if not p.stat().st_mode & 0o020] == []


def test_a_wait_for_a_lock_is_said_once_it_lasts(tmp_path, monkeypatch, caplog):
    """`extract --wait 120` behind another extraction printed nothing while it waited: in a log, a hang."""
    import logging

    from fedcache.store import locks

    monkeypatch.setattr(locks, "WAIT_SAID", 0.1)
    path = tmp_path / "e.lock"
    with caplog.at_level(logging.WARNING, logger="fedcache.store.locks"), exclusive_lock(path, "the first"):
        with pytest.raises(EntryLockedError):
            with exclusive_lock(path, "entry x of s.zarr", wait=0.6):
                pass
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("waiting up to 1 s more for entry x of s.zarr, being written by "
                                                 f"another process: pid {os.getpid()} "), said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedcache.store.locks"), exclusive_lock(path, "the first"):
        with pytest.raises(EntryLockedError):
            with exclusive_lock(path, "entry x", wait=0.05):  # refused before it is worth saying
                pass
    assert caplog.records == []
