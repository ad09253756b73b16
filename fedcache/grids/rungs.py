"""Successive halving's rungs (the rounds grids/halving.py cuts at), and where a pruned grid stopped before its first
cut waits. Without torch: a report reads it, and so does a grid as it is interrupted."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from fedcache.disk import log_lines
from fedcache.grids.spec import CELLS, VALIDATION
from fedcache.paths import CONFIG, DIVERGED, GRID, METRICS, RESULTS, RUNGS, SUMMARY
from fedcache.wording import count


def rungs(rounds: int, candidates: int, eta: int, first: int | None = None) -> list[int]:
    """The rounds (before the last) at which a group of ``candidates`` is cut."""
    cuts, left = 0, candidates
    while left > 1:
        left, cuts = math.ceil(left / eta), cuts + 1
    at = rounds / eta ** cuts if first is None else float(first)
    out: list[int] = []
    while len(out) < cuts:
        r = max(1, round(at))
        if r >= rounds:
            break
        if not out or r > out[-1]:
            out.append(r)
        at *= eta
    return out


def paused_before_first_cut(out: Path) -> str | None:
    """Where the runs of the --prune halving grid in ``out`` wait, stopped before its first cut, in words: ``paused
    before its first cut (round 1 of 9): 9 of its 12 validation runs are there, 3 not started``. Until that cut no
    run has a result, and a report has nothing to show. None for any other grid, or once a cut was made."""
    spec = _json(out / GRID) or {}
    select, eta, first = spec.get("select"), spec.get("reduction_factor"), spec.get("min_rounds")
    if spec.get("prune") != "halving" or not isinstance(select, list) or not isinstance(eta, int) or eta < 2 \
            or (out / VALIDATION / RESULTS).exists():
        return None
    sweep = spec.get("sweep") if isinstance(spec.get("sweep"), dict) else {}
    candidates = math.prod(_many(sweep.get(k)) for k in select)
    cuts, there, partway, gone = set(), 0, {}, {"diverged": 0, "finished": 0}
    for cell in sorted(p for p in (out / VALIDATION / CELLS).glob("*") if p.is_dir()):
        rounds = _field(_json(cell / CONFIG), "spec", "schedule", "rounds")
        if not isinstance(rounds, int):
            continue  # not started (or a config of no use here): counted among those not started
        at, got = rungs(rounds, candidates, eta, first if isinstance(first, int) else None)[:1], round_reached(cell)
        # A group with no rung (too few rounds: a rounds axis of 1,9) runs in full, uncut: it tells nothing of others.
        if at and ((cell / SUMMARY).exists() or got > at[0]):
            return None  # finished, or past its first cut (diverged there too): that cut was made
        cuts |= {(at[0], rounds)} if at else set()
        if (cell / DIVERGED).exists() or (cell / SUMMARY).exists():
            gone["diverged" if (cell / DIVERGED).exists() else "finished"] += 1
        elif at and got == at[0]:
            there += 1
        elif got:
            partway[got] = partway.get(got, 0) + 1
    if not cuts:
        return None  # no run of a group that is cut has started: nothing says where its first cut is
    total = math.prod(_many(v) for v in (spec.get("methods"), spec.get("seeds"), *sweep.values()))
    return _words(sorted(cuts), there, partway, gone, total)


def _words(cuts: list[tuple[int, int]], there: int, partway: dict[int, int], gone: dict[str, int], total: int) -> str:
    """``cuts``: the (first cut, rounds) of each kind of group; ``there``: the runs waiting at their group's first
    cut; ``partway``: the others, by the round they reached; ``gone``: those that diverged, and those that finished
    (in a group too short to cut)."""
    runs = f"its {count(total, 'validation run')}"
    lead = (f"{runs} {'is' if total == 1 else 'are all'} there" if there == total else
            f"{there} of {runs} {'is' if there == 1 else 'are'} there" if there else f"none of {runs} is there yet")
    parts = [f"{n} at round {r}" for r, n in sorted(partway.items(), reverse=True)]
    parts += [f"{gone['finished']} finished (too few rounds to cut)"] if gone["finished"] else []
    parts += [f"{gone['diverged']} diverged"] if gone["diverged"] else []
    left = total - there - sum(partway.values()) - sum(gone.values())
    parts += [f"{left} not started"] if left > 0 else []
    where = ", ".join(f"round {cut} of {rounds}" for cut, rounds in cuts)
    return f"paused before its first cut ({where}): {lead}" + (f", {', '.join(parts)}" if parts else "")


def round_reached(cell: Path, paused: Callable[[Path], dict] | None = None) -> int:
    """The last round a run trained to (0: none yet): its last rung or its last metrics line, whichever is later
    (rungs.json keeps the rung a candidate kept there trains on from; metrics.jsonl, the rounds it trained since).
    One kept at a rung that then diverged trained past it: its metrics stop at the rung (the round that diverged is
    never logged), yet the cut at that rung was made. So is one kept there (or revived) that has not trained on yet:
    its rung says it continues (grids/cell.mark_continued). ``paused``: as for ``last_rung``."""
    doc = _rungs(cell, paused)
    rung = _last(doc)
    if rung and ((cell / DIVERGED).exists() or _field(doc, str(rung), "continues") is True):
        return max(rung + 1, last_round(cell))
    return max(rung, last_round(cell))


def last_rung(cell: Path, paused: Callable[[Path], dict] | None = None) -> int:
    """The last round a --prune halving grid paused the run at (0: none). ``paused``: how a cell's rungs.json is read
    (a report's refuses a damaged one, naming it); by default a damaged one reads as none, as these words are advice."""
    return _last(_rungs(cell, paused))


def _rungs(cell: Path, paused: Callable[[Path], dict] | None) -> dict:
    return paused(cell) if paused else _json(cell / RUNGS) or {}


def _last(rungs: dict) -> int:
    return max((int(k) for k in rungs if str(k).isdigit()), default=0)


def last_round(cell: Path) -> int:
    """The last round a run's metrics.jsonl holds (0: none yet); a line torn by a crash is no round."""
    lines = log_lines((cell / METRICS).read_text(errors="replace")) if (cell / METRICS).exists() else []
    return max((line["round"] for line in lines), default=0)


def _many(values) -> int:
    """How many values a list of grid.json holds (a value of no list: one)."""
    return len(values) if isinstance(values, list) else 1


def _field(doc, *keys):
    """``doc[k1][k2]...``, or None where one is missing or not a JSON object."""
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _json(path: Path) -> dict | None:
    """A JSON object, or None where it is missing or no such object: these words are advice; a report or a re-run
    says what is wrong with a damaged file."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
