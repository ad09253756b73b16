"""A grid's worker processes (fedcache/grids/pool.py): parallel workers give one process's results, and SIGINT or
SIGTERM stop a grid and its workers within seconds, finished cells kept and the others checkpointed (both engines)."""
from __future__ import annotations

import pytest

from fedcache.cli import main
from fedcache.table import Table
from tests.conftest import BACKBONE


@pytest.mark.slow
def test_parallel_workers_give_the_same_results_as_one_process(toy_store, tmp_path, capsys):
    toml = tmp_path / "grid.toml"
    toml.write_text(f'store = "{toy_store}"\ndataset = "test-toy"\nbackbones = ["{BACKBONE}"]\n'
                    'methods = ["fedavg", "fedproto"]\nseeds = [0, 1]\n[set]\nrounds = 2\nclients = 2\nlr = ["0.01", "0.1"]\n')
    code = main(["grid", "--config", str(toml), "--jobs", "2", "--out", str(tmp_path / "par")])
    assert code == 0, capsys.readouterr().err
    assert "results.csv" in capsys.readouterr().out
    code = main(["grid", "--config", str(toml), "--jobs", "1", "--out", str(tmp_path / "seq")])
    assert code == 0
    par = Table.from_csv(tmp_path / "par" / "results.csv")
    seq = Table.from_csv(tmp_path / "seq" / "results.csv")
    assert len(par) == 8
    assert par.column("mean_accuracy") == seq.column("mean_accuracy")
    assert par.column("bytes_up") == seq.column("bytes_up")


def _children(pid: int) -> set[int]:
    import os

    kids = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                if entry.isdigit() and int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.add(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_parallel_grid_and_its_workers(toy_store, tmp_path, sig):
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "grid"
    cmd = [sys.executable, "-m", "fedcache.cli", "grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE,
           "-m", "fedavg,fedprox,fedproto,solo", "--rounds", "100000", "--partition", "iid", "--clients", "2",
           "--jobs", "2", "--engine", "processes", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()), preexec_fn=_sigint_as_in_a_terminal)
    try:
        _signal_mid_grid(proc, out, getattr(signal, sig))
    finally:
        if proc.poll() is None:  # a failed test must not leave a grid running
            for pid in _children(proc.pid) | {proc.pid}:
                os.kill(pid, signal.SIGKILL)


def _signal_mid_grid(proc, out, sig):
    import time

    deadline = time.monotonic() + 120
    while not (out / "cells").exists() or len(list((out / "cells").glob("*/metrics.jsonl"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
        time.sleep(0.2)
    workers = _children(proc.pid)
    assert len(workers) >= 2
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    # One line: workers killed outright left multiprocessing's resource tracker warning of "leaked semaphore
    # objects" (numcodecs' Blosc lock) after it.
    assert proc.returncode == 128 + sig and "Traceback" not in err and "resource_tracker" not in err, err
    assert time.monotonic() - t0 < 15
    time.sleep(0.5)
    assert not [w for w in workers if _alive(w)]


def _grid_process(toy_store, out, *options, python=None):
    import os
    import subprocess
    import sys

    cmd = [*(python or [sys.executable, "-m", "fedcache.cli"]), "grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE,
           "--partition", "iid", "--clients", "2", "-o", str(out), *options]
    # SIGINT as a terminal's command has it: a test run started in the background of a script inherits it
    # ignored, and a command left so is not ours to interrupt with it.
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()), preexec_fn=_sigint_as_in_a_terminal)


def _sigint_as_in_a_terminal() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(proc, ready, seconds=120):
    import time

    deadline = time.monotonic() + seconds
    while not ready():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "timeout"
        time.sleep(0.2)


def _wait_for_exit(workers, seconds=5.0):
    import time

    deadline = time.monotonic() + seconds
    while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)]


def _kill_tree(proc):
    import os
    import signal

    if proc.poll() is None:  # a failed test must not leave a grid running
        for pid in _children(proc.pid) | {proc.pid}:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
def test_a_stopped_parallel_grid_keeps_finished_cells_and_resumes_the_others(toy_store, tmp_path):
    """Short cells finish while long ones train; SIGTERM then leaves the finished ones finished and the long
    ones checkpointed, so a re-run skips the first and resumes the second."""
    import signal

    out = tmp_path / "grid"
    proc = _grid_process(toy_store, out, "-m", "fedavg,fedprox", "--rounds", "2,100000", "--jobs", "2",
                         "--engine", "processes")
    try:
        finished = lambda: list((out / "cells").glob("*rounds=2*/summary.json"))  # noqa: E731
        started = lambda: list((out / "cells").glob("*rounds=100000*/checkpoint.pt"))  # noqa: E731
        _wait_for(proc, lambda: (out / "cells").exists() and len(finished()) == 2 and len(started()) == 2)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_tree(proc)
    assert proc.returncode == 143 and "Traceback" not in err and "re-run the same command to resume" in err, err
    _wait_for_exit(workers)  # the bound: the workers are gone within a few seconds of the parent
    assert len(finished()) == 2 and len(started()) == 2
    assert not list((out / "cells").glob("*rounds=100000*/summary.json"))


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
def test_a_signal_stops_the_batched_engine_with_its_batch_checkpointed(toy_store, tmp_path):
    """The batched engine trains stacked cells (one batch: in the grid's own process): Ctrl-C stops it within seconds,
    exit 130, and the batch's checkpoint is on disk for the re-run."""
    import signal
    import time

    out = tmp_path / "grid"
    proc = _grid_process(toy_store, out, "-m", "fedavg", "--rounds", "100000", "--seeds", "0", "--set", "lr=0.01,0.1",
                         "--jobs", "2", "--engine", "batched")
    try:
        _wait_for(proc, lambda: any((out / "batches").glob("*/*.pt")) if (out / "batches").exists() else False)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_tree(proc)
    assert proc.returncode == 130 and "Traceback" not in err and "resource_tracker" not in err, err
    assert time.monotonic() - t0 < 15
    assert any((out / "batches").glob("*/*.pt")) and not list((out / "cells").glob("*/summary.json"))



