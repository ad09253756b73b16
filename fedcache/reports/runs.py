"""Finding and reading the runs under a run or grid directory, grouped by method and setting."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcache.disk import read_json
from fedcache.errors import ConfigError, DamagedFileError
from fedcache.grids.rungs import last_rung, paused_before_first_cut, round_reached
from fedcache.grids.spec import VALIDATION
from fedcache.paths import CELL, CONFIG, DIVERGED, GRID, METRICS, RESULTS, RUNGS, SELECTION, SUMMARY, is_store
from fedcache.wording import named

log = logging.getLogger(__name__)


@dataclass
class Run:
    path: Path
    summary: dict
    history: list[dict]
    config: dict
    setting: dict = field(default_factory=dict)  # swept values (grid cells), seed excluded
    missing: str = ""  # what the report lacks of this run (its metrics.jsonl cut short), said beside the results

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
    def reference(self) -> bool:
        """A method that pools every client's data (summary.json's ``pools_data``): the ceiling, not a contender."""
        return any(r.summary.get("pools_data") for r in self.runs)

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


def _give_a_directory() -> str:
    return (f"give a run directory ({named('train --out', 'fedcache.train(out=...)')}) or a grid directory "
            f"({named('grid --out', 'fedcache.grid(out=...)')})")


def find_runs(root: Path) -> list[Run]:
    """Every finished run at or below ``root`` (a train --out directory, a grid, or a folder of runs)."""
    root = Path(root)
    if not root.exists():
        raise ConfigError(f"{root} does not exist; {_give_a_directory()}")
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory; {_give_a_directory()}")
    found = _files_named(root, (SUMMARY, RUNGS, DIVERGED))
    finished = {p.parent for p in found if p.name != DIVERGED}
    cells = _Cells()
    finished -= _in_training(finished, cells)
    paths = sorted(p for p in finished if (p / METRICS).exists())
    for p in sorted(finished - set(paths)):  # a report short of a run without a word would mislead
        log.warning("%s is finished but has no %s (deleted?); the report leaves it out", p, METRICS)
    if not paths:
        raise ConfigError(_nothing_yet(root))
    # Diverged cells have no result but count: a mean over the other seeds alone would pass for all of them.
    diverged = sorted(p.parent for p in found
                      if p.name == DIVERGED and (p.parent / CELL).exists() and p.parent not in finished)
    runs = [_read(p, cells[p]) for p in paths] + [_diverged(p) for p in diverged]
    # Cells of several grids (a reproduce directory) are told apart by their grid's directory.
    grids = {grid_of(r.path) for r in runs if (r.path / CELL).exists()}
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


def _nothing_yet(root: Path) -> str:
    """Why ``root`` holds no run to report, and what to do: a --prune halving grid (or its validation stage) stopped
    before its first cut has none until that cut, which running it again makes."""
    grid = root.parent if root.name == VALIDATION and (root.parent / GRID).exists() else root
    paused = paused_before_first_cut(grid)
    if paused:
        again = named("run the same `fedcache grid` command again", "run the same fedcache.grid(...) call again")
        return (f"no results under {root} yet: its --prune halving grid is {paused}, and no run has a result before "
                f"that cut; {again} to continue it from there, then report")
    if not _files_named(root, (CONFIG, GRID, METRICS)):  # no run started there: "finish the run" was no advice
        what = "is a feature store, not a run" if is_store(root) else "holds no run or grid"
        return f"{root} {what} (a run directory holds {SUMMARY} and {METRICS}); {_give_a_directory()}"
    return f"no finished runs under {root} (a run directory holds {SUMMARY} and {METRICS}); finish the run or grid first"


def _files_named(root: Path, names: tuple[str, ...]) -> list[Path]:
    """Files so named at or below ``root``, links to directories followed: a folder of links to runs and grids (to
    report them together) was reported as holding no run, as ``Path.rglob`` does not follow them. A link back up
    the tree is entered once; a feature store (a grid's features, a Flower run's shards, one linked beside the runs)
    is not entered: it holds no run, and thousands of files."""
    seen: set[tuple[int, int]] = set()
    found = []
    for top, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()  # of two links to one folder, the first by name is the one a report names
        st = os.stat(top)
        if (st.st_dev, st.st_ino) in seen or ("zarr.json" in files and is_store(Path(top))):
            dirs.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        found += [Path(top) / f for f in files if f in names]
    return found


def grid_of(cell: Path) -> Path:
    """The grid (or --select stage) directory of a cell, as the report reached it (through links, named as they are);
    its real one where the cell was reached through a link to the grid's cells folder itself, whose parent is no grid."""
    reached, real = cell.parent.parent, cell.resolve().parent.parent
    return reached if reached.exists() and os.path.samefile(reached, real) else real


