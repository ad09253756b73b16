"""Output locations and names checked before any work starts, with an error that says what is wrong and what to do.

A run, grid, report or shard that finds out at the end (or after an 85-second extraction) that it cannot
write where it was told has wasted the user's time; a Python traceback from deep inside would not say which
option to change. The same holds for a name that becomes a path: a dataset's name is a folder of the store
(``partitions/<dataset>``), so ``..`` or ``a/b`` accepted by an import would break every later command.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from fedcache.disk import is_full
from fedcache.errors import ConfigError, DeniedError, PermissionDeniedError, StoreError
from fedcache.wording import named


GRID = "grid.json"  # what marks a grid's directory (fedcache/grids): a run is never written into one
STORE_MARK = "fedcache_store"  # the attribute in a feature store's root zarr.json (fedcache/store)
# A run's last finished round (fedcache/federate/rundir.py): here, without torch, for the command line's word after
# an interrupt, which may come while torch is still half imported.
CHECKPOINT = "checkpoint.pt"
# The rest of a run directory's layout (fedcache/federate/rundir.py) and the marks a grid puts beside a cell's run
# (fedcache/grids): spelled once, here, without torch, for the writers and for the reports that read them back.
CONFIG, METRICS, SUMMARY = "config.json", "metrics.jsonl", "summary.json"
CELL = "cell.json"  # a grid cell's method, seed and setting
DIVERGED = "diverged.json"  # a grid cell whose training became NaN
RUNGS = "rungs.json"  # a grid cell successive halving paused: its summary at each round it paused at
SELECTION = "selection.json"  # a --select grid's choices
RESULTS = "results.csv"  # a grid's results, written once its cells are done (a --prune halving stage: every cut made)
NAME_MAX = 255  # bytes of one file name on the usual file systems (ext4, xfs, btrfs, apfs, tmpfs)
NAME_HINT = "give a name of letters, digits, '-', '_' and '.' (e.g. my-dataset)"
STORE_HELP = "Feature store path (env FEDCACHE_STORE)."  # every command's --store, and the API's store


def default_store() -> Path:
    return Path(os.environ.get("FEDCACHE_STORE", "fedcache-store.zarr"))


def check_name(name: object, what: str) -> str:
    """``name`` (a dataset's or backbone's, as the store keeps it) when one folder of a file system and of a Zarr
    hierarchy can be named so, and a comma list (``--backbones a,b``) can name it; ConfigError naming ``what``
    and the problem otherwise."""
    problem = name_problem(name)
    if problem:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise ConfigError(f"{what} {shown}: {problem}; {NAME_HINT}")
    return name  # type: ignore[return-value]


def name_problem(name: object) -> str:
    """What keeps ``name`` from being a name (empty when nothing does)."""
    if not isinstance(name, str):
        return f"expected text, got {type(name).__name__}"
    checks = [
        (not name.strip(), "a name cannot be empty"),
        (name != name.strip(), "it starts or ends with a space"),
        ("/" in name or "\\" in name, "a name cannot hold a path separator (/ or \\)"),
        (any(ord(ch) < 32 or ord(ch) == 127 for ch in name), "a name cannot hold a control character (NUL, newline, ...)"),
        ("," in name, "a name cannot hold a comma (lists of names are split at commas)"),
        (set(name) == {"."}, "'.' and '..' are directories, not names"),
        (name.startswith("."), "a name starting with a dot is hidden on disk"),
        (name.startswith("__"), "Zarr keeps names starting with '__' for itself"),
    ]
    found = next((why for bad, why in checks if bad), "")
    if found:
        return found
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8 text"
    return f"it is {size} bytes long, and a file system holds at most {NAME_MAX} in a name" if size > NAME_MAX else ""


def check_path_text(path: Path | str, option: str) -> None:
    """A path every file system call can take: no NUL byte, no name in it longer than a file system holds."""
    text = str(path)
    if "\0" in text:
        raise ConfigError(f"{option} {text!r}: a path cannot hold a NUL byte; choose another path")
    for part in Path(text).parts:
        try:
            size = len(part.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            raise ConfigError(f"{option} {text!r}: the name {part!r} is not valid text; choose another path") from None
        if size > NAME_MAX:
            raise ConfigError(f"{option}: the name {part[:40]}... in it is {size} bytes long, and a file system holds at "
                              f"most {NAME_MAX} in a name; choose a shorter one")


WRITE_ELSEWHERE = "choose a directory you can write to"


def writable_dir(path: Path | str, option: str, advice: str = WRITE_ELSEWHERE) -> Path:
    """``path`` as a directory this process can create or write into; ConfigError naming ``option`` if not, with
    ``advice`` where it is not writable (the caller may know a better way than another directory)."""
    check_path_text(path, option)
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file; give a directory (it is created if missing)")
    _check_no_dangling_link(path, option)
    _check_below(path, path, option, advice)
    return path


def _check_no_dangling_link(path: Path, option: str) -> None:
    """A link to nothing on the way: mkdir refused it as "File exists", which the command said as it was."""
    for link in (path, *path.parents):
        if link.is_symlink() and not link.exists():
            at = "" if link == path else f": {link} in it"
            raise ConfigError(f"{option} {path}{at} is a symbolic link to {os.readlink(link)}, which does not exist; "
                              "create that directory, or give another")


# What a file system refuses: another user's file or folder (EACCES, EPERM), or a read-only mount (EROFS, which is
# no PermissionError).
DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def store_denied() -> str:
    """What to do about a store this user may not write in, named as the caller gives the store."""
    return (f"use a store you can write to ({named('--store', 'store=...')}, or FEDCACHE_STORE), or have its owner "
            f"run {named('this command', 'this call')}; reading a complete store needs no write permission")


def is_denied(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DENIED


def denied_problem(exc: OSError) -> tuple[bool, str]:
    """Whether a read was refused (the file is there, unreadable; else a write was), and what, in words naming the
    file: a read-only file system, or a missing permission."""
    where = exc.filename or "a file"
    if exc.errno == errno.EROFS:
        return False, f"{where} is on a read-only file system"
    unreadable = bool(exc.filename) and _unreadable(where)
    return unreadable, f"no permission to {'read' if unreadable else 'write'} {where}"


def _unreadable(path: str) -> bool:
    """Whether ``path`` is there and this user cannot read it, or cannot even look (a folder above it is another
    user's, not searchable: a store made under umask 077), which os.path.exists answers as missing."""
    try:
        os.stat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return not os.access(path, os.R_OK)


def denied_line(exc: OSError) -> str:
    """A refusal raised where fedcache does not check first (an extraction, an import or `store rm` in a store
    another user owns, or on a read-only mount): what was refused and what to do, said of the feature store where
    the file is one's."""
    read, problem = denied_problem(exc)
    store = store_holding(exc.filename) if exc.filename else None
    if store is None:
        return f"{problem}; {'have its owner make it readable' if read else 'choose a path you can write to'}"
    if read:
        return unreadable_store(store, problem)
    return f"cannot write in the feature store {store} ({problem}); {store_denied()}"


def denied_error(exc: OSError) -> DeniedError:
    """``exc`` in the command line's words (:func:`denied_line`), still an OSError of its errno and file, and a
    PermissionError where it was one: what a Python caller of fedcache gets."""
    kind = PermissionDeniedError if isinstance(exc, PermissionError) else DeniedError
    return kind(denied_line(exc), exc.errno, exc.filename)


def owner(path: Path) -> str | None:
    """The user name (or uid) of ``path``'s owner, who can make it readable; None where even that cannot be seen."""
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):  # no user database (Windows), or a uid it does not name
        return f"uid {uid}"


