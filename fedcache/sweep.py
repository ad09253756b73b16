"""``fedcache grid``: the cartesian product of methods x settings x seeds, run in parallel processes.

Layout of a grid directory::

    grid.json                 the spec, so a re-run can check it is the same grid
    features/                 the fused features, written once as .npy and memory-mapped by every worker
    cells/<cell>/             one ``fedcache train --out`` directory per run, plus cell.json;
                              summary.json is written last, so its presence marks a finished cell
    results.csv               one row per run
    table.md                  mean (std) over seeds per method and setting, best per column in bold

Workers share one copy of the features through the page cache (``np.load(mmap_mode="c")``) instead
of each reading and holding its own; each worker runs torch with one thread, since the heads are too
small for intra-op parallelism to beat one job per core.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tomllib

from fedcache.errors import ConfigError, FedcacheError
from fedcache.paths import writable_dir
from fedcache.table import Table

log = logging.getLogger(__name__)

from fedcache.federate.schedule import Schedule
from fedcache.spec import GridEngineSpec, RunSpec, grid_options, is_option, option, options

# Run options a grid fixes itself (one value for the whole grid, or its own axis: methods, seeds).
_RESERVED = tuple(o.name for o in options() if not o.opt.axis)
CELLS, FEATURES, RESULTS, TABLE, SPEC = "cells", "features", "results.csv", "table.md", "grid.json"
DONE = "summary.json"  # written last by train(): a finished cell
DIVERGED = "diverged.json"  # a validation cell whose training became NaN: finished, its candidate values lose
METRIC_COLUMNS = ("mean_accuracy", "std_accuracy", "global_accuracy", "worst10", "worst20", "worst40", "best10",
                  "variance", "bytes_up", "bytes_down", "params_up_per_round", "params_up_per_client", "bytes_up_per_client",
                  "rounds", "seconds", "random_weights", "worst_client_global_accuracy")


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
    engine: str = GridEngineSpec.engine  # fedcache/spec.py declares these two (GridEngineSpec)
    max_batch_cells: int | None = None

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
        how = GridEngineSpec(**{o.field: o.parse(getattr(self, o.field)) for o in grid_options()})  # checks them
        self.engine, self.max_batch_cells = how.engine, how.max_batch_cells

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["store"], d["out"] = str(self.store), str(self.out)
        for how in ("jobs", "track", "keep_checkpoints", "engine", "max_batch_cells"):  # how the cells run does not change their results
            d.pop(how)
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
    how = {"track": spec.track, "track_dir": spec.out if spec.track else None, "keep_checkpoints": spec.keep_checkpoints}
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


# ---- shared features -----------------------------------------------------------------------
def write_features(spec: GridSpec) -> Path:
    """The fused train/test tables as .npy files (float32, row-major) plus their metadata, written once."""
    from fedcache.federate.data import load_fused
    from fedcache.store.feature_store import FeatureStore

    folder = spec.out / FEATURES
    store = FeatureStore(spec.store, create=False)
    if (folder / "meta.json").exists():
        _check_same_entries(store, spec, json.loads((folder / "meta.json").read_text()))
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    meta = {}
    for split in ("train", "test"):
        t = load_fused(store, spec.dataset, spec.backbones, split)
        for name in ("features", "labels", "ids", "domains"):
            arr = getattr(t, name)
            np.save(folder / f"{split}_{name}.npy", np.ascontiguousarray(arr, np.float32 if name == "features" else arr.dtype))
        meta[split] = {"domain_names": list(t.domain_names), "class_names": list(t.class_names),
                       "random_weights": bool(t.random_weights), "entry_ids": list(t.entry_ids)}
    (folder / "meta.json").write_text(json.dumps(meta))  # last: its presence means the folder is complete
    return folder


def _check_same_entries(store, spec: GridSpec, meta: dict) -> None:
    """Finished cells were trained on the saved features: a re-extraction since then must not mix in."""
    saved = {e for split in ("train", "test") for e in meta[split]["entry_ids"]}
    current = {e.entry_id for split in ("train", "test") for b in spec.backbones for e in store.find(spec.dataset, split, b)}
    if saved != current:
        raise ConfigError(f"the store's features of {spec.dataset} changed since the grid in {spec.out} started "
                          "(re-extracted?); run the grid with another --out")


def read_features(folder: Path):
    """The shared tables, memory-mapped copy-on-write: pages are shared between workers, and a write
    (no method writes into its inputs, but torch wants writable arrays) stays private to its process."""
    from fedcache.store.feature_store import FeatureTable

    meta = json.loads((folder / "meta.json").read_text())
    tables = []
    for split in ("train", "test"):
        arrays = {n: np.load(folder / f"{split}_{n}.npy", mmap_mode="c" if n == "features" else None)
                  for n in ("features", "labels", "ids", "domains")}
        m = meta[split]
        tables.append(FeatureTable(**arrays, domain_names=tuple(m["domain_names"]), class_names=tuple(m["class_names"]),
                                   random_weights=m["random_weights"], entry_ids=tuple(m["entry_ids"])))
    return tuple(tables)


# ---- running ---------------------------------------------------------------------------------
CellCallback = Callable[[int, int, dict], None]  # (done, total, row of the cell just finished)
PlanCallback = Callable[[str], None]  # how the engine runs the cells, said before it starts


def run_grid(spec: GridSpec, on_cell: CellCallback | None = None, only: list[Cell] | None = None,
             on_plan: PlanCallback | None = None) -> Table:
    """Run every unfinished cell (finished ones are read back), then write results.csv and table.md.
    ``only``: these cells instead of the whole product (the test runs of a --select grid)."""
    if spec.select and only is None:
        return run_selected(spec, on_cell, on_plan)
    todo_cells = cells(spec) if only is None else only
    _check_cells(spec, todo_cells)
    _check_spec(spec)
    folder = write_features(spec)
    tables = read_features(folder)
    _make_partitions(spec, todo_cells, tables)
    rows: dict[Cell, dict] = {}
    pending = []
    for c in todo_cells:
        done = _read_done(spec, c)
        if done is not None:
            rows[c] = done
        else:
            pending.append(c)
    total = len(todo_cells)
    for c, row in _engine(spec, pending, folder, on_plan):
        rows[c] = row
        if on_cell:
            on_cell(len(rows), total, row)
    table = Table([rows[c] for c in todo_cells])
    write_outputs(spec.out, table, grid_caption(spec))
    return table


# ---- tune on validation, then test once ------------------------------------------------------
VALIDATION, TEST, SELECTION = "validation", "test", "selection.json"


def _engine(spec: GridSpec, todo: list[Cell], folder: Path, on_plan: PlanCallback | None) -> Iterator[tuple[Cell, dict]]:
    if spec.engine == "batched" and todo:
        return _batched(spec, todo, folder, on_plan)
    if on_plan and todo:
        on_plan(f"processes engine: {len(todo)} cells as their own runs, {min(spec.jobs, len(todo))} at a time")
    return _execute(spec, todo, folder)


BATCHES = "batches"  # a batch's checkpoint while it trains: out/batches/<id>/


def _batched(spec: GridSpec, todo: list[Cell], folder: Path, on_plan: PlanCallback | None) -> Iterator[tuple[Cell, dict]]:
    """The batched engine (sweep_batched.py): stackable cells in batches, the others as their own runs."""
    from fedcache import sweep_batched

    tables = read_features(folder)
    runs = {c: train_config(spec, c, spec.out / CELLS / c.name) for c in todo}
    started = sweep_batched.started_batches(spec.out / BATCHES, todo)
    grouping = sweep_batched.group(runs, tables, spec.max_batch_cells, {c: why for c in todo if (why := _alone(spec, c))},
                                   started, spec.jobs)
    _drop_stale_batches(spec.out / BATCHES, grouping.batches)
    batches = [{c: runs[c] for c in batch} for batch in grouping.batches]
    alone = [c for c in todo if c in grouping.alone]
    # Batches first (the longest tasks), then the cells that run alone, in one pool: no worker idles at a
    # barrier between the two.
    tasks = [(_batch_worker, (spec, batch, folder)) for batch in batches] + [(_worker, (spec, c, folder)) for c in alone]
    text = grouping.describe()
    if spec.jobs > 1 and len(tasks) > 1:
        text += f"; {min(spec.jobs, len(tasks))} at a time, each in a worker process of one torch thread"
    log.info(text)
    if on_plan:
        on_plan(text)
    if spec.jobs == 1 or len(tasks) <= 1:
        for batch in batches:
            yield from _run_batch(spec, batch, tables)
        yield from _execute(spec, alone, folder)  # in this process too: one cell at most, or --jobs 1
    else:  # side by side, one torch thread each, as the process engine runs its cells
        yield from _in_workers(spec, tasks)
    _remove_if_empty(spec.out / BATCHES)


def _run_batch(spec: GridSpec, batch: dict, tables) -> Iterator[tuple[Cell, dict]]:
    from fedcache import sweep_batched
    from fedcache.federate.divergence import DivergedError

    folder = spec.out / BATCHES / sweep_batched.batch_id([c.name for c in batch])
    for c in batch:
        out = spec.out / CELLS / c.name
        out.mkdir(parents=True, exist_ok=True)
        _write_cell_json(out, c)
    try:
        done = sweep_batched.run_batch(batch, tables, folder)
    except DivergedError:
        if not all(cfg.schedule.validation for cfg in batch.values()):
            raise
        # Tuning: which stacked run diverged is not known here, so each runs as its own run, which records
        # its own divergence (run_cell); the stack's checkpoint would only replay into NaN.
        shutil.rmtree(folder, ignore_errors=True)
        yield from ((c, run_cell(spec, c, tables)) for c in batch)
        return
    for c, result in done:
        yield c, _row(c, result.summary, spec.out / CELLS / c.name)
    # The grid removes the emptied parent once every batch is done (batches run side by side).
    shutil.rmtree(folder)


def _drop_stale_batches(folder: Path, batches: list[list[Cell]]) -> None:
    """The folders of interrupted batches that no batch of this run continues, said and removed (left, they
    would never be read again)."""
    from fedcache import sweep_batched

    live = {sweep_batched.batch_id([c.name for c in b]) for b in batches}
    for old in sorted(folder.iterdir()) if folder.is_dir() else []:
        if old.name not in live:
            log.warning("%s: an interrupted batch whose cells are grouped otherwise now (a lower --max-batch-cells, less "
                        "free memory, or some of them finished); they train from round 0", old)
            shutil.rmtree(old)


def _remove_if_empty(path: Path) -> None:
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()


def _batch_worker(spec: GridSpec, batch: dict, folder: Path) -> list[tuple[Cell, dict]]:
    return list(_run_batch(spec, batch, _tables(folder)))


def _alone(spec: GridSpec, c: Cell) -> str:
    """Why the grid runs this cell as its own run whatever its method, or empty."""
    from fedcache.federate.rundir import CHECKPOINT

    if spec.track:
        return "--track sends each run's metrics as it trains"
    if spec.keep_checkpoints == "all":
        return "--keep-checkpoints all keeps every round of each run"
    if (spec.out / CELLS / c.name / CHECKPOINT).exists():
        return "started as its own run (resumed as one)"
    return ""


def run_selected(spec: GridSpec, on_cell: CellCallback | None = None, on_plan: PlanCallback | None = None) -> Table:
    """--select: every cell on the validation split (spare training rows) in ``out/validation``; per
    method and other settings the selected axes' values with the best mean over seeds; those alone on
    the test split in ``out/test``, with the same seeds and partitions. ``out/table.md`` shows the test
    results with the chosen values; ``out/selection.json`` every candidate's validation score."""
    from fedcache.selection import RULE, choose

    if "validation" in spec.sweep:
        raise ConfigError("--select tunes on the validation split itself; leave out --validation")
    _check_spec(spec)  # out/grid.json names the --select grid: a plain grid there (or another --select) is refused
    base = dataclasses.replace(spec, select=[])
    n_tuned = len(cells(base))
    n_tested = len(cells(dataclasses.replace(base, sweep={k: vs[:1] if k in spec.select else vs for k, vs in spec.sweep.items()})))
    tuned = run_grid(dataclasses.replace(base, out=spec.out / VALIDATION, sweep={**spec.sweep, "validation": ["true"]}),
                     _counting(on_cell, 0, n_tuned + n_tested), on_plan=on_plan)
    choices = choose(tuned.to_records(), list(spec.sweep), spec.select)
    picked = [Cell(c.method, seed, tuple((k, dict(c.fixed + c.chosen)[k]) for k in spec.sweep))
              for c in choices for seed in spec.seeds]
    tested = run_grid(dataclasses.replace(base, out=spec.out / TEST), _counting(on_cell, n_tuned, n_tuned + n_tested),
                      only=picked, on_plan=on_plan)
    (spec.out / SELECTION).write_text(json.dumps({"rule": RULE, "selected": spec.select, "choices": [
        {"method": c.method, **dict(c.fixed), "chosen": dict(c.chosen), "validation_score": c.score,
         "candidates": [{**dict(v), "validation_score": sc, **({"diverged": True} if sc is None else {})}
                        for v, sc in c.candidates]} for c in choices]}, indent=2) + "\n")
    caption = grid_caption(spec) + f"; {', '.join(spec.select)} chosen per method and setting on validation ({RULE}), then tested once"
    tested.to_csv(spec.out / RESULTS)
    (spec.out / TABLE).write_text(summary_markdown(tested, caption=caption, beside=spec.select) + "\n")
    return tested


