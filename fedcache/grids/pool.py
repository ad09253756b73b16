"""Worker processes for a grid's cells and batches: spawned, one torch thread each, stopped with the grid (what a
worker sets up as it starts, and between its cells: fedcache/workers.py)."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures import wait as finished
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from multiprocessing.context import SpawnContext, SpawnProcess

from fedcache.borrowed import start_method_unset
from fedcache.errors import FedcacheError
from fedcache.ownership import Holder
from fedcache.wording import named, naming
from fedcache.workers import SIGTERM_SAID, init_worker, log_from_worker, unless_stopping

log = logging.getLogger(__name__)

STOP_GRACE = 5.0  # seconds a stopped worker has to leave before it is killed
RESEND = 0.2  # seconds between the SIGTERMs a stopped worker is sent until it leaves (``_stop``)


def in_workers(jobs: int, tasks: list[tuple[Callable, tuple]], workers: Workers | None = None) -> Iterator:
    """Each task's (cell, row) pairs as the task finishes, from ``jobs`` worker processes of one torch thread
    each (the heads are too small for intra-op parallelism to beat one task per core): ``workers``' processes
    where given (kept for the caller's next tasks), else ones started for these tasks and stopped after them."""
    if workers is not None:
        yield from workers.run(tasks)
        return
    with Workers(min(jobs, len(tasks))) as started:
        yield from started.run(tasks)


class Workers:
    """Up to ``jobs`` worker processes, started as tasks need them (the pool starts one for a task submitted while
    none is idle) and kept until the ``with`` block ends: a --select grid's stages and the rungs of its successive
    halving train in the same processes, each started once (a start imports torch: seconds of CPU a worker). With
    the processes, the pipe their log records and SIGTERM reports come on, and the thread that reads it."""

    def __init__(self, jobs: int) -> None:
        self._ctx = _SpawnRecorded()  # every worker the pool starts: those to stop, and how the gone ones ended
        self._jobs = jobs
        self._reports = contextlib.ExitStack()
        self._pool: ProcessPoolExecutor | None = None
        self._sigterm: Future | None = None
        self._futures: list[Future] = []  # the last run's cells
        self._read: set[Future] = set()  # those of them whose result the caller was given
        self._stop_all: Callable[[], None] = lambda: None  # says to the workers that the grid stops them all
        self._pool_threads: set[threading.Thread] = set()  # the pool's own, started by its first submit

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if exc is None and self._pool is not None:
                self._close()
            else:  # Ctrl-C or an error between tasks (a rung's cut): no cell runs, none is waited for
                self._abandon()
        finally:
            _join(self._pool_threads)
            self._reports.close()

    def run(self, tasks: list[tuple[Callable, tuple]]) -> Iterator:
        """Each task's (cell, row) pairs as the task finishes, in the workers started so far, and new ones while
        fewer than ``jobs`` run."""
        pool = self._pool or self._start()
        try:
            # The pool starts its workers as the tasks are submitted; starting one, even with the spawn context,
            # fixes this process's default start method (multiprocessing records it for the child): the caller's
            # to choose.
            with _workers_deaf_to_ctrl_c(), start_method_unset(), self._threads_of(pool):
                futures = [pool.submit(unless_stopping, naming(), fn, *args) for fn, args in tasks]
            self._futures, self._read = futures, set()
            for fut in _as_finished(futures, self._sigterm):
                self._read.add(fut)
                yield from fut.result()
        except BaseException as exc:
            # Ctrl-C, SIGTERM (the CLI turns it into an interrupt) or an error: the pool's own shutdown would
            # wait for every queued cell. Drop the queue and stop the running cells; finished ones are on disk.
            self._abandon()
            lost = _lost_worker(exc, self._ctx.workers())
            if lost:
                raise FedcacheError(lost) from None
            raise

    def _start(self) -> ProcessPoolExecutor:
        report_to, self._sigterm = self._reports.enter_context(_sigterm_reports(self._ctx))
        stops_all, self._stop_all = self._reports.enter_context(_stop_all_notice(self._ctx))
        self._pool = ProcessPoolExecutor(self._jobs, mp_context=self._ctx, initializer=init_worker,
                                         initargs=(os.getpid(), report_to, Holder.me().to_text(), _log_level(),
                                                   stops_all))
        return self._pool

    @contextlib.contextmanager
    def _threads_of(self, pool: ProcessPoolExecutor) -> Iterator[None]:
        """Records the threads the pool starts in the block (its first submit starts the one that manages it)."""
        before = set(threading.enumerate())
        yield
        self._pool_threads |= {t for t in set(threading.enumerate()) - before
                               if type(t).__module__ == type(pool).__module__}

    def _close(self) -> None:
        """Each worker gone on the pool's last message, once the cells are done. One killed outright as it read
        the queue for a next cell holds the queue's lock for good: the broken pool's SIGTERM then finds the others
        waiting behind it (they tell the grid), where only the grid's stop ends their wait (``_abandon``). All
        results in, the grid ends as it would have; a cell's result lost with the worker is its one line."""
        pool, self._pool = self._pool, None
        finished(self._futures)  # cells the caller left unread still finish, as the pool's own shutdown waited
        pool.shutdown(wait=False)
        running = _not_gone(self._ctx.workers(), self._sigterm)
        if running:
            self._stop_all()
            _stop(running)
        lost = _broken(self._futures)
        if lost is not None:
            raise FedcacheError(_lost_worker(lost, self._ctx.workers()))
        failed = _unread_error(self._futures, self._read)
        if failed is not None:  # raised as reading its result would have: the caller's one line for it
            raise failed

    def _abandon(self) -> None:
        """The queue dropped, the running cells and every worker stopped (``_stop``)."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        pool.shutdown(wait=False, cancel_futures=True)
        self._stop_all()  # before SIGTERM: a worker between cells then leaves at once (workers._exit_on_sigterm)
        # Its own workers, not active_children(): another thread of the caller may be starting processes of its own.
        _stop(self._ctx.workers())


class _SpawnRecorded(SpawnContext):
    """The spawn context (not fork: a forked child inherits the parent's OpenMP thread pool in an undefined state)
    that keeps every process it makes. Read after the pool's start, ``multiprocessing.active_children()`` missed a
    worker that had crashed by then (it reaps the ended ones): the SIGTERM the broken pool sent the others was then
    all that was seen, and a crash was said as a SIGTERM from outside."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[SpawnProcess] = []

    def Process(self, *args, **kwargs) -> SpawnProcess:  # noqa: N802 - the context's name for it
        process = SpawnProcess(*args, **kwargs)
        self.started.append(process)
        return process

    def workers(self) -> set[SpawnProcess]:
        """The processes made that were started (one whose start failed has no pid, and no sentinel to wait on)."""
        return {p for p in self.started if p.pid is not None}


def _join(threads: set[threading.Thread], timeout: float = STOP_GRACE) -> None:
    """Waits (bounded) for the pool's manager thread to end once its workers have: on Python 3.11, one still closing
    its wake-up pipe as the interpreter exits races the exit's last wake-up of it, which then prints a traceback
    (OSError: Bad file descriptor) after the grid's own last line (CPython later closed the race, gh-125451)."""
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def _not_gone(workers: set, sigterm: Future) -> set:
    """``workers`` still running once ``sigterm`` tells of a worker sent SIGTERM between cells (as the pool breaks,
    or from outside), or after ``STOP_GRACE`` seconds."""
    deadline = time.monotonic() + STOP_GRACE
    running = set(workers)
    while running and not sigterm.done() and time.monotonic() < deadline:
        ended = wait([w.sentinel for w in running], min(RESEND, max(0.0, deadline - time.monotonic())))
        running = {w for w in running if w.sentinel not in ended}
    return running


def _broken(futures: list[Future]) -> BrokenProcessPool | None:
    """The error of a cell among ``futures`` whose worker died (how the pool says it broke), if any."""
    errors = (f.exception() for f in futures if not f.cancelled())
    return next((e for e in errors if isinstance(e, BrokenProcessPool)), None)


def _unread_error(futures: list[Future], read: set[Future]) -> Exception | None:
    """The error of the first cell among ``futures`` that raised one and whose result was never read (a caller that
    stopped reading before the last cell, then left the ``with`` block): its workers close cleanly, and the cell's
    error was lost without a word."""
    errors = (f.exception() for f in futures if f not in read and not f.cancelled())
    return next((e for e in errors if isinstance(e, Exception)), None)


def _as_finished(futures: list[Future], sigterm: Future) -> Iterator[Future]:
    """``futures`` as they finish, and ``sigterm`` (its result raises) as soon as a worker between cells reports
    a SIGTERM: the grid stops then as for a busy worker's."""
    left = set(futures)
    for fut in as_completed([*futures, sigterm]):
        yield fut
        left.discard(fut)
        if not left:
            return


@contextlib.contextmanager
def _sigterm_reports(ctx) -> Iterator[tuple[object, Future]]:
    """(the end of a pipe that workers report a SIGTERM and their log records on, a future that fails with
    SystemExit once one reports a SIGTERM), read by a thread of this process while the block runs."""
    reader, writer = ctx.Pipe(duplex=False)
    sigterm: Future = Future()
    listener = threading.Thread(target=_listen, args=(reader, sigterm), name="fedcache-grid-workers", daemon=True)
    listener.start()
    try:
        yield writer, sigterm
    finally:
        try:
            writer.send_bytes(_GRID_DONE)
            listener.join()
        finally:  # also when a second Ctrl-C cuts the join short: no pipe left open in a long-lived interpreter
            writer.close()
            reader.close()


@contextlib.contextmanager
def _stop_all_notice(ctx) -> Iterator[tuple[object, Callable[[], None]]]:
    """(the end of a pipe that a worker sent SIGTERM between cells looks at, a call that makes it readable for every
    worker: the grid stops them all). A worker sent SIGTERM from outside tells the grid instead (``_listen``)."""
    reader, writer = ctx.Pipe(duplex=False)
    try:
        yield reader, lambda: writer.send_bytes(b"stop")  # never read: readable for every worker from then on
    finally:
        writer.close()
        reader.close()


_GRID_DONE = b""  # this process's last message on the pipe, once its workers are gone (theirs are never empty)


def _listen(reader, sigterm: Future) -> None:
    while True:
        try:
            said = reader.recv_bytes()
        except (EOFError, OSError):  # the pipe closed under it: the grid is leaving anyway
            return
        if said == _GRID_DONE:
            return
        if said != SIGTERM_SAID:
            _logged(said)
        elif not sigterm.done():  # the grid stops on the first; a second worker's changes nothing
            sigterm.set_exception(SystemExit(128 + signal.SIGTERM))


def _logged(said: bytes) -> None:
    """A worker's record written by this process's logging; a filter or handler of the caller's that raises is said
    once and the record dropped: the thread that reads the pipe also hears the workers' SIGTERM, and a grid whose reader
    died hung once the workers' records filled the pipe."""
    try:
        log_from_worker(said)
    except Exception as exc:  # noqa: BLE001 - any error of a caller's logging set-up
        logging.lastResort.handle(logging.makeLogRecord({
            "msg": f"a grid worker's log record could not be written ({type(exc).__name__}: {exc}); dropped",
            "levelno": logging.WARNING, "levelname": "WARNING"}))


def _log_level() -> int:
    """The lowest level this process writes fedcache's records at, or any other's: a worker's lower ones are
    dropped where they are made, instead of sent to be dropped here."""
    return min(logging.getLogger().getEffectiveLevel(), logging.getLogger("fedcache").getEffectiveLevel())


def _worker_died() -> str:
    # The __main__ guard is a script's fault alone: the command line's workers re-run the fedcache script, whose
    # import starts nothing.
    return named("a grid worker process died; re-run with --jobs 1 to see the error. Finished cells are kept.",
                 "a grid worker process died. From a script, call fedcache.grid(jobs>1) under "
                 "`if __name__ == '__main__':` (worker processes re-import the script); otherwise call it again "
                 "with jobs=1 to see the error. Finished cells are kept.")


def _worker_sent_sigterm() -> str:
    return ("a grid worker process was sent SIGTERM from outside the grid (a job scheduler's limit, `kill`?), so the "
            f"grid stopped. Finished cells are kept; the same {named('command', 'call')} resumes the others.")


# A worker gone under the grid (the grid stops its own workers only once it is stopping itself): its line, built
# when said, so that it names what the grid's caller gives (a command's --jobs, fedcache.grid's jobs).
_LOST_WORKER = {BrokenProcessPool: _worker_died, SystemExit: _worker_sent_sigterm}


def _lost_worker(exc: BaseException, workers: set) -> str | None:
    """The line for a worker gone under the grid, or None. A worker sent SIGTERM while still starting, before
    ``init_worker`` sets its handler (a scheduler's kill of every process of the job, in Python's start or its
    re-import of the main script), dies of it and breaks the pool as a crash does: told apart by how the workers
    that are gone ended, every one by SIGTERM (once broken, the pool sends it to the others itself; a crashed
    worker had ended otherwise first). Blocking SIGTERM while the workers start instead kept a worker that the grid
    stops as it starts until the grace ran out."""
    if isinstance(exc, BrokenProcessPool) and _ended(workers) == {-signal.SIGTERM}:
        exc = SystemExit(128 + signal.SIGTERM)
    return next((said() for kind, said in _LOST_WORKER.items() if isinstance(exc, kind)), None)


def _ended(workers: set, grace: float = 2.0) -> set[int]:
    """How ``workers`` ended, each once it has (up to ``grace`` seconds): the broken pool has sent SIGTERM to those
    left, and one being reaped by the pool's own thread reads no exit code for a moment; read at once, a crashed
    worker missing from the set had the others' SIGTERM taken for the cause."""
    deadline = time.monotonic() + grace
    pending = list(workers)
    while True:
        pending = [w for w in pending if w.exitcode is None]
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            return {w.exitcode for w in workers} - {None}
        wait([w.sentinel for w in pending], min(RESEND, left))
        time.sleep(0.005)  # ended (its sentinel ready) and being reaped elsewhere: no busy loop meanwhile


@contextlib.contextmanager
def _workers_deaf_to_ctrl_c() -> Iterator[None]:
    """Workers started in the block never get SIGINT: Ctrl-C reaches the whole process group, and a worker still
    importing torch printed its own KeyboardInterrupt traceback before the grid's one line (the grid stops its
    workers itself, ``_stop``). A blocked signal stays blocked across fork and exec, so this thread blocks SIGINT
    while it starts them (``workers.init_worker`` then ignores it). Ignored here instead, a SIGINT sent meanwhile (a
    script's ``kill -INT`` on reading "grid started") was lost, and the grid trained on. One sent meanwhile is held
    (from the main thread, which alone may set a handler) and raised once the workers are started: another thread
    may take it while this one blocks it, and its KeyboardInterrupt must not cut a worker's start short."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks, and no handler passes to a child there
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # started by the first worker, it would unblock SIGINT in this thread
    held: list[int] = []
    hold = threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT))
    before = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) if hold else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        finally:
            if hold:
                _put_back(signal.SIGINT, before)
        if held:
            signal.raise_signal(signal.SIGINT)  # the caller's handler: Ctrl-C's KeyboardInterrupt


def _put_back(signum: int, handler) -> None:
    """``handler`` for ``signum``, even if a pending handler raises as it is set (signal.signal runs them first: a
    SIGTERM the CLI turns into an interrupt, a timeout's SIGALRM): left as the stand-in, it swallowed every later
    Ctrl-C in the caller's interpreter."""
    try:
        signal.signal(signum, handler)
    except BaseException:
        signal.signal(signum, handler)  # the raising handler has run: nothing is pending now
        raise


def _stop(workers: set, grace: float | None = None) -> int:
    """Stop ``workers`` (SIGTERM: each leaves as Python does), killing those still running after ``grace`` seconds
    (``STOP_GRACE``), which is said; returns how many were killed."""
    grace = STOP_GRACE if grace is None else grace
    deadline = time.monotonic() + grace
    running = set(workers)
    while running:
        # Sent again until each has ended: a worker sent it in its cell (by the pool, broken by a worker killed
        # outright) lets its clean-up run, then waits for its next cell where only the signal ends the wait. One
        # already in Python's teardown (seconds of torch's on a loaded machine) has its handler reset to the
        # default, so the next one ends it at once instead of leaving it to the kill after the grace.
        for w in running:
            w.terminate()
        # Ended is told by the sentinel, not is_alive(): the broken pool's own thread may be reaping the same worker,
        # and is_alive() then said a dead one ran (a worker counted as killed that had stopped at once).
        ended = wait([w.sentinel for w in running], min(RESEND, max(0.0, deadline - time.monotonic())))
        running = {w for w in running if w.sentinel not in ended}
        if time.monotonic() >= deadline:
            break
    for w in running:
        w.kill()
    _say_killed(len(running), grace)
    return len(running)


def _say_killed(killed: int, grace: float) -> None:
    """A killed worker leaves its cell's lock file (a re-run takes it over, naming the worker) and the semaphores
    it registered with multiprocessing's resource tracker (numcodecs' Blosc lock), which the tracker removes as
    the grid exits, warning of them as "leaked": said here first, since nothing else says why. Not suppressed:
    only a process-wide warnings filter or PYTHONWARNINGS would reach the tracker, and the caller's process is
    not the library's to change."""
    if killed:
        log.warning("%d grid worker%s did not stop within %g s and %s killed; a re-run resumes %s cells from their "
                    "last checkpoints (Python may then warn of semaphores they leaked: it removes them as it exits)",
                    killed, "s" if killed > 1 else "", grace, "were" if killed > 1 else "was",
                    "their" if killed > 1 else "its")
