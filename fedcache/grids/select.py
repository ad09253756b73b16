"""Tune on validation, then test once: the choice of hyperparameters for `fedcache grid --select`.

A grid's validation cells are scored; for every method and every value of the settings that are not
being selected (alpha, say), the values of the selected settings (lr, say) with the best mean validation
score over seeds are chosen, and only those are run on the test split. Choosing on the test split would
report an optimistic number: the test split is read once, for the chosen values.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np

from fedcache.errors import ConfigError
from fedcache.grids.run import CellCallback, PlanCallback, check_spec, run_cells
from fedcache.grids.spec import RESULTS, TABLE, Cell, GridSpec, cells
from fedcache.grids.table import grid_caption, summary_markdown
from fedcache.table import Table

VALIDATION, TEST, SELECTION = "validation", "test", "selection.json"

RULE = ("the highest mean over seeds of the validation score; ties go to the value listed first; "
        "a value that diverged on any seed is not chosen")


@dataclass(frozen=True)
class Choice:
    method: str
    fixed: tuple[tuple[str, str], ...]  # the group: settings not selected
    chosen: tuple[tuple[str, str], ...]  # the selected settings' chosen values
    score: float  # mean validation score over seeds of the chosen values
    candidates: tuple[tuple[tuple[tuple[str, str], ...], float | None], ...]  # every value tried, its score (None: diverged)


def choose(rows: list[dict], setting_keys: list[str], select: list[str], metric: str = "mean_accuracy") -> list[Choice]:
    """``rows``: one per validation cell, with ``method``, ``seed``, ``metric`` and each key of
    ``setting_keys`` (the grid's axes, in order); a row with ``diverged`` has no score. Returns one Choice per
    (method, other settings)."""
    unknown = [k for k in select if k not in setting_keys]
    if unknown:
        raise ConfigError(f"--select {','.join(unknown)}: not an axis of this grid (axes: {', '.join(setting_keys) or 'none'}); "
                          "give the values to choose from as an axis, e.g. --set lr=1e-3,1e-2 --select lr")
    others = [k for k in setting_keys if k not in select]
    scores: dict[tuple, dict[tuple, list[float | None]]] = {}
    for r in rows:
        group = (r["method"], tuple((k, str(r[k])) for k in others))
        value = tuple((k, str(r[k])) for k in select)
        score = None if r.get("diverged") or r.get(metric) is None else float(r[metric])
        scores.setdefault(group, {}).setdefault(value, []).append(score)
    choices = []
    for (method, fixed), by_value in scores.items():
        # A value with a diverged seed has no mean: averaging the other seeds would favour it.
        means = [(value, None if None in v else float(np.mean(v))) for value, v in by_value.items()]
        scored = [vm for vm in means if vm[1] is not None]
        if not scored:
            where = ", ".join(f"{k}={v}" for k, v in fixed)
            raise ConfigError(f"--select: every value of {', '.join(select)} diverged on validation for {method}"
                              f"{' at ' + where if where else ''}; add smaller values (e.g. a lower lr) to choose from")
        best = max(scored, key=lambda vm: vm[1])  # max keeps the first of equal scores: the value listed first
        choices.append(Choice(method, fixed, best[0], best[1], tuple(means)))
    return choices


def run_selected(spec: GridSpec, on_cell: CellCallback | None = None, on_plan: PlanCallback | None = None) -> Table:
    """--select: every cell on the validation split (spare training rows) in ``out/validation``; per
    method and other settings the selected axes' values with the best mean over seeds; those alone on
    the test split in ``out/test``, with the same seeds and partitions. ``out/table.md`` shows the test
    results with the chosen values; ``out/selection.json`` every candidate's validation score."""
    if "validation" in spec.sweep:
        raise ConfigError("--select tunes on the validation split itself; leave out --validation")
    check_spec(spec)  # out/grid.json names the --select grid: a plain grid there (or another --select) is refused
    base = dataclasses.replace(spec, select=[])
    n_tuned = len(cells(base))
    n_tested = len(cells(dataclasses.replace(base, sweep={k: vs[:1] if k in spec.select else vs for k, vs in spec.sweep.items()})))
    tuned = run_cells(dataclasses.replace(base, out=spec.out / VALIDATION, sweep={**spec.sweep, "validation": ["true"]}),
                      _counting(on_cell, 0, n_tuned + n_tested), on_plan=on_plan)
    choices = choose(tuned.to_records(), list(spec.sweep), spec.select)
    picked = [Cell(c.method, seed, tuple((k, dict(c.fixed + c.chosen)[k]) for k in spec.sweep))
              for c in choices for seed in spec.seeds]
    tested = run_cells(dataclasses.replace(base, out=spec.out / TEST), _counting(on_cell, n_tuned, n_tuned + n_tested),
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
