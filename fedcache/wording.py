"""Words shared by messages: counts ("1 run", "2 runs", "3 batches"), the near names of a typo, and how an option
is named: the command line's flag (``--rounds``), or inside a Python API call the keyword the caller passed
(``rounds``)."""
from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path

# Set for the length of a fedcache.api call (its context alone: other threads and calls keep the flags), unless a
# command line set it first: `fedcache reproduce` calls the API, and its user typed flags.
_KEYWORDS: ContextVar[bool | None] = ContextVar("fedcache_keyword_names", default=None)
# Where the settings were given: a run's (``--set``, ``settings``), a grid's axes (``--set``, ``sweep``), or a grid
# file's [set] (``--set``, its keys: the API caller wrote the file, not a ``sweep``).
_GIVEN: ContextVar[str] = ContextVar("fedcache_settings_given", default="settings")
# A grid file's [set] axes, in its pre-flight check and inside its cells: the file, and each axis by the full name of
# the setting or option it sets (``optim.lr``, ``schedule.rounds``) -> its key there (``lr``). By the full name: two
# axes whose names end alike (flesd's ``method.momentum``, ``optim.momentum``) are two settings. The file's user
# wrote them there, not as a sweep or a --set.
_FILE_AXES: ContextVar[tuple[str, Mapping[str, str]]] = ContextVar("fedcache_file_axes", default=("", {}))
# The settings a run or a grid was given (by --set, settings, sweep), by full name (``optim.lr``) -> the key its
# user gave it by (``lr`` or ``optim.lr``): a message names a setting as its user typed it, so that a search of
# the command or the call finds it.
_TYPED: ContextVar[Mapping[str, str]] = ContextVar("fedcache_settings_typed", default={})


def count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


class Placeholder(str):
    """A word of a printed command that its user replaces (``STORE``, ``DATASET``): :func:`pasted` says it as typed."""


def pasted(*words: str | os.PathLike) -> str:
    """Arguments of a command a message gives to paste, as the shell must read them. A path is given as a ``Path``
    (any ``os.PathLike``) and said absolute, so that it names the same file pasted in another folder or read from a
    log later (a relative store there is a new, empty one): absolute as ``os.path.abspath`` makes it, links kept as
    typed, as an entry records its folders. A :class:`Placeholder` is said as typed. Any other ``str`` is a value (a
    name, a flag, a number), never made absolute: a path given as a ``str`` would be said relative. Paths and values
    are quoted where the shell would split them (``shlex.quote``: ``my feats.zarr`` is ``'my feats.zarr'``,
    ``feats.zarr`` stays as it is)."""
    return " ".join(_said(w) for w in words)


def _said(word: str | os.PathLike) -> str:
    if isinstance(word, Placeholder):
        return str(word)
    if isinstance(word, os.PathLike):
        return shlex.quote(os.path.abspath(os.path.expanduser(word)))
    return shlex.quote(str(word))


