"""The tracker interface and what every tracker shares."""
from __future__ import annotations

import math
from pathlib import Path

from fedcache.errors import ConfigError
from fedcache.registry import Registry
from fedcache.wording import named

# The per-round figures a tracker receives (numbers only; per-client lists stay in metrics.jsonl).
ROUND_KEYS = ("accuracy", "global_accuracy", "train_loss", "bytes_up", "bytes_down")


class Tracker:
    name = ""  # the --track name (the registry's key)
    extra = ""  # the pip extra that installs what this tracker needs

    def __init__(self, directory: Path, run_name: str, params: dict[str, str]) -> None:
        self.directory, self.run_name, self.params = directory, run_name, params

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self, summary: dict) -> None:
        raise NotImplementedError

    def fail(self) -> None:
        """The run stopped (an error, Ctrl-C): keep what was logged, mark it unfinished where the tracker can."""

    @classmethod
    def missing(cls, exc: ImportError) -> ConfigError:
        given = named(f"--track {cls.name}", f"track={cls.name!r}")
        return ConfigError(f"{given} needs {exc.name}: pip install 'fedcache[{cls.extra}]'")


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    """Nested settings as ``section.key`` -> text, as trackers take parameters."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)
    return out


def numbers(metrics: dict, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    """The finite numeric entries of ``metrics`` (all, or those of ``keys``)."""
    chosen = metrics.items() if keys is None else ((k, metrics.get(k)) for k in keys)
    return {k: float(v) for k, v in chosen
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


TRACKERS: Registry[type[Tracker]] = Registry("tracker")


def register(cls: type[Tracker]) -> type[Tracker]:
    TRACKERS.add(cls.name, cls)
    return cls
