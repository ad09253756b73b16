"""The ``--set`` resolution of a method's settings without data: what ``RunSpec.of(..., settings=...)`` does
for its method, optimizer and head sections (``fedcache.spec.resolve_method``), in the shape tests read."""
from __future__ import annotations

from types import SimpleNamespace

from fedcache.spec import method_class, parse_pairs, resolve_method


def resolve_settings(method: str, settings: list[str], preset: str | None = None, head: str | None = None):
    m, optim, h = resolve_method(method, preset, head, parse_pairs(settings))
    return SimpleNamespace(method_cls=method_class(method), params=m.params, optim=optim, head=h.name or
                           method_class(method).default_head, preset=optim.preset)
