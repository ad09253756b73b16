"""``--set key=value``: typed, range-checked hyperparameters routed to the dataclass that owns them.

Every key belongs to one owner: the method's parameters (``method.``), the optimizer (``optim.``) or the
head choice (``head.``). A short key is accepted only when exactly one owner has it; a key two owners
share (FLESD's ``momentum`` and SGD's ``momentum``) must be qualified, because routing it by guess once
sent a method's setting to an optimizer that ignored it. A value the chosen configuration does not use
(``optim.momentum`` with Adam) is refused rather than silently dropped.

Numeric fields declare their valid range in their type (``lr: Positive = 1e-3``); ``convert`` checks it
for ``--set`` values and ``check_fields`` for instances built in Python.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fedcache.errors import ConfigError


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


Positive = Annotated[float, Range(0, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]  # a share or rate, both ends allowed
UnitOpen = Annotated[float, Range(0, 1, hi_open=True)]  # momentum-like: 1 would never move
PositiveInt = Annotated[int, Range(1)]
NonNegativeInt = Annotated[int, Range(0)]

GROUP_ALIASES = {"optimizer": "optim", "params": "method"}


def parse_pairs(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value (e.g. --set lr=0.01), got {item!r}")
        key = key.strip().replace("-", "_")
        if key in out:
            raise ConfigError(f"--set {key} is given twice ({out[key]!r} and {value.strip()!r}); keep one")
        out[key] = value.strip()
    return out


def fields_of(cls: type) -> dict[str, Any]:
    """Field name -> type, with range annotations kept."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def build(cls: type, values: dict[str, str], base: Any = None) -> Any:
    """An instance of dataclass ``cls`` (from ``base`` or defaults) with ``values`` converted to field types."""
    types = fields_of(cls)
    converted = {k: convert(k, v, types[k]) for k, v in values.items()}
    return dataclasses.replace(base, **converted) if base is not None else cls(**converted)


def convert(key: str, text: str, typ: Any) -> Any:
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is Annotated:
        value = convert(key, text, args[0])
        _check(f"--set {key}", value, args[0], _range_of(typ), shown=text)
        return value
    if origin is Literal:
        if text not in [str(a) for a in args]:
            raise ConfigError(f"--set {key}={text}: must be one of {', '.join(map(str, args))}")
        return next(a for a in args if str(a) == text)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null", "") and type(None) in args:
            return None
        return convert(key, text, next(a for a in args if a is not type(None)))
    if origin is tuple:
        return _tuple(key, text, args)
    return _scalar(key, text, typ)


def _tuple(key: str, text: str, args: tuple) -> tuple:
    parts = [p for p in text.split(",") if p]
    fixed = len(args) > 0 and args[-1] is not Ellipsis
    if fixed and len(parts) != len(args):
        raise ConfigError(f"--set {key}={text}: expected {len(args)} comma-separated values "
                          f"(e.g. {key}={','.join(['0.9', '0.999'][:len(args)] or ['...'])})")
    types = args if fixed else [args[0] if args else str] * len(parts)
    return tuple(convert(key, p, t) for p, t in zip(parts, types))


def _scalar(key: str, text: str, typ: Any) -> Any:
    try:
        if typ is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        value = typ(text)
    except (TypeError, ValueError):
        raise ConfigError(f"--set {key}={text}: expected {getattr(typ, '__name__', typ)}") from None
    _check(f"--set {key}", value, typ, None, shown=text)
    return value


def _range_of(typ: Any) -> Range | None:
    return next((a for a in typing.get_args(typ)[1:] if isinstance(a, Range)), None)


def _check(key: str, value: Any, typ: Any, rng: Range | None, shown: Any) -> None:
    if typ is float and isinstance(value, (int, float)) and not math.isfinite(value):
        raise ConfigError(f"{key}={shown}: must be a finite number")
    if rng is not None and isinstance(value, (int, float)) and not rng.contains(value):
        raise ConfigError(f"{key}={shown}: must be {rng}")


def check_fields(obj: Any, label: Any = None) -> None:
    """Refuse an instance whose numeric fields are out of their declared range (built without ``--set``).
    ``label(field)``: how the error names a field (a CLI flag, say); default: the field's name."""
    for name, typ in fields_of(type(obj)).items():
        _check_value(label(name) if label else name, getattr(obj, name), typ)


def _check_value(name: str, value: Any, typ: Any) -> None:
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is not None:  # an optional field left unset is fine
            _check_value(name, value, next(a for a in args if a is not type(None)))
    elif origin is Annotated:
        _check(name, value, args[0], _range_of(typ), shown=value)
    elif typ is float:
        _check(name, value, float, None, shown=value)
    elif origin is tuple and isinstance(value, tuple):
        fixed = bool(args) and args[-1] is not Ellipsis
        for v, t in zip(value, args if fixed else [args[0] if args else type(None)] * len(value)):
            _check_value(name, v, float if t is type(None) and isinstance(v, float) else t)


def split_settings(values: dict[str, str], groups: dict[str, type]) -> dict[str, dict[str, str]]:
    """Route each key to the dataclass that owns it (``group.key`` or an unambiguous short ``key``)."""
    owners: dict[str, list[str]] = {}
    for g, cls in groups.items():
        for name in fields_of(cls):
            owners.setdefault(name, []).append(g)
    routed: dict[str, dict[str, str]] = {g: {} for g in groups}
    unknown = []
    for key, value in values.items():
        group, name = _owner(key, owners, groups)
        if group is None:
            unknown.append(key)
        elif name in routed[group]:
            raise ConfigError(f"--set {group}.{name} is given twice (as {key} and another spelling); keep one")
        else:
            routed[group][name] = value
    if unknown:
        listing = "; ".join(f"{g}: {', '.join(fields_of(cls)) or '-'}" for g, cls in groups.items())
        raise ConfigError(f"unknown --set key(s) {', '.join(unknown)}. Known keys -- {listing}")
    return routed


def _owner(key: str, owners: dict[str, list[str]], groups: dict[str, type]) -> tuple[str | None, str]:
    prefix, dot, name = key.partition(".")
    if dot:
        group = GROUP_ALIASES.get(prefix, prefix)
        if group not in groups:
            raise ConfigError(f"--set {key}: unknown prefix {prefix!r}; use one of {', '.join(g + '.' for g in groups)}")
        return (group if name in fields_of(groups[group]) else None), name
    found = owners.get(key, [])
    if len(found) > 1:
        spellings = " or ".join(f"--set {g}.{key}=..." for g in found)
        raise ConfigError(f"--set {key} is ambiguous: both {' and '.join(found)} have a {key!r} setting; "
                          f"write {spellings}")
    return (found[0] if found else None), key


def refuse_unused(given: dict[str, str], obj: Any, group: str, owner: str) -> None:
    """A key the user set that ``obj`` (with its other values) would not use is an error, never silence.

    ``obj.ignored()``, where a dataclass defines it, maps field -> why it is unused in this configuration.
    """
    ignored = obj.ignored() if hasattr(obj, "ignored") else {}
    bad = [f"{group}.{k} ({ignored[k]})" for k in given if k in ignored]
    if bad:
        raise ConfigError(f"{owner} does not use {'; '.join(bad)}: remove the setting or change what makes it unused")
