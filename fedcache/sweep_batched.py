"""``fedcache grid --engine batched``: the grid's cells trained in stacks of federations (federate/batched.py).

Cells that share the data, method, head, optimizer kind, round schedule and every setting that is not per
row are grouped; each group is cut into batches that fit the memory budget; each batch trains as one
stacked computation and then writes every cell's directory as ``fedcache train --out`` would (cell.json,
config.json, metrics.jsonl, checkpoint.pt, summary.json last), so results.csv, table.md, reports and
resumption read them as before. A batch checkpoints under ``batches/<id>/`` after every round and continues
from there. Cells that cannot stack run as their own runs (``sweep._execute``), and the grid says which and why.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcache.sweep import CELLS, Cell, GridSpec, _execute, _row, read_features, train_config

log = logging.getLogger(__name__)

BATCHES = "batches"
MEMORY_SHARE = 0.25  # of the memory free when the grid starts: the default budget of one batch


@dataclass
class Grouping:
    batches: list[list[Cell]]
    alone: dict[Cell, str]  # cell -> why it runs as its own run
    per_cell_bytes: dict[str, int]  # method -> estimated bytes of one cell in a batch
    limit: int  # cells per batch at most

    def describe(self) -> str:
        """What the grid prints before it starts."""
        n = sum(map(len, self.batches))
        sizes = ", ".join(f"{len(b)} {b[0].method}" for b in self.batches)
        text = f"batched engine: {n} cells in {len(self.batches)} batches" + (f" ({sizes})" if sizes else "")
        text += f", at most {self.limit} cells per batch"
        if self.alone:
            reasons: dict[str, int] = {}
            for why in self.alone.values():
                reasons[why] = reasons.get(why, 0) + 1
            text += f"; {len(self.alone)} cells as their own runs: " + "; ".join(f"{why} ({k})" for why, k in reasons.items())
        return text


def execute(spec: GridSpec, todo: list[Cell], folder: Path, on_plan: Callable[[str], None] | None = None
            ) -> Iterator[tuple[Cell, dict]]:
    tables = read_features(folder)
    grouping = group(spec, todo, tables)
    text = grouping.describe()
    log.info(text)
    if on_plan:
        on_plan(text)
    for batch in grouping.batches:
        yield from run_batch(spec, batch, tables)
    yield from _execute(spec, [c for c in todo if c in grouping.alone], folder)


# ---- grouping ------------------------------------------------------------------------------------
def group(spec: GridSpec, todo: list[Cell], tables) -> Grouping:
    from fedcache.federate.train import resolve

    groups: dict[tuple, list[Cell]] = {}
    alone: dict[Cell, str] = {}
    costs: dict[str, int] = {}
    for c in todo:
        cfg = train_config(spec, c, None)
        r = resolve(cfg)
        why = _why_alone(spec, c, cfg, r, tables)
        if why:
            alone[c] = why
            continue
        groups.setdefault(_key(cfg, r), []).append(c)
        costs[c.method] = max(costs.get(c.method, 0), cell_bytes(cfg, r, tables))
    budget = MEMORY_SHARE * free_memory()
    batches, limits = [], []
    for cells_ in groups.values():
        limit = max(1, int(budget // costs[cells_[0].method]))
        if spec.max_batch_cells:
            limit = min(limit, spec.max_batch_cells)
        limits.append(limit)
        parts = math.ceil(len(cells_) / limit)
        batches += [list(b) for b in np.array_split(np.array(cells_, dtype=object), parts)]
    return Grouping(batches, alone, costs, min(limits, default=spec.max_batch_cells or 0))


def _why_alone(spec: GridSpec, c: Cell, cfg, r, tables) -> str:
    from fedcache.federate.batched import head_reason
    from fedcache.federate.loop import CHECKPOINT
    from fedcache.federate.methods.base import batchable
    from fedcache.heads import make_head

    if not batchable(r.method_cls):
        return f"{c.method} does not declare that its runs can train stacked"
    if not cfg.engine.batched:
        return "--no-batch trains each client alone"
    if head_reason(make_head(r.head, tables[0].features.shape[1], len(tables[0].class_names))):
        return head_reason(make_head(r.head, tables[0].features.shape[1], len(tables[0].class_names)))
    if spec.track:
        return "--track sends each run's metrics as it trains"
    if spec.keep_checkpoints == "all":
        return "--keep-checkpoints all keeps every round of each run"
    if (spec.out / CELLS / c.name / CHECKPOINT).exists():
        return "started as its own run (resumed as one)"
    return ""


def _key(cfg, r) -> tuple:
    """What the cells of one batch share (federate.batched.stack_key, from the spec before any data is read)."""
    params = {k: v for k, v in dataclasses.asdict(r.params).items() if k not in r.method_cls.row_params}
    s = cfg.schedule
    return (r.method_cls.name, r.head, r.optim.optimizer, repr(sorted(params.items())), s.rounds, s.local_epochs,
            s.batch_size, s.eval_every, s.validation, cfg.data)


def cell_bytes(cfg, r, tables) -> int:
    """A rough upper estimate of one cell's memory in a batch: per client, its head's parameters about
    eight times (received, trained, gradients, Adam's two moments, upload, state, server share) and one
    mini-batch of inputs, activations and their gradients."""
    import torch

    from fedcache.federate.train import partition_request
    from fedcache.heads import make_head

    train_t = tables[0]
    dim, classes = train_t.features.shape[1], len(train_t.class_names)
    head = make_head(r.head, dim, classes)
    params = sum(t.numel() for t in head.init(1, torch.Generator().manual_seed(0)).values())
    clients = partition_request(cfg, len(train_t.domain_names)).n_clients
    step = cfg.schedule.batch_size * (dim + 2 * (head.feature_dim + classes)) * 3
    return 4 * clients * (8 * params + step)


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
def batch_id(cells_: list[Cell]) -> str:
    return hashlib.sha256("\n".join(c.name for c in cells_).encode()).hexdigest()[:16]


def run_batch(spec: GridSpec, cells_: list[Cell], tables) -> Iterator[tuple[Cell, dict]]:
    """Train the cells as one stack (continuing its checkpoint), then write each cell's run directory."""
    from fedcache.federate.batched import Federation, run_stack
    from fedcache.federate.loop import RunConfig
    from fedcache.federate.train import prepare

    folder = spec.out / BATCHES / batch_id(cells_)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cells.json").write_text(json.dumps([c.name for c in cells_], indent=1) + "\n")
    feds, resolved = [], []
    for c in cells_:
        cfg = train_config(spec, c, spec.out / CELLS / c.name)
        method, res = prepare(cfg, tables)
        s, e = cfg.schedule, cfg.engine
        feds.append(Federation(method, RunConfig(s.rounds, s.fraction, s.eval_every, e.batched, None, False, e.keep_checkpoints)))
        resolved.append(res)
    results = run_stack(feds, folder / "checkpoint.pt")
    for c, res, result in zip(cells_, resolved, results):
        yield c, _write_cell(spec, c, res, result)
    shutil.rmtree(folder)
    if not any(folder.parent.iterdir()):
        folder.parent.rmdir()


def _write_cell(spec: GridSpec, c: Cell, resolved: dict, result) -> dict:
    """The files ``fedcache train --out`` leaves, summary.json last (it marks the cell finished)."""
    import torch

    from fedcache.federate.loop import CHECKPOINT, METRICS

    out = spec.out / CELLS / c.name
    if out.exists():
        shutil.rmtree(out)  # a cell started by another engine and never checkpointed
    out.mkdir(parents=True)
    (out / "cell.json").write_text(json.dumps({"method": c.method, "seed": c.seed, "setting": dict(c.setting)}) + "\n")
    (out / "config.json").write_text(json.dumps(resolved, indent=2) + "\n")
    (out / METRICS).write_text("".join(json.dumps(line) + "\n" for line in result.history))
    s = result.summary
    if spec.keep_checkpoints == "last":  # what `fedcache train --resume` of this run reads
        torch.save({"rnd": s["rounds"], "server": result.server, "clients": result.clients, "bytes_up": s["bytes_up"],
                    "bytes_down": s["bytes_down"], "params_up": result.params_up, "seconds": s["seconds"]}, out / CHECKPOINT)
    summary = {**s, "partition_id": resolved["partition"]["partition_id"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return _row(c, summary, out)
