"""One command per directory (fedcache/ownership.py): another process's hold refuses at once, naming it; waiting
queues behind it; a lock file a killed holder left is taken over and said; the file goes when its holder lets
go, and no two holders ever overlap, even as files are removed and made again."""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fedcache.errors import DirectoryBusyError
from fedcache import ownership
from fedcache.ownership import LOCK, Holder, check_free, hold
from tests.faults import ROOT, held_elsewhere


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with held_elsewhere(tmp_path / "d") as proc:
        with pytest.raises(DirectoryBusyError) as exc:
            with hold(tmp_path / "d", "the grid directory d"):
                pass
        with pytest.raises(DirectoryBusyError):
            check_free(tmp_path / "d", "the grid directory d")
    text = str(exc.value)
    assert text.startswith("the grid directory d is in use by another fedcache command: ")
    assert f"pid {proc.pid} on {socket.gethostname()}" in text and "started " in text
    assert f"kill {proc.pid}" in text and "choose another --out" in text and "\n" not in text
    with hold(tmp_path / "d", "d"):  # free once its holder exits
        pass
    assert not (tmp_path / "d" / LOCK).exists()


def test_a_holder_that_has_not_yet_written_its_record_is_named_once_it_has(tmp_path):
    """Two commands started together: the loser may look while the winner holds the lock but has not written who
    it is yet (or the file still names the killed holder before it); the message waits a moment for the record."""
    import threading

    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / LOCK
    path.write_text(Holder(2**22 + 12345, socket.gethostname(), "fedcache grid (killed)", "2026-01-01T00:00:00+00:00").to_text())
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    me = Holder(os.getpid(), socket.gethostname(), "fedcache grid -o d", "2026-01-01T00:00:00+00:00")
    later = threading.Timer(0.3, lambda: (os.ftruncate(fd, 0), os.pwrite(fd, me.to_text().encode(), 0)))
    later.start()
    try:
        with pytest.raises(DirectoryBusyError) as exc:
            check_free(tmp_path / "d", "the grid directory d")
    finally:
        later.join()
        os.close(fd)
    assert f"pid {os.getpid()} on {socket.gethostname()} (`fedcache grid -o d`" in str(exc.value)


def test_check_free_creates_nothing(tmp_path):
    check_free(tmp_path / "missing", "the run directory missing")
    assert not (tmp_path / "missing").exists()


def test_waiting_queues_behind_the_holder(tmp_path):
    with held_elsewhere(tmp_path / "d") as proc:
        t0 = time.monotonic()
        with pytest.raises(DirectoryBusyError, match=r"\(waited 0.5 s\)"):
            with hold(tmp_path / "d", "d", wait=0.5):
                pass
        assert time.monotonic() - t0 >= 0.5
        proc.stdin.close()  # lets go in a moment
        with hold(tmp_path / "d", "d", wait=30):
            assert Holder.parse((tmp_path / "d" / LOCK).read_text()).pid == os.getpid()


def test_a_lock_a_killed_holder_left_is_taken_over_and_said(tmp_path, caplog):
    with held_elsewhere(tmp_path / "d") as proc:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert (tmp_path / "d" / LOCK).exists()  # left behind, but the kernel dropped its flock
        with caplog.at_level(logging.WARNING), hold(tmp_path / "d", "the run directory d"):
            pass
    said = [r.getMessage() for r in caplog.records if "taking it over" in r.getMessage()]
    assert len(said) == 1 and f"pid {proc.pid}" in said[0] and "the run directory d was left locked" in said[0]
    assert not (tmp_path / "d" / LOCK).exists()


