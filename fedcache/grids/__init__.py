"""``fedcache grid``: the cartesian product of methods x axes x seeds, each cell a run, resumable.

- ``spec``: the grid's specification (GridSpec, TOML files), its cells and each cell's run spec
- ``features``: the fused features, written once and memory-mapped by every worker
- ``run``: check the directory, make the partitions, run the unfinished cells, write the results
- ``processes`` / ``batches``: the two engines (each cell its own run; cells stacked into one computation)
- ``pool``: worker processes; ``cell``: one cell's run and row; ``select``: tune on validation, test once
- ``halving``: successive halving of a --select grid's candidates; ``rungs``: where it cuts (and waits, stopped)
- ``table``: results.csv and table.md

(``fedcache.grid`` is the Python API's function, hence ``grids`` for the package.)
"""
from __future__ import annotations

import importlib
import logging
import shutil
from typing import TYPE_CHECKING

from fedcache.disk import again
from fedcache.errors import DiskFullError, FedcacheError
from fedcache.grids.rungs import paused_before_first_cut
from fedcache.grids.spec import VALIDATION, Cell, GridSpec, axis_label, cells, load_toml, option_axes, train_config
from fedcache.ownership import LOCK, hold
from fedcache.partitioning import said_once
from fedcache.paths import DIVERGED, RESULTS, check_outside
from fedcache.progress import StepCallback, said_now
from fedcache.table import Table
from fedcache.wording import count, named

if TYPE_CHECKING:
    from fedcache.grids.run import CellCallback, PlanCallback, SaidCellCallback

# Imported when first named, and the engines when a grid runs: they import torch, which a grid's spec (its options
# and TOML file) does not need, so `fedcache grid` refuses a bad one without waiting seconds for torch.
_RUNNING = {"METRIC_COLUMNS": "cell", "load_results": "table", "summary_markdown": "table"}

log = logging.getLogger(__name__)


