"""Backbone specs and loaders; importing this package fills ``BACKBONES`` and ``LOADERS``."""
from __future__ import annotations

import importlib
import pkgutil

from fedcache.extract.backbones.base import BACKBONES, LOADERS, BackboneSpec, LoadedBackbone, LoadRequest, has_text_tower

for _mod in pkgutil.iter_modules(__path__):
    if _mod.name != "base" and not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["BACKBONES", "LOADERS", "BackboneSpec", "LoadedBackbone", "LoadRequest", "has_text_tower"]