def test_a_lock_a_killed_grid_worker_left_names_the_worker_and_its_grid(tmp_path, caplog):
    """A grid stopping kills the workers still running after a grace; each leaves its cell's lock. The record
    named the worker's pid with the grid's command line, and the re-run said that `fedcache grid` "stopped without
    letting go (killed?)", of a grid that had stopped cleanly."""
    grid = Holder(2**22 + 1, socket.gethostname(), "fedcache grid -o g", "2026-01-01T00:00:00+00:00")
    (tmp_path / LOCK).write_text(Holder(**{**grid.__dict__, "via": 2**22 + 2}).to_text())
    with caplog.at_level(logging.WARNING), hold(tmp_path, "the run directory c"):
        pass
    said = [r.getMessage() for r in caplog.records if "taking it over" in r.getMessage()]
    assert len(said) == 1 and "stopped without letting go" not in said[0], said
    assert said[0].startswith(f"the run directory c was left locked by pid {2**22 + 2}, working for pid {2**22 + 1} "
                              f"on {socket.gethostname()} (`fedcache grid -o g`"), said
    assert "the command it worked for kills it when it does not stop in time" in said[0]


def test_a_process_working_for_another_holds_for_it(tmp_path, monkeypatch):
    """A grid's worker holds its cells for the grid: a command refused there is told to stop the grid (the
    process its user started), and the record still says which process took the lock."""
    grid = Holder(os.getppid(), socket.gethostname(), "fedcache grid -o g", "2026-01-01T00:00:00+00:00")
    monkeypatch.setattr(ownership, "_working_for", grid)
    with hold(tmp_path, "c"):
        held = Holder.parse((tmp_path / LOCK).read_text())
    assert held == Holder(grid.pid, grid.host, grid.command, grid.started, via=os.getpid())


def test_while_a_process_holds_a_directory_its_record_is_the_one_it_wrote(tmp_path):
    """A grid gave its workers Holder.me() as it started them: its cells' locks said the grid had started then
    (minutes later; with --select, hours). What a process holds, or its workers hold, names its command as started
    when it took its directory; once it lets go, a later command of the process is its own."""
    with hold(tmp_path / "g", "g"):
        grid = Holder.parse((tmp_path / "g" / LOCK).read_text())
        time.sleep(1.1)  # the record's time is to the second
        assert Holder.me() == grid
        with hold(tmp_path / "other", "other"):
            assert Holder.parse((tmp_path / "other" / LOCK).read_text()) == grid
    assert Holder.me().started != grid.started


def test_a_record_left_in_an_unlocked_file_is_taken_over(tmp_path, caplog):
    (tmp_path / LOCK).write_text(Holder(999999, "elsewhere", "fedcache grid -o x", "2020-01-01T00:00:00+00:00").to_text())
    with caplog.at_level(logging.WARNING), hold(tmp_path, "x"):
        assert Holder.parse((tmp_path / LOCK).read_text()).pid == os.getpid()
    assert "pid 999999 on elsewhere" in caplog.text


def test_a_process_holds_a_directory_once_and_what_is_below_it(tmp_path):
    with hold(tmp_path / "grid", "grid"):
        with hold(tmp_path / "grid", "grid"), hold(tmp_path / "grid" / "cells" / "c", "cell"):
            assert not (tmp_path / "grid" / "cells" / "c" / LOCK).exists()  # already this process's
            check_free(tmp_path / "grid", "grid")
        assert (tmp_path / "grid" / LOCK).exists()  # the inner holds do not let go of the outer
    assert not (tmp_path / "grid" / LOCK).exists()


def test_a_directory_below_one_this_process_holds_is_made_as_any_other(tmp_path):
    """hold() says it creates its directory: below a held one it made nothing, and its caller (``fedcache shard``
    into flower-sim's run directory) met a missing directory."""
    with hold(tmp_path / "run", "run"):
        with hold(tmp_path / "run" / "shards" / "a", "shards"):
            assert (tmp_path / "run" / "shards" / "a").is_dir()
            (tmp_path / "run" / "shards" / "a" / "x").write_text("x")
        with hold(tmp_path / "run" / "empty", "empty"):
            assert (tmp_path / "run" / "empty").is_dir()
        assert not (tmp_path / "run" / "empty").exists()  # made for the hold alone, removed as at the top
    assert (tmp_path / "run" / "shards" / "a" / "x").exists()


def test_a_directory_made_for_the_lock_alone_is_removed(tmp_path):
    with hold(tmp_path / "new", "new"):
        pass
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with hold(tmp_path / "kept", "kept"):
        pass
    assert (tmp_path / "kept").is_dir()