@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
def test_a_worker_sent_sigterm_from_outside_stops_the_grid_in_one_line(toy_store, tmp_path):
    """A worker exits on SIGTERM as Python does (workers.init_worker), which from outside the grid (a scheduler, kill)
    reached the grid as the cell's SystemExit: it must stop the grid with its other workers and say so, not pass
    as an exit status without a word while the other worker trains on."""
    import os
    import signal

    out = tmp_path / "grid"
    proc = _grid_process(toy_store, out, "-m", "fedavg,fedprox,fedproto,solo", "--rounds", "100000", "--jobs", "2",
                         "--engine", "processes")
    try:
        _wait_for(proc, lambda: len(list(out.glob("cells/*/metrics.jsonl"))) >= 2)
        workers = _children(proc.pid) - {os.getpid()}
        worker = next(w for w in workers if "spawn_main" in open(f"/proc/{w}/cmdline").read())
        os.kill(worker, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_tree(proc)
    assert proc.returncode == 1 and "Traceback" not in err and "resource_tracker" not in err, err
    assert "a grid worker process was sent SIGTERM from outside the grid" in err
    _wait_for_exit(workers)


def _meet(folder: str) -> None:
    """Both workers hold a task at once: the first done could otherwise take the other task too."""
    import os
    import time

    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)


def _own_pid(folder: str) -> list[int]:
    import os

    _meet(folder)
    return [os.getpid()]


def _long(folder: str) -> list:
    import time

    _meet(folder)
    time.sleep(120)
    return []


