"""Process-wide state that a dependency changes while fedcache uses it, given back when that use ends.

The library changes nothing process-wide: the process is its caller's (only the `fedcache` command owns its
own). Some dependencies change it as a side effect of the work fedcache asks of them; each such place runs
inside one of these, which puts back what it found, through public APIs only.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import random
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def start_method_unset() -> Iterator[None]:
    """multiprocessing's start method left unset where the caller had not set it. The first multiprocessing object
    made with the default context (a DataLoader's worker queue, numcodecs' Blosc lock, a spawned process) fixes
    it for the whole process, after which the caller's own ``multiprocessing.set_start_method("spawn")`` raises.
    What exists keeps its context; later objects get the method the caller chooses. A method that was set is left
    as it is.

    Unsetting it is a write to process-wide state, so it is made as narrowly as public APIs allow: once, by the
    last of the blocks open in any thread (a grid starting its workers while another thread reads a store: the
    block that found the method fixed by the other's work left it fixed), and only where the method is the
    default (``get_all_start_methods()[0]``), which a first use fixes by itself: another thread's choice of
    another method meanwhile stays. While a block is open, another thread's ``set_start_method()`` without
    ``force`` is refused, as it is after any use of multiprocessing."""
    with _Blocks.lock:
        if not _Blocks.open:
            _Blocks.found_unset = multiprocessing.get_start_method(allow_none=True) is None
        _Blocks.open += 1
    try:
        yield
    finally:
        with _Blocks.lock:
            _Blocks.open -= 1
            if not _Blocks.open and _Blocks.found_unset and _fixed_by_a_first_use():
                multiprocessing.set_start_method(None, force=True)


class _Blocks:
    """The blocks of ``start_method_unset`` open in this process, in any thread."""

    lock = threading.Lock()
    open = 0
    found_unset = False  # the method was unset as the first of them began


def _fixed_by_a_first_use() -> bool:
    return multiprocessing.get_start_method(allow_none=True) == multiprocessing.get_all_start_methods()[0]


@contextlib.contextmanager
def handler_kept(signum: int) -> Iterator[None]:
    """The handler of ``signum`` as the caller had it. torch's DataLoader installs a SIGCHLD handler, once per
    process, the first time it starts workers, and leaves it there; given back, the loaders of this process
    still find a dead worker, by the status check they make every few seconds, instead of at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sets handlers: nothing here can change one
        return
    before = signal.getsignal(signum)
    try:
        yield
    finally:
        if before is not None and signal.getsignal(signum) is not before:  # None: set outside Python, not ours to set
            signal.signal(signum, before)


@contextlib.contextmanager
def random_kept() -> Iterator[None]:
    """Python's ``random`` where the caller's seed left it, for a block that imports a dependency: scikit-learn's
    estimators import rich, whose import draws 24 bits of the global generator for its style ids, so a script's
    next ``random.random()`` after its first linear probe differed from the same script without one."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)
