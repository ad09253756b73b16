"""Output locations checked before any work starts, with an error that says what is wrong and what to do.

A run, grid, report or shard that finds out at the end (or after an 85-second extraction) that it cannot
write where it was told has wasted the user's time; a Python traceback from deep inside would not say which
option to change.
"""
from __future__ import annotations

import os
from pathlib import Path

from fedcache.errors import ConfigError


def writable_dir(path: Path | str, option: str) -> Path:
    """``path`` as a directory this process can create or write into; ConfigError naming ``option`` if not."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file; give a directory (it is created if missing)")
    _check_below(path, path, option)
    return path


def _check_below(target: Path, path: Path, option: str) -> None:
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise ConfigError(f"{option} {target}: {existing} is a file, so nothing can be made below it; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {target}: no permission to write in {existing}; choose a directory you can write to")


def writable_file(path: Path | str, option: str) -> Path:
    """``path`` as a file this process can create or replace; ConfigError naming ``option`` if not."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file name")
    if str(path) == "" or path.name == "":
        raise ConfigError(f"{option}: give a file name")
    _check_below(path, path.parent, option)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{option} {path}: no permission to replace it; choose another file")
    return path


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")
