"""Running a grid's cells: check its directory, share its features, make its partitions, train the unfinished
cells (each as its own run: ``grids/processes.py``; or stacked: ``grids/batches.py``) and write results.csv and
table.md. (A ``--select`` grid runs this twice: ``grids/select.py``.)"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from fedcache.disk import human, read_json
from fedcache.errors import ConfigError
from fedcache.federate.rundir import CONFIG, RunDir, same_config, write_json
from fedcache.paths import CHECKPOINT
from fedcache.grids.batches import drop_batches_of, drop_behind_batches, own_runs, run_batched, started_batches
from fedcache.grids.cell import DIVERGED, DONE, clear_killed, read_done
from fedcache.grids.features import read_features, write_features
from fedcache.grids.pool import Workers
from fedcache.grids.processes import execute, jobs_of
from fedcache.grids.spec import BATCHES, CELLS, FEATURES, SPEC, Cell, GridSpec, Names, Stops, cells, same_value, train_config
from fedcache.grids.table import grid_caption, write_outputs
from fedcache.progress import StepCallback, said_now, said_step
from fedcache.spec import RunSpec, method_class
from fedcache.table import Table
from fedcache.training import instantiate, load_data
from fedcache.wording import count

log = logging.getLogger(__name__)

CellCallback = Callable[[int, int, dict], None]  # (done, total, row of the cell just finished)
SaidCellCallback = Callable[[int, int, dict, str], None]  # the same, and the cell in words as logged (grids.cell_text)
PlanCallback = Callable[[str], None]  # how the engine runs the cells, said before it starts


def run_cells(spec: GridSpec, on_cell: CellCallback | None = None, only: list[Cell] | None = None,
              on_plan: PlanCallback | None = None, stops: Stops | None = None, write: bool = True,
              on_step: StepCallback | None = None, workers: Workers | None = None, plan: str | None = None,
              prepared: Prepared | None = None) -> Table:
    """Run every unfinished cell (finished ones are read back), then write results.csv and table.md (unless not
    ``write``). ``only``: these cells instead of the whole product (the test runs of a --select grid);
    ``stops``: the round each of them pauses at instead of its end (a rung of grids/halving.py); ``on_step``: the
    steps before the first cell that took a while (``progress.said_step``), and a re-run's count of the cells left
    (else told to ``on_plan``); ``workers``: the worker processes to train in (``pool.Workers``: a --select grid's,
    kept for its next stage or rung), else started for these cells; ``plan``: the caller's own (halving's rungs), said
    once the partitions are made, before the engine's plan, as a re-run's count is (said before them, a command's
    "grid started" came before its "partitions ready"); ``prepared``: the partitions and methods the command made
    and checked before (a --select grid's, kept for its next stage or rung): only new ones are made and said."""
    stops = stops or {}
    todo_cells = cells(spec) if only is None else only
    configs = check_cells(spec, todo_cells)
    check_spec(spec)
    clear_killed(spec.out)
    rows, pending = _finished_and_pending(spec, todo_cells, stops)
    folder = spec.features_folder
    fresh = not (folder / "meta.json").exists()
    # A finished grid re-run for its tables writes no copy of the features where a user deleted it to free the disk
    # (GBs on a large store); one that is there is still checked against the store.
    if pending or not fresh:
        folder, tables = _shared_features(spec, fresh, on_step)
        _prepare(configs, pending, tables, folder, fresh, on_step, prepared or Prepared())
    total = len(todo_cells)
    resumed = _checkpointed(spec, pending) if only is None else 0
    if (rows or resumed) and only is None:  # a re-run: said before the engine's plan (the rest only)
        # As a step where the caller takes them (the CLI prints one without starting its bar, whose "grid started"
        # then follows the engine's plan, as on a fresh grid); else with the plan. A finished grid's too: its
        # engine has no plan to say, and a caller's on_plan heard nothing of the call.
        _say_resuming(spec, len(rows), total, len(pending), resumed, on_step or on_plan)
    if plan is not None:  # as the resuming line is: "grid started" follows the engine's plan
        said_now(log, on_step or on_plan, plan)
    for c, row in _engine(spec, pending, folder, on_plan, stops, workers):
        rows[c] = row
        if on_cell:
            on_cell(len(rows), total, row)
    table = Table([rows[c] for c in todo_cells])
    if write:
        write_outputs(spec.out, table, grid_caption(spec), axes=list(spec.sweep))
    return table


def _finished_and_pending(spec: GridSpec, todo: list[Cell], stops: Stops) -> tuple[dict[Cell, dict], list[Cell]]:
    """The rows of the cells that finished before (or paused where ``stops`` says), and the cells left to train."""
    rows: dict[Cell, dict] = {}
    pending = []
    for c in todo:
        done = read_done(spec, c, stops.get(c))
        if done is not None:
            rows[c] = done
        else:
            pending.append(c)
    return rows, pending


def _shared_features(spec: GridSpec, fresh: bool, on_step: StepCallback | None) -> tuple[Path, tuple]:
    """The grid's features, written from the store where ``fresh`` (said: on a large store, the longest step before
    the first cell), and read back memory-mapped."""
    t0 = time.perf_counter()
    folder = write_features(spec)
    tables = read_features(folder)
    if fresh:
        seconds = time.perf_counter() - t0
        rows, size = sum(len(t) for t in tables), sum(t.features.nbytes for t in tables)
        said_step(log, on_step, f"shared features ready in {seconds:.1f} s: {count(rows, 'row')} ({human(size)}) of "
                                f"{spec.dataset} on {'+'.join(spec.backbones)} read from {spec.store} into {folder}",
                  seconds)
    return folder, tables


@dataclass
class Prepared:
    """What a grid command made and checked before its cells trained. A --select grid's stages and the rungs of its
    successive halving share one: each after the first found every partition in the store again and built every
    method again (seconds on a large store, every time), and said "partitions ready" again, read as work redone."""

    partitions: set[tuple] = field(default_factory=set)  # (partition, seed): made, or found, and stored
    # (method, whether on validation): built on their first cell's data. By split too: a method checks the data it
    # is built on (tpfl's visual=pixel, the test split's images), so a test stage's must be built on the test split.
    methods: set[tuple[str, bool]] = field(default_factory=set)


def _prepare(configs: dict[Cell, RunSpec], pending: list[Cell], tables, folder: Path, fresh: bool,
             on_step: StepCallback | None, prepared: Prepared) -> None:
    """The cells' partitions and the methods that train now, checked before any cell runs (those ``prepared``
    holds were, by this command)."""
    t0 = time.perf_counter()
    try:
        partitions = _make_partitions(configs, tables, prepared.partitions)
        # What trains now: a finished grid builds nothing to write its tables.
        methods = _check_methods(configs, pending, tables, prepared.methods)
    except BaseException:
        if fresh:  # refused before any cell (no spare rows for --select, say): a copy of the data no cell needs
            shutil.rmtree(folder, ignore_errors=True)
        raise
    seconds = time.perf_counter() - t0
    if partitions:
        said_step(log, on_step, f"partitions ready in {seconds:.1f} s: {count(partitions, 'partition')}, "
                                f"{count(methods, 'method')} checked", seconds)
    elif methods:  # a re-run's later rung, or the test stage: its cells' partitions were ready
        split = "" if any(cfg.schedule.validation for cfg in configs.values()) else " on the test split"
        said_step(log, on_step, f"{count(methods, 'method')} checked{split} in {seconds:.1f} s", seconds)


def _checkpointed(spec: GridSpec, pending: list[Cell]) -> int:
    """How many of the cells left to train continue from a checkpoint: their own, or their batch's."""
    batched = {c for batch in started_batches(spec.out / BATCHES, pending) for c in batch}
    return sum(c in batched or (spec.out / CELLS / c.name / CHECKPOINT).exists() for c in pending)


def _say_resuming(spec: GridSpec, finished: int, total: int, pending: int, resumed: int,
                  say: Callable[[str], None] | None) -> None:
    """A re-run's count of what it keeps, and of what it continues rather than starts (a grid interrupted before its
    first cell finished said nothing, as a fresh one)."""
    how = ("their results are read back" if not pending else
           "none from a checkpoint" if not resumed else "from its last checkpoint" if pending == 1 else
           "each from its last checkpoint" if resumed == pending else
           f"{resumed} from {'its last checkpoint' if resumed == 1 else 'their last checkpoints'}")
    text = (f"resuming {spec.out}: {finished} of {count(total, 'cell')} finished before, {pending or 'none'} to train "
            f"({how})")
    log.info(text)
    if say:
        say(text)


def _engine(spec: GridSpec, todo: list[Cell], folder: Path, on_plan: PlanCallback | None,
            stops: Stops, workers: Workers | None) -> Iterator[tuple[Cell, dict]]:
    if not todo:
        return iter(())
    return GRID_ENGINES[spec.engine](spec, todo, folder, on_plan, stops, workers)


def _processes(spec: GridSpec, todo: list[Cell], folder: Path, on_plan: PlanCallback | None,
               stops: Stops, workers: Workers | None) -> Iterator[tuple[Cell, dict]]:
    drop_behind_batches(spec.out / BATCHES, {c: train_config(spec, c, spec.out / CELLS / c.name) for c in todo}, stops)
    _refuse_batched_progress(spec, todo)
    drop_batches_of(spec.out / BATCHES, todo)
    said_now(log, on_plan, f"processes engine: {own_runs(len(todo))}, "
                           f"{min(jobs_of(spec), len(todo))} at a time")
    return execute(spec, todo, folder, stops=stops, workers=workers)


def _refuse_batched_progress(spec: GridSpec, todo: list[Cell]) -> None:
    """Cells an interrupted batched grid trained together continue from their batch's checkpoint, which only the
    batched engine reads: the process engine would train them again from round 0 and leave it behind."""
    started = [c for batch in started_batches(spec.out / BATCHES, todo) for c in batch]
    if started:
        raise ConfigError(
            f"{spec.out}: {count(len(started), 'cell')} of this grid stopped part-way in the batched engine, whose "
            f"checkpoints ({spec.out / BATCHES}) only it continues; resume with {spec.names.add('engine', 'batched')}, "
            f"or delete {spec.out / BATCHES} to train them again from round 0 with "
            f"{spec.names.add('engine', 'processes')}")


# The names of spec.GridEngineSpec.engine (a test checks they agree).
GRID_ENGINES = {"batched": run_batched, "processes": _processes}


def check_spec(spec: GridSpec) -> None:
    """A grid directory belongs to one grid: resuming with other options would mix results. The same test as
    for a run's directory (``rundir.same_config``): what this fedcache records beyond an older grid.json is no
    difference."""
    path = spec.out / SPEC
    mine = json.loads(json.dumps(spec.to_json()))
    if not path.exists() and RunDir(spec.out).started():  # its tables would sit beside the run and mix in reports
        raise ConfigError(f"{spec.out} holds a run of `fedcache train` ({CONFIG}), not a grid; choose another "
                          f"{spec.names.to_change('out')}")
    if path.exists():
        saved = read_json(path, f"delete it, and the grid takes the options it is given now (cells of the same names are "
                                f"read back, not trained again), or choose another {spec.names.to_change('out')}")
        # An axis only this grid has is a difference too: it adds cells (unlike a key a later fedcache records).
        differ = same_config(saved, mine) + [f"sweep.{k}" for k in mine["sweep"] if k not in saved.get("sweep", {})]
        differ = [k for k in differ if k != "out"]  # a grid moved to another disk (a full one) is the same grid
        if not differ:
            write_json(path, mine)
            return
        if holds_runs(spec.out):
            raise ConfigError(f"{spec.out} holds a different grid (it differs in {_differences(saved, mine, differ, spec.names)}; "
                              f"see {path}); use the same options to resume it, or another "
                              f"{spec.names.to_change('out')}")
        # Nothing ran: a start refused before its first cell (--select without spare rows, say) left only its
        # plan and features. The corrected command its error asked for must not be refused in turn.
        shutil.rmtree(spec.out / FEATURES, ignore_errors=True)
    spec.out.mkdir(parents=True, exist_ok=True)
    write_json(path, mine)


def in_saved_order(spec: GridSpec) -> GridSpec:
    """``spec`` with its axes in the order ``out/grid.json`` lists them. A cell's folder is named by its settings
    in axis order: a grid file whose [set] lines moved, or a command line giving its axes in another order, would
    otherwise train every cell again under new names beside the old ones (and a report would count both)."""
    try:
        saved = json.loads((spec.out / SPEC).read_text()).get("sweep", {})
    except (OSError, ValueError, AttributeError):
        return spec  # no grid here yet, or a damaged grid.json: check_spec says so
    if not isinstance(saved, dict) or set(saved) != set(spec.sweep):
        return spec
    # A value spelled otherwise than the grid that started here (1e-3 and 0.001, 1 and 1.0, true and True: one
    # value) keeps that grid's spelling, which names its cells' folders: refused as another grid otherwise.
    sweep = {k: _saved_spelling(spec.sweep[k], saved[k]) for k in saved}
    if sweep == spec.sweep and list(sweep) == list(spec.sweep):
        return spec
    return dataclasses.replace(spec, sweep=sweep)


def _saved_spelling(values: list[str], saved: Any) -> list[str]:
    if not isinstance(saved, list):
        return values
    spelled = {same_value(str(v)): str(v) for v in saved}
    return [spelled.get(same_value(v), v) for v in values]


def holds_runs(out: Path) -> bool:
    """Whether a run under ``out`` finished or checkpointed (a cell, a --select stage's cell, a batch)."""
    return any(p.name in (DONE, DIVERGED) or p.suffix == ".pt" for p in out.rglob("*") if p.is_file())


def _differences(saved: dict, mine: dict, keys: list[str], names: Names) -> str:
    """``--method (fedavg,fedproto there, fedavg here), alpha (...)``: each differing key with both values, a grid
    option named as its caller gave it (its flag, keyword or file key), an axis by its name."""
    def value(doc: dict, key: str):
        for part in key.split("."):
            doc = doc.get(part) if isinstance(doc, dict) else None
        return doc

    shown = lambda v: "unset" if v in (None, []) else ",".join(map(str, v)) if isinstance(v, list) else str(v)
    said = lambda k: k.removeprefix("sweep.") if k.startswith("sweep.") else names.key(k)
    return ", ".join(f"{said(k)} ({shown(value(saved, k))} there, {shown(value(mine, k))} here)" for k in keys)


def check_cells(spec: GridSpec, todo: list[Cell]) -> dict[Cell, RunSpec]:
    """Every cell's options (types, ranges) and settings, checked before anything is read or written:
    a bad value in the last cell must not surface after hours of the others. An unknown method name
    raises with the close matches and the full list. Returns each cell's run spec (without its out)."""
    return {c: train_config(spec, c, None) for c in todo}


def _check_methods(configs: dict[Cell, RunSpec], todo: list[Cell], tables, checked: set[tuple[str, bool]]) -> int:
    """Each method not in ``checked`` built once per split (validation or test) on its first cell's data there,
    before any cell trains: what a method needs of the data (clip-zs a backbone with a text tower, say) is said now,
    not after the other methods' cells have trained. Methods draw from their own generators, so building one here
    changes no cell's numbers. Returns how many were built (added to ``checked``)."""
    first = {}
    for c in todo:
        key = (c.method, configs[c].schedule.validation)
        if key not in checked:
            first.setdefault(key, c)
    for key, c in first.items():
        cfg = configs[c]
        instantiate(cfg, load_data(cfg, tables, views=method_class(c.method).uses_views)[0])
        checked.add(key)
    return len(first)


def _make_partitions(configs: dict[Cell, RunSpec], tables, made: set[tuple]) -> int:
    """Every distinct partition not in ``made`` is made (or found) and stored here, once, so parallel workers only
    read the store; returns how many (added to ``made``). A cell on validation has its test cell's partition."""
    new = 0
    for cfg in configs.values():
        key = (cfg.partition, cfg.schedule.seed)
        if key not in made:
            load_data(cfg, tables)
            made.add(key)
            new += 1
    return new
