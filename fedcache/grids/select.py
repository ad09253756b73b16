"""Tune on validation, then test once: the choice of hyperparameters for `fedcache grid --select`.

A grid's validation cells are scored; for every method and every value of the settings that are not
being selected (alpha, say), the values of the selected settings (lr, say) with the best mean validation
score over seeds are chosen, and only those are run on the test split. Choosing on the test split would
report an optimistic number: the test split is read once, for the chosen values.
"""
from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcache.errors import ConfigError
from fedcache.federate.divergence import DivergedError
from fedcache.federate.rundir import write_json
from fedcache.grids.cell import read_diverged
from fedcache.grids.halving import Group, run_halving
from fedcache.grids.pool import Workers
from fedcache.grids.processes import jobs_of
from fedcache.grids.run import CellCallback, PlanCallback, Prepared, check_cells, check_spec, run_cells
from fedcache.grids.spec import FEATURES, TEST, VALIDATION, Cell, GridSpec, axis_label, cells
from fedcache.grids.table import grid_caption, write_outputs
from fedcache.paths import SELECTION
from fedcache.progress import StepCallback
from fedcache.table import Table
from fedcache.wording import named

RULE = ("the highest mean over seeds of the validation score; ties go to the value listed first; "
        "a value that diverged on any seed is not chosen")


@dataclass(frozen=True)
class Choice:
    method: str
    fixed: tuple[tuple[str, str], ...]  # the group: settings not selected
    chosen: tuple[tuple[str, str], ...]  # the selected settings' chosen values
    score: float  # mean validation score over seeds of the chosen values
    candidates: tuple[tuple[tuple[tuple[str, str], ...], float | None], ...]  # every value tried, its score (None: diverged)
    stopped_at: tuple[tuple[tuple[tuple[str, str], ...], int], ...] = ()  # --prune: the round each value stopped at


def choose(rows: list[dict], setting_keys: list[str], select: list[str], metric: str = "mean_accuracy") -> list[Choice]:
    """``rows``: one per validation cell, with ``method``, ``seed``, ``metric`` and each key of
    ``setting_keys`` (the grid's axes, in order); a row with ``diverged`` has no score. Returns one Choice per
    (method, other settings). Rows with ``stopped_at`` (successive halving) compete only with the group's
    candidates that trained as long: a value cut at an earlier rung is listed, never chosen."""
    unknown = [k for k in select if k not in setting_keys]
    if unknown:
        raise ConfigError(f"--select {','.join(unknown)}: not an axis of this grid (axes: {', '.join(setting_keys) or 'none'}); "
                          "give the values to choose from as an axis, e.g. --set lr=1e-3,1e-2 --select lr")
    others = [k for k in setting_keys if k not in select]
    scores: dict[tuple, dict[tuple, list[float | None]]] = {}
    stopped: dict[tuple, dict[tuple, int]] = {}
    for r in rows:
        group = (r["method"], tuple((k, str(r[k])) for k in others))
        value = tuple((k, str(r[k])) for k in select)
        score = None if r.get("diverged") or r.get(metric) is None else float(r[metric])
        scores.setdefault(group, {}).setdefault(value, []).append(score)
        if r.get("stopped_at") is not None:
            stopped.setdefault(group, {})[value] = int(r["stopped_at"])
    choices = []
    for (method, fixed), by_value in scores.items():
        # A value with a diverged seed has no mean: averaging the other seeds would favour it.
        means = [(value, None if None in v else float(np.mean(v))) for value, v in by_value.items()]
        at = stopped.get((method, fixed), {})
        furthest = max(at.values(), default=None)
        scored = [vm for vm in means if vm[1] is not None and at.get(vm[0]) == furthest]
        if not scored:
            where = ", ".join(f"{k}={v}" for k, v in fixed)
            raise ConfigError(f"{named('--select', 'select')}: every value of {', '.join(select)} diverged on validation for {method}"
                              f"{' at ' + where if where else ''}; add smaller values (e.g. a lower lr) to choose from")
        best = max(scored, key=lambda vm: vm[1])  # max keeps the first of equal scores: the value listed first
        choices.append(Choice(method, fixed, best[0], best[1], tuple(means), tuple(at.items())))
    return choices


