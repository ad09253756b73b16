"""Successive halving for ``fedcache grid --select ... --prune halving``: tuning at a fraction of the grid.

A group is what ``--select`` chooses within: one method and one value of every setting that is not selected.
Its candidates are the values of the selected settings (lr=1e-3, lr=1e-2, ...). Every candidate trains, on the
validation split, up to the group's first rung; the best 1/eta (``--reduction-factor``) by mean validation score
over the grid's seeds continue from their checkpoints to the next rung, and so on until one is left, which is the
choice; if more than one is left after the last rung, they run to the full rounds and the best is chosen as a full
``--select`` grid chooses. Ties go to the value listed first; a candidate that diverged on any seed is cut.

The rungs: with n candidates, the cuts needed to leave one (each keeps ceil(n/eta)) at rounds
first, first*eta, ..., with ``first`` = rounds / eta^cuts by default, so that the last cut comes at rounds / eta.
A paused cell keeps its checkpoint and its row at the rung (``rungs.json``): a re-run reads the rows back and
makes the same cuts, and a continued cell's numbers are those of a run that never paused (``driver.run``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from fedcache.grids.cell import diverged_round, mark_continued
from fedcache.grids.pool import Workers
from fedcache.grids.run import CellCallback, PlanCallback, Prepared, run_cells
from fedcache.grids.rungs import rungs
from fedcache.grids.spec import CELLS, Cell, GridSpec, cells, train_config
from fedcache.progress import StepCallback, said_now
from fedcache.wording import count

Value = tuple[tuple[str, str], ...]  # the selected settings' values of one candidate
VALIDATION_AXIS = "validation"  # the validation stage's own axis: the same in every cell, in no group's key


@dataclass
class Group:
    method: str
    fixed: Value  # the settings not selected
    candidates: dict[Value, list[Cell]]  # in the order the values are listed; a candidate's cells are its seeds
    rounds: int
    rungs: list[int]
    eta: int
    alive: list[Value] = field(default_factory=list)
    cuts: list[dict] = field(default_factory=list)  # per rung: its round, every candidate's score, who continued
    stopped_at: dict[Value, int] = field(default_factory=dict)  # the round each candidate stopped at
    revivals: list[dict] = field(default_factory=list)  # kept candidates that diverged, and who trained in their place
    ran: dict[Cell, int] = field(default_factory=dict)  # the rounds each cell trained (grids/select.pruning_caption)
    done: bool = False

    def __post_init__(self) -> None:
        self.alive = list(self.candidates)

    @property
    def stop(self) -> int | None:
        """The round the live candidates train to next (None: the full rounds)."""
        return self.rungs[len(self.cuts)] if len(self.cuts) < len(self.rungs) else None

    def label(self) -> str:
        return self.method + "".join(f" {k}={v}" for k, v in self.fixed)

    def cut(self, rows: dict[Cell, dict], metric: str) -> None:
        """After the live candidates reached ``stop``: keep the best ceil(n/eta); done with one left, or after
        the full rounds."""
        at = self.stop
        scores = {v: _score([rows[c] for c in self.candidates[v]], metric) for v in self.alive}
        lost = [v for v in self.alive if scores[v] is None]
        # Too few left that did not diverge for what this cut keeps (the full rounds: one to choose): the next best
        # of the last cut make up the difference. With enough left, the cut is the one halving always made.
        short = (1 if at is None else math.ceil(len(self.alive) / self.eta)) - (len(self.alive) - len(lost))
        if short > 0 and self._revive(lost, at, short):
            return  # they train up to this round too; the cut is made when they are there
        if at is None:
            self.stopped_at.update({v: self.rounds for v in self.alive})
            self.done = True
            return
        ranked = sorted((v for v in self.alive if scores[v] is not None), key=lambda v: -scores[v])  # stable: ties keep listing order
        kept = set(ranked[:math.ceil(len(self.alive) / self.eta)])
        self.cuts.append({"round": at, "scores": scores, "kept": [v for v in self.alive if v in kept]})
        self.stopped_at.update({v: at for v in self.alive if v not in kept})
        self.alive = [v for v in self.alive if v in kept]
        if len(self.alive) <= 1:
            self.stopped_at.update({v: at for v in self.alive})
            self.done = True

    def _revive(self, lost: list[Value], at: int | None, count: int) -> bool:
        """Kept candidates diverged on their way to ``at``: ``count`` of the best candidates cut before (the latest
        cut first, then by their score there) continue from where they stopped in their place, as a full grid
        would have ranked the diverged ones last. False when none is left to continue."""
        cut_at = {v: (cut["round"], score) for cut in self.cuts for v, score in cut["scores"].items()
                  if score is not None and v not in cut["kept"]}
        gone = {v for r in self.revivals for v in r["diverged"]} | set(lost)
        pool = sorted((v for v in cut_at if v not in gone and v not in self.alive),
                      key=lambda v: (-cut_at[v][0], -cut_at[v][1]))
        revived = pool[:count]
        if not revived:
            return False
        self.revivals.append({"round": at or self.rounds, "diverged": lost, "revived": revived})
        self.stopped_at.update({v: at or self.rounds for v in lost})
        self.alive = [v for v in self.candidates if (v in self.alive and v not in lost) or v in revived]
        return True

    def planned(self) -> int:
        """Cell runs (a candidate's seeds, each stage) if nothing diverges."""
        n, runs = len(self.candidates), 0
        for _ in self.rungs:
            runs += n
            n = math.ceil(n / self.eta)
            if n <= 1:
                return runs * self.seeds
        return (runs + n) * self.seeds

    @property
    def seeds(self) -> int:
        return len(next(iter(self.candidates.values())))


def _rounds_run(spec: GridSpec, row: dict, stop: int) -> int:
    """A cell's rounds up to ``stop``, or up to the round it diverged in: its run stopped there."""
    if not row.get("diverged"):
        return stop
    return diverged_round(spec.out / row["run_dir"]) or stop  # a record of an older fedcache names no round


def _score(rows: list[dict], metric: str) -> float | None:
    """The mean over seeds; None where a seed diverged (averaging the others would favour the candidate)."""
    values = [None if r.get("diverged") or r.get(metric) is None else float(r[metric]) for r in rows]
    return None if None in values else float(np.mean(values))


def groups_of(spec: GridSpec, select: list[str], eta: int, first: int | None) -> list[Group]:
    """The validation stage's cells (``spec``: its grid) as groups of candidates, with their rungs."""
    others = [k for k in spec.sweep if k not in select and k != VALIDATION_AXIS]
    by_group: dict[tuple, dict[Value, list[Cell]]] = {}
    for c in cells(spec):
        setting = dict(c.setting)
        key = (c.method, tuple((k, setting[k]) for k in others))
        by_group.setdefault(key, {}).setdefault(tuple((k, setting[k]) for k in select), []).append(c)
    out = []
    for (method, fixed), candidates in by_group.items():
        rounds = train_config(spec, next(iter(candidates.values()))[0], None).schedule.rounds
        out.append(Group(method, fixed, candidates, rounds, rungs(rounds, len(candidates), eta, first), eta))
    return out


def run_halving(spec: GridSpec, select: list[str], eta: int, first: int | None, metric: str = "mean_accuracy",
                on_cell: CellCallback | None = None, on_plan: PlanCallback | None = None,
                after: int = 0, on_step: StepCallback | None = None,
                workers: Workers | None = None, prepared: Prepared | None = None) -> tuple[list[dict], list[Group], int]:
    """The validation stage of a pruned --select grid (``spec``: that stage's grid). Returns every cell's last row
    (with ``stopped_at``, the round it stopped at) in the grid's order, the groups with their cuts, and the cell
    runs it made (more than planned where a diverged candidate's place went to the next best; fewer where a group
    was left with one).
    ``after``: the cell runs that follow this stage, for one progress count over both; ``workers``: the worker
    processes every rung trains in (``pool.Workers``); ``prepared``: the partitions and methods every rung shares
    (``run.Prepared``: made and checked by the first)."""
    groups = groups_of(spec, select, eta, first)
    prepared = prepared or Prepared()
    plan: str | None = plan_text(groups, eta)  # said by the first rung once its partitions are made, as a plain grid's
    last: dict[Cell, dict] = {}
    before, total = 0, sum(g.planned() for g in groups) + after
    while live := [g for g in groups if not g.done]:
        stops = {c: (g, g.stop) for g in live for v in g.alive for c in g.candidates[v]}
        # A kept candidate beside revived ones is at this stop already: its row is the one it had, not a cell run.
        waiting = {c for c, (g, at) in stops.items() if c in last and last[c]["stopped_at"] == (at or g.rounds)}
        step = [c for c in cells(spec) if c in stops and c not in waiting]
        counted = (lambda done, _, row, at=before: on_cell(at + done, max(total, at + done), row)) if on_cell else None
        table = run_cells(spec, counted, only=step, on_plan=on_plan, write=False, on_step=on_step,
                          stops={c: stops[c][1] for c in step if stops[c][1] is not None}, workers=workers, plan=plan,
                          prepared=prepared)
        plan = None
        rows = dict(zip(step, table.to_records()))
        for c, row in rows.items():
            g, at = stops[c]
            # ``rounds`` is the cell's setting (its full rounds), not the round a paused summary reached: that is
            # stopped_at, and table.md tells a cut candidate by stopped_at < rounds (it is never marked best).
            last[c] = {**row, "rounds": g.rounds, **dict(c.setting), "stopped_at": at or g.rounds}
            g.ran[c] = _rounds_run(spec, row, at or g.rounds)
        reached = [(g, g.stop, len(g.revivals)) for g in live]
        for g in live:
            g.cut({**{c: last[c] for c in waiting}, **rows}, metric)
        _mark_continued(spec, live, last)
        before += len(step)
        _say(on_plan, step_text(reached))
    return [last[c] for c in cells(spec)], groups, before


def _mark_continued(spec: GridSpec, groups: list[Group], last: dict[Cell, dict]) -> None:
    """The cells that train on from the rung they wait at (kept at a cut, or revived), marked so in their rungs.json
    before they do: a report of the grid stopped before they train tells them from the ones cut there."""
    for g in groups:
        if g.done:
            continue  # left with one: chosen at its rung, trained no further on validation
        for c in (c for v in g.alive for c in g.candidates[v]):
            if c in last and last[c]["stopped_at"] < (g.stop or g.rounds):
                mark_continued(spec.out / CELLS / c.name, last[c]["stopped_at"])


def plan_text(groups: list[Group], eta: int) -> str:
    """What the grid says before it starts: the rungs of each kind of group, the groups that run in full."""
    kinds: dict[tuple, int] = {}
    for g in groups:
        kinds[len(g.candidates), tuple(g.rungs), g.rounds] = kinds.get((len(g.candidates), tuple(g.rungs), g.rounds), 0) + 1
    parts = []
    for (n, at, rounds), k in kinds.items():
        # No rung: the first cut would fall at or after the last round (few rounds, or --min-rounds past them).
        where = (f"cut at rounds {', '.join(map(str, at))} of {rounds}" if at else
                 f"no cut before the last round: run in full ({count(rounds, 'round')})")
        parts.append(f"{k} group{'s' * (k > 1)} of {n} candidate{'s' * (n > 1)}: {where}")
    full = sum(len(g.candidates) * g.seeds * g.rounds for g in groups)
    most = sum(_planned_rounds(g) for g in groups)
    return (f"successive halving (reduction factor {eta}): " + "; ".join(parts)
            + f"; at most {most} of the full grid's {full} validation rounds ({100 * most / full:.0f}%)")


def _planned_rounds(g: Group) -> int:
    n, done, rounds = len(g.candidates), 0, 0
    for r in g.rungs:
        rounds += n * (r - done)
        n, done = math.ceil(n / g.eta), r
        if n <= 1:
            return rounds * g.seeds
    return (rounds + n * (g.rounds - done)) * g.seeds


def step_text(reached: list[tuple[Group, int | None, int]]) -> str:
    """After a step: at each rung round, how many candidates continue of how many; the groups that ran in full;
    kept candidates that diverged and the ones that continue in their place."""
    at_round: dict[int, list[int]] = {}
    full, lost, revived, chosen = 0, 0, 0, 0
    for g, at, revivals in reached:
        if len(g.revivals) > revivals:
            lost += len(g.revivals[-1]["diverged"])
            revived += len(g.revivals[-1]["revived"])
            continue
        if at is None:
            full += 1
            continue
        counts = at_round.setdefault(at, [0, 0])
        counts[0] += len(g.cuts[-1]["kept"])
        counts[1] += len(g.cuts[-1]["scores"])
        chosen += g.done
    parts = [f"round {r}: {k} of {n} candidates kept" for r, (k, n) in sorted(at_round.items())]
    if full:
        parts.append(f"{full} group{'s' * (full > 1)} trained to the full rounds")
    if lost:
        parts.append(f"{lost} kept candidate{'s' * (lost > 1)} diverged: the next best {revived} continue{'s' * (revived == 1)} "
                     "in their place")
    # Said only where one was: after a cut that left two in every group, it read as if a choice had been made.
    return "halving: " + "; ".join(parts) + (" (a group left with one has chosen it)" if chosen else "")


def _say(on_plan: PlanCallback | None, text: str) -> None:
    said_now(logging.getLogger(__name__), on_plan, text)
