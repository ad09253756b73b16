"""The process engine of ``fedcache grid``: every cell its own run, ``--jobs`` at a time in worker processes
(or in this process with one job)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fedcache.grids.cell import run_cell
from fedcache.grids.features import read_features, tables_of
from fedcache.grids.pool import Workers, in_workers
from fedcache.grids.spec import Cell, GridSpec, Stops
from fedcache.training import run_device


def execute(spec: GridSpec, todo: list[Cell], folder: Path, jobs: int | None = None,
            stops: Stops | None = None, workers: Workers | None = None) -> Iterator[tuple[Cell, dict]]:
    """(cell, row) of each cell as it finishes, ``jobs`` (default: the grid's; on a GPU, 1) at a time.
    ``stops``: the round a cell pauses at (successive halving's rungs); a cell not in it runs to its end.
    ``workers``: the processes to run them in (a --select grid's, ``pool.Workers``); else started here."""
    jobs, stops = jobs or jobs_of(spec), stops or {}
    if jobs == 1 or len(todo) <= 1:
        tables = read_features(folder)
        for c in todo:
            yield c, run_cell(spec, c, tables, stops.get(c))
        return
    yield from in_workers(jobs, [(worker, (spec, c, folder, stops.get(c))) for c in todo], workers)


def worker(spec: GridSpec, c: Cell, folder: Path, stop: int | None = None) -> list[tuple[Cell, dict]]:
    """One cell in a worker process, on the features the process has open."""
    return [(c, run_cell(spec, c, tables_of(folder), stop))]


def jobs_of(spec: GridSpec) -> int:
    """Cells at a time: ``--jobs`` worker processes on the CPU; on a GPU one, in this process (workers would each
    hold a copy of the features and a context of their own)."""
    return spec.jobs if run_device(spec.device).type == "cpu" else 1