def run_selected(spec: GridSpec, on_cell: CellCallback | None = None, on_plan: PlanCallback | None = None,
                 on_step: StepCallback | None = None) -> Table:
    """--select: every cell on the validation split (spare training rows) in ``out/validation`` (with --prune
    halving, the candidates cut as grids/halving.py says); per method and other settings the selected axes' values
    with the best mean over seeds; those alone on the test split in ``out/test``, with the same seeds and
    partitions. ``out/table.md`` shows the test results with the chosen values; ``out/selection.json`` every
    candidate's validation score (and where it was cut)."""
    if "validation" in spec.sweep:
        raise ConfigError(f"{spec.names.key('select')} tunes on the validation split itself; leave out "
                          f"{spec.names.axis('validation')}")
    # A typo in a setting is said as one, not as a grid that differs from out's (one seed: the seed checks nothing).
    check_cells(spec, cells(dataclasses.replace(spec, seeds=spec.seeds[:1])))
    check_spec(spec)  # out/grid.json names the --select grid: a plain grid there (or another --select) is refused
    base = dataclasses.replace(spec, select=[], prune="none", features=_shared_features(spec))
    n_tested = len(cells(dataclasses.replace(base, sweep={k: vs[:1] if k in spec.select else vs for k, vs in spec.sweep.items()})))
    tuning = dataclasses.replace(base, out=spec.out / VALIDATION, sweep={**spec.sweep, "validation": ["true"]})
    prepared = Prepared()  # the partitions made and methods checked once, for both stages (and every rung)
    with Workers(jobs_of(spec)) as workers:  # one start of the workers for both stages (and every rung)
        tuned, groups, n_tuned = _tune(spec, tuning, _from_out(on_cell, VALIDATION), on_plan, n_tested, on_step,
                                       workers, prepared)
        choices = choose(tuned.to_records(), list(spec.sweep), spec.select)
        picked = [Cell(c.method, seed, tuple((k, dict(c.fixed + c.chosen)[k]) for k in spec.sweep))
                  for c in choices for seed in spec.seeds]
        # Written before the test stage: the choices stand whatever the test runs do.
        write_json(spec.out / SELECTION, selection_doc(spec, choices, groups))
        tested = run_cells(dataclasses.replace(base, out=spec.out / TEST),
                           _counting(_from_out(on_cell, TEST), n_tuned, n_tuned + n_tested),
                           only=picked, on_plan=on_plan, write=False, on_step=on_step, workers=workers, prepared=prepared)
    lost = [r for r in tested if r.get("diverged")]
    if lost:
        early = any(at < g.rounds for g in groups for at in (g.stopped_at.get(v) for v in g.alive) if at is not None)
        cut = "; successive halving chose it at a rung, before it could diverge there" if early else ""
        what = read_diverged(spec.out / TEST / lost[0]["run_dir"])
        prune = f" or leave out {spec.names.key('prune')}" if early else ""
        raise DivergedError(f"{spec.names.key('select')}: a value chosen on validation ({spec.out / SELECTION}) diverged "
                            f"on the test split{cut}: {what}. Choose among smaller values{prune}, in "
                            f"{spec.names.new_out()}")
    # The chosen values beside each result, in test/ too: where every group chose the same value, it is neither
    # a column nor (the grid swept several) in the caption's fixed options.
    picked_keys = ", ".join(axis_label(k, spec.methods) for k in spec.select)  # --select head: head, not head.name
    chosen = f"{picked_keys} as chosen on validation (../{SELECTION})"
    write_outputs(spec.out / TEST, tested, grid_caption(base) + f"; {chosen}", beside=spec.select, axes=list(spec.sweep))
    caption = grid_caption(spec) + f"; {picked_keys} chosen per method and setting on validation ({RULE}"
    caption += f"; {pruning_caption(spec, groups)})" if groups else ")"
    # Each run_dir relative to --out, as a plain grid's results name them: the test runs are under test/.
    tested = Table([{**row, "run_dir": f"{TEST}/{row['run_dir']}"} for row in tested])
    write_outputs(spec.out, tested, caption + ", then tested once", beside=spec.select, axes=list(spec.sweep))
    return tested


def _shared_features(spec: GridSpec) -> Path:
    """The features both stages read: the grid's own. An older fedcache wrote a copy per stage; the first becomes
    the grid's (its entries are checked against the store as ever: cells trained on it must not mix with cells of
    a re-extraction), the other goes."""
    shared = spec.features_folder
    for stage in (VALIDATION, TEST):
        old = spec.out / stage / FEATURES
        if (old / "meta.json").exists() and not (shared / "meta.json").exists():
            shutil.rmtree(shared, ignore_errors=True)
            old.rename(shared)
        shutil.rmtree(old, ignore_errors=True)
    return shared


