"""Advisory file locks, so two writers never touch the same rows of an entry.

flock is released by the kernel when the holder dies (even by kill -9), so a crashed
extraction never leaves a stale lock behind. The holder writes who it is into the file (pid, host,
command, start: fedcache/ownership.py's record), so that a refused writer can say whom it waits for.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from fedcache.errors import EntryLockedError
from fedcache.ownership import POLL, Holder, read_holder


QUEUE = "wait for it to finish, or pass --wait SECONDS to queue behind it"


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str, wait: float = 0.0, advice: str = QUEUE) -> Iterator[None]:
    """Hold an exclusive lock on ``path``; wait up to ``wait`` seconds, then fail clearly: ``what`` is being written
    by its holder (named), and ``advice`` says what to do."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, path, what, wait, advice)
        with contextlib.suppress(OSError):  # a full disk: the lock holds without its record
            os.ftruncate(fd, 0)
            os.pwrite(fd, Holder.me().to_text().encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _acquire(fd: int, path: Path, what: str, wait: float, advice: str) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = read_holder(path)
                who = holder.describe() if holder else "another process"
                raise EntryLockedError(f"{what} is being written by another process: {who}; {advice}") from None
            time.sleep(POLL)
