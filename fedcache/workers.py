"""A grid's worker process as it starts and between its cells (the pool itself: fedcache/grids/pool.py).

Kept out of ``fedcache.grids``: unpickling a worker's initializer imports its module, and importing
``fedcache.grids`` imports torch (seconds), all that time before the initializer ran. A worker was then still
without its SIGTERM handler (the grid's stop, or a scheduler's, killed it outright) and without its SIGINT ignored.
This module imports nothing heavy (tests/grids/test_pool.py checks): the handlers are set first, torch after.

The worker's pipe to the grid carries a SIGTERM that finds it between cells, and its log records, which the grid
writes with its own handlers (``log_from_worker``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
from collections.abc import Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import SemLock

from fedcache.ownership import Holder, on_orphaned, work_for
from fedcache.wording import named_as

SIGTERM_SAID = b"SIGTERM"  # a worker's message to the grid when SIGTERM finds it between cells

_report_to = None  # the grid's pipe (``SIGTERM_SAID``, log records)
_stops_all = None  # the grid's pipe that turns readable once it stops every worker (``_grid_stops_all``)
_in_cell = False  # this worker runs a cell (``unless_stopping``)
_stopping = False  # this worker was sent SIGTERM
_leaving = False  # this worker leaves the pool's wait for its next cell (``_exit_on_sigterm``)


def init_worker(grid: int, report_to, holder: str, level: int, stops_all) -> None:
    """A worker's start: ``grid`` is the grid's pid, ``holder`` its lock record, ``level`` the lowest level the grid
    writes its log records at, ``stops_all`` the pipe the grid says on that it stops every worker."""
    global _report_to, _stops_all
    _report_to, _stops_all = report_to, stops_all  # before the handler, which may use them at once
    # The grid stops its workers with SIGTERM (pool._stop): a worker leaves as Python does (SystemExit in its cell;
    # between cells, on the pool's last message or once the grid stops them all), so its cell's clean-up runs (its
    # run directory's lock is let go) and what it registered with multiprocessing's resource tracker is
    # unregistered. Killed outright by the signal, each worker's Blosc lock (numcodecs makes one to read the
    # partition) was reported as "leaked semaphore objects" under the grid's one line.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # blocked since it started; ignored even if something unblocks it
    os.environ["OMP_NUM_THREADS"] = "1"
    work_for(Holder.parse(holder))  # the cells it locks are held for the grid, the command to stop
    _log_to_grid(level)
    import torch

    torch.set_num_threads(1)
    on_orphaned(grid, lambda: os._exit(1))  # its grid killed outright: it would train on under the next command


def _exit_on_sigterm(signum: int, frame) -> None:
    global _stopping, _leaving
    if not (_in_cell or _leaving) and _grid_stops_all() and _waits_for_a_cell(frame):
        # The pool's last message may never come: a worker killed outright as it read the queue holds the queue's
        # lock for good. Anywhere else (reading the queue, sending a cell's result, already leaving) the worker
        # goes on, and the grid sends SIGTERM again until it has left (pool._stop).
        _leaving = True  # once: a second SystemExit would cut its clean-up short
        raise SystemExit(128 + signum)
    if _stopping:
        return  # already leaving (the grid stops every worker, this one too): let its clean-up run
    _stopping = True
    if _in_cell:
        raise SystemExit(128 + signum)  # the pool sends it back as the cell's error; the worker goes on
    # Between cells the worker is in the pool's own code, reading its next cell from the pipe all workers share:
    # an exception there could leave half a message in it, which another worker then read as garbage (an
    # EOFError traceback under the grid's line), and a worker gone there broke the pool ("a grid worker process
    # died"). It tells the grid, which stops; the worker refuses its next cell or leaves on the pool's last message.
    with contextlib.suppress(OSError):  # a grid already gone
        _report_to.send_bytes(SIGTERM_SAID)


def _grid_stops_all() -> bool:
    """The grid said that it stops every worker (or is gone): its one byte there is never read."""
    try:
        return _stops_all is not None and _stops_all.poll()
    except OSError:  # closed under it
        return True


# Looked up once, and None where a Python has them in C: its workers then never leave from the handler, as before.
_LOCK_ENTER = getattr(getattr(SemLock, "__enter__", None), "__code__", None)
_QUEUE_GET = getattr(getattr(Queue, "get", None), "__code__", None)


def _waits_for_a_cell(frame) -> bool:
    """``frame`` (where a signal found the worker) is the pool's wait for the next cell blocked on the queue's lock:
    not reading from the queue, where leaving after a message's length would leave its body to the next reader.
    False where it cannot be told: an error raised in a signal handler lands anywhere in the worker."""
    try:
        if frame is not None and frame.f_code is _LOCK_ENTER:
            frame = frame.f_back
        return frame is not None and frame.f_code is _QUEUE_GET
    except Exception:  # noqa: BLE001 - see above
        return False


def unless_stopping(naming: bool | None, fn: Callable, *args):
    """``fn(*args)`` in a worker not yet stopped: the pool hands a stopped worker the cells it had queued all the
    same, and only once none is left does it tell the worker to exit. Its messages name the options as the
    grid's caller names them (``naming``: ``wording.naming()`` there; a context variable stays in its process)."""
    global _in_cell
    try:
        _in_cell = True
        if _stopping:  # also a SIGTERM that came as this cell was handed over
            raise SystemExit(128 + signal.SIGTERM)
        with named_as(naming):
            return fn(*args)
    finally:
        _in_cell = False


