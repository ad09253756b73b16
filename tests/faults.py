"""Helpers of the fault tests (issue 33): a small real file system, a faked full disk, a process that holds a
directory, and running the CLI in this process as a user would see it.

``small_disk`` mounts a tmpfs of a given size (root only: it skips where mounting is not possible, as on most CI
machines); ``FakeDisk`` makes the writes under a directory fail as a full file system does, by patching the calls
fedcache writes through (``os.write``, ``os.pwrite``, numpy's array writer) and the free space ``fedcache.disk``
sees, so the default suite covers the clean-up logic everywhere.
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
LEFTOVERS = ("*.tmp", "*.partial", ".*.partial")


# ---- a small real file system -----------------------------------------------------------------------------
def mount_tmpfs(where: Path, size: str) -> None:
    """Mount a tmpfs of ``size`` (``4m``) at ``where``, or skip the test."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("a small file system needs root to mount a tmpfs (the faked full disk covers the same code)")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until ``leave`` bytes are free (a filler file; delete it to free the space)."""
    filler = disk / "filler"
    filler.unlink(missing_ok=True)
    st = os.statvfs(disk)
    size = st.f_bavail * st.f_frsize - leave
    if size > 0:
        with open(filler, "wb") as fh:
            fh.truncate(0)
            block = b"\0" * (1 << 16)
            while size > 0:
                size -= fh.write(block[: min(len(block), size)])


def free_up(disk: Path) -> None:
    (disk / "filler").unlink(missing_ok=True)


def can_mount() -> bool:
    return sys.platform == "linux" and os.geteuid() == 0


class TightDisk:
    """A directory whose file system has ``leave(n)`` bytes free: a real tmpfs (``real``) filled up to that, or,
    where this process cannot mount one, the faked full disk below. ``free_up()`` gives the space back."""

    SIZE = "4m"

    def __init__(self, where: Path, monkeypatch, real: bool) -> None:
        self.path, self.real = where, real
        if real:
            mount_tmpfs(where, self.SIZE)
        else:
            where.mkdir(parents=True, exist_ok=True)
            self.fake = FakeDisk(monkeypatch, where, 1 << 40)

    def leave(self, n: int) -> None:
        if self.real:
            fill(self.path, n)
        else:
            self.fake.free = n

    def free_up(self) -> None:
        if self.real:
            free_up(self.path)
        else:
            self.fake.free = 1 << 40

    def close(self) -> None:
        if self.real:
            unmount(self.path)


# ---- a faked full disk --------------------------------------------------------------------------------------
class FakeDisk:
    """Writes to files below ``root`` may take ``free`` more bytes; the write that passes it writes what fits and
    then fails with ENOSPC (numpy's array writer with its short-write OSError, which has no errno). ``free_bytes``
    as fedcache.disk sees it is the same budget."""

    def __init__(self, monkeypatch, root: Path, free: int) -> None:
        import fedcache.disk as disk

        self.root, self.free = Path(root).resolve(), free
        self.paths: dict[int, Path] = {}
        real_open, real_write, real_pwrite, real_free = os.open, os.write, os.pwrite, disk.free_bytes
        real_write_array = np.lib.format.write_array

        def fake_open(path, flags, mode=0o777, *, dir_fd=None):
            fd = real_open(path, flags, mode, dir_fd=dir_fd)
            self.paths[fd] = Path(opened_path(path, dir_fd))
            return fd

        def take(fd: int, n: int) -> int:
            """How many of ``n`` bytes fit; raises ENOSPC when none do."""
            if not self.below(self.paths.get(fd)):
                return n
            if self.free <= 0 and n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            fits = min(n, self.free)
            self.free -= fits
            return fits

        def fake_write(fd, data):
            fits = take(fd, len(data))
            return real_write(fd, memoryview(data)[:fits])

        def fake_pwrite(fd, data, offset):
            fits = take(fd, len(data))
            return real_pwrite(fd, memoryview(data)[:fits], offset)

        def fake_write_array(fp, array, *args, **kw):
            name = Path(getattr(fp, "name", "")).resolve() if getattr(fp, "name", None) else None
            if not self.below(name):
                return real_write_array(fp, array, *args, **kw)
            buf = io.BytesIO()
            real_write_array(buf, array, *args, **kw)
            data = buf.getvalue()
            fits = min(len(data), max(self.free, 0))
            fp.write(data[:fits])
            self.free -= fits
            if fits < len(data):
                raise OSError(f"{len(data)} requested and {fits} written")

        def fake_free(path):
            return max(self.free, 0) if self.below(Path(path).absolute()) else real_free(path)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "write", fake_write)
        monkeypatch.setattr(os, "pwrite", fake_pwrite)
        monkeypatch.setattr(np.lib.format, "write_array", fake_write_array)
        monkeypatch.setattr(disk, "free_bytes", fake_free)

    def below(self, path: Path | None) -> bool:
        if path is None:
            return False
        path = Path(os.path.abspath(path))
        return path == self.root or self.root in path.parents