def _counting(on_cell: CellCallback | None, before: int, total: int) -> CellCallback | None:
    """One count over both stages of a --select grid (validation, then test), so progress never goes back."""
    if on_cell is None:
        return None
    return lambda done, _, row: on_cell(before + done, total, row)


def _check_spec(spec: GridSpec) -> None:
    """A grid directory belongs to one grid: resuming with other options would mix results."""
    path = spec.out / SPEC
    mine = json.loads(json.dumps(spec.to_json()))
    if path.exists():
        saved = json.loads(path.read_text())
        if saved == mine:
            return
        if _holds_runs(spec.out):
            raise ConfigError(f"{spec.out} holds a different grid (it differs in {_differences(saved, mine)}; see {path}); "
                              "use the same options to resume it, or another --out")
        # Nothing ran: a start refused before its first cell (--select without spare rows, say) left only its
        # plan and features. The corrected command its error asked for must not be refused in turn.
        shutil.rmtree(spec.out / FEATURES, ignore_errors=True)
    spec.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=2) + "\n")


def _holds_runs(out: Path) -> bool:
    """Whether a run under ``out`` finished or checkpointed (a cell, a --select stage's cell, a batch)."""
    return any(p.name in (DONE, DIVERGED) or p.suffix == ".pt" for p in out.rglob("*") if p.is_file())