# A record is one write to the pipe that every worker shares: one of at most PIPE_BUF bytes is never interleaved
# with another's, and no lock is needed (one that a killed worker held would stop the others' logging).
_MESSAGE = getattr(select, "PIPE_BUF", 512) - 4  # less the length multiprocessing writes before each message
_CUT = " [...] ".encode()


def _log_to_grid(level: int) -> None:
    """The worker's log records go to the grid, which writes them as its own (the CLI: ``WARNING name: ...`` from
    FEDCACHE_LOG's level on). With no handler of its own, a worker wrote them through logging.lastResort, bare and
    at any level. A handler its re-imported main script set up (basicConfig at the top of a script) is replaced:
    each line is written once, where the grid's are."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_ToGrid())
    root.setLevel(level)


class _ToGrid(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            said = record_bytes(record.levelno, record.name, self.format(record))
        except Exception:
            self.handleError(record)
            return
        with contextlib.suppress(OSError):  # the grid gone: its worker follows (on_orphaned)
            _report_to.send_bytes(said)


def record_bytes(levelno: int, name: str, text: str) -> bytes:
    """``levelno pid name`` and the record's text on the next line, cut to fit one write to the pipe: its start and
    its end kept (a traceback's last line is its reason), the middle left out."""
    head = f"{levelno} {os.getpid()} {name}\n".encode()
    body = text.encode(errors="replace")
    room = _MESSAGE - len(head)
    if len(body) > room:
        keep = (room - len(_CUT)) // 2
        start = body[:keep].decode(errors="ignore").encode()  # never half a character
        end = body[len(body) - keep:].decode(errors="ignore").encode()
        body = start + _CUT + end
    return head + body


def log_from_worker(said: bytes) -> None:
    """A worker's record (``_ToGrid``) handled in the grid's process by its logger of that name, as the grid's own
    records are: its level, filters and handlers (the CLI's, a caller's)."""
    head, _, text = said.decode(errors="replace").partition("\n")
    try:
        level, pid, name = head.split(" ", 2)
        levelno, process = int(level), int(pid)
    except ValueError:  # not a record: nothing to write
        return
    logger = logging.getLogger(name)
    if logger.isEnabledFor(levelno):
        logger.handle(logging.makeLogRecord({"name": name, "levelno": levelno, "msg": text, "process": process,
                                             "levelname": logging.getLevelName(levelno)}))
