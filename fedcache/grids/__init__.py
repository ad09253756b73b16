"""``fedcache grid``: the cartesian product of methods x axes x seeds, each cell a run, resumable.

- ``spec``: the grid's specification (GridSpec, TOML files), its cells and each cell's run spec
- ``features``: the fused features, written once and memory-mapped by every worker
- ``run``: check the directory, make the partitions, run the unfinished cells, write the results
- ``processes`` / ``batches``: the two engines (each cell its own run; cells stacked into one computation)
- ``pool``: worker processes; ``cells``: one cell's run and row; ``select``: tune on validation, test once
- ``table``: results.csv and table.md

(``fedcache.grid`` is the Python API's function, hence ``grids`` for the package.)
"""
from __future__ import annotations

from fedcache.grids.cells import METRIC_COLUMNS
from fedcache.grids.run import CellCallback, PlanCallback, run_cells
from fedcache.grids.select import run_selected
from fedcache.grids.spec import Cell, GridSpec, cells, load_toml, option_axes, train_config
from fedcache.grids.table import load_results, summary_markdown
from fedcache.table import Table


def run_grid(spec: GridSpec, on_cell: CellCallback | None = None, on_plan: PlanCallback | None = None) -> Table:
    """Every unfinished cell of the grid (finished ones are read back), then results.csv and table.md; with
    ``--select``, tuned on the validation split first and the chosen values tested once."""
    if spec.select:
        return run_selected(spec, on_cell, on_plan)
    return run_cells(spec, on_cell, on_plan=on_plan)


__all__ = ["METRIC_COLUMNS", "Cell", "GridSpec", "cells", "load_results", "load_toml", "option_axes", "run_grid",
           "summary_markdown", "train_config"]
