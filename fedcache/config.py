"""Typed configuration: the one validator every setting passes, whoever gives it.

A field states its type with its valid range (``lr: Positive = 1e-3``), its choices (``Literal[...]``, or
``Annotated[str, Choices(registry)]`` for a registry's names) and, where the command line shows it, its flag
and help (``opt(...)``). ``parse`` turns a value given as text (a flag, ``--set``, a grid axis, a TOML file, a
Flower run config) or as Python into the field's type and checks it; ``check`` checks a value given in Python;
``Checked`` runs ``check`` on every field of a dataclass when it is built. Every message names the setting,
the value given and what was expected, so every entry point reports a bad value alike. No torch here.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fedcache.errors import ConfigError
from fedcache.wording import did_you_mean, named, option


@dataclass(frozen=True)
class Range:
    """A closed or half-open interval; ``None`` is unbounded. Every float must also be finite."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, v: float) -> bool:
        above = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        below = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
        return above and below

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


@dataclass(frozen=True)
class Choices:
    """The names a text field accepts, asked when checked (a registry filled by import)."""

    names: Callable[[], tuple[str, ...]]


@dataclass(frozen=True)
class Redirect:
    """Values a field refuses with a message of their own (value -> where to go instead): names a user will
    try, from a paper, that are another method. They are not among the values the field lists as accepted. A
    message that names options is a function, said when raised: the command line's flags or the API's keywords."""

    to: tuple[tuple[str, str | Callable[[], str]], ...]

    def message(self, value: Any) -> str | None:
        said = dict(self.to).get(value)
        return said() if callable(said) else said


@dataclass(frozen=True)
class Reader:
    """How text becomes a value of a type with no text form of its own (``0/4`` -> a Part, ``NAME=PATH`` items ->
    a dict): ``read(value)`` returns the value, or raises ValueError saying what it expected. A value already of
    the type (from Python) is not read."""

    read: Callable[[Any], Any]