def leftovers(where: Path) -> list[Path]:
    """Temporary or partial files a write left behind."""
    return sorted(p for pattern in LEFTOVERS for p in Path(where).rglob(pattern))


# ---- the CLI as a user sees it -----------------------------------------------------------------------------
def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of ``fedcache argv`` in this process; an exception escaping main fails the test."""
    from fedcache.cli import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def one_error_line(err: str) -> str:
    """The one ``error:`` line of a refused command (log warnings may come before it)."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def cli_process(argv: list[str], cwd: Path | None = None, script: str | None = None, *args: str) -> subprocess.Popen:
    """``fedcache argv`` as its own process (this checkout first on the path), in a session of its own so that a
    test can kill it with its workers (``kill_all``). ``script`` (with ``args`` before ``argv``) runs instead of
    the plain CLI: ``TOY_CLI`` knows the tests' dataset."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), FEDCACHE_DEBUG="")
    head = ["-c", script, *args] if script else ["-m", "fedcache.cli"]
    return subprocess.Popen([sys.executable, *head, *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd, start_new_session=True)


# The CLI with the tests' dataset (test-toy) registered, as tests/conftest.py does in this process.
TOY_CLI = "import sys, tests.conftest\nfrom fedcache.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def kill_all(proc: subprocess.Popen) -> None:
    """``kill -9`` of a command and every process it started (its session): nothing lets go on its own."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def holder_pid(directory: Path) -> int | None:
    """The pid the lock file of ``directory`` names (fedcache/ownership.py), if any."""
    from fedcache.ownership import LOCK, read_holder

    holder = read_holder(Path(directory) / LOCK)
    return holder.pid if holder else None


HOLDER = """
import sys, time
from fedcache.ownership import hold
with hold(sys.argv[1], "the directory " + sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
"""


@contextlib.contextmanager
def held_elsewhere(directory: Path, script: str = HOLDER, *args: str):
    """Another process holding ``directory`` (ownership.hold) for the block; yields the process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script, str(directory), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "held", proc.stderr.read()
        yield proc
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_until(ready, seconds: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert proc is None or proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timeout"
        time.sleep(0.05)


@contextlib.contextmanager
def held_by_another_thread(lock, for_seconds: float = 0.5):
    """``lock`` (a lock's context manager) entered by another thread, let go ``for_seconds`` after this block
    starts: what this block does meanwhile meets it held. Yields the event set when it is let go."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    threading.Timer(for_seconds, release.set).start()
    try:
        yield release
    finally:
        release.set()
        thread.join()


def opened_path(path, dir_fd: int | None = None) -> str:
    """The absolute path ``os.open(path, ..., dir_fd=dir_fd)`` opens: a relative path is relative to the folder
    ``dir_fd`` is open on where given (shutil.rmtree opens so), not to the working directory."""
    path = os.fsdecode(path)
    if dir_fd is None or os.path.isabs(path):
        return os.path.abspath(path)
    import fcntl

    if hasattr(fcntl, "F_GETPATH"):  # macOS: no /proc
        folder = os.fsdecode(fcntl.fcntl(dir_fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\0"))
    else:
        folder = os.readlink(f"/proc/self/fd/{dir_fd}")
    return os.path.normpath(os.path.join(folder, path))


def deny_writes_in(monkeypatch, folder: Path, code: int = errno.EACCES) -> None:
    """Files and folders below ``folder`` refuse writes as another user's do (EACCES), or a read-only mount's
    (``code`` EROFS, an OSError that is no PermissionError), where this process is root (a real chmod does it
    otherwise): opening to write, and making a folder."""
    if not os.access(folder, os.W_OK) and code == errno.EACCES:
        return  # not root: the chmod already denies it
    real_open, real_mkdir, folder = os.open, os.mkdir, str(folder)

    def below(path) -> bool:
        return path == folder or path.startswith(folder + os.sep)

    def refuse(path):
        raise OSError(code, os.strerror(code), str(path))  # EACCES: Python makes it a PermissionError

    def fake_open(path, flags, mode=0o777, *, dir_fd=None):
        if below(opened_path(path, dir_fd)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def fake_mkdir(path, mode=0o777, *, dir_fd=None):
        where = opened_path(path, dir_fd)
        if below(where) and not os.path.isdir(where):
            refuse(path)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


def read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
