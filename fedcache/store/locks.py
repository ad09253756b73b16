"""Advisory file locks, so two writers never touch the same rows of an entry.

flock is released by the kernel when the holder dies (even by kill -9), so a crashed
extraction never leaves a stale lock behind. The holder writes who it is into the file (pid, host,
command, start: fedcache/ownership.py's record), so that a refused writer can say whom it waits for.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

from fedcache.disk import FILE_MODE
from fedcache.errors import EntryLockedError, StoreError
from fedcache.ownership import POLL, Holder, is_current, may_run, read_holder
from fedcache.wording import named

log = logging.getLogger(__name__)
WAIT_SAID = 2.0  # seconds of waiting for a lock after which the wait is said: a long queue looked like a hang


def queue_advice() -> str:
    """What a writer refused by another writer of its entry can do, named as its caller gives the wait."""
    return f"wait for it to finish, or pass {named('--wait SECONDS', 'wait=SECONDS')} to queue behind it"


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str, wait: float = 0.0, advice: str | None = None,
                   transient: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``path``; wait up to ``wait`` seconds, then fail clearly: ``what`` is being written
    by its holder (named), and ``advice`` says what to do. ``transient``: the file goes as the lock is let go (a
    lock of one command's work, such as a report's, leaves nothing in the directory). Removed while still held: a
    process that waited on it then holds a file no longer at the path, sees so, and locks the one there now."""
    deadline = time.monotonic() + wait
    fd, recorded = _exclusive_fd(path, what, deadline, advice)
    while transient and not is_current(fd, path):
        os.close(fd)
        fd, recorded = _exclusive_fd(path, what, deadline, advice)
    try:
        if recorded:
            with contextlib.suppress(OSError):  # a full disk: the lock holds without its record
                os.ftruncate(fd, 0)
                os.pwrite(fd, Holder.me().to_text().encode(), 0)
        yield
    finally:
        # The record goes with the lock: a writer refused later by a reader (shared_lock) must not name this
        # finished one. A holder killed outright leaves its record, which the next holder replaces.
        with contextlib.suppress(OSError):
            if transient:
                path.unlink()
            elif recorded:
                os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor releases the lock


def _exclusive_fd(path: Path, what: str, deadline: float, advice: str | None) -> tuple[int, bool]:
    """A descriptor holding ``path`` exclusively, waited for until ``deadline``, and whether it is open for writing."""
    fd, recorded = _lock_fd(path, required=True)
    try:
        _acquire(fd, path, what, max(0.0, deadline - time.monotonic()), advice)
    except OSError as exc:
        os.close(fd)
        if recorded or isinstance(exc, BlockingIOError):
            raise
        # NFS emulates flock with POSIX locks, which need a descriptor open for writing for an exclusive one.
        raise StoreError(f"cannot lock {path}: another user's lock file that this file system locks only when "
                         f"writable; make it group-writable (chmod g+w {path}) or remove it while no fedcache "
                         f"command uses the store ({exc.strerror})") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, recorded


@contextlib.contextmanager
def shared_lock(path: Path, what: str, wait: float = 0.0, advice: str | None = None) -> Iterator[None]:
    """Hold ``path`` shared: no exclusive holder (a writer) meanwhile, other shared holders welcome. Nothing is
    written to the file. In a store this process may not write, a lock file that exists is still taken; where none
    exists and none can be made, the block runs without it."""
    opened = _lock_fd(path)
    if opened is None:
        yield
        return
    fd = opened[0]
    try:
        _acquire(fd, path, what, wait, advice, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _lock_fd(path: Path, required: bool = False) -> tuple[int, bool] | None:
    """A descriptor to lock ``path`` by, and whether it is open for writing. A read-only store, or another user's
    lock file (made before FILE_MODE, or under a stricter umask): open for reading, since a local flock needs no
    write permission; only the holder record is then not written. Where the file is missing and cannot be made:
    None, or with ``required`` the error of making it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE), True
    except OSError as making:
        try:
            return os.open(path, os.O_RDONLY), False
        except OSError:
            if required:
                raise making from None
            return None


def _acquire(fd: int, path: Path, what: str, wait: float, advice: str | None, mode: int = fcntl.LOCK_EX) -> None:
    start = time.monotonic()
    deadline, said = start + wait, False
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                # Said when refused, not when defined: the caller (a flag, or a keyword) is known only then.
                advice = advice or queue_advice()
                raise EntryLockedError(f"{what} is being written by another process{_holder(path)}; {advice}") from None
            if not said and time.monotonic() - start >= WAIT_SAID:
                log.warning("waiting up to %d s more for %s, being written by another process%s",
                            math.ceil(deadline - time.monotonic()), what, _holder(path))
                said = True
            time.sleep(POLL)


def _holder(path: Path) -> str:
    """": pid N on host (command, since ...)" of the lock's holder, or "". A writer killed outright left its record; a
    reader, or a writer without write permission on the lock file, writes none: the record names the holder only
    while its process runs."""
    holder = read_holder(path)
    return f": {holder.describe()}" if holder and may_run(holder) else ""


def live_holders(paths: Iterable[Path]) -> list[Holder]:
    """The holders the lock files ``paths`` record whose process may still run: a writer that let go emptied its
    record, and one killed outright left it for a process that is gone. Read, not locked: a lock taken to see whether
    it is free, even for a moment, refuses a writer that asks for it then."""
    return [h for h in map(read_holder, paths) if h is not None and may_run(h)]


def import_lock(dataset: str, backbone: str) -> str:
    """The lock's name for imports under (dataset, backbone): hashed, since the names may hold dots (``a.b``/``c``
    and ``a``/``b.c`` joined alike) and two long ones exceed a file name's 255 bytes."""
    return "import." + hashlib.sha256(json.dumps([dataset, backbone]).encode()).hexdigest()[:16]
