"""One small registry used by every kind of named thing (datasets, backbones, methods...).

Names are data: CLI names are kebab-case, a duplicate is an error, an unknown name
lists the close matches and everything that exists. Some kinds also accept open-ended
names with a prefix (``timm:<model>``, ``open_clip:<arch>/<tag>``); those are resolved
by a factory registered for the prefix. A name may also be declared with the module that
registers it (``declare``): it is known before that module is imported, which happens when
the name is first asked for.
"""
from __future__ import annotations

import importlib
import re
import sys
from typing import Callable, Generic, Iterator, TypeVar

from fedcache.errors import ConfigError, UnknownNameError
from fedcache.wording import close_names

T = TypeVar("T")

_KEBAB = re.compile(r"^[a-z0-9]+(?:[-.][a-z0-9]+)*$")


class Registry(Generic[T]):
    # What to do where a declared module registers other names than it is declared with (a kind whose names come
    # from its files says how to name the file).
    declare_advice = "declare each name with the module that registers it"

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._prefixes: dict[str, tuple[Callable[[str], T], str]] = {}
        self._declared: dict[str, str] = {}  # name -> the module whose import registers it

    def add(self, name: str, item: T) -> T:
        self._check_new(name, self._items)
        module = self._declared.get(name)
        if module is not None and module not in sys.modules:  # another module's, before the declared one loads:
            # it would stand in for the built-in, and the built-in's own registration would fail some later get
            raise ConfigError(f"{self.kind} name {name!r} is a built-in {self.kind}'s (registered by {module}); "
                              f"register yours under another name")
        self._items[name] = item
        return item

    def declare(self, name: str, module: str) -> None:
        """``name`` is registered by importing ``module``, done when the name is first asked for (``get``,
        ``items``): it is listed, matched and checked before that, with nothing imported (a method's module imports
        torch, seconds that a misspelt name need not wait for)."""
        self._check_new(name, self._declared)
        self._declared[name] = module

    def _check_new(self, name: str, taken: dict) -> None:
        if not _KEBAB.match(name):
            raise ConfigError(f"{self.kind} name {name!r} is not kebab-case (e.g. 'clip-rn50')")
        if name in taken:
            raise ConfigError(f"duplicate {self.kind} name {name!r}")

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def deco(item: T) -> T:
            self.add(name, item)
            return item

        return deco

    def add_prefix(self, prefix: str, factory: Callable[[str], T], help: str) -> None:
        """Resolve ``prefix:<rest>`` names by calling ``factory(rest)``."""
        if prefix in self._prefixes:
            raise ConfigError(f"duplicate {self.kind} prefix {prefix!r}")
        self._prefixes[prefix] = (factory, help)

    def get(self, name: str) -> T:
        self.check(name)
        if name not in self._items and name in self._declared:
            self._load(name)
        if name in self._items:
            return self._items[name]
        prefix, _, rest = name.partition(":")
        return self._prefixes[prefix][0](rest)

    def check(self, name: str) -> None:
        """Raise as ``get`` does for a name it cannot resolve, without importing a declared module or calling a
        prefix's factory."""
        if name in self:
            return
        prefix, sep, rest = name.partition(":")
        if sep and prefix in self._prefixes:
            if not rest:
                raise ConfigError(f"{self.kind} {name!r} needs a value after '{prefix}:'")
            return
        raise UnknownNameError(self._unknown_message(name))

    def _load(self, name: str) -> None:
        module, before = self._declared[name], set(self._items)
        importlib.import_module(module)
        if name not in self._items:  # a module renamed without its registration, or the reverse
            raise ConfigError(f"importing {module} registered no {self.kind} {name!r}, the name it is declared with: "
                              f"register {name!r} there, or {self.declare_advice}")
        # A name no one declared would be known only once its module is loaded: names() and len() would depend on
        # which names were asked for first.
        extra = sorted(set(self._items) - before - self._declared.keys())
        if extra:
            raise ConfigError(f"importing {module} registered {self.kind} {', '.join(map(repr, extra))} beside "
                              f"{name!r}, the name it is declared with: move {'it' if len(extra) == 1 else 'them'} "
                              f"to a module of {'its' if len(extra) == 1 else 'their'} own, and {self.declare_advice}")

    def _unknown_message(self, name: str) -> str:
        close = close_names(name, self.names(), n=3, cutoff=0.5)
        msg = f"unknown {self.kind} {name!r}."
        if close:
            msg += f" Did you mean {', '.join(repr(c) for c in close)}?"
        msg += f" Known: {', '.join(self.names())}."
        if self._prefixes:
            msg += " Also accepted: " + ", ".join(h for _, h in self._prefixes.values()) + "."
        return msg

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._declared

    def names(self) -> list[str]:
        return sorted({*self._items, *self._declared})

    def items(self) -> Iterator[tuple[str, T]]:
        for name in sorted(self._declared.keys() - self._items.keys()):  # in one order, whatever the hash seed
            self._load(name)
        return iter(sorted(self._items.items()))

    def prefixes(self) -> dict[str, str]:
        return {p: h for p, (_, h) in self._prefixes.items()}

    def __len__(self) -> int:
        return len(self.names())