def _grid_setting(r: Run) -> dict:
    """Which grid a cell belongs to. The two stages of a --select grid (validation/, test/ beside
    selection.json) are its ``split``, which also says what its ``validation`` setting said."""
    grid = grid_of(r.path)
    if (grid.parent / SELECTION).exists():
        return {"split": grid.name, **{k: v for k, v in r.setting.items() if k != "validation"}}
    return {"grid": grid.name, **r.setting}


# A run's own files are rewritten by running it again: a grid runs a cell again once its folder is gone.
REDO_RUN = ("delete the folder {folder} and run the same `fedcache train` or `fedcache grid` command again (a grid runs "
            "that cell again), or move the folder out to report the others")


# What a report computes with (means, stds, sums over seeds), where a summary has it: a number, or null. A text
# ("41.2", edited by hand) was a traceback of numpy's sum (and a thousand lines of its locals).
NUMBERS = ("mean_accuracy", "std_accuracy", "global_accuracy", "worst10", "worst20", "worst40", "best10", "variance",
           "bytes_up", "bytes_down", "params_up_per_round", "params_up_per_client", "bytes_up_per_client", "seconds")


def _summary_problem(value) -> str:
    """A summary is a JSON object naming its method (the report labels and groups runs by it), its figures numbers."""
    if not isinstance(value, dict):
        return "not a JSON object"
    if not isinstance(value.get("method"), str):
        return "no \"method\" in it"
    wrong = next((k for k in NUMBERS if value.get(k) is not None and not _number(value[k])), None)
    if wrong:
        return f"its \"{wrong}\" is {json.dumps(value[wrong])[:40]}, not a number"
    clients = value.get("per_client_accuracy") or []
    if not isinstance(clients, list) or not all(_number(c) for c in clients):
        return "its \"per_client_accuracy\" is not a list of numbers"
    return ""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rungs_problem(value) -> str:
    """rungs.json: a summary per round a halving grid paused the run at, keyed by that round."""
    if not isinstance(value, dict) or not value:
        return "not a JSON object of rounds"
    if not all(k.isdigit() for k in value):
        return "a key that is not a round"
    return next(filter(None, map(_summary_problem, value.values())), "")


def _config_problem(value) -> str:
    """config.json: the report reads a run's options from its "spec" (runs written before it: "train") and its
    partition from "partition", each a JSON object, and the spec's sections too (``Run.option``)."""
    if not isinstance(value, dict):
        return "not a JSON object"
    for name in ("spec", "train", "partition"):
        if not isinstance(value.get(name, {}), dict):
            return f"its \"{name}\" is not a JSON object"
    section = next((k for k, v in (value.get("spec") or {}).items() if not isinstance(v, dict)), None)
    return f"its \"spec\" section \"{section}\" is not a JSON object" if section else ""


def _run_json(path: Path, name: str, problem=None) -> dict:
    """A run's ``name`` file ({} where it has none)."""
    if not (path / name).exists():
        return {}
    return read_json(path / name, REDO_RUN.format(folder=path), problem)


