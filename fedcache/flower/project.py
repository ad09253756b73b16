"""The Flower App project (a directory with a pyproject.toml) that `flwr run` bundles and ships.

The bundle holds no code: its components name fedcache's own ServerApp and ClientApp, which every
machine of the federation has installed (``pip install "fedcache[flower]"``). Its config is the
default run config; ``flwr run DIR CONNECTION --run-config "method='fedpcl' ..."`` overrides it.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

import tomli_w

from fedcache import __version__, disk
from fedcache.errors import ConfigError
from fedcache.flower.config import FlowerRun
from fedcache.paths import writable_dir

FLWR_VERSION = "1.41.0"  # keep equal to the pin of the `flower` extra in pyproject.toml


def write_app(directory: Path | str, run: FlowerRun | None = None) -> Path:
    directory = writable_dir(directory, "the Flower App directory")
    directory.mkdir(parents=True, exist_ok=True)
    project = {
        "project": {"name": "fedcache-flower", "version": __version__, "license": "Apache-2.0",
                    "description": "fedcache methods on Flower: generic ServerApp and ClientApp",
                    "dependencies": [f"flwr=={FLWR_VERSION}", f"fedcache=={__version__}"]},
        "tool": {"flwr": {"app": {
            "publisher": "fedcache",
            "components": {"serverapp": SERVERAPP, "clientapp": "fedcache.flower.client:app"},
            "config": _nested(run.to_config() if run is not None else default_config()),
        }}},
    }
    path = directory / "pyproject.toml"
    _refuse_another_project(path)
    # Whole or not at all: `flwr run` reads a pyproject.toml cut at a line's end as a complete one.
    disk.write_text(path, tomli_w.dumps(project), "the Flower App's project file")
    return path


SERVERAPP = "fedcache.flower.server:app"


def _refuse_another_project(path: Path) -> None:
    """An App written before is written again (a new default config); any other pyproject.toml there is someone's
    project (`fedcache flower-app .` in one replaced the user's own), never overwritten."""
    if not path.exists():
        return
    try:  # a file this user may not read raises as itself (the command's one line for a refused read)
        components = tomllib.loads(path.read_text())["tool"]["flwr"]["app"]["components"]
        ours = components.get("serverapp") == SERVERAPP
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError):
        ours = False
    if not ours:
        raise ConfigError(f"{path} is not a fedcache Flower App's, and is kept; give `fedcache flower-app` a directory "
                          "of its own (a new one is created)")


def default_config() -> dict:
    """The App's default run config: fedavg's, but with the optimizer preset and the head left empty (the
    method's default), so that a run naming only another method (``--run-config 'method.name="fedpcl"'``)
    gets that method's own preset and head, as ``fedcache train -m fedpcl`` does, not fedavg's."""
    return {**FlowerRun().to_config(), "optim.preset": "", "head.name": ""}


def _nested(flat: dict) -> dict:
    """``section.field`` keys as TOML tables (``[tool.flwr.app.config.schedule]``); Flower flattens them
    back to the same keys before the apps read them."""
    out: dict = {}
    for key, value in flat.items():
        section, _, name = key.partition(".")
        out.setdefault(section, {})[name] = value
    return out