def _tune(spec: GridSpec, tuning: GridSpec, on_cell, on_plan, n_tested: int, on_step: StepCallback | None,
          workers: Workers, prepared: Prepared) -> tuple[Table, list[Group], int]:
    """The validation stage: every cell in full, or pruned by successive halving. Returns its rows, the
    halving's groups (none for the full stage) and the cell runs it counted for progress."""
    if spec.prune == "none":
        n_tuned = len(cells(tuning))
        return run_cells(tuning, _counting(on_cell, 0, n_tuned + n_tested), on_plan=on_plan, on_step=on_step,
                         workers=workers, prepared=prepared), [], n_tuned
    rows, groups, ran = run_halving(tuning, spec.select, spec.reduction_factor, spec.min_rounds, on_cell=on_cell,
                                    on_plan=on_plan, after=n_tested, on_step=on_step, workers=workers, prepared=prepared)
    tuned = Table(rows)
    write_outputs(tuning.out, tuned, grid_caption(tuning) + "; " + pruning_caption(spec, groups)
                  + "; a candidate cut early shows its score at the round it stopped (stopped_at in results.csv)",
                  axes=list(tuning.sweep))
    return tuned, groups, ran  # the test stage counts on from there: the count never goes back


def pruning_caption(spec: GridSpec, groups: list[Group]) -> str:
    full = sum(len(g.candidates) * g.seeds * g.rounds for g in groups)
    ran = sum(r for g in groups for r in g.ran.values())  # a diverged cell's up to where it stopped, not to its cut
    if not any(g.cuts for g in groups):  # one round: no rung (--min-rounds at or past the rounds is refused)
        return (f"successive halving (reduction factor {spec.reduction_factor}) cut no candidate: every group trained "
                "its candidates to the full rounds")
    return (f"candidates cut by successive halving (reduction factor {spec.reduction_factor}): "
            f"{ran} of the full grid's {full} validation rounds ({100 * ran / full:.0f}%) trained; "
            "a candidate cut early is never chosen")


def selection_doc(spec: GridSpec, choices: list[Choice], groups: list[Group]) -> dict:
    """selection.json: the rule, and per group the chosen values, every candidate's validation score (at the round
    it stopped, with --prune) and, with --prune, each cut."""
    cuts = {(g.method, g.fixed): g for g in groups}

    def candidate(c: Choice, value, score) -> dict:
        at = dict(c.stopped_at).get(value)
        return {**dict(value), "validation_score": score, **({"diverged": True} if score is None else {}),
                **({"stopped_at": at} if at is not None else {})}

    def group(c: Choice) -> dict:
        doc = {"method": c.method, **dict(c.fixed), "chosen": dict(c.chosen), "validation_score": c.score,
               "candidates": [candidate(c, v, sc) for v, sc in c.candidates]}
        g = cuts.get((c.method, c.fixed))
        if g is not None:
            doc["full_rounds"] = g.rounds
            doc["cuts"] = [{"round": cut["round"], "kept": [dict(v) for v in cut["kept"]],
                            "scores": [{**dict(v), "validation_score": sc} for v, sc in cut["scores"].items()]}
                           for cut in g.cuts]
            if g.revivals:  # kept candidates that diverged later, and the cut ones that trained on in their place
                doc["revived"] = [{"round": r["round"], "diverged": [dict(v) for v in r["diverged"]],
                                   "continued": [dict(v) for v in r["revived"]]} for r in g.revivals]
        return doc

    doc = {"rule": RULE, "selected": spec.select, "choices": [group(c) for c in choices]}
    if groups:
        doc["prune"] = {"method": "successive halving", "reduction_factor": spec.reduction_factor,
                        "min_rounds": spec.min_rounds, "note": PRUNE_NOTE}
    return doc


PRUNE_NOTE = ("each cut keeps the best ceil(n / reduction_factor) candidates of a group by mean validation score over "
              "seeds at that round; a candidate that would have overtaken them later (a late bloomer) is not seen")


def _from_out(on_cell: CellCallback | None, stage: str) -> CellCallback | None:
    """``on_cell`` given each cell's row with its run_dir relative to --out (``test/cells/...``), as the returned
    table and results.csv name it, not to the stage's folder."""
    if on_cell is None:
        return None
    return lambda done, total, row: on_cell(done, total, {**row, "run_dir": f"{stage}/{row['run_dir']}"})


def _counting(on_cell: CellCallback | None, before: int, total: int) -> CellCallback | None:
    """One count over both stages of a --select grid (validation, then test), so progress never goes back."""
    if on_cell is None:
        return None
    return lambda done, _, row: on_cell(before + done, total, row)