class _Cells(dict):
    """Each run's cell.json ({} where it has none), read once however many questions a report asks of it (its
    halving group, its candidate, its setting)."""

    def __missing__(self, path: Path) -> dict:
        self[path] = cell = _run_json(path, CELL)
        return cell


def _read(path: Path, cell: dict) -> Run:
    """A finished run; ``cell``: its cell.json."""
    summary = _run_json(path, SUMMARY, _summary_problem) or _stopped(path)
    history = _history(path)
    run = Run(path, summary, history, _run_json(path, CONFIG, _config_problem), _setting(path, cell))
    run.missing = _cut_short(run)
    return run


def _history(path: Path) -> list[dict]:
    """A finished run's metrics.jsonl, one round a line. Its last line torn by a crash while it was appended (no line
    end; bytes cut inside a character are one such line) is no round; any other line that is not a round's JSON
    object is damage (edited by hand, or another file in its place), refused naming the line: read as no round, the
    report said the run held "rounds up to 0 (cut short)"."""
    lines = (path / METRICS).read_text(errors="replace").split("\n")  # numbered as an editor numbers them
    history = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            if n == len(lines) and raw.lstrip().startswith("{"):  # the last, with no line end: torn
                continue
            line = _NOT_JSON
        if not isinstance(line, dict) or not isinstance(line.get("round"), int) or isinstance(line["round"], bool):
            what = "not JSON" if line is _NOT_JSON else 'not a JSON object with a whole-number "round"'
            raise DamagedFileError(path / METRICS, f"line {n} is {what}: {raw.strip()[:40]!r}",
                                   REDO_RUN.format(folder=path))
        history.append(line)
    return history


_NOT_JSON = object()


def _setting(path: Path, cell: dict) -> dict:
    if not isinstance(cell.get("setting", {}), dict):
        raise DamagedFileError(path / CELL, "its \"setting\" is not a JSON object", REDO_RUN.format(folder=path))
    return cell.get("setting", {})


def _cut_short(run: Run) -> str:
    """What a finished run's metrics.jsonl lacks: cut short (by hand, or an older version's torn file), its curves
    stop early; said, since the report can go on with the summary's figures."""
    rounds = run.summary.get("rounds")  # a run halving stopped: the round it stopped at
    last = max((line["round"] for line in run.history), default=0)
    if not isinstance(rounds, int) or last >= rounds:
        return ""
    log.warning("%s holds rounds up to %d of the run's %d (cut short); its group's curves in the report stop there",
                run.path / METRICS, last, rounds)
    return f"{run.path / METRICS} holds rounds up to {last} of {rounds}: its group's curves stop there"


def _diverged(path: Path) -> Run:
    cell = _run_json(path, CELL, _summary_problem)  # a diverged cell is named by its cell.json's method
    at = _run_json(path, DIVERGED).get("round")  # None: a record of an older fedcache
    summary = {"method": cell["method"], "diverged": True, "diverged_round": at if isinstance(at, int) else None}
    return Run(path, summary, [], _run_json(path, CONFIG, _config_problem), _setting(path, cell))


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
    stopped at its last rung as a candidate that was cut there is. Kept and not yet trained on, its rung says so
    (``continues``, grids/cell.mark_continued)."""
    if any((path / name).exists() for name in (SUMMARY, DIVERGED)):
        return False  # finished; or diverged after its rung, which _stopped says
    return round_reached(path, _rungs) > last_rung(path, _rungs)


def _rungs(path: Path) -> dict:
    """A run's rungs.json, a damaged one refused (naming it): the report would otherwise misjudge the run."""
    return _run_json(path, RUNGS, _rungs_problem)