@pytest.mark.slow
def test_a_worker_sent_sigterm_between_cells_stops_the_grid_in_one_line(tmp_path):
    """A worker waiting for its next cell, sent SIGTERM from outside, left the pool there: the grid said a worker
    had died (re-run with --jobs 1). Exiting in the pool's own code could also leave half a message in the pipe the
    workers share, which the other read as garbage: the flaky EOFError traceback of the test above."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import os, signal, time\nfrom fedcache.grids.pool import in_workers\n"
            "from tests.grids.test_pool import _long, _own_pid\n"
            f"tasks = [(_own_pid, ({str(tmp_path)!r},)), (_long, ({str(tmp_path)!r},))]\n"
            "try:\n"
            "    for pid in in_workers(2, tasks):\n"
            "        time.sleep(0.5)  # back in the pool, waiting for a cell that will not come\n"
            "        t0 = time.monotonic()\n"
            "        os.kill(pid, signal.SIGTERM)\n"
            "except Exception as e:\n"
            "    print(e)\n"
            "    print(time.monotonic() - t0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[2],
                         timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "resource_tracker" not in out.stderr, out.stderr
    line, took = out.stdout.splitlines()
    assert "a grid worker process was sent SIGTERM from outside the grid" in line
    assert float(took) < 10  # the other worker stopped too, not left to train its 120 s


def test_where_a_sigterm_found_a_worker_is_never_an_error_in_its_handler():
    """A frame the check cannot read (a Python whose queue or lock has other code) is not the wait for a cell: an
    error raised in the handler would land wherever the signal found the worker."""
    import sys
    from multiprocessing.queues import Queue

    from fedcache import workers

    class Unreadable:
        @property
        def f_code(self):
            raise RuntimeError("no code here")

    assert workers._waits_for_a_cell(Unreadable()) is False
    assert workers._waits_for_a_cell(sys._getframe()) is False
    assert workers._waits_for_a_cell(type("Frame", (), {"f_code": Queue.get.__code__})()) is True


def test_a_sigterm_between_cells_is_told_to_the_grid_not_raised(monkeypatch):
    """Between cells a worker is in the pool's own code: SystemExit raised there is what tore the pool's messages.
    The worker tells the grid instead, and refuses the next cell it is handed; in a cell it raises, once."""
    import multiprocessing
    import signal

    from fedcache import workers

    reader, writer = multiprocessing.Pipe(duplex=False)
    with reader, writer:  # closed when the test ends, passed or not: no pipe left to the interpreter's end
        monkeypatch.setattr(workers, "_report_to", writer)
        monkeypatch.setattr(workers, "_stopping", False)
        workers._exit_on_sigterm(signal.SIGTERM, None)
        assert reader.poll(5) and reader.recv_bytes() == workers.SIGTERM_SAID
        workers._exit_on_sigterm(signal.SIGTERM, None)  # the grid's own, as it stops its workers: already told
        assert not reader.poll(0.1)
        with pytest.raises(SystemExit):
            workers.unless_stopping(None, print, "a cell it must not run")
        cleaned = []

        def cell():
            try:
                workers._exit_on_sigterm(signal.SIGTERM, None)
            finally:
                workers._exit_on_sigterm(signal.SIGTERM, None)  # the grid's own, stopping its workers: the clean-up runs
                cleaned.append(True)

        monkeypatch.setattr(workers, "_stopping", False)
        with pytest.raises(SystemExit):
            workers.unless_stopping(None, cell)
        assert cleaned and not reader.poll(0.1)


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
def test_workers_of_a_grid_killed_with_sigkill_leave_with_it(toy_store, tmp_path):
    """kill -9 reaches the grid only; its workers used to live on, training and writing into the directory that
    the next command takes over."""
    import os
    import signal

    out = tmp_path / "grid"
    proc = _grid_process(toy_store, out, "-m", "fedavg,fedprox,fedproto,solo", "--rounds", "100000", "--jobs", "2",
                         "--engine", "processes")
    try:
        _wait_for(proc, lambda: len(list(out.glob("cells/*/metrics.jsonl"))) >= 2)
        workers = _children(proc.pid)
        assert len(workers) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        _wait_for_exit(workers, seconds=5.0)
    finally:
        _kill_tree(proc)
        for w in [w for w in locals().get("workers", ()) if _alive(w)]:  # a failed test must not leave them
            os.kill(w, signal.SIGKILL)


def _sigint_handler() -> list:
    import signal

    return [(signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))]


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="needs signal masks")
@pytest.mark.slow
def test_workers_ignore_ctrl_c_which_the_grid_handles():
    """Ctrl-C reaches the whole process group: a worker still importing torch printed a traceback of its own
    before the grid's one line. Workers never get it (blocked from their start, then ignored); this process, once
    they are started, handles it as before."""
    import signal

    from fedcache.grids.pool import in_workers

    before = signal.getsignal(signal.SIGINT)
    assert list(in_workers(2, [(_sigint_handler, ()), (_sigint_handler, ())])) == [(signal.SIG_IGN, True)] * 2
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="needs signal masks")
def test_a_sigint_as_the_grid_starts_its_workers_still_stops_it():
    """The grid ignored SIGINT while it started its workers (so that they would ignore it), and one sent then was
    lost: a script's `kill -INT` on reading "grid started" left the grid training. Sent from inside the pool's
    submit (the workers start there), it must interrupt. In a process of its own: a signal to this one would stop
    pytest."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import os, signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"  # as a terminal's command
            "from concurrent.futures import ProcessPoolExecutor\nimport fedcache.grids.pool as pool\n"
            "class Signalled(ProcessPoolExecutor):\n"
            "    def submit(self, *args, **kwargs):\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "        return super().submit(*args, **kwargs)\n"
            "pool.ProcessPoolExecutor = Signalled\n"
            "try:\n"
            "    print(list(pool.in_workers(2, [(sorted, ([2, 1],)), (sorted, ([4, 3],))])))\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 0 and out.stdout.split() == ["interrupted"] and not out.stderr, (out.stdout, out.stderr)