def test_a_folder_whose_file_system_takes_no_lock_file_is_refused_not_waited_on(tmp_path, monkeypatch):
    """/proc (to root) is a folder that takes no new file: "No such file or directory", which hold() took for a
    folder its last holder had just removed, made it again and tried the lock file again, for ever."""
    real, tries = os.open, []

    def refused(path, flags, *args, **kwargs):
        if os.path.basename(path) == LOCK:
            tries.append(path)
            if len(tries) > 10_000:
                raise RuntimeError("still trying")
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(FileNotFoundError):
        with hold(tmp_path / "new", "the run directory new"):
            pass
    assert len(tries) == ownership.REMAKES + 1 and not (tmp_path / "new").exists()


def test_a_file_system_without_locks_is_said_and_not_fatal(tmp_path, monkeypatch, caplog):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with caplog.at_level(logging.WARNING), hold(tmp_path, "the grid directory x"):
        with hold(tmp_path / "cells" / "c", "the run directory c", inside=True):  # said once, not for every cell
            pass
    assert caplog.text.count("cannot lock files") == 1, caplog.text
    # The lock file locked nothing: left, every cell kept one for good, and a batch's folder was never removed.
    assert not list(tmp_path.rglob(LOCK))


def test_a_grid_s_worker_does_not_say_again_that_files_cannot_be_locked(tmp_path, monkeypatch, caplog):
    """A spawned worker of a grid (--jobs N) holds nothing of its own: it said so for every cell it locked, each
    line forwarded to the grid's log under the grid's own."""
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(ownership, "_working_for", Holder(1, socket.gethostname(), "fedcache grid -o x", "2026-01-01"))
    with caplog.at_level(logging.WARNING):
        for name in ("a", "b"):
            with hold(tmp_path / "cells" / name, f"the run directory {name}", inside=True):
                pass
    assert "cannot lock files" not in caplog.text


SWAPPER = """
import os, sys, time
from fedcache.ownership import hold
log, me = sys.argv[1] + "/log", str(os.getpid())
for _ in range(int(sys.argv[2])):
    with hold(sys.argv[1] + "/d", "d", wait=60):
        with open(log, "a") as fh:
            fh.write("in " + me + "\\n")
        time.sleep(0.002)
        with open(log, "a") as fh:
            fh.write("out " + me + "\\n")
"""


def test_holders_never_overlap_while_the_file_is_removed_and_made_again(tmp_path):
    """Each release removes the lock file while others wait on it; a waiter must then not count its lock on the
    removed file (the two would overlap): every "in" is followed by its own "out"."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", SWAPPER, str(tmp_path), "40"], env=env) for _ in range(3)]
    for p in procs:
        assert p.wait(120) == 0
    lines = (tmp_path / "log").read_text().split("\n")[:-1]
    assert len(lines) == 3 * 40 * 2
    for i in range(0, len(lines), 2):
        assert lines[i].startswith("in ") and lines[i + 1] == "out " + lines[i][3:], lines[i:i + 2]


def test_the_holder_record_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/fedcache", "grid", "-o", "runs/my grid"])
    with hold(tmp_path, "x"):
        record = json.loads((tmp_path / LOCK).read_text())
    assert record["command"] == "fedcache grid -o 'runs/my grid'" and record["pid"] == os.getpid()


def test_a_process_holding_for_the_command_that_started_it_is_named_as_that_command(tmp_path, monkeypatch):
    """The Flower simulation's process holds --out for the `fedcache train` that started it: a refused command named
    the simulation's pid and `sim.py /tmp/.../request.json ...`, not the command the user can see and stop."""
    from fedcache.ownership import busy

    user = Holder(os.getppid(), socket.gethostname(), "fedcache train --engine flower-sim -o runs/x", "2026-01-01T00:00:00+00:00")
    monkeypatch.setattr(sys, "argv", ["/venv/lib/fedcache/flower/sim.py", "/tmp/call/request.json", "/tmp/call/answer.json"])
    with hold(tmp_path, "the run directory x", holder=user):
        assert Holder.parse((tmp_path / LOCK).read_text()) == dataclasses.replace(user, via=os.getpid())
        text = str(busy(tmp_path / LOCK, "the run directory x", "choose another --out"))
    assert f"pid {user.pid} on {user.host} (`fedcache train --engine flower-sim -o runs/x`" in text
    assert f"kill {user.pid}:" in text and "sim.py" not in text


