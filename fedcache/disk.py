"""Writing when the disk is full: one line naming the path and the space it needs, nothing half-written left.

A full file system (or a quota) shows up in many shapes: ``OSError: [Errno 28]`` from a write, numpy's short
write (``1000000 requested and 262112 written``, no errno), torch's zip writer (``unexpected pos 960 vs 854``).
Every write of fedcache's own files goes through here, so each becomes a ``DiskFullError`` that says which file,
about how much it needs and how much is free, after the write's temporary files are removed: the directory is as
the last finished write left it, and the same command continues once there is space. Where the size is known
before writing (a checkpoint, a grid's shared features, an entry of the store), it is checked first.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Iterator

from fedcache import interrupts
from fedcache.errors import DamagedFileError, DiskFullError
from fedcache.wording import named

# Files are made as open() makes them and the umask decides: in a store or run directory a group shares
# (umask 002), what one user wrote (a chunk, a run's files, a lock) stays writable by the others.
FILE_MODE = 0o666

# No room for what is being written: the disk, the user's quota, or the largest file allowed (a file system's
# limit, FAT32's 4 GB, or the shell's `ulimit -f`; Python ignores SIGXFSZ, so the write fails with EFBIG).
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# numpy's tofile reports a short write without an errno (wording differs across versions).
# Libraries that wrap the error (h5py) keep its text.
_SHORT_WRITE = re.compile(r"Not enough free space|\d+ requested and \d+ written|No space left on device|Disk quota exceeded"
                          r"|File too large")


def again(what: str = "", kept: str = "") -> str:
    """What a full disk's refusal advises, named for its caller (a command, or a Python call): ``what`` it is (the
    same ``grid`` command), ``kept``: what of its work a re-run takes up."""
    same = f"{what} {named('command', 'call')}" if what else named("command", "call")
    return f"free some space and run the same {same} again" + (f": {kept}" if kept else "")


BLOCK = 4096  # what a small file takes on the usual file systems: sizes are rounded up to it


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says there is no room left: the file system, the user's quota, a file-size limit."""
    if isinstance(exc, DiskFullError):
        return True
    if not isinstance(exc, OSError):
        return False
    return exc.errno in FULL_ERRNOS or bool(_SHORT_WRITE.search(str(exc)))