def __getattr__(name: str):
    if name in _RUNNING:
        return getattr(importlib.import_module(f"fedcache.grids.{_RUNNING[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@said_once()  # each partition's warnings said by the first cell on it, not by each
def run_grid(spec: GridSpec, on_cell: SaidCellCallback | None = None, on_plan: PlanCallback | None = None,
             on_step: StepCallback | None = None) -> Table:
    """Every unfinished cell of the grid (finished ones are read back), then results.csv and table.md; with
    ``--select``, tuned on the validation split first and the chosen values tested once. ``on_cell(done, total, row,
    text)``: each finished cell, ``text`` its words as logged. ``on_step``: the steps before the cells (reading the
    features, making the partitions) that took a while (``progress.said_step``)."""
    from fedcache.grids.run import in_saved_order, run_cells
    from fedcache.grids.select import run_selected

    # Held before its grid.json is read, until its tables are written (fedcache/ownership.py): two grids in one
    # directory would replace each other's files and mix their cells; the second is refused, naming the first.
    spec.check_given()
    check_outside(spec.out)
    # Only a directory that was empty or absent is this call's to tidy when it is refused: an existing one may hold
    # features/ or validation/ of the user's own.
    fresh = not spec.out.exists() or not any(spec.out.iterdir())
    with hold(spec.out, f"the grid directory {spec.out}"):
        spec = in_saved_order(spec)
        on_cell = _logged_cells(spec, on_cell)
        try:
            if spec.select:
                tested = run_selected(spec, on_cell, on_plan, on_step)
                _said_candidates_diverged(spec)
                return tested
            return _said_diverged(spec, run_cells(spec, on_cell, on_plan=on_plan, on_step=on_step))
        except KeyboardInterrupt:
            _said_paused(spec, on_step or on_plan)
            raise
        except DiskFullError as exc:  # a cell's advice speaks of train's --resume: a grid resumes by itself
            raise exc.advised(again("grid", "finished cells are kept, the others continue from their last checkpoint")) from None
        except FedcacheError:
            if fresh:  # refused before any cell ran (an unknown dataset, --select without spare rows): no plan left
                _forget_plan(spec.out)
            raise


def _said_paused(spec: GridSpec, say: StepCallback | None) -> None:
    """Where the runs of a --prune halving grid stopped before its first cut wait: none has a result (a report has
    nothing to show) until that cut, which the grid run again makes."""
    paused = paused_before_first_cut(spec.out) if spec.prune == "halving" else None
    if paused:
        again = named("the same `fedcache grid` command", "the same fedcache.grid(...) call")
        said_now(log, say, f"{spec.out}: the grid is {paused}; {again} run again continues it from there")


def _forget_plan(out) -> None:
    """What a grid refused before its first cell wrote left in a directory that was empty or absent (its
    grid.json, its stages' and its features): removed, but for the hold's lock; hold() then removes the directory."""
    from fedcache.grids.run import holds_runs

    if holds_runs(out):
        return
    for path in out.iterdir():
        if path.name != LOCK:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def cell_text(row: dict, sweep: dict[str, list[str]], labels: dict[str, str] | None = None) -> str:
    """A finished cell in a few words, as the log and a command's progress say it: its method, the axes on which the
    grid's cells differ (named by ``labels`` where given: ``head``, as table.md, for the cells' ``head.name``), its
    seed and its score (``fedavg lr=0.1 seed 0: 34.8%``). Cells stacked in one batch finish together, and the method
    and seed alone named them all alike."""
    labels = labels or {}
    axes = [f"{labels.get(k, k)}={row[k]}" for k, values in sweep.items() if len(values) > 1 and k in row]
    score = "diverged" if row.get("diverged") else f"{row['mean_accuracy']:.1f}%"
    return " ".join([row["method"], *axes, f"seed {row['seed']}:", score])


def _logged_cells(spec: GridSpec, on_cell: SaidCellCallback | None) -> CellCallback:
    """``on_cell``, after each finished cell is logged with the count it is given (one count over a --select grid's
    stages): cells that finish together (a batch, the workers side by side) each have their line, where a command's
    progress shows every tenth of the grid. Its words are said once, of ``spec`` in its saved order, and given to
    ``on_cell``: a progress line naming the axes in the order the command gave them would differ from the log's."""

    labels = {k: axis_label(k, spec.methods) for k in spec.sweep}

    def logged(done: int, total: int, row: dict) -> None:
        text = cell_text(row, spec.sweep, labels)
        log.info("cell %d/%d finished: %s", done, total, text)
        if on_cell is not None:
            on_cell(done, total, row, text)

    return logged


def _said_diverged(spec: GridSpec, table: Table) -> Table:
    """Cells that diverged are rows marked so (table.md says "diverged"); said once more where a user looks last."""
    lost = [r for r in table if r.get("diverged")]
    if lost:
        first = lost[0]
        log.warning(
            "%s diverged (%s is the first; its error is in %s): table.md marks %s; lower the values that "
            "diverge, or leave them out, in %s", count(len(lost), "cell") + f" of {len(table)}",
            first["run_dir"], spec.out / first["run_dir"] / DIVERGED, "them" if len(lost) > 1 else "it",
            spec.names.new_out())
    return table


def _said_candidates_diverged(spec: GridSpec) -> None:
    """A --select grid's candidates that diverged: never chosen, as a plain grid's diverged cells said once more at
    its end (they were said only as they happened, among the progress lines)."""
    where = spec.out / VALIDATION
    lost = [r for r in Table.from_csv(where / RESULTS) if r.get("diverged")] if (where / RESULTS).exists() else []
    if lost:
        first = where / lost[0]["run_dir"]  # the stage's rows name their cells within it
        log.warning("%s diverged on validation, never chosen (%s is the first; its error is in %s); %s marks %s",
                    count(len(lost), "candidate cell"), first.relative_to(spec.out), first / DIVERGED,
                    where / "table.md", "them" if len(lost) > 1 else "it")


__all__ = ["METRIC_COLUMNS", "Cell", "GridSpec", "cell_text", "cells", "load_results", "load_toml", "option_axes", "run_grid",
           "summary_markdown", "train_config"]
