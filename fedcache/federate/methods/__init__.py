"""Federated methods, one file each, named after its method (``fst_cbdg.py`` registers ``fst-cbdg``).

``METHODS`` knows every method's name from the files, before any is imported: a method's module is imported when
the method is first asked for. The modules import torch (seconds), which a command refused for a misspelt method
name need not wait for; ``Method`` and the rest of ``base`` are imported on first use for the same reason.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from fedcache.errors import ConfigError
from fedcache.registry import Registry

if TYPE_CHECKING:
    from fedcache.federate.methods.base import LocalResult, Method, MethodContext


class MethodRegistry(Registry["type[Method]"]):
    """A method states its name once, in its registration; the class receives it as ``name``."""

    declare_advice = "name the file after the method (fst_cbdg.py for fst-cbdg)"

    def add(self, name: str, item: type[Method]) -> type[Method]:
        if "name" in vars(item):
            raise ConfigError(f"method class {item.__qualname__} states its name ({item.name!r}) beside its "
                              f"registration as {name!r}: leave out the name attribute, the registration sets it")
        super().add(name, item)
        item.name = name
        return item


METHODS = MethodRegistry("method")
for _mod in pkgutil.iter_modules(__path__):
    if _mod.name != "base" and not _mod.name.startswith("_") and not _mod.ispkg:  # one file per method
        METHODS.declare(_mod.name.replace("_", "-"), f"{__name__}.{_mod.name}")

_FROM_BASE = ("LocalResult", "Method", "MethodContext")


def __getattr__(name: str):
    if name in _FROM_BASE:
        return getattr(importlib.import_module(f"{__name__}.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_FROM_BASE))


__all__ = ["METHODS", "LocalResult", "Method", "MethodContext", "MethodRegistry"]
