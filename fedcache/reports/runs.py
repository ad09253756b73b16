"""Finding and reading the runs under a run or grid directory, grouped by method and setting."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcache.disk import log_lines
from fedcache.errors import ConfigError
from fedcache.paths import CELL, CONFIG, DIVERGED, METRICS, RUNGS, SELECTION, SUMMARY

log = logging.getLogger(__name__)


@dataclass
class Run:
    path: Path
    summary: dict
    history: list[dict]
    config: dict
    setting: dict = field(default_factory=dict)  # swept values (grid cells), seed excluded

    @property
    def label(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.setting.items())
        return f"{self.summary['method']} ({extra})" if extra else self.summary["method"]

    @property
    def stopped_at(self) -> int | None:
        """The round a --prune halving grid stopped this run at, before its last (None: it ran to the end)."""
        return self.summary.get("stopped_at")

    def option(self, name: str):
        """A run option by its `fedcache train` name (seed, validation, store, ...) from config.json's
        spec; None when the run has no config.json. Runs written before the spec kept them flat under "train"."""
        from fedcache.spec import option

        spec = self.config.get("spec")
        if spec is None:
            return self.config.get("train", {}).get(name)
        o = option(name)
        return spec.get(o.section, {}).get(o.field)


@dataclass
class Group:
    """The runs of one method and setting (several seeds)."""

    label: str
    runs: list[Run]  # the runs with a result
    diverged: list[Run] = field(default_factory=list)  # grid cells whose training became NaN: no result, counted
    expected_seeds: int | None = None  # the grid's seeds (None: not a grid); fewer runs: the grid is unfinished

    @property
    def unfinished_seeds(self) -> int:
        """Seeds of the grid with neither a result nor a divergence yet (an unfinished grid)."""
        return max(0, (self.expected_seeds or 0) - len(self.runs) - len(self.diverged))

    @property
    def complete(self) -> bool:
        """Every seed has a result: none diverged, none still to run, none stopped early by halving. Only a
        complete group can be the best: a mean over fewer seeds, or of an earlier round, would flatter it."""
        return bool(self.runs) and not self.diverged and not self.unfinished_seeds and self.stopped_at is None

    @property
    def first(self) -> Run:
        """A run of the group, for what its runs share (method, setting, options)."""
        return (self.runs or self.diverged)[0]

    @property
    def method(self) -> str:
        return self.first.summary["method"]

    @property
    def setting(self) -> dict:
        return self.first.setting

    @property
    def stopped_at(self) -> int | None:
        """The round its runs stopped at before their last (successive halving), or None."""
        return self.runs[0].stopped_at if self.runs else None

    def mean(self, key: str) -> float | None:
        vals = [r.summary.get(key) for r in self.runs if r.summary.get(key) is not None]
        return float(np.mean(vals)) if vals else None

    def std(self, key: str) -> float | None:
        """Sample std over seeds (ddof=1, as the papers print); None with one seed."""
        vals = [r.summary.get(key) for r in self.runs if r.summary.get(key) is not None]
        return float(np.std(vals, ddof=1)) if len(vals) > 1 else None

    def curve(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, mean over seeds) of a per-round metric, on the rounds every run evaluated."""
        rounds, mean, _ = self.band(key)
        return rounds, mean

    def band(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rounds, mean, sample std over seeds; 0 with one seed) on the rounds every run evaluated."""
        per_run = [{line["round"]: line.get(key) for line in r.history} for r in self.runs]
        rounds = sorted(set.intersection(*(set(k for k, v in d.items() if v is not None) for d in per_run)))
        vals = np.array([[d[k] for d in per_run] for k in rounds], float).reshape(len(rounds), len(per_run))
        std = vals.std(1, ddof=1) if len(per_run) > 1 else np.zeros(len(rounds))
        return np.array(rounds), vals.mean(1), std

    def per_client(self) -> np.ndarray:
        return np.concatenate([np.asarray(r.summary.get("per_client_accuracy", []), float) for r in self.runs])


def find_runs(root: Path) -> list[Run]:
    """Every finished run at or below ``root`` (a train --out directory, a grid, or a folder of runs)."""
    root = Path(root)
    if not root.exists():
        raise ConfigError(f"{root} does not exist; give a run directory (train --out) or a grid directory (grid --out)")
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory; give a run directory (train --out) or a grid directory (grid --out)")
    finished = {p.parent for name in (SUMMARY, RUNGS) for p in root.rglob(name)}
    finished -= {p for p in finished if _training_past_its_rung(p)}
    paths = sorted(p for p in finished if (p / METRICS).exists())
    for p in sorted(finished - set(paths)):  # a report short of a run without a word would mislead
        log.warning("%s is finished but has no %s (deleted?); the report leaves it out", p, METRICS)
    if not paths:
        raise ConfigError(f"no finished runs under {root} (a run directory holds {SUMMARY} and {METRICS}); "
                          "finish the run or grid first")
    # Diverged cells have no result but count: a mean over the other seeds alone would pass for all of them.
    diverged = sorted(p.parent for p in root.rglob(DIVERGED) if (p.parent / CELL).exists() and p.parent not in finished)
    runs = [_read(p) for p in paths] + [_diverged(p) for p in diverged]
    # Cells of several grids (a reproduce directory) are told apart by their grid's directory.
    grids = {r.path.parent.parent for r in runs if (r.path / CELL).exists()}
    if len(grids) > 1:
        for r in runs:
            if (r.path / CELL).exists():
                r.setting = _grid_setting(r)
    # Separate runs of one method that are not grid cells are told apart by their directory.
    methods = [r.summary["method"] for r in runs if not r.setting]
    for r in runs:
        if not r.setting and methods.count(r.summary["method"]) > 1:
            r.setting = {"run": r.path.name}
    return runs


def _grid_setting(r: Run) -> dict:
    """Which grid a cell belongs to. The two stages of a --select grid (validation/, test/ beside
    selection.json) are its ``split``, which also says what its ``validation`` setting said."""
    grid = r.path.parent.parent
    if (grid.parent / SELECTION).exists():
        return {"split": grid.name, **{k: v for k, v in r.setting.items() if k != "validation"}}
    return {"grid": grid.name, **r.setting}


def _read(path: Path) -> Run:
    summary = json.loads((path / SUMMARY).read_text()) if (path / SUMMARY).exists() else _stopped(path)
    history = log_lines((path / METRICS).read_text())  # a line torn by a crash is no round
    config = json.loads((path / CONFIG).read_text()) if (path / CONFIG).exists() else {}
    cell = json.loads((path / CELL).read_text()) if (path / CELL).exists() else {}
    return Run(path, summary, history, config, cell.get("setting", {}))


def _diverged(path: Path) -> Run:
    cell = json.loads((path / CELL).read_text())
    config = json.loads((path / CONFIG).read_text()) if (path / CONFIG).exists() else {}
    return Run(path, {"method": cell["method"], "diverged": True}, [], config, cell.get("setting", {}))


def unscored(r: Run) -> bool:
    """A grid cell that diverged before its end: no result (one stopped by halving keeps its last rung's)."""
    return bool(r.summary.get("diverged")) and r.stopped_at is None


def group_runs(runs: list[Run]) -> list[Group]:
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.label, []).append(r)
    return [Group(label, [r for r in rs if not unscored(r)], [r for r in rs if unscored(r)]) for label, rs in groups.items()]


def _training_past_its_rung(path: Path) -> bool:
    """A candidate successive halving kept, stopped (the grid was) on its way to the next rung: in training, not
    stopped at its last rung as a candidate that was cut there is."""
    if any((path / name).exists() for name in (SUMMARY, DIVERGED)) or not (path / METRICS).exists():
        return False  # finished; or diverged after its rung, which _stopped says
    last = max(map(int, json.loads((path / RUNGS).read_text())), default=0)
    return any(line["round"] > last for line in log_lines((path / METRICS).read_text()))


def _stopped(path: Path) -> dict:
    """A run successive halving stopped early: its summary at the last round it reached, marked so."""
    rungs = json.loads((path / RUNGS).read_text())
    last = max(rungs, key=int)
    diverged = {"diverged": True} if (path / DIVERGED).exists() else {}  # after its last rung, on its way to the next
    return {**rungs[last], "stopped_at": int(last), **diverged}
