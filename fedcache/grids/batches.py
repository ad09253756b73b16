"""The batched engine of ``fedcache grid``: the grid's runs trained in stacks of federations (federate/stacked.py).

Runs that share the data, method, head, optimizer kind, round schedule and every setting that is not per row
are grouped; a run's partition, seed and sampling fraction are its federation's own, and every step of a stack
is the full batch width (federate/local.py), so a run's numbers are its own run's bit for bit whatever it is
stacked with. Within a group, cells that draw the same mini-batches (same partition, seed and fraction) share
batches, since a stack steps as long as its longest cell's clients need; cells alone in their draws stack with
each other. Each group is cut into batches that fit the memory budget; each batch trains as one stacked
computation through the round driver (federate/stacked.py), which writes every run's directory as for a run
by itself, so results.csv, table.md, reports and resumption read them alike. A batch checkpoints under its
own folder after every round and continues from there.
The grid decides which of its cells come here; runs that cannot stack run as their own runs
(grids/processes.py), in the same pool of workers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedcache.disk import discard, read_json, write_text
from fedcache.federate import driver
from fedcache.federate.driver import Run
from fedcache.federate.rundir import CHECKPOINT, RunDir
from fedcache.federate.stacked import Stacked
from fedcache.grids.cell import (BEHIND, LAST_LINE, cell_record, failing_as, hold_cell, lacks, last_line_lost,
                                 lost_how, result_row, run_cell, start_again, start_round, write_cell_json)
from fedcache.grids.features import read_features, tables_of
from fedcache.grids.pool import Workers, in_workers
from fedcache.grids.processes import execute, jobs_of, worker
from fedcache.grids.spec import BATCHES, CELLS, Cell, GridSpec, Stops, train_config
from fedcache.ownership import LOCK
from fedcache.paths import METRICS
from fedcache.progress import said_now
from fedcache.spec import RunSpec
from fedcache.training import device_name, on_device, prepare, run_device
from fedcache.wording import count, named

log = logging.getLogger(__name__)

MEMORY_SHARE = 0.25  # of the memory free when the grid starts: the default budget of one batch


@dataclass
class Grouping:
    batches: list[list[Hashable]]
    alone: dict[Hashable, str]  # run -> why it runs as its own run
    methods: list[str]  # per batch
    per_cell_bytes: dict[str, int]  # method -> estimated bytes of one run in a batch
    limit: int  # runs per batch at most

    def describe(self) -> str:
        """What the grid prints before it starts."""
        n = sum(map(len, self.batches))
        alike: dict[tuple[int, str], int] = {}  # (cells, method) -> batches, in the order they come
        for b, m in zip(self.batches, self.methods):
            alike[len(b), m] = alike.get((len(b), m), 0) + 1
        sizes = ", ".join(f"{k} x {size} {m}" if k > 1 else f"{size} {m}" for (size, m), k in alike.items())
        if self.batches:
            text = f"batched engine: {count(n, 'cell')} in {count(len(self.batches), 'batch', 'batches')} ({sizes}), at most {count(self.limit, 'cell')} per batch"
        else:
            text = "batched engine: no cells to stack"
        if self.alone:
            reasons: dict[str, int] = {}
            for why in self.alone.values():
                reasons[why] = reasons.get(why, 0) + 1
            text += f"; {own_runs(len(self.alone))}: " + "; ".join(f"{why} ({k})" for why, k in reasons.items())
        return text


def own_runs(n: int) -> str:
    """``1 cell as its own run``, ``3 cells as their own runs``."""
    return f"{count(n, 'cell')} as {'its own run' if n == 1 else 'their own runs'}"


# ---- grouping ------------------------------------------------------------------------------------
NOTHING_TO_STACK = "no other cell of its method and settings to stack with"


def group(runs: dict[Hashable, RunSpec], tables, max_batch_cells: int | None, alone: dict[Hashable, str],
          started: list[list[Hashable]] = (), workers: int = 1, budget: float | None = None,
          across_draws: bool = False, rounds: Mapping[Hashable, tuple[int, int | None]] | None = None,
          largest_head: int | None = None) -> Grouping:
    """``alone``: runs the caller already keeps out of the stacks, with the reason. ``started``: batches an
    interrupted grid checkpointed (``started_batches``); each stays a batch where it still fits, so that it
    continues from its checkpoint even where the budget now cuts its group otherwise. ``workers``: a batch holds
    about that share of its group, so that one method's cells spread over the workers (a batch trains on one).
    ``budget``: the bytes one batch may take (default: a share of the free host memory). ``across_draws``: stack
    cells of every partition and seed together (on a GPU, where a step's cost hardly grows with its rows, fewer
    and wider stacks beat the steps that stacks of one partition save). ``rounds``: per run, the round it starts
    from (its own checkpoint's) and the round it pauses at; only runs alike in both stack. ``largest_head``: runs
    whose head has more parameters train as their own runs (LARGEST_STACKED_HEAD_ON_CPU)."""
    groups: dict[tuple, dict[tuple, list[Hashable]]] = {}
    alone = dict(alone)
    costs: dict[str, int] = {}
    sizes: dict[str, int] = {}  # head -> its parameters
    continuing = {k for batch in started for k in batch}  # a checkpointed stack continues whatever its head's size
    for key, cfg in runs.items():
        if key in alone:
            continue
        why = _why_alone(cfg) or ("" if key in continuing else _too_large(cfg, tables, largest_head, sizes))
        if why:
            alone[key] = why
            continue
        span = (rounds or {}).get(key, (0, None))
        groups.setdefault((*_key(cfg), span), {}).setdefault(() if across_draws else _draws(cfg), []).append(key)
        costs[cfg.method.name] = max(costs.get(cfg.method.name, 0), cell_bytes(cfg, tables))
    budget = MEMORY_SHARE * free_memory() if budget is None else budget
    batches, methods, limits = [], [], []
    for group_key, by_draws in groups.items():
        limit = max(1, int(budget // costs[group_key[0]]))
        if max_batch_cells:
            limit = min(limit, max_batch_cells)
        limits.append(limit)
        size = min(limit, max(2, math.ceil(sum(map(len, by_draws.values())) / workers)))
        parts = _parts(by_draws, limit, started, alone, size)
        batches += parts
        methods += [group_key[0]] * len(parts)
    return Grouping(batches, alone, methods, costs, min(limits, default=max_batch_cells or 0))


def _parts(by_draws: dict[tuple, list[Hashable]], limit: int, started, alone: dict[Hashable, str],
           size: int | None = None) -> list[list[Hashable]]:
    """One group's batches. Cells that draw the same mini-batches (same partition, seed and fraction) stack
    together: a batch of them steps no longer than each of its cells. A cell that is the only one of its
    draws joins the group's other such cells across partitions and seeds (its numbers are still its own
    run's, but its batch steps as long as its longest cell's clients need); one such cell left over joins
    the smallest batch with room, else it runs alone (a stack of one only adds the stack's bookkeeping). Pools are
    cut into batches of about ``size`` cells (``limit`` by default, the most any batch holds)."""
    keys = [k for ks in by_draws.values() for k in ks]
    parts = _continued(started, keys, limit)
    taken = {k for part in parts for k in part}
    rests = [[k for k in ks if k not in taken] for ks in by_draws.values()]
    shared, single = [r for r in rests if len(r) > 1], [r[0] for r in rests if len(r) == 1]
    size = size or limit
    # As many parts as fit ``size`` whole (none smaller than it), and as the limit needs.
    new = [part for rest in [*shared, single] if len(rest) > 1
           for part in _split(rest, max(1, len(rest) // size, math.ceil(len(rest) / limit)))]
    if len(single) == 1:
        room = [p for p in new if len(p) < limit]
        if room:
            min(room, key=len).append(single[0])
        else:
            alone[single[0]] = NOTHING_TO_STACK if len(keys) == 1 else f"the limit of {count(limit, 'cell')} per batch"
    for part in new:
        if len(part) == 1:  # only where the limit cuts a pool so
            alone[part[0]] = f"the limit of {count(limit, 'cell')} per batch"
    return parts + [p for p in new if len(p) > 1]


def _continued(started: list[list[Hashable]], keys: list[Hashable], limit: int) -> list[list[Hashable]]:
    """The started batches of this group (all their runs among ``keys``) within ``limit``; of overlapping ones
    (left by two interrupted groupings) the first."""
    kept, taken = [], set()
    for batch in started:
        if set(batch) <= set(keys) and len(batch) <= limit and not taken & set(batch):
            kept.append(batch)
            taken |= set(batch)
    return kept


def started_batches(folder: Path, keys: list[Cell]) -> list[list[Cell]]:
    """The batches under ``folder`` (a grid's batches/) with a checkpoint whose runs are all among ``keys``,
    in their order."""
    by_name = _by_name(keys)
    return [[by_name[n] for n in names] for batch, names in _recorded(folder)
            if (batch / CHECKPOINT).exists() and all(n in by_name for n in names)]


def _by_name(keys: Iterable[Cell]) -> dict[str, Cell]:
    """Each cell by the names ``_recorded`` gives the runs of a batch: its fields' JSON (``cell.cell_record``), and
    ``str(cell)``, the Python text an older fedcache recorded (its interrupted batches continue all the same)."""
    return {name: c for c in keys for name in (json.dumps(cell_record(c)), str(c))}


def _recorded(folder: Path) -> list[tuple[Path, list[str]]]:
    """Each batch folder under ``folder`` with its runs as ``run_batch`` records them, each named by its fields'
    JSON (or, recorded by an older fedcache, its text)."""
    return [(runs.parent, [r if isinstance(r, str) else json.dumps(r) for r in read_json(
                runs, f"delete the folder {runs.parent} and run the grid again: its cells train again from their start",
                problem=_not_runs)])
            for runs in sorted(folder.glob("*/runs.json"))]


def _not_runs(value) -> str:
    if not isinstance(value, list):
        return "not a JSON list"
    fields = set(cell_record(Cell("", 0, ())))
    ok = all(isinstance(r, str) or (isinstance(r, dict) and set(r) == fields) for r in value)
    return "" if ok else f"not a list of runs (each an object of {', '.join(sorted(fields))})"


def _split(keys: list, parts: int) -> list[list]:
    """``keys`` cut into ``parts`` runs of consecutive keys whose sizes differ by at most one."""
    size, extra = divmod(len(keys), parts)
    bounds = np.cumsum([0] + [size + (i < extra) for i in range(parts)])
    return [keys[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _why_alone(cfg: RunSpec) -> str:
    from fedcache.federate.stacking import why_not_stackable
    from fedcache.spec import method_class

    why = why_not_stackable(method_class(cfg.method.name), cfg.method.params)
    if not why and not cfg.engine.batched:
        return f"{named('--no-batch', 'batched=False')} trains each client alone"
    return why


# On a CPU a stack saves the per-step cost of torch's dispatch, which a small head's arithmetic cannot hide; a
# large head's arithmetic dominates, and a stack adds the padding to its longest client (grid_speed.py --heads,
# docs/performance.md). The bound lies between the head sizes measured there.
LARGEST_STACKED_HEAD_ON_CPU = 100_000


def _too_large(cfg: RunSpec, tables, largest: int | None, sizes: dict[str, int]) -> str:
    """Why a run trains as its own run for its head's size (``largest``: the most parameters a stacked head may
    have; None: any), or empty. ``sizes`` caches each head's count."""
    if largest is None:
        return ""
    if cfg.head.name not in sizes:
        sizes[cfg.head.name] = head_parameters(cfg.head.name, tables)
    n = sizes[cfg.head.name]
    return f"a head of {n:,} parameters trains faster alone on a CPU" if n > largest else ""


def _key(cfg: RunSpec) -> tuple:
    """What the runs of one batch share: federate.stacked.stack_key, from the spec before any data is read;
    the method's name first."""
    from fedcache.federate.stacking import stacking_of
    from fedcache.spec import method_class

    varying = stacking_of(method_class(cfg.method.name)).varying
    params = {k: v for k, v in dataclasses.asdict(cfg.method.params).items() if k not in varying}
    s = cfg.schedule
    return (cfg.method.name, cfg.head.name, cfg.optim.optimizer, repr(sorted(params.items())), s.rounds, s.local_epochs,
            s.batch_size, s.eval_every, s.validation, cfg.data, cfg.engine.device)


def _draws(cfg: RunSpec) -> tuple:
    """What decides a run's mini-batches: cells that share it read the same rows at every step."""
    return repr(cfg.partition), cfg.schedule.seed, cfg.schedule.fraction


def cell_bytes(cfg, tables) -> int:
    """A rough upper estimate of one cell's memory in a batch: per client, its head's parameters about
    eight times (received, trained, gradients, Adam's two moments, upload, state, server share) and one
    mini-batch of inputs, activations and their gradients; and what the method holds over the rows
    (its stacking declaration's ``memory``)."""
    from fedcache.federate.stacking import stacking_of
    from fedcache.spec import method_class
    from fedcache.partitioning import partition_request
    from fedcache.heads import make_head

    train_t = tables[0]
    dim, classes = train_t.features.shape[1], len(train_t.class_names)
    head = make_head(cfg.head.name, dim, classes)
    params = _parameters(head)
    clients = partition_request(cfg, len(train_t.domain_names)).n_clients
    step = cfg.schedule.batch_size * (dim + 2 * (head.feature_dim + classes)) * 3
    rows = stacking_of(method_class(cfg.method.name)).memory(cfg.method.params, len(train_t.labels), clients, dim, classes,
                                                             cfg.schedule.batch_size)
    return 4 * clients * (8 * params + step) + rows


def head_parameters(name: str, tables) -> int:
    """One client's head's (``name``) parameters and buffers on the grid's features."""
    from fedcache.heads import make_head

    return _parameters(make_head(name, tables[0].features.shape[1], len(tables[0].class_names)))


def _parameters(head) -> int:
    return sum(t.numel() for t in head.init(1, torch.Generator().manual_seed(0)).values())


ACROSS_DRAWS_ON_GPU = True  # see group(); benchmarks/grid_speed.py --device cuda measures both
GPU_SHARE = 0.8  # of a GPU's free memory: one batch at a time uses it, and nothing else of the grid's does


def memory_budget(device: torch.device) -> tuple[float, str]:
    """The bytes one batch may take on ``device``, and how the plan line says it."""
    if device.type != "cuda":
        return MEMORY_SHARE * free_memory(), ""
    free, total = torch.cuda.mem_get_info(device)
    return GPU_SHARE * free, f"on {device_name(device)}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"


def free_memory() -> int:
    """Bytes the system can give without swapping (MemAvailable; free pages where /proc is missing)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# ---- one batch -------------------------------------------------------------------------------------
def batch_id(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def run_batch(runs: dict[Cell, RunSpec], tables, folder: Path, stop: int | None = None) -> list[tuple[Cell, object]]:
    """Train the runs as one stack, each into its own run directory (``engine.out``), continuing the stack's
    checkpoint in ``folder`` (the caller removes the folder once it is done), or else the runs' own checkpoints
    where every run has one (runs paused at one round); (key, its ``RunResult``) per run. ``stop``: pause there."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "runs.json", json.dumps([cell_record(k) for k in runs], indent=1) + "\n", "the batch's record")
    checkpoint = folder / CHECKPOINT
    resume = continuable(checkpoint) or all((cfg.engine.out / CHECKPOINT).exists() for cfg in runs.values())
    with on_device(next(iter(runs.values()))):  # a grid's cells share the device (engine.device is no axis)
        stack = [_stacked_run(cfg, tables, resume) for cfg in runs.values()]
        return list(zip(runs, driver.run(stack, Stacked(stack), resume=resume, checkpoint=checkpoint, stop_after=stop)))


def _stacked_run(cfg: RunSpec, tables, resume: bool) -> Run:
    method, config = prepare(cfg, tables)
    out = RunDir(cfg.engine.out, cfg.engine.keep_checkpoints)
    if not resume:
        out.clear()
        out.write_config(config)
    facts = {"partition_id": config["partition"]["partition_id"], "device": device_name(torch.get_default_device())}
    return Run(method, cfg.schedule, out, facts)


def continuable(checkpoint: Path) -> bool:
    """Whether a batch's checkpoint is there to continue from; one an older fedcache wrote is said and removed
    (its cells train from round 0)."""
    from fedcache.errors import ConfigError
    from fedcache.federate.rundir import load_checkpoint

    if not checkpoint.exists():
        return False
    try:
        load_checkpoint(checkpoint)
    except ConfigError as exc:
        log.warning("%s", exc)
        checkpoint.unlink()
        return False
    return True


# ---- the engine ------------------------------------------------------------------------------------

def run_batched(spec: GridSpec, todo: list[Cell], folder: Path, on_plan, stops: Stops | None = None,
                workers: Workers | None = None) -> Iterator[tuple[Cell, dict]]:
    """Stackable cells in batches, the others as their own runs; (cell, row) as each finishes. On a GPU every
    batch runs in this process, one after another, as large as its memory holds (workers would each hold a
    copy of the features and a context of their own). ``stops``: the round a cell pauses at (grids/halving.py);
    ``workers``: the processes to run them in (a --select grid's, ``pool.Workers``), else started here."""
    stops = stops or {}
    tables = read_features(folder)
    runs = {c: train_config(spec, c, spec.out / CELLS / c.name) for c in todo}
    jobs = jobs_of(spec)
    budget, where = memory_budget(run_device(spec.device))
    drop_behind_batches(spec.out / BATCHES, runs, stops)
    own = _own_rounds(runs, stops)
    started = started_batches(spec.out / BATCHES, todo)
    device = run_device(spec.device)
    spans = {c: (own[c], stops.get(c)) for c in todo}
    grouping = group(runs, tables, spec.max_batch_cells, dict.fromkeys(todo, why) if (why := _alone(spec)) else {},
                     started, jobs, budget, across_draws=ACROSS_DRAWS_ON_GPU and device.type != "cpu", rounds=spans,
                     largest_head=LARGEST_STACKED_HEAD_ON_CPU if device.type == "cpu" else None)
    _drop_stale_batches(spec.out / BATCHES, grouping.batches)
    batches = [{c: runs[c] for c in batch} for batch in grouping.batches]
    alone = [c for c in todo if c in grouping.alone]
    # Batches first (the longest tasks), then the cells that run alone, in one pool: no worker idles at a
    # barrier between the two.
    tasks = ([(_batch_worker, (spec, batch, folder, stops)) for batch in batches]
             + [(worker, (spec, c, folder, stops.get(c))) for c in alone])
    text = grouping.describe() + (f" ({where})" if where else "")
    if jobs > 1 and len(tasks) > 1:
        text += f"; {min(jobs, len(tasks))} at a time, each in a worker process of one torch thread"
    said_now(log, on_plan, text)
    if jobs == 1 or len(tasks) <= 1:
        for batch in batches:
            yield from _run_batch(spec, batch, tables, stops)
        yield from execute(spec, alone, folder, jobs=1, stops=stops)  # in this process too: one cell at most, --jobs 1, or a GPU
    else:  # side by side, one torch thread each, as the process engine runs its cells
        yield from in_workers(jobs, tasks, workers)
    _remove_if_empty(spec.out / BATCHES)



def _own_rounds(runs: Mapping[Cell, RunSpec], stops: Stops) -> dict[Cell, int]:
    """The round of each cell's own checkpoint (``start_round``, read once), 0 for a cell whose last line is lost,
    emptied before it is grouped, as a cell run alone is (``run_cell``): stacked from that checkpoint, it would lack
    that line for good."""
    own = {}
    for c, cfg in runs.items():
        own[c] = start_round(cfg.engine.out)
        if last_line_lost(cfg, stops.get(c), own[c]):
            with hold_cell(cfg.engine.out):
                start_again(cfg, stops.get(c))
            own[c] = 0
    return own


def _run_batch(spec: GridSpec, batch: dict, tables, stops: Stops) -> Iterator[tuple[Cell, dict]]:
    from fedcache.federate.divergence import DivergedError

    folder = spec.out / BATCHES / batch_id([c.name for c in batch])
    stop = stops.get(next(iter(batch)))  # one for the batch: the grouping keeps runs of one stop together
    with hold_cell(folder, "the batch"):
        for c in batch:
            # Each cell checked free of a live holder (a worker of a grid killed outright), one at a time: held for
            # the whole batch, a stack of thousands of cells would keep as many files open (past `ulimit -n`).
            with hold_cell(spec.out / CELLS / c.name):
                write_cell_json(spec.out / CELLS / c.name, c)
        try:
            # Its messages name a setting as a cell of its own does (run_cell), not as train's settings['lr'].
            with spec.names.swept(spec.sweep, spec.methods), failing_as(_batch_text(batch)):
                done = run_batch(batch, tables, folder, stop)
        except DivergedError:
            # Which stacked run diverged is not known here, so each runs as its own run, which records its own
            # divergence (run_cell); the stack's checkpoint would only replay into NaN.
            discard(p for p in folder.iterdir() if p.name != LOCK)
            yield from ((c, run_cell(spec, c, tables, stop)) for c in batch)
            done = []
        rows = [(c, result_row(c, result, spec.out / CELLS / c.name)) for c, result in done]
    # Removed once let go (the lock's file with it); the grid removes the emptied parent once every batch is done
    # (batches run side by side).
    shutil.rmtree(folder, ignore_errors=True)
    yield from rows


def _batch_text(batch: dict) -> str:
    first = next(iter(batch))
    others = f" and {count(len(batch) - 1, 'other cell')}" if len(batch) > 1 else ""
    return f"the batch of {CELLS}/{first.name}{others}"


def _drop_stale_batches(folder: Path, batches: list[list[Cell]]) -> None:
    """The folders of interrupted batches that no batch of this run continues, said and removed (left, they
    would never be read again)."""
    live = {batch_id([c.name for c in b]) for b in batches}
    for old in sorted(folder.iterdir()) if folder.is_dir() else []:
        if old.name not in live:
            _drop(old)


def drop_batches_of(folder: Path, todo: list[Cell]) -> None:
    """The folders of batches (under ``folder``, a grid's batches/) that hold a cell of ``todo``, which the process
    engine trains as their own runs, said and removed: left, a batch whose other cells had finished (interrupted as
    it wrote them) was continued by a later batched run once its cells were to train again, from a checkpoint that
    is not of their runs now. (A batch whose cells are all to train is refused before: ``run._refuse_batched_progress``.)"""
    names = set(_by_name(todo))
    for batch, held in _recorded(folder):
        if names & set(held):
            _drop(batch, "whose cells the process engine trains as their own runs now")
    _remove_if_empty(folder)


def drop_behind_batches(folder: Path, runs: Mapping[Cell, RunSpec], stops: Stops) -> None:
    """The folders of batches (under ``folder``, a grid's batches/) whose checkpoint is of a round that the run
    directory of one of ``runs`` it stacks lacks, said and removed. A grid killed after a batch's cells were written
    but before its folder went left a checkpoint of their last round, which no run read (its cells had finished);
    once their folders were deleted (as a damaged cell's message asks), a later run continued it without the
    cells' config.json and metrics lines. A damaged line in place of the last one is no such gap: the batch
    continues (the resume keeps the readable lines and says which it lacks), but where a cell lacks the line of its
    last round (damaged or deleted, ``lacks``): continued, it would be scored again from the checkpoint but lack that
    line for good (its training loss is not in the checkpoint), which training the batch again writes back.
    ``stops``: the round each cell pauses at (a halving rung), its last round here."""
    cells = _by_name(runs)
    for batch, names in _recorded(folder):
        rnd = start_round(batch)
        lacking = {n: lacks(runs[cells[n]], rnd, stops.get(cells[n])) for n in names if n in cells}
        behind = [runs[cells[n]].engine.out for n, why in lacking.items() if why == BEHIND]
        last = [runs[cells[n]].engine.out for n, why in lacking.items() if why == LAST_LINE]
        if behind:
            _drop(batch, f"whose checkpoint of round {rnd} is ahead of the run folder {behind[0]}"
                         + (f" and {count(len(behind) - 1, 'other cell')}" if len(behind) > 1 else "")
                         + " (deleted or cleared since)")
        elif last:
            _drop(batch, f"whose checkpoint is of the round its cells stop at ({rnd}), whose metrics line in "
                         f"{last[0] / METRICS} is {lost_how(last[0])}: trained again, the cell has that line back")
    _remove_if_empty(folder)


def regrouped() -> str:
    """Why an interrupted batch is dropped, naming the option as the grid's caller does."""
    return (f"whose cells are grouped otherwise now (a lower {named('--max-batch-cells', 'max_batch_cells')}, less "
            "free memory, or some of them finished)")


def _drop(old: Path, why: str | None = None) -> None:
    # Held by a live process (a worker of a grid killed outright), it is waited for, then refused: its cells are
    # locked only as it starts, so they would train here under its holder (clear_killed refuses one held as the grid starts).
    with hold_cell(old, "the batch"):
        log.warning("%s: an interrupted batch %s; they continue from their own checkpoints, or round 0", old,
                    why or regrouped())
        discard(p for p in old.iterdir() if p.name != LOCK)
    _remove_if_empty(old)  # its lock's file went as it was let go


def _remove_if_empty(path: Path) -> None:
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()


def _batch_worker(spec: GridSpec, batch: dict, folder: Path, stops: Stops) -> list[tuple[Cell, dict]]:
    return list(_run_batch(spec, batch, tables_of(folder), stops))


def _alone(spec: GridSpec) -> str:
    """Why the grid runs every cell as its own run whatever its method, or empty."""
    if spec.track:
        return f"{named('--track', 'track')} sends each run's metrics as it trains"
    if spec.keep_checkpoints == "all":
        return f"{named('--keep-checkpoints all', 'keep_checkpoints=' + repr('all'))} keeps every round of each run"
    return ""