def test_starting_workers_leaves_the_start_method_to_the_caller():
    """Starting a process, even from the spawn context, records the default start method for the child, which fixed
    it in the grid's process: the caller's own set_start_method then raised. In a process of its own (once fixed, it
    stays so)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import multiprocessing\nfrom fedcache.grids.pool import in_workers\n"
            "assert list(in_workers(2, [(sorted, ([2, 1],)), (sorted, ([4, 3],))])) in ([1, 2, 3, 4], [3, 4, 1, 2])\n"
            "multiprocessing.set_start_method('spawn')\nprint(multiprocessing.get_start_method())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert out.returncode == 0 and out.stdout.split() == ["spawn"], out.stderr


def _sigterm_then_init(*args) -> None:
    """A worker's initializer sent SIGTERM before it sets its handler: from outside, a scheduler's kill of every
    process of the job, which can find a worker still starting."""
    import os
    import signal

    from fedcache.workers import init_worker

    os.kill(os.getpid(), signal.SIGTERM)
    init_worker(*args)


@pytest.mark.slow
def test_a_worker_sent_sigterm_as_it_starts_stops_the_grid_in_one_line():
    """Before its initializer set its SIGTERM handler a worker died of the signal, and the grid took it for a crash:
    "a grid worker process died ... re-run with --jobs 1". The workers here send it themselves, as their
    initializer starts (in_workers passes workers.init_worker)."""
    out = _sorts_in_workers_started_by("_sigterm_then_init", cells=2)
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert "a grid worker process was sent SIGTERM from outside the grid" in out.stdout, out.stdout


def _sorts_in_workers_started_by(init: str, cells: int, held_up: bool = False, **env: str):
    """A subprocess running ``cells`` small cells on two grid workers whose initializer is this module's ``init``
    (in_workers passes workers.init_worker), the grid ``held_up`` after its submits (``_submits_then_waits``); what
    it printed: the cells' results, or the grid's line, then the pool's threads still running."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tasks = ", ".join(f"(sorted, ([{2 * i + 2}, {2 * i + 1}],))" for i in range(cells))
    code = (f"import fedcache.grids.pool as pool\nfrom tests.grids.test_pool import {init}, _submits_then_waits\n"
            f"pool.init_worker = {init}\n"
            + (f"_submits_then_waits(pool.ProcessPoolExecutor, {cells})\n" if held_up else "") +
            "try:\n"
            f"    print(list(pool.in_workers(2, [{tasks}])))\n"
            "except Exception as e:\n"
            "    print(e)\n"
            "import threading\n"
            "print('pool threads left:', [t.name for t in threading.enumerate()\n"
            "                             if type(t).__module__ == pool.ProcessPoolExecutor.__module__])\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[2], env=dict(os.environ, **env))


def _one_crashes_then_init(*args) -> None:
    """The first worker to start crashes; the other is still starting when the pool, broken, terminates it."""
    import os
    import time

    from fedcache.workers import init_worker

    try:
        os.close(os.open(os.environ["CRASH_MARK"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        time.sleep(30)
    else:
        os._exit(1)
    init_worker(*args)


def _submits_then_waits(pool_class, cells: int) -> None:
    """``pool_class.submit`` waits, once the ``cells``-th cell is submitted, until the crashing worker of
    ``_one_crashes_then_init`` has ended (the grid's thread held up on a loaded machine while a worker starts); the
    pool's own thread, broken by that death, terminates the other workers only a second after that wait: the crashed
    worker has ended and the other still runs as the grid goes on."""
    import os
    import threading
    import time
    from concurrent.futures import process

    submit, count, held = pool_class.submit, [], threading.Event()

    def submitted(self, *args, **kwargs):
        future = submit(self, *args, **kwargs)
        count.append(1)
        if len(count) == cells:
            deadline = time.monotonic() + 60
            while not os.path.exists(os.environ["CRASH_MARK"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the worker leaves right after it made the mark
            held.set()
        return future

    pool_class.submit = submitted
    manager = process._ExecutorManagerThread  # a test's hold-up: no private API in fedcache itself
    terminate = manager.terminate_broken

    def terminated_later(self, cause):
        held.wait(60)
        time.sleep(1)  # the grid's thread goes on from its submits meanwhile
        for worker in self.processes.values():  # ended and reaped here first: the grid reads how each ended,
            worker.terminate()                   # and one the pool reaped as the grid read it said nothing
        for worker in self.processes.values():
            worker.join()
        return terminate(self, cause)

    manager.terminate_broken = terminated_later
    join = manager.join_executor_internals

    def joined_later(self):
        time.sleep(1)  # still closing its pipes when the grid has said its line: Python's exit raced it (CI)
        return join(self)

    manager.join_executor_internals = joined_later


@pytest.mark.slow
@pytest.mark.parametrize("held_up", [False, True])
def test_a_worker_that_crashes_as_it_starts_is_not_taken_for_a_sigterm(tmp_path, held_up):
    """A crashed worker breaks the pool, which then sends SIGTERM to the others: the grid still says a worker died
    (re-run with --jobs 1), though every other worker ended by SIGTERM; also when the worker crashed before the
    grid's thread, held up, went on from its submits (CI's failure: the crashed worker was not among those it knew
    of). The pool's own thread has ended with the grid: one still closing its pipes as Python exited printed a
    traceback after the grid's line (CI, Python 3.11)."""
    # Three cells for two workers: ProcessPoolExecutor wakes its manager thread before it spawns a worker, so with
    # as many cells as workers the last one's death can go unseen until another worker's result (here, 30 s on):
    # the third submit wakes it after both exist (in 5 of 10 runs with two cells, none of 8 with three).
    out = _sorts_in_workers_started_by("_one_crashes_then_init", cells=3, held_up=held_up,
                                       CRASH_MARK=str(tmp_path / "crashed"))
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert "a grid worker process died" in out.stdout, out.stdout
    assert "pool threads left: []" in out.stdout, out.stdout  # ended with the grid: none for Python's exit to race


def _deaf_to_sigterm(ready) -> None:
    """A worker that does not stop when asked (one busy in C code under heavy load does not, in time)."""
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def test_workers_that_do_not_stop_in_time_are_killed_and_it_is_said(caplog):
    """Killed, a worker leaves its cell's lock and the semaphores it registered (Python's resource tracker then
    warns of them as leaked under the grid's line): the grid says first why, and that nothing is lost."""
    import logging
    import multiprocessing

    from fedcache.grids import pool

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    deaf = ctx.Process(target=_deaf_to_sigterm, args=(ready,))
    deaf.start()
    try:
        assert ready.wait(60)
        with caplog.at_level(logging.WARNING, logger="fedcache.grids.pool"):
            assert pool._stop({deaf}, grace=0.2) == 1
        deaf.join(10)
        assert deaf.exitcode == -9
    finally:
        deaf.kill()
    assert [r.getMessage() for r in caplog.records] == [
        "1 grid worker did not stop within 0.2 s and was killed; a re-run resumes its cells from their last checkpoints "
        "(Python may then warn of semaphores they leaked: it removes them as it exits)"]


def _holder():
    import os

    from fedcache.ownership import Holder

    return [(os.getpid(), Holder.me())]


@pytest.mark.slow
def test_a_worker_holds_its_cells_for_the_grid(tmp_path):
    """A killed worker's cell lock named the worker with the grid's command line; the re-run then blamed a `fedcache
    grid` that had stopped cleanly. A worker holds for the grid (the command to stop), and says it is its worker;
    the grid started when it took its directory (its workers' records said: when they were started)."""
    import os
    import time

    from fedcache.grids.pool import in_workers
    from fedcache.ownership import LOCK, Holder, hold

    with hold(tmp_path, "the grid directory"):
        me = Holder.parse((tmp_path / LOCK).read_text())
        time.sleep(1.1)  # the record's time is to the second: the workers start in another
        for worker, holder in in_workers(2, [(_holder, ()), (_holder, ())]):
            assert (holder.pid, holder.command, holder.via, holder.started) == (os.getpid(), me.command, worker,
                                                                                 me.started) and worker != os.getpid()


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.slow
def test_a_grid_whose_workers_were_killed_says_so_and_its_rerun_does_not_blame_it(toy_store, tmp_path):
    """The grace forced to 0 s (heavy load: workers that do not leave within 5 s): the stopped grid says that it
    killed them, and the re-run, taking over their cells' locks, names them as the grid's workers."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "grid"
    options = ["-m", "fedavg,fedprox", "--rounds", "100000", "--jobs", "2", "--engine", "processes"]
    started = lambda n: lambda: len(list((out / "cells").glob("*/checkpoint.pt"))) >= n  # noqa: E731
    grace_0 = ("import sys\nimport fedcache.grids.pool as pool\nfrom fedcache.cli.root import _console_script\n"
               "pool.STOP_GRACE = 0.0\nsys.argv[0] = 'fedcache'\n_console_script()\n")
    first = _grid_process(toy_store, out, *options, python=[sys.executable, "-c", grace_0])
    try:
        _wait_for(first, started(2))
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    finally:
        _kill_tree(first)
    lines = err.splitlines()
    said = next(i for i, l in enumerate(lines) if "2 grid workers did not stop within 0 s and were killed" in l)
    assert first.returncode == 143 and lines[said + 1].startswith("interrupted"), err
    again = _grid_process(toy_store, out, *options)
    try:
        # Each cell's lock is taken over, and the round after the checkpoint written, before it is stopped.
        _wait_for(again, lambda: sum(f"\"pid\": {again.pid}," in (c / ".fedcache.lock").read_text()
                                     for c in (out / "cells").iterdir() if (c / ".fedcache.lock").exists()) == 2)
        again.send_signal(signal.SIGTERM)
        _, err = again.communicate(timeout=60)
    finally:
        _kill_tree(again)
    # A worker killed once its cell had let go (as it was exiting) left no lock: one line at least, each of them right,
    # and written as the CLI writes its log lines.
    taken = [l for l in err.splitlines() if "taking it over" in l]
    assert taken and all(f", working for pid {first.pid} on " in l and "stopped without letting go" not in l for l in taken), err
    assert all(l.startswith("WARNING fedcache.ownership: the run directory ") for l in taken), err


def test_the_worker_initializer_s_module_imports_no_torch():
    """Unpickling a worker's initializer imports its module before the initializer runs: in fedcache.grids.pool,
    that was torch (seconds), and the worker had no SIGTERM handler nor SIGINT ignored all that time."""
    import subprocess
    import sys
    from pathlib import Path

    from fedcache.grids import pool

    assert pool.init_worker.__module__ == "fedcache.workers"
    code = "import sys, fedcache.workers\nprint(sorted({'torch', 'numpy', 'fedcache.grids'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert out.stdout.split() == ["[]"], out.stderr


# Each process of the grid writes, as it exits, whether it is a spawned worker and whether it imported the CLI.
SAYS_WHAT_IT_IMPORTED = '''
import atexit, os, sys


def _said():
    spawned = "multiprocessing" in sys.modules and sys.modules["multiprocessing"].parent_process() is not None
    with open(os.path.join(os.environ["FEDCACHE_TEST_IMPORTED"], str(os.getpid())), "w") as fh:
        fh.write(f"{spawned} {'fedcache.cli' in sys.modules}")


atexit.register(_said)
'''


def _console_script_as_pip_writes_it(folder):
    """The `fedcache` script that pip writes for pyproject.toml's [project.scripts] entry: a file importing the
    entry point at its top (pip's template, as in a virtualenv's bin/)."""
    import sys
    import tomllib
    from pathlib import Path

    entry = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]["fedcache"]
    module, function = entry.split(":")
    script = folder / "fedcache"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nif __name__ == '__main__':\n"
                      f"    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n    sys.exit({function}())\n")
    return script


@pytest.mark.slow
def test_the_console_script_s_grid_workers_do_not_import_the_cli(toy_store, tmp_path):
    """A spawned worker re-runs its parent's main script before its first cell: the console script's import of
    `fedcache.cli` (typer, rich: half a second of each worker's start, without its SIGTERM handler) ran in every
    worker of `fedcache grid --jobs N`. The entry point imports the CLI only when the command runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    site, said = tmp_path / "site", tmp_path / "said"
    site.mkdir()
    said.mkdir()
    (site / "sitecustomize.py").write_text(SAYS_WHAT_IT_IMPORTED)
    script = _console_script_as_pip_writes_it(tmp_path)
    cmd = [sys.executable, str(script), "grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE,
           "--partition", "iid", "--clients", "2", "-m", "fedavg,fedprox", "--rounds", "1", "--jobs", "2",
           "--engine", "processes", "-o", str(tmp_path / "grid")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(Path(__file__).parents[2])]),
               FEDCACHE_TEST_IMPORTED=str(said))
    grid = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = grid.communicate(timeout=120)
    finally:
        _kill_tree(grid)
    assert grid.returncode == 0, err
    seen = {int(f.name): f.read_text().split() for f in said.iterdir()}
    workers = [cli for pid, (worker, cli) in seen.items() if worker == "True"]
    assert seen[grid.pid] == ["False", "True"] and 1 <= len(workers) <= 2, seen  # the check sees the CLI's import
    assert workers == ["False"] * len(workers), seen


SPY_ON_HANDLERS = '''
import signal, sys

SEEN = []


def _spy(signum, handler, _real=signal.signal):
    """In a worker (this script, re-imported there as __mp_main__): whether torch was imported as SIGTERM's handler
    was set."""
    if signum == signal.SIGTERM and __name__ == "__mp_main__":
        SEEN.append("torch" in sys.modules)
    return _real(signum, handler)


signal.signal = _spy


def seen():
    return [list(SEEN)]


if __name__ == "__main__":
    from fedcache.grids.pool import in_workers

    print(list(in_workers(2, [(seen, ()), (seen, ())])))
'''


@pytest.mark.slow
def test_a_worker_s_signal_handlers_are_set_before_it_imports_torch(tmp_path):
    """The order as a worker runs it: its initializer sets SIGTERM's handler with torch not yet imported (a spy in
    the main script, which each spawned worker runs first)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "grid_script.py"
    script.write_text(SPY_ON_HANDLERS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[[False],", "[False]]"], out.stdout


def _logs(text: str) -> list[str]:
    import logging

    logging.getLogger("fedcache.in_a_worker").warning("%s warned", text)
    logging.getLogger("fedcache.in_a_worker").info("%s informed", text)
    logging.getLogger("elsewhere").info("%s: not at the grid's level for this logger", text)
    return [text]


@pytest.mark.slow
def test_a_worker_s_log_records_are_written_by_the_grid_s_handlers(caplog, capfd):
    """A worker's records (a cell lock's takeover line) went through logging.lastResort: no ``WARNING name:``, and
    written whatever FEDCACHE_LOG said. They are handled by the grid's logger of their name, at its levels."""
    import logging
    import os

    from fedcache.grids.pool import in_workers

    with caplog.at_level(logging.INFO, logger="fedcache"):
        assert sorted(in_workers(2, [(_logs, ("one",)), (_logs, ("two",))])) == ["one", "two"]
    got = sorted((r.name, r.levelname, r.getMessage()) for r in caplog.records if r.process != os.getpid())
    assert got == [("fedcache.in_a_worker", "INFO", "one informed"), ("fedcache.in_a_worker", "INFO", "two informed"),
                   ("fedcache.in_a_worker", "WARNING", "one warned"), ("fedcache.in_a_worker", "WARNING", "two warned")]
    assert "warned" not in capfd.readouterr().err  # nor written by the worker itself


def test_a_worker_s_record_is_one_write_to_the_pipe(caplog):
    """Every worker writes to one pipe, without a lock: a record longer than PIPE_BUF could be interleaved with
    another's, so it is cut to fit; the grid handles it as its own, with the worker's pid."""
    import logging
    import select

    from fedcache.workers import log_from_worker, record_bytes

    said = record_bytes(logging.WARNING, "fedcache.x", "é" * 10_000 + "\nValueError: the reason")
    assert len(said) <= getattr(select, "PIPE_BUF", 512) - 4 and b" [...] " in said
    assert said.endswith("\nValueError: the reason".encode())  # a traceback's last line kept
    with caplog.at_level(logging.WARNING):
        log_from_worker(record_bytes(logging.WARNING, "fedcache.x", "a 100% line"))
        log_from_worker(record_bytes(logging.INFO, "fedcache.x", "below the level"))
        log_from_worker(said)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records][:1] == [
        ("fedcache.x", "WARNING", "a 100% line")]
    assert len(caplog.records) == 2 and caplog.records[1].getMessage().startswith("éé")


def test_a_logging_filter_that_raises_does_not_stop_the_grid_hearing_its_workers(capfd):
    """The thread reading the workers' pipe writes their records through the caller's logging and hears their SIGTERM:
    a filter of the caller's that raised ended it, and a SIGTERM said after was never heard (the grid then hung once
    the workers' records filled the pipe)."""
    import logging
    import multiprocessing
    import threading
    from concurrent.futures import Future

    from fedcache.grids.pool import _GRID_DONE, _listen
    from fedcache.workers import SIGTERM_SAID, record_bytes

    def refuse(record):
        raise RuntimeError("a filter that fails")

    logger = logging.getLogger("fedcache.filtered")
    logger.addFilter(refuse)
    reader, writer = multiprocessing.Pipe(duplex=False)
    sigterm: Future = Future()
    listening = threading.Thread(target=_listen, args=(reader, sigterm))
    try:
        listening.start()
        writer.send_bytes(record_bytes(logging.WARNING, "fedcache.filtered", "a record"))
        writer.send_bytes(SIGTERM_SAID)
        assert isinstance(sigterm.exception(timeout=10), SystemExit)
        writer.send_bytes(_GRID_DONE)
        listening.join(10)
        assert not listening.is_alive()
    finally:
        logger.removeFilter(refuse)
        writer.close()
        reader.close()
    assert "could not be written (RuntimeError: a filter that fails); dropped" in capfd.readouterr().err



def _pid_once_both_started(folder: str) -> list[int]:
    """This worker's pid, once two workers took one of these cells each (a worker still importing torch as the grid
    stops does not leave until the import is done: seconds, past the grace on a loaded machine)."""
    import os
    import time
    from pathlib import Path

    (Path(folder) / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return [os.getpid()]


@pytest.mark.slow
@pytest.mark.parametrize("signum, said", [(9, "a grid worker process died"),
                                          (15, "a grid worker process was sent SIGTERM from outside the grid")])
def test_a_worker_gone_between_two_runs_of_kept_workers_stops_the_next_in_one_line(tmp_path, signum, said):
    """A --select grid keeps its workers between its stages and rungs (pool.Workers): one killed or sent SIGTERM
    while idle there stops the grid at its next rung with the grid's line for it, the other worker stopped too."""
    import os
    import time

    from fedcache.errors import FedcacheError
    from fedcache.grids.pool import Workers

    both = [(_pid_once_both_started, (str(tmp_path),))] * 2
    with pytest.raises(FedcacheError, match=said) as caught, Workers(2) as workers:
        first = set(workers.run(both))
        assert len(first) == 2 and os.getpid() not in first
        os.kill(min(first), signum)
        # Idle, the pool (a worker killed) or the grid's thread that reads the workers' pipe (one sent SIGTERM) hears
        # it. A fixed half second was too short under two parallel suites: the other worker then trained both cells.
        deadline = time.monotonic() + 60
        while not _heard(workers, signum) and time.monotonic() < deadline:
            time.sleep(0.05)
        list(workers.run(both))
    assert "\n" not in str(caught.value)
    deadline = time.monotonic() + 5  # a killed one (the grid's _stop) takes a moment to end
    while any(map(_running, first)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_running, first))  # both gone with the grid's line


def _heard(workers, signum: int) -> bool:
    """The grid's ``workers`` know of the signal one of them was sent: a kill broke the pool, a SIGTERM was reported."""
    if signum == 15:
        return workers._sigterm.done()
    return bool(workers._pool._broken)  # the pool's own record (a test's look inside: fedcache never reads it)


def _running(pid: int) -> bool:
    """``pid`` runs: neither gone nor ended and not yet reaped (the pool's own thread may be reaping it)."""
    import os

    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _own_pid_later(folder: str) -> list[int]:
    """``_own_pid``, a second later: the other worker is back first, reading the pool's queue (holding its lock)."""
    import os
    import time

    _meet(folder)
    time.sleep(1.0)
    return [os.getpid()]


def _long_with_slow_clean_up(folder: str) -> list:
    """A cell that takes 1.5 s to leave once stopped (a checkpoint written as it is interrupted)."""
    import time

    try:
        _long(folder)
    finally:
        time.sleep(1.5)
    return []


def _ends_without_a_kill(workers, cells, caplog) -> float:
    """Seconds ``workers``' ``cells`` took to stop in the grid's one line, none of its workers killed by the grid."""
    import logging
    import time

    from fedcache.errors import FedcacheError

    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="fedcache.grids.pool"), \
            pytest.raises(FedcacheError, match="a grid worker process died"):
        with workers:
            list(cells)
    assert not [r for r in caplog.records if "did not stop" in r.getMessage()]
    return time.monotonic() - t0


@pytest.mark.slow
def test_a_worker_killed_while_it_reads_the_queue_does_not_leave_the_others_waiting(tmp_path, monkeypatch, caplog):
    """A worker killed outright while idle, reading the queue for its next cell (after a rung), holds the queue's
    lock for good: the other idle worker waited for the pool's last message behind it until the grid killed it."""
    import os
    import time

    from fedcache.grids import pool

    monkeypatch.setattr(pool, "STOP_GRACE", 30.0)  # the old wait: 30 s, and "did not stop ... killed"
    workers = pool.Workers(2)
    reading, waiting = list(workers.run([(_own_pid, (str(tmp_path),)), (_own_pid_later, (str(tmp_path),))]))
    time.sleep(0.5)  # both idle
    os.kill(reading, 9)
    time.sleep(0.5)
    assert _ends_without_a_kill(workers, workers.run([(_own_pid, (str(tmp_path),))] * 2), caplog) < 15
    deadline = time.monotonic() + 5  # its pipes closed as it exits, it is not yet ended
    while _running(waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(waiting)


@pytest.mark.slow
def test_a_worker_killed_idle_beside_a_running_cell_does_not_leave_that_worker_waiting(tmp_path, monkeypatch, caplog):
    """Fewer cells than workers (a test stage): the idle one killed, the broken pool stops the other's cell, which
    is still cleaning up when the grid sends its SIGTERM; it then waited behind the dead worker's queue lock."""
    import os
    import time

    from fedcache.grids import pool

    monkeypatch.setattr(pool, "STOP_GRACE", 30.0)
    workers = pool.Workers(2)
    tasks = [(_own_pid, (str(tmp_path),)), (_long_with_slow_clean_up, (str(tmp_path),))]
    cells = workers.run(tasks)
    idle = next(cells)  # the cell that ends at once
    time.sleep(0.5)  # back in the pool, reading the queue for a cell that will not come
    os.kill(idle, 9)
    assert _ends_without_a_kill(workers, cells, caplog) < 15


def _closed_within(workers, seconds: float) -> BaseException | None:
    """What ``workers``' clean exit raised, or AssertionError if it had not returned after ``seconds``."""
    import threading

    said: list = []

    def close():
        try:
            workers.__exit__(None, None, None)
            said.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            said.append(exc)

    closing = threading.Thread(target=close, daemon=True)
    closing.start()
    closing.join(seconds)
    return said[0] if said else AssertionError(f"the workers' exit still waited after {seconds} s")


@pytest.mark.slow
def test_a_worker_killed_idle_as_the_workers_close_does_not_leave_the_others_waiting(tmp_path, monkeypatch):
    """Every result read (a --select grid's last stage), an idle worker killed outright as it read the queue holds
    its lock for good: the pool's own shutdown waited for the other worker behind it forever. Nothing was lost."""
    import os
    import time

    from fedcache.grids import pool

    monkeypatch.setattr(pool, "STOP_GRACE", 30.0)
    workers = pool.Workers(2)
    reading, waiting = list(workers.run([(_own_pid, (str(tmp_path),)), (_own_pid_later, (str(tmp_path),))]))
    time.sleep(0.5)  # both idle
    os.kill(reading, 9)
    time.sleep(0.5)
    try:
        assert _closed_within(workers, 15) is None
        deadline = time.monotonic() + 5  # its pipes closed as it exits, it is not yet ended
        while _running(waiting) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(waiting)
    finally:  # the old exit: the pool's thread joins this worker at the test process's exit
        if _running(waiting):
            os.kill(waiting, 9)


@pytest.mark.slow
def test_a_cell_left_unread_whose_worker_was_killed_is_the_grid_s_one_line(tmp_path):
    """The ``with`` block left without error before every result was read: the cells still finish, and one whose
    worker died is said (it ended the grid without a word, the cell's result lost)."""
    import multiprocessing
    import os
    import time

    from fedcache.errors import FedcacheError
    from fedcache.grids import pool

    before = {p.pid for p in multiprocessing.active_children()}
    workers = pool.Workers(2)
    cells = workers.run([(_own_pid, (str(tmp_path),)), (_long, (str(tmp_path),))])
    idle = next(cells)
    busy = {p.pid for p in multiprocessing.active_children()} - before - {idle}
    assert len(busy) == 1
    os.kill(busy.pop(), 9)
    time.sleep(0.5)
    said = _closed_within(workers, 30)
    assert isinstance(said, FedcacheError) and "a grid worker process died" in str(said), said
    assert str(said).count("\n") == 0


def _refused_once(flag: str) -> list:
    """Raises once ``flag`` exists (the test makes it after reading the other cell's row): the error is never first."""
    import time
    from pathlib import Path

    from fedcache.errors import ConfigError

    deadline = time.monotonic() + 60
    while not Path(flag).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{flag} never made")
        time.sleep(0.01)
    raise ConfigError("cell 2 refused: its one line")


def test_a_cell_error_whose_result_was_never_read_is_said_as_the_workers_close(tmp_path):
    """A caller that stops reading before the last cell and leaves the ``with`` block closes the workers cleanly; a
    cell among those unread that raised was then lost without a word. It is raised as its read would have raised it:
    by the block's exit, the erring cell held until the other's row was read."""
    import contextlib

    from fedcache.errors import ConfigError
    from fedcache.grids.pool import Workers

    flag = tmp_path / "read"
    block = contextlib.ExitStack()
    workers = block.enter_context(Workers(2))
    rows = workers.run([(sorted, ([2, 1],)), (_refused_once, (str(flag),))])
    try:
        assert next(rows) == 1
        flag.touch()
        with pytest.raises(ConfigError, match=r"^cell 2 refused: its one line$"):
            block.close()  # the with block left, the second cell's result unread
    finally:
        flag.touch()  # a failed read above: the erring cell not left waiting its minute for the flag
        rows.close()
        block.close()