def close_names(name: str, known, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``known`` that ``name`` is a typo of, nearest first, matched without case."""
    import difflib

    # Without case: 'HALVING' or 'FedAvg' is as near its name as a typo is (difflib alone found nothing).
    by_lower: dict[str, str] = {}
    for k in map(str, known):
        by_lower.setdefault(k.lower(), k)
    return [by_lower[k] for k in difflib.get_close_matches(str(name).lower(), list(by_lower), n=n, cutoff=cutoff)]


def did_you_mean(name: str, known, n: int = 1, cutoff: float = 0.6) -> str:
    """ " (did you mean 'dirichlet'?)" for a typo of one of ``known`` (up to ``n`` close names), or ""."""
    near = close_names(name, known, n, cutoff)
    return f" (did you mean {', '.join(map(repr, near))}?)" if near else ""


@contextlib.contextmanager
def keyword_names() -> Iterator[None]:
    """Messages raised inside name options as Python keyword arguments (``rounds=0``, ``settings``), not as the
    command line's flags (``--rounds``, ``--set``): a library caller never typed a flag. Inside
    ``flag_names()`` (a command of the command line that calls the API) the flags stay."""
    with _naming(True if _KEYWORDS.get() is None else _KEYWORDS.get()):
        yield


@contextlib.contextmanager
def flag_names() -> Iterator[None]:
    """Messages raised inside name options as the command line's flags, also where it calls the Python API."""
    with _naming(False):
        yield


def _naming(keywords: bool | None) -> contextlib.AbstractContextManager[None]:
    return _set(_KEYWORDS, keywords)


@contextlib.contextmanager
def _set(var: ContextVar, value) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def naming() -> bool | None:
    """How messages name options now, for ``named_as`` in another process (a grid's worker): the context
    variable does not cross into it."""
    return _KEYWORDS.get()


@contextlib.contextmanager
def named_as(state: bool | None) -> Iterator[None]:
    """Messages raised inside name options as they were named where ``naming()`` gave ``state``."""
    with _naming(state):
        yield


@contextlib.contextmanager
def swept(file: Path | str | None = None, keys: Mapping[str, str] | None = None) -> Iterator[None]:
    """Settings checked inside are a grid's axes: the Python API's ``sweep``, not ``settings`` (inside
    ``filed()``, still the file's). ``keys``: the axes grid ``file``'s [set] gave (the full name of what each sets
    -> its key there), named as the file's wherever a cell's message comes from: ``grid file g.toml's [set] lr``;
    left out, those of an enclosing ``swept`` stay."""
    axes = _FILE_AXES.get() if keys is None else (str(file), dict(keys))
    with _given("file" if _GIVEN.get() == "file" else "sweep"), _set(_FILE_AXES, axes):
        yield


def run_again() -> str:
    """How a run is trained again from round 0, as its caller does it: a grid's cell (inside ``swept``) as
    ``cell_again`` says, a run with ``--overwrite``."""
    if _GIVEN.get() != "settings":
        return cell_again()
    return f"run it again with {named('--overwrite', 'overwrite=True')}"


def cell_again(folder: Path | str | None = None) -> str:
    """How a grid's cell (of ``folder``, where the message names it) is trained again: by deleting its folder and
    running the same grid again (a grid takes no --overwrite)."""
    its = f"the cell's folder {folder}" if folder is not None else "its folder"
    return f"delete {its} and run the same grid {named('command', 'call')} again"


@contextlib.contextmanager
def filed(file: Path | str, keys: Mapping[str, str]) -> Iterator[None]:
    """Settings and options checked inside came from grid ``file``'s [set]: messages name each by its key there
    (``keys``: as ``swept``'s), with the file, as a cell does."""
    with _given("file"), _set(_FILE_AXES, (str(file), dict(keys))):
        yield


@contextlib.contextmanager
def typed_as(keys: Mapping[str, str]) -> Iterator[None]:
    """Settings named inside are named by the key their user gave each (``keys``: its full name -> that key, as
    ``--set optim.lr=-1`` if so typed); one given neither here nor in an enclosing ``typed_as``, by its short name.
    An enclosing ``typed_as`` wins: it is nearer the user (a grid's ``--set lr`` reaches a run as ``optim.lr``)."""
    with _set(_TYPED, {**keys, **_TYPED.get()}):
        yield


def _given(where: str) -> contextlib.AbstractContextManager[None]:
    return _set(_GIVEN, where)


def in_grid_file(file: Path | str, key: str = "") -> str:
    """A grid file's [set] key as every message names it, before the check of its cells and in one:
    ``grid file g.toml's [set] lr`` (``key`` left out, the table: ``grid file g.toml's [set]``)."""
    return f"grid file {file}'s [set]" + (f" {shown_key(key)}" if key else "")


LONGEST_KEY = 60  # characters of a key a message repeats: no setting's name is near it


def shown_key(key: str) -> str:
    """``key`` as a message repeats it: one that is no setting's name by its length alone (a pasted paragraph, a
    value typed as a key) is cut, so the message stays one readable line."""
    if len(key) <= LONGEST_KEY:
        return key
    return f"{key[:LONGEST_KEY // 2]}... ({len(key):,} characters)"


def toml_key(key: str) -> str:
    """A [set] key as a grid file's line spells it: ``lr``, a dotted one quoted (``"partition.alpha"``). Bare,
    ``partition.alpha`` is TOML's table ``partition``, refused beside ``partition = "dirichlet"``."""
    return f'"{key}"' if "." in key else key


def write_setting(*keys: str, value: str | None = None) -> str:
    """Advice to give one of the settings ``keys`` where its user gives settings, each alternative whole as it is
    pasted there: ``--set optim.lr=...``; in a Python API call ``settings={'optim.lr': ...}`` (a grid's axes:
    ``sweep={...}``), since ``settings optim.lr=...`` is no Python; in a grid file a TOML line, ``"optim.lr" = ...
    under [set]`` (several: ``"method.mu" = ... or "optim.mu" = ... under [set]``; quoted, ``toml_key``), as a
    grid's advice on its axes writes it (``grids.spec.Names.add_axis``). ``value``: a text value to advise
    (``--set optimizer=adam``, ``settings={'optimizer': 'adam'}``, ``optimizer = "adam" under [set]``)."""
    given = set_flag()
    cli, py, toml = ("...",) * 3 if value is None else (value, repr(value), f'"{value}"')
    if given == "[set]":
        return " or ".join(f"{toml_key(key)} = {toml}" for key in keys) + " under [set]"
    return " or ".join(named(f"{given} {key}={cli}", f"{given}={{{key!r}: {py}}}") for key in keys)


def given_in_file(name: str) -> str | None:
    """The setting or option of full name ``name`` (``optim.lr``) as a grid's file gave it, where it did (inside
    ``swept(file, keys)`` or ``filed``): ``grid file g.toml's [set] lr``."""
    file, keys = _FILE_AXES.get()
    return in_grid_file(file, keys[name]) if name in keys else None


def by_keyword() -> bool:
    """Whether messages name options as keyword arguments now (inside ``keyword_names()``)."""
    return bool(_KEYWORDS.get())


def named(flag: str, keyword: str) -> str:
    """``flag`` as the command line spells an option in a message, or ``keyword`` inside ``keyword_names()``."""
    return keyword if by_keyword() else flag


def option(flag: str, keyword: str, key: str = "") -> str:
    """A run option as messages name it: ``flag`` on the command line (``--rounds (schedule.rounds)``), ``keyword``
    in a Python API call (``rounds``), a grid's axis there ``sweep['rounds']``; one from a grid file's [set] (``key``:
    its full name, ``schedule.rounds``) by its key there, with the file (``grid file g.toml's [set] rounds``)."""
    if filed := given_in_file(key):
        return filed
    given = _GIVEN.get()
    if given == "file":
        return keyword
    if not by_keyword():
        return flag
    return f"sweep[{keyword!r}]" if given == "sweep" else keyword


def set_flag() -> str:
    """The method/optimizer settings as messages name them: ``--set`` (CLI), ``settings`` (API), a grid's axes
    ``sweep`` (API), a grid file's ``[set]`` (both)."""
    given = _GIVEN.get()
    return "[set]" if given == "file" else named("--set", "settings" if given == "settings" else "sweep")


def set_key(key: str) -> str:
    """A key as its user gave it to the settings, at the start of a message about it: ``--set lrr`` on the command
    line, in the Python API ``settings['lrr']`` (a grid's axis ``sweep['lrr']``), a grid file's [set] key with the
    file (``grid file g.toml's [set] lrr``), as every message about that file's keys names them."""
    file, _ = _FILE_AXES.get()
    if _GIVEN.get() == "file":
        return in_grid_file(file, key) if file else f"[set] {shown_key(key)}"
    if not by_keyword():
        return f"--set {shown_key(key)}"
    if len(key) <= LONGEST_KEY:
        return f"{set_flag()}[{key!r}]"
    return f"{set_flag()}[{key[:LONGEST_KEY // 2]!r}...] (a key of {len(key):,} characters)"


def setting(key: str) -> str:
    """One setting as messages name it, ``key`` its full name (``optim.lr``), by the key its user gave it (inside
    ``typed_as``; one not given by its short name, ``lr``): ``--set lr`` on the command line; in the Python API
    ``settings['lr']``, a grid's axis ``sweep['lr']``; a grid file's [set] key by its key there, with the file
    (``grid file g.toml's [set] lr``)."""
    if filed := given_in_file(key):
        return filed
    name = _TYPED.get().get(key) or key.rsplit(".", 1)[-1]
    if _GIVEN.get() == "file":
        return name
    return f"{set_flag()}[{name!r}]" if by_keyword() else f"--set {name}"