DEVICES = r"auto|cpu|mps|cuda(:\d+)?"  # what --device takes, for rounds (train, grid) and for extract alike
Positive = Annotated[float, Range(0, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]  # a share or rate, both ends allowed
Share = Annotated[float, Range(0, 1, lo_open=True)]  # a share that must keep something: (0, 1]
UnitOpen = Annotated[float, Range(0, 1, hi_open=True)]  # momentum-like: 1 would never move
PositiveInt = Annotated[int, Range(1)]
NonNegativeInt = Annotated[int, Range(0)]


# ---- how a field appears outside Python ------------------------------------------------------
@dataclass(frozen=True)
class Opt:
    """A field's option: its name, flags, help and role in a grid."""

    help: str | Callable[[], str]  # a callable is asked when the help is shown (it reads a registry)
    name: str = ""  # option name (API keyword, CLI parameter); default: the field's name
    short: str = ""  # e.g. "-d"
    aliases: tuple[str, ...] = ()  # further long flags (--backbone for --backbones)
    flag: str = ""  # default: --<option name with dashes>; "--a/--no-a" for a switch
    axis: bool = True  # `fedcache grid` may sweep it (v1,v2,...)
    recorded: bool = True  # part of what a run is (config.json); False: where it is written, whether it continues
    sep: str = ","  # how a tuple is written as one string (CLI text, Flower config)
    repeatable: bool = False  # a tuple given as a repeated flag (--set a=1 --set b=2), not as one text


def opt(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """A dataclass field that is an option: its default, declared here once, and its ``Opt``."""
    return field(default=default, default_factory=factory, metadata={"opt": Opt(**meta)})


def fields_of(cls: type) -> dict[str, Any]:
    """Field name -> type, with range and choice annotations kept."""
    return dict(_fields_of(cls))


@functools.cache
def _fields_of(cls: type) -> dict[str, Any]:
    # get_type_hints evaluates every annotation's text anew (compile, eval): a grid of 2,000 cells spent most of
    # its minute before the first cell in it. A class's annotations do not change once it is made.
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


# ---- the validator ---------------------------------------------------------------------------
_UNIONS = (typing.Union, types.UnionType)


def base_type(typ: Any) -> Any:
    """The type without range, choices and None: str, int, float, bool, tuple, Path, ..."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is Annotated:
        return base_type(args[0])
    if origin in _UNIONS:
        return base_type(next(a for a in args if a is not type(None)))
    if origin is Literal:
        return type(args[0])
    return tuple if origin is tuple else typ


def optional(typ: Any) -> bool:
    return typing.get_origin(typ) in _UNIONS and type(None) in typing.get_args(typ)


def choices(typ: Any) -> tuple:
    """The values a field accepts, where it names them (a Literal, or a registry's names)."""
    source = _choice_source(typ)
    return tuple(source.names()) if isinstance(source, Choices) else source


def _choice_source(typ: Any) -> tuple | Choices:
    """A Literal's values, or the Choices whose registry names them when asked (filled by import); () if neither."""
    for t in (typ, *typing.get_args(typ)):
        if typing.get_origin(t) is Literal:
            return typing.get_args(t)
        if typing.get_origin(t) is Annotated:
            found = next((a for a in typing.get_args(t)[1:] if isinstance(a, Choices)), None)
            if found is not None:
                return found
            inner = _choice_source(typing.get_args(t)[0])
            if inner:
                return inner
    return ()


def value_range(typ: Any) -> Range | None:
    return _annotation(typ, Range)


def _annotation(typ: Any, kind: type) -> Any:
    """The first ``kind`` among ``typ``'s annotations (or those of its union's members), else None."""
    for t in (typ, *typing.get_args(typ)):
        if typing.get_origin(t) is Annotated:
            found = next((a for a in typing.get_args(t)[1:] if isinstance(a, kind)), None)
            if found is not None:
                return found
    return None


def allowed(typ: Any) -> str:
    """What a field accepts, as a user reads it: ``one of a, b``, ``a finite number in (0, 1]``, ``text``."""
    names = choices(typ)
    if names:
        what = "one of " + ", ".join(map(str, names))
    else:
        base, bounds = base_type(typ), value_range(typ)
        what = _describe(base) + (f" {bounds}" if bounds else "")
    return what + (", or none" if optional(typ) else "")


def parse(label: str, value: Any, typ: Any, sep: str = ",", verbatim: bool = False) -> Any:
    """``value`` (text, or a Python value) as a value of ``typ``, checked; ConfigError naming ``label`` and the
    value as given (``verbatim``: text as the user typed it in ``key=value``, unquoted)."""
    if isinstance(value, str) and not value.strip() and base_type(_without_none(typ)) is Path:
        # Path("") is the working directory: an unset variable (--out "$OUT") would write there, or nowhere.
        raise ConfigError(f"{label}='': give a path{' (or leave it out)' if optional(typ) else ''}")
    if value is None or (optional(typ) and isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        if optional(typ):
            return None
        raise ConfigError(f"{label}: a value is required")
    inner = _without_none(typ)
    reader = _annotation(inner, Reader)
    if reader is not None:
        out = _read(label, value, reader, base_type(inner))
    elif typing.get_origin(_strip(inner)) is tuple:
        out = _tuple(label, value, _strip(inner), sep)
    else:
        out = _scalar(label, value, base_type(inner))
    check(label, out, typ, shown=value if verbatim and isinstance(value, str) else None)
    return out


def check(label: str, value: Any, typ: Any, shown: str | None = None) -> None:
    """Refuse a value that is not of ``typ`` or outside its range or choices; ConfigError naming ``label`` and
    the value (``shown``: as the user wrote it)."""
    given = lambda: f"{label}={shown}" if shown is not None else f"{label}={value!r}"
    shape = _shape(typ)
    if value is None:
        if not shape.optional:
            raise ConfigError(f"{label}: a value is required")
        return
    if shape.tupled is not None:
        _check_tuple(label, value, shape.tupled)
        return
    base = shape.base
    if base is Any:
        return
    if base is float:
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{given()}: must be a finite number")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif base is Path:  # a path given as text is a path
        ok = isinstance(value, (str, os.PathLike))
    elif isinstance(base, type):
        ok = isinstance(value, base) and not (base is int and isinstance(value, bool))
    else:
        ok = True
    if not ok:
        raise ConfigError(f"{given()}: expected {_describe(base)}")
    if shape.redirect is not None and shape.redirect.message(value):
        raise ConfigError(f"{given()}: {shape.redirect.message(value)}")
    allowed = tuple(shape.names.names()) if isinstance(shape.names, Choices) else shape.names
    if allowed and value not in allowed:
        raise ConfigError(f"{given()}: must be one of {', '.join(map(str, allowed))}{_close_choice(value, allowed)}")
    if shape.range is not None and not shape.range.contains(value):
        raise ConfigError(f"{given()}: must be {shape.range}")


def _close_choice(value: Any, allowed: tuple) -> str:
    """ " (did you mean 'dirichlet'?)" for a typo of a choice, as for a method's or a dataset's name."""
    return did_you_mean(value, allowed) if isinstance(value, str) else ""


@dataclass(frozen=True)
class _Shape:
    """What ``check`` asks of a type, worked out once per type (typing's introspection is most of a check)."""

    optional: bool
    tupled: Any  # the tuple type of a tuple field, else None
    base: Any
    names: tuple | Choices
    range: Range | None
    redirect: Redirect | None


def _shape(typ: Any) -> _Shape:
    try:
        return _cached_shape(typ)
    except TypeError:  # an annotation that cannot be hashed
        return _cached_shape.__wrapped__(typ)


@functools.cache
def _cached_shape(typ: Any) -> _Shape:
    inner = _without_none(typ)
    if typing.get_origin(_strip(inner)) is tuple:
        return _Shape(optional(typ), _strip(inner), tuple, (), None, None)
    return _Shape(optional(typ), None, base_type(inner), _choice_source(inner), value_range(inner),
                  _annotation(inner, Redirect))


def check_fields(obj: Any, label: Callable[[str], str] | None = None) -> None:
    """Check every field of a dataclass instance (built in Python, not parsed); ``label(field)`` names it."""
    for name, typ in _fields_of(type(obj)).items():
        try:
            check(name, getattr(obj, name), typ)
        except ConfigError:  # named as the user gave it only then: the label costs more than the check
            check(label(name) if label else name, getattr(obj, name), typ)
            raise


class Checked:
    """Mixin of a dataclass whose fields are checked when it is built. A section of the run specification
    names itself (``section = "schedule"``), and a message names a field as the user gave it:
    ``--fraction (schedule.fraction)=1.5: must be in (0, 1]``; a class of no section (a stage's settings, not
    kept as a tree) by its flag alone: ``--batch-size=0: must be >= 1``."""

    section: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self, type(self).label)

    @classmethod
    def label(cls, name: str) -> str:
        o = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("opt")
        if o is None:
            return f"{cls.section}.{name}" if cls.section else name
        return Option(cls.section, name, None, o, None).label


def option_name(o: Opt, field_name: str) -> str:
    return o.name or field_name


def flag_of(o: Opt, field_name: str) -> str:
    """The long flag as messages name it: ``--rounds`` (a switch's ``--batch/--no-batch`` as ``--batch``)."""
    return (o.flag or "--" + option_name(o, field_name).replace("_", "-")).split("/")[0]


@dataclass(frozen=True)
class Option:
    """One field that has an ``Opt``, as the outside sees it: the command line's option, the API's keyword."""

    section: str  # the section of the tree it is in ("" where the settings are no tree: extract's)
    field: str
    type: Any  # with its range and choices
    opt: Opt
    default: Any  # dataclasses.MISSING: required

    @property
    def name(self) -> str:
        return option_name(self.opt, self.field)

    @property
    def key(self) -> str:
        return f"{self.section}.{self.field}" if self.section else self.field

    @property
    def flags(self) -> tuple[str, ...]:
        """The CLI's flags; a switch on by default is ``--x/--no-x`` (one off by default is ``--x``: its ``--no-x``
        would change nothing, and took a column of every command's help)."""
        long = self.opt.flag or "--" + self.name.replace("_", "-")
        if self.base is bool and "/" not in long and self.default is True:
            long = f"{long}/--no-{long[2:]}"
        return (long, *self.opt.aliases, *((self.opt.short,) if self.opt.short else ()))

    @property
    def flag(self) -> str:
        """The flag as error messages name it: ``--rounds``; in a Python API call its keyword, ``rounds`` (a
        switch's as it is turned on, ``resume=True``)."""
        return named(flag_of(self.opt, self.field), self.name + ("=True" if self.base is bool else ""))

    @property
    def label(self) -> str:
        """How messages name it: ``--rounds (schedule.rounds)``, or the flag alone outside a tree; in a Python API
        call its keyword, ``rounds`` (a grid's axis ``sweep['rounds']``); from a grid file, its key there."""
        return option(f"{self.flag} ({self.key})" if self.section else self.flag, self.name, self.key)

    def given(self, value: Any) -> str:
        """The option with a value, as the caller wrote it: ``--alpha 0.3`` or ``alpha=0.3``."""
        text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
        return named(f"{self.flag} {text}", f"{self.name}={value!r}")

    @property
    def help(self) -> str:
        return self.opt.help() if callable(self.opt.help) else self.opt.help

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def base(self) -> Any:
        """The type without range and None: str, int, float, bool, Path, tuple."""
        return base_type(self.type)

    @property
    def read(self) -> bool:
        """Whether its text is read by a ``Reader`` (a type with no text form of its own)."""
        return _annotation(self.type, Reader) is not None

    def parse(self, value: Any) -> Any:
        """A value of this option from Python or text (CLI, grid axis, Flower config), type-checked."""
        return parse(self.label, value, self.type, self.opt.sep)


def options_of(cls: type, section: str = "") -> list[Option]:
    """The fields of ``cls`` that have an ``Opt``, in declaration order, with their defaults."""
    types = fields_of(cls)
    return [Option(section, f.name, types[f.name], f.metadata["opt"],
                   f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
            for f in dataclasses.fields(cls) if "opt" in f.metadata]


# ---- pieces ------------------------------------------------------------------------------------
def _strip(typ: Any) -> Any:
    return _strip(typing.get_args(typ)[0]) if typing.get_origin(typ) is Annotated else typ


def _without_none(typ: Any) -> Any:
    if typing.get_origin(typ) in _UNIONS:
        rest = [a for a in typing.get_args(typ) if a is not type(None)]
        return rest[0] if len(rest) == 1 else typ
    return typ


def _describe(base: Any) -> str:
    return {float: "a finite number", int: "an integer", bool: "true or false", str: "text", Path: "a path (text)"}.get(
        base, getattr(base, "__name__", str(base)))


def _scalar(label: str, value: Any, base: Any) -> Any:
    try:
        if base is bool:
            return _bool(value)
        if base in (int, float) and isinstance(value, bool):
            raise ValueError
        if base is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        if base is str and not isinstance(value, str):
            raise ValueError
        out = base(value.strip() if isinstance(value, str) and base is not str else value)
    except (TypeError, ValueError):
        raise ConfigError(f"{label}={value!r}: expected {_describe(base)}") from None
    _check_plain(label, value, base, out)
    return out


def _check_plain(label: str, value: Any, base: Any, number: Any) -> None:
    """Python reads 1_0 as 10, and digits of other scripts too; a grid keeps an axis's value as its user wrote it
    (its cells' folders, results.csv), where such a spelling is no number to the tools that read them."""
    if base in (int, float) and isinstance(value, str) and ("_" in value or not value.isascii()):
        raise ConfigError(f"{label}={value!r}: expected {_describe(base)} in plain digits: write {number}")


def _read(label: str, value: Any, reader: Reader, base: Any) -> Any:
    if isinstance(value, typing.get_origin(base) or base):
        return value
    try:
        return reader.read(value)
    except ValueError as exc:  # a repeated flag's list: the message names the item that is wrong
        shown = label if isinstance(value, (list, tuple)) else f"{label}={value!r}"
        raise ConfigError(f"{shown}: {exc}") from None


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        if text not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError
        return text in ("true", "1", "yes")
    if isinstance(value, (bool, int)) and value in (0, 1):
        return bool(value)
    raise ValueError


def _tuple(label: str, value: Any, typ: Any, sep: str) -> tuple:
    if isinstance(value, str):
        text = value.strip()
        if text[:1] + text[-1:] in ("()", "[]"):  # a grid's value of a tuple, written whole: (0.9,0.999)
            text = text[1:-1]
        items = [v.strip() for v in text.split(sep) if v.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ConfigError(f"{label}={value!r}: expected a list")
    args = typing.get_args(typ)
    fixed = bool(args) and args[-1] is not Ellipsis
    if fixed and len(items) != len(args):
        what = "comma-separated values" if sep == "," else f"values separated by {sep!r}"
        # A grid splits its values at commas: "0.9,0.999" there is two values of one item each.
        whole = "(" + sep.join(f"v{i + 1}" for i in range(len(args))) + ")"
        raise ConfigError(f"{label}={value!r}: expected {len(args)} {what} (a grid takes each value whole, in "
                          f"brackets: {whole},{whole}; in a grid file, a list of lists)")
    kinds = args if fixed else [args[0] if args else str] * len(items)
    return tuple(parse(label, v, k) for v, k in zip(items, kinds))


def _check_tuple(label: str, value: Any, typ: Any) -> None:
    if not isinstance(value, tuple):
        raise ConfigError(f"{label}={value!r}: expected a tuple")
    args = typing.get_args(typ)
    fixed = bool(args) and args[-1] is not Ellipsis
    if fixed and len(value) != len(args):
        raise ConfigError(f"{label}={value!r}: expected {len(args)} values")
    for v, k in zip(value, args if fixed else [args[0] if args else str] * len(value)):
        check(label, v, k)