def unreadable_store(store: Path, problem: str) -> str:
    return f"cannot read the feature store {store} ({problem}); have its owner make it readable (chmod -R a+rX)"


def unmade_store(store: Path, problem: str) -> str:
    return (f"cannot make the feature store {store} ({problem}); give {named('a --store', 'a store=...')} "
            "(or FEDCACHE_STORE) in a folder you can write to")


def check_store_place(store: Path | str) -> None:
    """A --store that is no store but lies inside one (its ``entries/``, a folder beside them) is refused: made there,
    the outer store read it as a damaged entry, which stopped every run on that store."""
    store = Path(store)
    with contextlib.suppress(OSError):
        if is_store(store):
            return
    outer = store_holding(store.parent)
    if outer is not None:
        raise ConfigError(f"{named(f'--store {store}', f'store={str(store)!r}')} is inside the feature store {outer}; "
                          f"give {outer} itself (one store holds every dataset and backbone), or a folder outside it")


def check_new_store(store: Path | str) -> None:
    """A feature store still to be made at ``store``, checked as making it would be, making nothing: an extraction
    makes its store only once it has something to write in it, and says at once where it never could."""
    option = named("--store", "store")
    check_path_text(store, option)
    store = Path(store)
    _check_no_dangling_link(store, option)
    existing = _nearest_existing(store)
    if not existing.is_dir():
        raise StoreError(unmade_store(store, f"{existing} is a file"))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StoreError(unmade_store(store, _not_writable(existing)))
    if problem := refused_in(existing, _made_first(store, existing)):
        raise StoreError(unmade_store(store, problem))


def is_store(directory: Path) -> bool:
    """Whether ``directory`` is a fedcache feature store: its root zarr.json carries the mark."""
    meta = directory / "zarr.json"
    return meta.is_file() and STORE_MARK in meta.read_text(errors="replace")


def store_holding(path: Path | str) -> Path | None:
    """The feature store ``path`` is in (or is), if any."""
    path = Path(path).absolute()
    for parent in (path, *path.parents):
        with contextlib.suppress(OSError):
            if is_store(parent):
                return parent
    return None