def test_a_process_holding_for_a_command_killed_outright_is_named_itself(tmp_path):
    """flower-sim's child holds --out for its caller; a caller killed outright (SIGKILL) leaves the child ending for
    up to half a minute, and a refused command named the caller, a pid that was gone ('kill' it: nothing to kill)."""
    from fedcache.ownership import busy

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process
    user = Holder(gone.pid, socket.gethostname(), "fedcache train --engine flower-sim -o runs/x", "2026-01-01T00:00:00+00:00")
    with hold(tmp_path, "the run directory x", holder=user):
        start = time.monotonic()
        text = str(busy(tmp_path / LOCK, "the run directory x", "choose another --out"))
        assert time.monotonic() - start < 0.5  # a live holder: not waited for as one still writing its record
    assert (f"in use by another fedcache command: pid {os.getpid()} on {user.host} (working for `fedcache train "
            f"--engine flower-sim -o runs/x`, pid {gone.pid}, which is gone; started ") in text
    assert f"kill {os.getpid()}:" in text and "\n" not in text


def test_a_lock_on_a_file_its_holder_removed_is_no_lock(tmp_path, monkeypatch):
    """The race the removal makes, played in order: this process opens the lock file, its holder lets go
    (removing it), a third process makes and holds a new one, and only then does this process's flock run; it
    succeeds on the removed file, which must not count."""
    import fedcache.ownership as ownership

    real_flock, stack = fcntl.flock, []
    with held_elsewhere(tmp_path / "d") as first:
        (tmp_path / "d" / "keep").write_text("")  # the directory outlives its first holder

        def flock_after_the_swap(fd, op):
            if not stack:
                first.stdin.close()
                first.wait(10)
                stack.append(held_elsewhere(tmp_path / "d"))
                stack.append(stack[0].__enter__())
            return real_flock(fd, op)

        monkeypatch.setattr(ownership.fcntl, "flock", flock_after_the_swap)
        try:
            with pytest.raises(DirectoryBusyError) as refused:
                with hold(tmp_path / "d", "d"):
                    pass
            assert f"pid {stack[1].pid} " in str(refused.value)  # the third process, which holds the new file
        finally:
            if stack:
                stack[0].__exit__(None, None, None)


def test_a_credential_on_the_command_line_is_not_recorded(tmp_path, monkeypatch):
    """Flower starts each ServerApp with --token, its key to the SuperLink: the lock file (world-readable) and the
    message naming the holder (streamed to whoever submitted a resumed run) held its first hundred characters."""
    token = "a1b2c3" * 40
    for argv in (["/venv/bin/flwr-serverapp", "--runtime-api-address", "127.0.0.1:9091", "--token", token, "--insecure"],
                 ["/venv/bin/flwr-serverapp", f"--token={token}"]):
        monkeypatch.setattr(sys, "argv", argv)
        with hold(tmp_path / "run", "the run directory"):
            record = (tmp_path / "run" / LOCK).read_text()
        assert token[:6] not in record and "--token" in record and "flwr-serverapp" in record


def test_a_folder_another_holder_removes_as_this_one_makes_it_is_made_again(tmp_path, monkeypatch):
    """Holders remove the empty folders they made as they let go: one there as mkdir tried and gone when pathlib looked
    again raised FileExistsError out of hold() (a CI run of the test above). Faked: the first mkdir finds it "there"."""
    import os

    from fedcache.ownership import hold

    target, real, raced = tmp_path / "d", os.mkdir, []

    def mkdir(path, *args, **kwargs):
        if os.fspath(path) == str(target) and not raced:
            raced.append(path)
            raise FileExistsError(17, "File exists", str(path))  # made and removed by another holder meanwhile
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with hold(target, "the folder d"):
        assert target.is_dir() and raced
