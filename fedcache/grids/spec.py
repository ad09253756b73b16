"""A grid's specification: methods x axes x seeds, its cells, and the TOML file that may hold it.

Layout of a grid directory::

    grid.json                 the spec, so a re-run can check it is the same grid
    features/                 the fused features, written once as .npy and memory-mapped by every worker
    cells/<cell>/             one run directory per cell (as ``fedcache train --out`` writes one), plus cell.json;
                              summary.json is written last, so its presence marks a finished cell
    batches/<id>/             a stack of cells while it trains (the batched engine): its checkpoint
    validation/, test/        a --select grid's two stages, each a grid directory (with --prune halving, a
                              validation cell cut at a rung keeps its checkpoint and rungs.json, no summary.json)
    results.csv, table.md     one row per cell; mean (std) over seeds per method and setting
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from fedcache.errors import ConfigError
from fedcache.federate.schedule import Schedule
from fedcache.paths import writable_dir
from fedcache.spec import GRID_SECTIONS, GridEngineSpec, PruneSpec, RunSpec, grid_options, is_option, option, options

CELLS, FEATURES, BATCHES, RESULTS, TABLE, SPEC = "cells", "features", "batches", "results.csv", "table.md", "grid.json"
# Run options a grid fixes itself (one value for the whole grid, or its own axis: methods, seeds).
_RESERVED = tuple(o.name for o in options() if not o.opt.axis)


@dataclass
class GridSpec:
    store: Path
    dataset: str
    backbones: list[str]
    methods: list[str]
    out: Path
    seeds: list[int] = field(default_factory=lambda: [Schedule().seed])
    # key -> values. A key that is a run option (alpha, partition, clients, rounds, ...; fedcache/spec.py)
    # sets that option; any other key is a method / optimizer setting (lr, mu, ...), as with ``train --set``.
    sweep: dict[str, list[str]] = field(default_factory=dict)
    jobs: int = 1
    # Axes whose values are chosen on validation (spare training rows), then run once on the test split.
    select: list[str] = field(default_factory=list)
    # How each cell runs, not what it computes (left out of the grid's identity, like jobs).
    track: list[str] = field(default_factory=list)
    keep_checkpoints: str = "last"
    device: str = "auto"  # where every cell's rounds run (engine.device); recorded, since a GPU rounds otherwise
    engine: str = GridEngineSpec.engine  # fedcache/spec.py declares these (GridEngineSpec, PruneSpec)
    max_batch_cells: int | None = None
    prune: str = PruneSpec.prune
    reduction_factor: int = PruneSpec.reduction_factor
    min_rounds: int | None = None

    def __post_init__(self) -> None:
        self.store, self.out = Path(self.store), writable_dir(self.out, "--out")
        self.seeds = [option("seed").parse(s) for s in self.seeds]  # 'a' is a clear error, not a ValueError
        self.sweep = {k.replace("-", "_"): [str(v) for v in (vs if isinstance(vs, (list, tuple)) else [vs])]
                      for k, vs in self.sweep.items()}
        if not self.methods or not self.backbones or not self.seeds:
            raise ConfigError("a grid needs at least one method, one backbone and one seed")
        bad = [k for k in self.sweep if is_option(k) and option(k).name in _RESERVED]
        if bad:
            raise ConfigError(f"--set {bad[0]}=...: give methods with --method, seeds with --seeds; "
                              f"{', '.join(_RESERVED)} cannot be swept with --set")
        empty = [k for k, vs in self.sweep.items() if not vs]
        if empty:
            raise ConfigError(f"--set {empty[0]}= has no values; write --set {empty[0]}=v1,v2")
        if self.jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {self.jobs}")
        for o in grid_options():
            setattr(self, o.field, o.parse(getattr(self, o.field)))
        for section in GRID_SECTIONS.values():  # checks them
            section(**{f.name: getattr(self, f.name) for f in dataclasses.fields(section)})
        self._check_pruning()

    def _check_pruning(self) -> None:
        if self.prune == "none":
            return
        if not self.select:
            raise ConfigError(f"--prune {self.prune} cuts the candidates of --select; name the axes to choose, "
                              "e.g. --set lr=1e-3,1e-2 --select lr")
        if any(option(k).name == "rounds" for k in self.select if is_option(k)):
            raise ConfigError(f"--prune {self.prune} gives the candidates rounds itself; it cannot --select rounds")
        if self.track:
            raise ConfigError(f"--prune {self.prune} with --track: a tracker's run of a candidate cut early would stay "
                              "open; track the plain --select grid, or leave out --track")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["store"], d["out"] = str(self.store), str(self.out)
        how = ("jobs", "track", "keep_checkpoints", *(o.field for o in grid_options() if not o.opt.recorded))
        for key in how:  # how the cells run does not change their results
            d.pop(key)
        return d


@dataclass(frozen=True)
class Cell:
    method: str
    seed: int
    setting: tuple[tuple[str, str], ...]  # the swept (key, value) pairs, in spec order

    @property
    def name(self) -> str:
        parts = [self.method] + [f"{k}={v}" for k, v in self.setting] + [f"seed={self.seed}"]
        return re.sub(r"[^A-Za-z0-9_.=+-]", "_", "__".join(parts))

    @property
    def setting_label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.setting) or "-"


Stops = dict  # Cell -> the round it pauses at (successive halving's rungs); a cell not in it runs to its end


def load_toml(path: Path) -> dict:
    """A grid file: the GridSpec fields at top level, sweeps under ``[set]`` (docs/getting-started.md)."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"grid file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"grid file {path} is not valid TOML: {exc}") from None
    known = {f.name for f in dataclasses.fields(GridSpec)} | {"set"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"grid file {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if "set" in raw:
        raw["sweep"] = raw.pop("set")
    return raw


def cells(spec: GridSpec) -> list[Cell]:
    keys = list(spec.sweep)
    combos = list(itertools.product(*(spec.sweep[k] for k in keys)))
    return [Cell(m, s, tuple(zip(keys, combo))) for m in spec.methods for combo in combos for s in spec.seeds]


def train_config(spec: GridSpec, cell: Cell, out: Path | None) -> RunSpec:
    """The cell's run: the grid's fixed options, then the cell's axes as overrides (run options and settings
    alike, each routed to the field it names: ``RunSpec.override``)."""
    how = {"track": spec.track, "track_dir": spec.out if spec.track else None, "keep_checkpoints": spec.keep_checkpoints,
           "device": spec.device}
    base = RunSpec.of(store=spec.store, dataset=spec.dataset, backbones=spec.backbones, method=cell.method,
                      seed=cell.seed, out=out, **how)
    return base.override(dict(cell.setting))


def option_axes(given: dict[str, list], methods: list[str]) -> dict[str, list]:
    """Axes given as run-option flags (``grid --alpha 0.1,1``): a flag names its option even where a method
    of the grid has a setting of the same name (perfedavg's ``alpha``), so it is qualified there
    (``partition.alpha``) instead of refused as ambiguous; elsewhere it keeps its short name."""
    from fedcache.spec import setting_fields

    def key(name: str) -> str:
        shared = any(name in fields for m in methods for fields in setting_fields(m).values())
        return option(name).key if shared else name

    return {key(name): values for name, values in given.items()}