def check_outside(out: Path | str) -> None:
    """An output directory outside every feature store and grid directory: written into a store, its files sat
    among the store's; into another grid (its ``cells/``, say), a report of that grid counted them as its own."""
    check_outside_stores(out)
    out = Path(out).resolve()  # a link into a grid is inside it
    for parent in out.parents:
        if (parent / GRID).is_file():
            raise ConfigError(f"{_given_out(out)} is inside the grid directory {parent}, which writes its cells itself; "
                              "choose a directory outside it")


def check_outside_stores(out: Path | str) -> None:
    """An output directory outside every feature store (a report's too: its files sat among the store's)."""
    out = Path(out).resolve()  # a link into a store is inside it
    for parent in (out, *out.parents):
        if is_store(parent):
            raise ConfigError(f"{_given_out(out)} is inside the feature store {parent}; choose a directory outside it")


def _given_out(out: Path) -> str:
    return named(f"--out {out}", f"out={str(out)!r}")


def _check_below(target: Path, path: Path, option: str, advice: str = WRITE_ELSEWHERE) -> None:
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise ConfigError(f"{option} {target}: {existing} is a file, so nothing can be made below it; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {target}: {_not_writable(existing)}; {advice}")
    if problem := refused_in(existing, _made_first(target, existing)):
        raise ConfigError(f"{option} {target}: {problem}; {advice}")


def refused_in(directory: Path, made: str) -> str:
    """Why the file system takes no new file in ``directory`` (``made``, in words: what the command makes there
    first), where the permission checks let it through; empty if it takes one. To root every permission check
    passes, and some file systems refuse whatever the permissions say (/proc: "No such file or directory", /sys, a
    network mount whose server checks for itself): a file made and removed at once asks the file system itself,
    before any work. Found out at the write, a demo said it after minutes of extracting, and a run in /proc waited
    for its lock file for ever."""
    probe = directory / f".fedcache-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        # No room is said where the size is known (disk.check_space); a folder removed since is the command's to make.
        if is_full(exc) or not directory.is_dir():
            return ""
        return refused_problem(exc, made)
    os.close(fd)
    with contextlib.suppress(OSError):
        probe.unlink()
    return ""


def refused_problem(exc: OSError, made: str | None = None) -> str:
    """Why the file system refused to make ``made`` (``exc``'s file unless given), in words naming it: a missing
    permission or a read-only mount (:func:`denied_problem`), or a file system that takes no new file whatever the
    permissions say (/proc, /sys: "No such file or directory")."""
    if is_denied(exc):
        return denied_problem(exc if made is None else OSError(exc.errno, exc.strerror, made))[1]
    return f"the file system refused to create {made or exc.filename} ({exc.strerror})"


def _made_first(target: Path, existing: Path) -> str:
    """What writing ``target`` makes first in ``existing``, its nearest existing folder: the first folder (or the
    file) of it not there yet, or a file in ``target``, a directory already there."""
    below = target.absolute().relative_to(existing).parts
    return str(existing / below[0]) if below else f"a file in {existing}"


def _not_writable(directory: Path) -> str:
    """Why nothing can be written in ``directory``: a read-only mount (a snapshot, a shared volume, `mount -o ro`)
    is not fixed as a permission is, by its owner."""
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return f"{directory} is on a read-only file system" if read_only else f"no permission to write in {directory}"


def writable_file(path: Path | str, option: str) -> Path:
    """``path`` as a file this process can create or replace; ConfigError naming ``option`` if not."""
    check_path_text(path, option)
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file name")
    if str(path) == "" or path.name == "":
        raise ConfigError(f"{option}: give a file name")
    _check_below(path, path.parent, option)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{option} {path}: no permission to replace it; choose another file")
    return path


# What a path given to be read may be instead of a file: a named pipe's read waits for a writer (for ever, where
# none comes), a device's may never end, a directory's fails.
_NOT_FILES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_a_file(path: Path | str) -> str:
    """What ``path`` (a link: what it leads to) is, where it is there and is no regular file: ``a named pipe
    (FIFO)``; "" for a file, and where nothing can be seen there (its reader says why)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return ""
    return next((what for test, what in _NOT_FILES if test(mode)), "")


@contextlib.contextmanager
def removed_if_left_empty(directory: Path | str) -> Iterator[None]:
    """``directory`` and the parents of it that are not there yet, removed after the block where it left them
    empty: a command that fails (a full disk, a refusal) leaves no empty folder behind, nor the parents it made
    (runs/ of runs/g); one that wrote there keeps them."""
    directory = Path(directory)
    made = [p for p in (directory, *directory.parents) if not p.exists()]  # deepest first
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # the first that is not empty ends it: its parents hold it
            for folder in made:
                folder.rmdir()


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")