def _in_training(paths: set[Path], cells: _Cells) -> set[Path]:
    """The cells of ``paths`` that halving kept at their last rung, on their way to the next. A candidate is kept or
    cut with all its seeds, and the grid trains them in turns: a seed still waiting at the rung, beside one that has
    gone past it (or finished), was kept there too, not cut."""
    past = {p for p in paths if _training_past_its_rung(p)}
    if not any((p / RUNGS).exists() and not (p / SUMMARY).exists() for p in paths - past):
        return past  # no seed waits at a rung (no halving grid): every other run's metrics need not be read twice
    everyone = {p: round_reached(p, _rungs) for p in paths}  # each run's metrics read once, for both questions
    past |= _awaiting_cut(everyone, cells)
    reached = {p: at for p, at in everyone.items() if not (p / DIVERGED).exists()}
    candidate = {p: _candidate(p, cells[p]) for p in reached}
    furthest = _furthest(reached, candidate)
    waiting = {p for p in reached if (p / RUNGS).exists() and not (p / SUMMARY).exists() and candidate[p] is not None}
    return past | {p for p in waiting if furthest[candidate[p]] > reached[p]}


def _awaiting_cut(reached: dict[Path, int], cells: _Cells) -> set[Path]:
    """The runs of ``reached`` (each run's last round, ``round_reached``) paused at a rung whose cut was never made (the grid was stopped before it, Ctrl-C):
    unfinished, as a full grid's interrupted cells are, not cut. The kept candidates of a cut train past its rung
    next, so while no run of the group has, and its stage has not finished (no results.csv), none there was cut.
    (A group whose last candidate waits at a rung while other groups revive theirs reads so too: unfinished.)"""
    paused = {p for p in reached if (p / RUNGS).exists() and not (grid_of(p) / RESULTS).exists()
              and not any((p / name).exists() for name in (SUMMARY, DIVERGED))}
    if not paused:
        return set()
    selected: dict[Path, set[str]] = {}  # per stage, the axes its grid selects (read once)
    group = {p: _group(p, cells[p], selected) for p in reached}
    furthest = _furthest(reached, group)
    return {p for p in paused if furthest.get(group[p], 0) <= last_rung(p, _rungs)}


def _furthest(reached: dict[Path, int], key: dict[Path, tuple | None]) -> dict[tuple, int]:
    """The furthest round any run of each ``key`` (its candidate, its group) reached."""
    furthest: dict[tuple, int] = {}
    for p, at in reached.items():
        if (k := key[p]) is not None:
            furthest[k] = max(furthest.get(k, 0), at)
    return furthest


def _group(path: Path, cell: dict, selected: dict[Path, set[str]]) -> tuple | None:
    """A grid cell's halving group (``cell``: its cell.json): its stage, method and the settings its grid does not
    select (None: no cell)."""
    if cell.get("method") is None:
        return None
    stage = grid_of(path)
    if stage not in selected:
        try:  # the --select grid's, above its stages (none: not a --select grid's stage)
            spec = json.loads((stage.parent / GRID).read_text()) if (stage.parent / GRID).exists() else None
        except (OSError, ValueError) as exc:
            log.warning("%s is damaged (%s): the report takes each candidate of %s for a group of its own, and may "
                        "call cut ones unfinished", stage.parent / GRID, exc, stage)
            spec = None
        selected[stage] = set(spec.get("select") or []) if isinstance(spec, dict) else set()
    setting = (cell.get("setting") or {}).items()
    return stage, cell["method"], tuple(sorted((str(k), str(v)) for k, v in setting if k not in selected[stage]))


def _candidate(path: Path, cell: dict) -> tuple | None:
    """A grid cell's candidate (``cell``: its cell.json): its grid, method and setting, its seed left out (None: not
    a grid cell)."""
    if cell.get("method") is None:
        return None
    return path.parent, cell["method"], tuple(sorted((str(k), str(v)) for k, v in (cell.get("setting") or {}).items()))


def _stopped(path: Path) -> dict:
    """A run successive halving stopped early: its summary at the last round it reached, marked so."""
    rungs = _rungs(path)
    last = max(rungs, key=int)
    diverged = {"diverged": True} if (path / DIVERGED).exists() else {}  # after its last rung, on its way to the next
    return {**rungs[last], "stopped_at": int(last), **diverged}
