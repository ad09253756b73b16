"""An interrupt that Python dropped, raised again.

A signal's handler runs wherever the main thread is at its next instruction. Raised in a weakref's callback or a
``__del__`` (an import's module lock, a garbage collection), its KeyboardInterrupt is printed as "Exception ignored
in ..." and dropped: the process goes on, and a handler that raises once (the command line's, the Flower
simulation's) is deaf from then on. For a process that owns its interpreter (the ``fedcache`` command, the
simulation's process): the library sets no hook of the caller's.
"""
from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

AGAIN_AFTER = 0.05  # seconds: the main thread has left the callback by then


class RaisedAgain:
    """A ``sys.unraisablehook``: a KeyboardInterrupt its handler raised and Python dropped is sent again, as the
    signal ``rearm(exc)`` returns once it has made the handler raise again (None: not the handler's own, which Python
    prints, as anything else). The signal is sent from a thread started here: starting one in the hook, that is in a
    finalizer, could wait for a lock the interrupted thread holds."""

    def __init__(self, rearm: Callable[[BaseException], int | None]) -> None:
        self._rearm = rearm
        self._asked = self._sent = 0  # each written by one thread alone
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()  # put() is safe in a finalizer
        threading.Thread(target=self._send, daemon=True, name="fedcache-interrupt-again").start()

    def __call__(self, unraisable) -> None:
        if (not isinstance(unraisable.exc_value, KeyboardInterrupt)
                or threading.current_thread() is not threading.main_thread()):
            try:  # the handler's interrupt, raised while another's exception is printed, would escape the hook unsaid
                sys.__unraisablehook__(unraisable)
                return
            except KeyboardInterrupt as raised:
                dropped = raised
        else:
            dropped = unraisable.exc_value
        while True:
            try:  # a signal pending meanwhile (signal.signal runs it) raises here, where it is dropped too
                signum = self._rearm(dropped)
                if signum is None:
                    sys.__unraisablehook__(unraisable)
                else:
                    self._asked += 1
                    self._signals.put(signum)
                return
            except KeyboardInterrupt as again:
                dropped = again

    def _send(self) -> None:
        while True:
            signum = self._signals.get()
            time.sleep(AGAIN_AFTER)
            os.kill(os.getpid(), signum)
            self._sent += 1

    def wait_sent(self, timeout: float) -> bool:
        """Whether every signal asked for was sent within ``timeout`` seconds (tests restore their handlers after)."""
        deadline = time.monotonic() + timeout
        while self._sent < self._asked and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._sent >= self._asked


HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM wait while the block runs (the list it gives fills with them), then are raised again, to
    their own handlers: a KeyboardInterrupt raised inside a C library's call into Python (HDF5's writes through a
    file object, torch.save's into one) is that library's failed write, which it may not survive. Only a Python
    handler is held: an ignored signal stays ignored, a default one ends the process. Outside the main thread no
    handler runs, and nothing is held."""
    got: list[int] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.getsignal(s) for s in HELD if callable(signal.getsignal(s))}
        _install({s: lambda signum, frame: got.append(signum) for s in handlers}, handlers)
    try:
        yield got
    finally:
        _install(handlers, {})
        for signum in got:
            signal.raise_signal(signum)


def _install(wanted: dict, before: dict) -> None:
    """Each signal's handler of ``wanted``, every one of them. ``signal.signal`` first runs a pending signal's
    handler, whose KeyboardInterrupt leaves that handler unchanged: it is set again, and the interrupt raised once
    all are (installing, with ``before`` put back: one signal held and the other not, or a later SIGTERM swallowed
    by the held one's handler)."""
    raised = None
    for signum, handler in wanted.items():
        while True:
            try:
                signal.signal(signum, handler)
                break
            except KeyboardInterrupt as exc:
                raised = raised or exc
    if raised is not None:
        if before:
            _install(before, {})
        raise raised

