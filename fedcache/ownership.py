"""One command at a time in a directory: a run's (``train --out``) or a grid's (``grid --out``).

A command that writes such a directory holds an exclusive ``flock`` on ``<dir>/.fedcache.lock`` while it runs,
and writes into it who it is (pid, host, command line, start time; a Flower ServerApp, its run id). A second
command on the same directory is refused at once, with one line naming the holder and what to do: two writers of
one directory would replace each other's files and mix their numbers. The kernel drops a flock when its holder
dies (a crash, ``kill -9``), so the file a killed command leaves behind holds no lock: the next command takes it
over, says whose it was, and carries on as a re-run does (finished work kept, a checkpointed run resumed).

The file is removed when its holder lets go. A command that opened it just before (and waited) would then hold
a lock on a file no longer in the directory, so a lock counts only while its file is still the one at the path.
Within one process the lock is reentrant: a grid holds its directory, and the cells it trains in this process
(each a run directory below it) are already its own. It still takes each cell's lock as it trains it (``inside``):
a worker of a grid killed outright may still be writing there for a moment (or longer, stopped), holding it.

A store's entries are locked per entry and per part instead (fedcache/store/locks.py, with the same holder
record): several extractions of disjoint parts of one store are meant to run at once.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from fedcache.disk import FILE_MODE
from fedcache.errors import DirectoryBusyError
from fedcache.paths import removed_if_left_empty
from fedcache.wording import named

log = logging.getLogger(__name__)

LOCK = ".fedcache.lock"
POLL = 0.2  # seconds between tries while waiting
# Lock files refused for want of their folder, in a row, each after making it: past this, no holder removing it is
# racing this one; the folder is there and its file system takes no file (/proc as root).
REMAKES = 100
RESUMES = "a re-run resumes"  # a grid's; a run's needs --resume
_HELD: dict[Path, int] = {}  # directories this process holds -> how many holds are open on each
_RECORDS: dict[Path, Holder] = {}  # directories this process holds by their lock file -> the record it wrote
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a file system without flock


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: written into the lock file, read back for the message another command prints."""

    pid: int
    host: str
    command: str
    started: str  # ISO time, UTC: when its command took the first directory it holds (``me``)
    # The process holding it for the command ``pid`` (flower-sim's child), 0 for the command itself: a command killed
    # outright leaves it ending for seconds (ten at most: flower/sim.py's _interrupt_then_end), still holding, and
    # the line must name a process that lives.
    via: int = 0
    # The Flower run whose ServerApp this is (a deployment's run directory), 0 for any other holder: its submitter
    # stops it with `flwr stop <run id>`, from a machine where the ServerApp's pid means nothing.
    flower_run: int = 0

    @classmethod
    def me(cls) -> "Holder":
        """This process's record: the one it wrote for a directory it still holds, so that what it holds later and
        its workers' cells name its command as started when it took that (a grid's workers recorded the time the
        pool started, minutes or hours later with --select); else one started now."""
        if _working_for is not None:
            return _working_for.for_me()
        held = next(iter(_RECORDS.values()), None)
        return held or cls(os.getpid(), socket.gethostname(), command_line(),
                           _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    @classmethod
    def parse(cls, text: str) -> "Holder | None":
        """The holder a lock file records; None when it is empty or not a record (a holder still writing it)."""
        try:
            doc = json.loads(text)
            return cls(int(doc["pid"]), str(doc["host"]), str(doc["command"]), str(doc["started"]), int(doc.get("via", 0)),
                       int(doc.get("flower_run", 0)))
        except (ValueError, KeyError, TypeError):
            return None

    def to_text(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    def describe(self) -> str:
        """``pid 4242 on host-a (`fedcache grid ...`, started 2025-01-01T10:00:00+00:00, 3 min ago)``; the process
        holding it for a command that is gone, as working for that command; a Flower run's ServerApp, as that run."""
        started = f"started {self.started}{_ago(self.started)}"
        if self.to_stop != self.pid:
            return f"pid {self.via} on {self.host} (working for `{self.command}`, pid {self.pid}, which is gone; {started})"
        process = f"pid {self.pid} on {self.host} (`{self.command}`, {started})"
        return f"Flower run {self.flower_run}, whose ServerApp is {process}" if self.flower_run else process

    @property
    def stop_with(self) -> str:
        """How its user stops it: ``kill <pid>``; a Flower run's ServerApp, ``flwr stop <run id>``, its pid beside it
        (a SuperLink started again since without ``--database`` no longer knows the run, which may go on a while)."""
        kill = f"kill {self.to_stop}"
        if not self.flower_run:
            return kill
        return f"`flwr stop {self.flower_run}`, or {kill} on {self.host} if its SuperLink was started again since"

    @property
    def to_stop(self) -> int:
        """The pid to stop: the command's, or the process holding it for the command once that is gone."""
        return self.via if self.via and not _may_run(self.host, self.pid) else self.pid

    def for_me(self) -> "Holder":
        """This record as held by this process for its command (``via``)."""
        return self if self.pid == os.getpid() else replace(self, via=os.getpid())


_working_for: Holder | None = None  # set in a grid's worker process (``work_for``)


def work_for(holder: Holder) -> None:
    """What this process locks from now on, it holds for ``holder``'s command (the one to stop; this process as
    ``via``). For a grid's worker process only, which is the grid's own: a worker named itself, with the grid's
    command line, so a cell it left locked when killed was blamed on a `fedcache grid` that had stopped cleanly."""
    global _working_for
    _working_for = holder


# Options whose value is a credential: Flower starts each flwr-serverapp with --token, its key to the SuperLink. The
# lock file is world-readable and a refused command prints its holder, which a deployment streams to any submitter.
SECRET_OPTIONS = ("--token",)


def command_line(limit: int = 160) -> str:
    """This process's command as a user typed it: ``fedcache grid -o runs/x ...`` for the CLI, else the program;
    credentials (``SECRET_OPTIONS``) masked."""
    argv = list(sys.argv) or ["python"]
    head = "fedcache" if Path(argv[0]).name in ("fedcache", "__main__.py") else Path(argv[0]).name or "python"
    text = " ".join([head, *map(shlex.quote, _masked(argv[1:]))])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _masked(args: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(args):
        name = a.split("=", 1)[0]
        if i and args[i - 1] in SECRET_OPTIONS:
            a = "***"
        elif name in SECRET_OPTIONS and "=" in a:
            a = f"{name}=***"
        out.append(a)
    return out


def read_holder(path: Path) -> Holder | None:
    try:
        return Holder.parse(Path(path).read_text(errors="replace"))
    except OSError:
        return None


@contextlib.contextmanager
def hold(directory: Path | str, what: str, wait: float = 0.0, advice: str | None = None,
         resumes: str = RESUMES, holder: Holder | None = None, inside: bool = False) -> Iterator[None]:
    """Own ``directory`` (created if missing) for the block. ``what`` names it in messages (``the grid directory
    runs/x``); another command's hold is waited for up to ``wait`` seconds, then refused with DirectoryBusyError
    naming the holder, what to do, and ``advice`` (``resumes``: how its work is taken up once it is stopped). A
    directory this process already holds (or one below it) is its own. ``holder``: who is recorded as holding it,
    this process unless given (a process that works for the command a user started names that command: the one
    to wait for or stop). ``inside``: locked even below a directory this process holds (a grid's cell it trains
    itself): a worker of a grid killed outright may still be writing there, holding the cell's lock."""
    directory = Path(directory)
    key = directory.resolve()
    with removed_if_left_empty(directory):  # a command refused before writing leaves nothing behind
        _make(directory)
        mine = holder.for_me() if holder else Holder.me()
        nested = key in _HELD if inside else _held_here(key)
        with _nested(key) if nested else _locked(directory, key, what, wait, advice, resumes, mine):
            yield


def _make(directory: Path) -> None:
    """``mkdir -p`` of a folder that other holders make and remove (each removes the empty folders it made as it
    lets go): pathlib's ``exist_ok`` raises FileExistsError when the folder was there as mkdir tried and gone when
    it looked again; it is made again."""
    while True:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            return
        except FileExistsError:
            if os.path.lexists(directory) and not directory.is_dir():  # a file: no folder can be made there
                raise


@contextlib.contextmanager
def _nested(key: Path) -> Iterator[None]:
    _HELD[key] = _HELD.get(key, 0) + 1
    try:
        yield
    finally:
        _release_count(key)


@contextlib.contextmanager
def _locked(directory: Path, key: Path, what: str, wait: float, advice: str | None, resumes: str,
            holder: Holder) -> Iterator[None]:
    path = directory / LOCK
    fd = _acquire(path, what, wait, advice, resumes, holder)
    _HELD[key] = 1
    _RECORDS[key] = holder
    try:
        yield
    finally:
        _release_count(key)
        if fd is not None:
            _let_go(fd, path)
        else:  # no flock: the file locks nothing; left, every cell kept one and a batch's folder was never removed
            with contextlib.suppress(OSError):
                path.unlink()


def check_free(directory: Path | str, what: str, advice: str | None = None, resumes: str = RESUMES) -> None:
    """Refuse now (DirectoryBusyError) if another command holds ``directory``; nothing is created."""
    directory = Path(directory)
    path = directory / LOCK
    if _held_here(directory.resolve()) or not path.exists():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise busy(path, what, advice, resumes=resumes) from None
    except OSError:
        pass  # no flock here: hold() says so when it runs
    finally:
        os.close(fd)


def busy(path: Path, what: str, advice: str | None, wait: float = 0.0, resumes: str = RESUMES) -> DirectoryBusyError:
    """``advice``: what else to do; by default another --out (in a Python call, ``out``)."""
    advice = advice or named("choose another --out", "choose another out")
    holder = _settled_holder(path)
    who = holder.describe() if holder else "another process (it is starting)"
    waited = f" (waited {wait:g} s)" if wait else ""
    stop = f"stop it ({holder.stop_with}: finished work is kept and {resumes})" if holder else "stop it"
    return DirectoryBusyError(f"{what} is in use by another fedcache command{waited}: {who}; wait for it to finish, "
                              f"{stop}, or {advice}")


def _settled_holder(path: Path, settle: float = 1.0) -> Holder | None:
    """The holder's record once it has written it: a command that has just taken the lock writes its record a
    moment later, and until then the file is empty or still names a killed holder before it."""
    deadline = time.monotonic() + settle
    while True:
        holder = read_holder(path)
        if (holder is not None and may_run(holder)) or time.monotonic() >= deadline:
            return holder
        time.sleep(0.02)


def may_run(holder: Holder) -> bool:
    """False only for a holder on this host whose process is gone (and the process holding it for it, if any)."""
    return _may_run(holder.host, holder.pid) or bool(holder.via) and _may_run(holder.host, holder.via)


def _may_run(host: str, pid: int) -> bool:
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # alive, someone else's
    return True


def _held_here(key: Path) -> bool:
    return any(key == held or held in key.parents for held in _HELD)


def _release_count(key: Path) -> None:
    _HELD[key] -= 1
    if not _HELD[key]:
        del _HELD[key]
        _RECORDS.pop(key, None)


def _acquire(path: Path, what: str, wait: float, advice: str | None, resumes: str, holder: Holder) -> int | None:
    """The descriptor holding the lock on ``path``; None where the file system has no flock (said once)."""
    deadline, remade = time.monotonic() + wait, 0
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except FileNotFoundError:  # the holder before made the directory for its lock alone, and removed it
            remade += 1
            if remade > REMAKES:  # looped for ever in /proc
                raise
            _make(path.parent)
            continue
        remade = 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise busy(path, what, advice, wait, resumes) from None
            time.sleep(POLL)
            continue
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_FLOCK:
                raise
            # Said once, by the grid's own hold: not for a cell below it, nor in a grid's worker (it holds nothing).
            if _working_for is None and not _held_here(path.parent.resolve()):
                log.warning("%s: this file system cannot lock files (%s); nothing stops a second command from "
                            "writing it at the same time", what, exc.strerror)
            return None
        if is_current(fd, path):
            _record(fd, path, what, holder)
            return fd
        os.close(fd)  # its holder removed it as we opened it: try the file now at the path


def is_current(fd: int, path: Path) -> bool:
    """Whether ``fd`` is open on the file now at ``path``: a lock taken on a file its holder removed as it let go
    (and another command has made again since) is no lock."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _record(fd: int, path: Path, what: str, holder: Holder) -> None:
    """Say whose lock a killed command left behind, then write ours (``holder``)."""
    _say_left(fd, what)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.to_text().encode(), 0)
    except OSError as exc:  # a full disk: the lock holds all the same, and the write that needs space says so
        log.debug("%s: the holder's record was not written (%s)", path, exc)


def _say_left(fd: int, what: str) -> None:
    previous = Holder.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
    if previous is not None:
        log.warning("%s was left locked by %s; taking it over", what, _left_by(previous))


def _left_by(previous: Holder) -> str:
    if not previous.via:
        return f"{previous.describe()}, which stopped without letting go (killed?)"
    # A process holding it for a command lets go as it leaves, even when stopped; the command kills it when it does
    # not stop in time (a grid's workers, fedcache/grids/pool.py, which says so; flower-sim's child, sim.py).
    return (f"pid {previous.via}, working for pid {previous.pid} on {previous.host} (`{previous.command}`, started "
            f"{previous.started}{_ago(previous.started)}), which ended without letting go (killed? the command it "
            "worked for kills it when it does not stop in time)")


def _let_go(fd: int, path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()  # while still held: a command waiting on this file then sees it is no longer the lock
    os.close(fd)


def _ago(started: str) -> str:
    try:
        seconds = (_dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(started)).total_seconds()
    except ValueError:
        return ""
    if seconds < 0:
        return ""
    return f", {seconds:.0f} s ago" if seconds < 120 else f", {seconds / 60:.0f} min ago" if seconds < 7200 else f", {seconds / 3600:.1f} h ago"


def on_orphaned(parent: int, then: Callable[[], None], every: float = 0.1) -> None:
    """Call ``then`` from a daemon thread once this process's parent is no longer ``parent``. A process a command
    started (a grid's worker, the Flower simulation) cannot be stopped by a command killed outright (SIGKILL), and
    would go on writing the directory the next command takes over."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        then()

    threading.Thread(target=watch, daemon=True, name="on-orphaned").start()