def _differences(saved: dict, mine: dict) -> str:
    """``methods (fedavg,fedproto there, fedavg here), alpha (...)``: the keys, swept keys one by one."""
    old, new = saved.get("sweep", {}), mine.get("sweep", {})
    pairs = [(k, saved.get(k), mine.get(k)) for k in sorted({*saved, *mine}) if k != "sweep" and saved.get(k) != mine.get(k)]
    pairs += [(k, old.get(k), new.get(k)) for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
    shown = lambda v: "unset" if v in (None, []) else ",".join(map(str, v)) if isinstance(v, list) else str(v)
    return ", ".join(f"{k} ({shown(a)} there, {shown(b)} here)" for k, a, b in pairs)


def _check_cells(spec: GridSpec, todo: list[Cell]) -> None:
    """Every cell's options (types, ranges) and settings, checked before anything is read or written:
    a bad value in the last cell must not surface after hours of the others. An unknown method name
    raises with the close matches and the full list."""
    for c in todo:
        train_config(spec, c, None)


def _make_partitions(spec: GridSpec, todo: list[Cell], tables) -> None:
    """Every distinct partition is made and stored here, once, so parallel workers only read the store."""
    from fedcache.training import load_data

    seen = set()
    for c in todo:
        cfg = train_config(spec, c, None)
        key = (cfg.partition, cfg.schedule.seed)
        if key not in seen:
            seen.add(key)
            load_data(cfg, tables)


def _read_done(spec: GridSpec, c: Cell) -> dict | None:
    path = spec.out / CELLS / c.name / DONE
    if (path.parent / DIVERGED).exists():
        return _diverged_row(c, path.parent)
    return _row(c, json.loads(path.read_text()), path.parent) if path.exists() else None


def _execute(spec: GridSpec, todo: list[Cell], folder: Path) -> Iterator[tuple[Cell, dict]]:
    if spec.jobs == 1 or len(todo) <= 1:
        tables = read_features(folder)
        for c in todo:
            yield c, run_cell(spec, c, tables)
        return
    yield from _in_workers(spec, [(_worker, (spec, c, folder)) for c in todo])


def _in_workers(spec: GridSpec, tasks: list[tuple[Callable, tuple]]) -> Iterator:
    """Each task's (cell, row) pairs as the task finishes, from ``spec.jobs`` worker processes of one torch
    thread each."""
    import multiprocessing

    # spawn, not fork: a forked child inherits the parent's OpenMP thread pool in an undefined state.
    ctx = multiprocessing.get_context("spawn")
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(min(spec.jobs, len(tasks)), mp_context=ctx, initializer=_init_worker)
    try:
        futures = [pool.submit(fn, *args) for fn, args in tasks]
        for fut in as_completed(futures):
            yield from fut.result()
    except BrokenProcessPool:
        raise FedcacheError(
            "a grid worker process died. From a script, call fedcache.grid(jobs>1) under "
            "`if __name__ == '__main__':` (worker processes re-import the script); otherwise re-run "
            "with --jobs 1 to see the error. Finished cells are kept."
        ) from None
    except BaseException:
        # Ctrl-C, SIGTERM (the CLI turns it into an interrupt) or an error: leaving the `with` block would
        # wait for every queued cell. Drop the queue and stop the running cells; finished ones are on disk.
        pool.shutdown(wait=False, cancel_futures=True)
        _stop(set(multiprocessing.active_children()) - before)
        raise
    pool.shutdown()


def _stop(workers: set, grace: float = 5.0) -> None:
    for w in workers:
        w.terminate()
    deadline = time.monotonic() + grace
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
        if w.is_alive():
            w.kill()


def _init_worker() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


_TABLES: dict[str, tuple] = {}  # per worker process: the memory-mapped features, opened once


def _tables(folder: Path):
    """The grid's shared features, read once per worker process."""
    key = str(folder)
    if key not in _TABLES:
        _TABLES[key] = read_features(folder)
    return _TABLES[key]


def _worker(spec: GridSpec, c: Cell, folder: Path) -> list[tuple[Cell, dict]]:
    return [(c, run_cell(spec, c, _tables(folder)))]


def run_cell(spec: GridSpec, c: Cell, tables) -> dict:
    """One run in its own directory; an interrupted one resumes from its checkpoint."""
    from fedcache.federate.divergence import DivergedError
    from fedcache.federate.rundir import CHECKPOINT
    from fedcache.training import train

    out = spec.out / CELLS / c.name
    resume = (out / CHECKPOINT).exists() and (out / "config.json").exists()
    if not resume and out.exists():
        shutil.rmtree(out)  # started but never checkpointed: nothing to keep
    out.mkdir(parents=True, exist_ok=True)
    _write_cell_json(out, c)
    cfg = train_config(spec, c, out).replace(resume=resume)
    try:
        result = train(cfg, tables=tables, run_name=c.name)
    except DivergedError as exc:
        if not cfg.schedule.validation:
            raise
        # Tuning tries values that may diverge (a large lr): that is the candidate's result, which loses
        # (fedcache/selection.py), not the end of the grid. Its error is kept beside the run.
        (out / DIVERGED).write_text(json.dumps({"error": str(exc)}) + "\n")
        return _diverged_row(c, out)
    return _row(c, result.summary, out)


def _diverged_row(c: Cell, out: Path) -> dict:
    # No summary: every figure is None, but a swept key that is also a figure (rounds) keeps its value.
    return {**_row(c, {}, out), **dict(c.setting), "diverged": True}


def _write_cell_json(out: Path, c: Cell) -> None:
    (out / "cell.json").write_text(json.dumps({"method": c.method, "seed": c.seed, "setting": dict(c.setting)}) + "\n")


def _row(c: Cell, summary: dict, out: Path) -> dict:
    row = {"method": c.method, **dict(c.setting), "seed": c.seed}
    row.update({k: summary.get(k) for k in METRIC_COLUMNS})
    row["run_dir"] = str(Path(CELLS) / out.name)
    return row


# ---- outputs ---------------------------------------------------------------------------------
def write_outputs(out: Path, table: Table, caption: str = "") -> None:
    table.to_csv(out / RESULTS)
    (out / TABLE).write_text(summary_markdown(table, caption=caption) + "\n")


def grid_caption(spec: GridSpec) -> str:
    """What every cell shares: data, fixed options and settings (one value), seeds; axes are the columns."""
    fixed = [f"{k}={vs[0]}" for k, vs in spec.sweep.items() if len(vs) == 1]
    return (f"{spec.dataset} on {'+'.join(spec.backbones)}; seeds {','.join(map(str, spec.seeds))}"
            + (f"; fixed: {', '.join(fixed)}" if fixed else "")
            + "; every other option at `fedcache train`'s default (each cell's config.json has them all)")


def summary_markdown(table: Table, metric: str = "mean_accuracy", caption: str = "", beside: list[str] = ()) -> str:
    """Methods as rows, the settings that vary as columns, mean (std) over seeds; the best mean of each
    column in bold. Settings with one value across the grid go to the caption, not the column labels.
    ``beside``: settings shown next to each result instead of as columns (values chosen per cell)."""
    rows = table.to_records()
    if not rows:
        return "(no runs)"
    setting_keys = [k for k in rows[0] if k not in ("method", "seed", "run_dir", "diverged", *METRIC_COLUMNS, *beside)
                    and len({str(r[k]) for r in rows}) > 1]
    label = lambda r: ", ".join(f"{k}={r[k]}" for k in setting_keys) or metric.replace("_", " ")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    columns = list(dict.fromkeys(label(r) for r in rows))
    stats: dict[tuple[str, str], tuple[float, float, int]] = {}
    for m in methods:
        for col in columns:
            vals = [r[metric] for r in rows if r["method"] == m and label(r) == col and r[metric] is not None]
            if vals:
                std = float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")  # sample std, as the papers print
                stats[m, col] = (float(np.mean(vals)), std, len(vals))
    best = {col: max((s[0] for (m, c), s in stats.items() if c == col), default=None) for col in columns}
    lines = [f"{metric.replace('_', ' ')} %, mean (sample std, ddof=1) over seeds" + (f"; {caption}" if caption else ""), "",
             "| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for m in methods:
        cells_ = []
        for col in columns:
            if (m, col) not in stats:
                cells_.append("-")
                continue
            mean, std, _ = stats[m, col]
            text = f"{mean:.2f} ({std:.2f})" if std == std else f"{mean:.2f} (one seed)"
            chosen = next((r for r in rows if r["method"] == m and label(r) == col), {})
            text += "".join(f", {k}={chosen[k]}" for k in beside if k in chosen)
            cells_.append(f"**{text}**" if np.isclose(mean, best[col]) else text)
        lines.append(f"| {m} | " + " | ".join(cells_) + " |")
    return "\n".join(lines)


def load_results(out: Path) -> Table:
    """A finished grid's results.csv as a Table (numbers parsed)."""
    path = Path(out) / RESULTS
    if not path.exists():
        raise ConfigError(f"{out} has no {RESULTS}; run `fedcache grid --out {out}` first")
    return Table.from_csv(path)