def free_bytes(path: Path | str) -> int | None:
    """Bytes this user may still write on the file system holding ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def human(n: int | float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def full_error(path: Path | str, what: str, need: int | None = None, advice: str | None = None,
               exc: BaseException | None = None, more: bool = False) -> DiskFullError:
    """The one line: which file, what it needs (about: ``need``; ``more``: besides what it wrote before the disk
    filled), what is free, what to do (``advice``: :func:`again` where not given)."""
    advice = advice or again()
    free = free_bytes(Path(path).parent)
    if getattr(exc, "errno", None) == errno.EFBIG or "File too large" in str(exc or ""):
        return DiskFullError(f"cannot write {what} {path}: it is larger than the largest file allowed there (the file "
                             "system's limit, 4 GB on FAT32, say, or the shell's `ulimit -f`)", advice, too_large=True)
    needs = f"it needs about {human(need or 0)}{' more' if more else ''}"
    if getattr(exc, "errno", None) == errno.EDQUOT:
        room = "your disk quota is reached" + (f" ({needs})" if need else "")
    elif free is None:
        room = needs if need else "the file system is full"
    elif need and need > free:
        room = f"{needs}, {human(free)} is free there"
    else:  # the estimate fell short, or there was none
        room = f"it needs more than the {human(free)} free there"
    return DiskFullError(f"no space left on the disk for {what} {path}: {room}", advice)


def on_disk(size: int) -> int:
    """What a file of ``size`` bytes takes: whole blocks."""
    return -(-size // BLOCK) * BLOCK


def full_disk(exc: OSError) -> DiskFullError:
    """A full-disk error raised by code that does not say what it was writing: said as well as it can be."""
    where = exc.filename or getattr(exc, "filename2", None)
    if where:
        return full_error(where, "writing", exc=exc)
    return DiskFullError(f"no space left on the disk ({exc})", again())


def check_space(path: Path | str, need: int, what: str, advice: str | None = None, margin: int = 0) -> None:
    """Refuse before writing ``need`` bytes at ``path`` where its file system has less free (plus ``margin`` for
    the metadata beside it)."""
    free = free_bytes(Path(path).parent)
    if free is not None and need + margin > free:
        raise full_error(path, what, need + margin, advice)


@contextlib.contextmanager
def on_full_disk(path: Path | str, what: str, need: int | None = None, remove: Iterable[Path] = (),
                 advice: str | None = None, left: Callable[[], int | None] | None = None) -> Iterator[None]:
    """Within the block, a write that finds the disk full removes ``remove`` (its temporary or partial files and
    folders) and raises DiskFullError naming ``path`` (an inner one, already said, passes through). ``left``: of a
    block whose writes are kept as they go (an entry's batches), what is still to write once the disk filled (None
    where nothing was written yet): said instead of ``need``, which was all of it, as what it needs more."""
    try:
        yield
    except DiskFullError:
        discard(remove)
        raise
    except (OSError, RuntimeError) as exc:
        if not (is_full(exc) or _torch_short_write(exc, path)):
            raise
        discard(remove)
        still = left() if left is not None else None
        raise full_error(path, what, need if still is None else still, advice, exc, more=still is not None) from None


def discard(paths: Iterable[Path]) -> None:
    for p in paths:
        p = Path(p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


def write_atomic(path: Path | str, data: bytes | memoryview, what: str, advice: str | None = None, check: bool = False,
                 mode: int = FILE_MODE) -> None:
    """``data`` into ``path`` through a temporary file renamed over it: a reader sees the old file or the new one,
    never a part. ``check``: compare the size with the free space first (worth it for large files). ``mode``: a
    narrower one (0o600, a private key) for a file that must never be readable by others."""
    save_atomic(path, lambda f: f.write(data), len(data), what, advice, check, mode)


def save_atomic(path: Path | str, save: Callable[["FdFile"], object], size: int, what: str, advice: str | None = None,
                check: bool = False, mode: int = FILE_MODE) -> None:
    """``write_atomic`` of what ``save(file)`` writes into a file object, about ``size`` bytes: a large file (a
    checkpoint) streamed out, not first made whole in memory beside what it is made of."""
    path = Path(path)
    tmp = path.with_name(path.name + PARTIAL)
    if check:
        check_space(path, size, what, advice)
    # SIGINT and SIGTERM wait for the file: raised inside torch.save's calls to ``save``, a KeyboardInterrupt was a
    # failed write in torch's C++ writer, whose own end-of-file write then went on (a process seen hung at 24 GB).
    with on_full_disk(path, what, size, remove=[tmp], advice=advice), interrupts.held():
        try:
            fd = _create(tmp, mode)
            try:
                file = FdFile(fd)
                try:
                    save(file)
                    file.flush()
                except Exception:
                    if file.failed is not None:  # torch's writer hides it behind its own "unexpected pos"
                        raise file.failed from None
                    raise
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


class FdFile:
    """A write-only file object over a descriptor whose writes are ``write_all``'s (a full disk raises); small
    writes gathered (torch.save writes a few small records per tensor: a call each cost a third more time)."""

    GATHER = 1 << 20

    def __init__(self, fd: int) -> None:
        self.fd, self.pending = fd, bytearray()
        self.failed: OSError | None = None  # the first write that failed (a full disk), whatever a caller makes of it

    def write(self, data: bytes | memoryview) -> int:
        n = memoryview(data).nbytes
        if n >= self.GATHER:
            self.flush()
            self._out(data)
        else:
            self.pending += data
            if len(self.pending) >= self.GATHER:
                self.flush()
        return n

    def flush(self) -> None:
        if self.pending:
            self._out(self.pending)
            self.pending = bytearray()

    def _out(self, data: bytes | memoryview) -> None:
        try:
            write_all(self.fd, data)
        except OSError as exc:
            self.failed = self.failed or exc
            raise


PARTIAL = ".tmp"  # what write_atomic writes a file as before renaming it


def remove_partial_writes(folder: Path | str) -> None:
    """The temporary files of ``write_atomic`` calls whose process was killed (one that fails removes its own), in
    ``folder``: for a caller that knows no write there is under way, whose file would go from under it."""
    for tmp in Path(folder).glob("*" + PARTIAL):
        with contextlib.suppress(OSError):
            tmp.unlink()


def _create(tmp: Path, mode: int) -> int:
    """The temporary file, open to write. A private one is a new file, private from its first byte: an old one
    (of a write that was killed) may have been opened by another user, who would read what is written into it."""
    if mode == FILE_MODE:
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    tmp.unlink(missing_ok=True)
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)


def write_staged(path: Path | str, data: bytes) -> None:
    """``data`` into ``path`` in a staging folder that is discarded whole if anything fails: no rename of its own,
    and a full disk is the caller's to say, of what the folder becomes (``on_full_disk`` around the staging)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def write_text(path: Path | str, text: str, what: str, advice: str | None = None) -> None:
    write_atomic(path, text.encode(), what, advice)


def log_lines(text: str) -> list[dict]:
    """The rounds of a metrics log (``append``'s lines), without a blank or torn one: a crash while appending
    leaves the last line torn, and its round, after the checkpoint's, is run and written again on resume."""
    lines = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw) if raw.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and isinstance(line.get("round"), int):
            lines.append(line)
    return lines


def append(path: Path | str, data: bytes, what: str, advice: str | None = None) -> None:
    """``data`` at the end of ``path``; on a full disk the file is cut back to where it ended (no torn line)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        end = os.fstat(fd).st_size
        write_all(fd, data)
    except OSError as exc:
        if not is_full(exc):
            raise
        with contextlib.suppress(OSError):
            os.ftruncate(fd, end)
        raise full_error(path, what, len(data), advice, exc) from None
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Every byte of ``data`` (a write may take fewer than asked; a full disk raises)."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _torch_short_write(exc: BaseException, path: Path | str) -> bool:
    """torch's zip writer on a full disk: a RuntimeError without an errno; said so only when the disk is full."""
    if not isinstance(exc, RuntimeError) or not re.search(r"unexpected pos|file write failed", str(exc)):
        return False
    free = free_bytes(Path(path).parent)
    return free is not None and free < (1 << 20)


def _not_an_object(value) -> str:
    return "" if isinstance(value, dict) else "not a JSON object"


def read_json(path: Path, advice: str, problem=None):
    """``path``'s JSON, checked by ``problem`` (what is wrong with it, or ""; default: a JSON object is expected);
    a torn or hand-edited file raises DamagedFileError, one line naming it and ``advice``, where it would be a
    traceback further on."""
    try:
        value = json.loads(Path(path).read_bytes())
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError of bytes cut inside a character
        raise DamagedFileError(path, f"not JSON: {exc}", advice) from None
    wrong = (problem or _not_an_object)(value)
    if wrong:
        raise DamagedFileError(path, wrong, advice)
    return value
