"""Where run metrics go besides metrics.jsonl: the trackers researchers already use, behind extras.

`open_trackers(["tensorboard", "mlflow"], directory, run_name, params)` gives one `Tracker` per name; the
round driver calls `log(round, metrics)` after each evaluated round and `close(summary)` at the end. A grid
opens one run per cell, with the cell's settings as parameters.
"""
from __future__ import annotations

from pathlib import Path

from fedcache.trackers.base import TRACKERS, Tracker, flatten


def known_trackers() -> list[str]:
    from fedcache.trackers import mlflow_tracker, tensorboard_tracker  # noqa: F401  (they register themselves)

    return list(TRACKERS.names())


def open_trackers(names: list[str], directory: Path, run_name: str, params: dict) -> list[Tracker]:
    known_trackers()
    return [TRACKERS.get(n)(Path(directory), run_name, flatten(params)) for n in names]


__all__ = ["TRACKERS", "Tracker", "flatten", "known_trackers", "open_trackers"]
