"""An interrupt that Python dropped, raised again.

A signal's handler runs wherever the main thread is at its next instruction. Raised in a weakref's callback or a
``__del__`` (an import's module lock, a garbage collection), its KeyboardInterrupt is printed as "Exception ignored
in ..." and dropped: the process goes on, and a handler that raises once (the command line's, the Flower
simulation's) is deaf from then on. For a process that owns its interpreter (the ``fedcache`` command, the
simulation's process): the library sets no hook of the caller's.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

AGAIN_AFTER = 0.05  # seconds: the main thread has left the callback by then


def raised_again(rearm: Callable[[], int | None]) -> Callable:
    """A ``sys.unraisablehook``: a dropped KeyboardInterrupt is sent again, as the signal ``rearm()`` returns once
    it has made the handler raise again (None: not one of its handler's; Python prints it, as anything else)."""

    def hook(unraisable) -> None:
        signum = rearm() if issubclass(unraisable.exc_type, KeyboardInterrupt) else None
        if signum is None:
            sys.__unraisablehook__(unraisable)
            return
        later = threading.Timer(AGAIN_AFTER, os.kill, (os.getpid(), signum))
        later.daemon = True
        later.start()

    return hook
