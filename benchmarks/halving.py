"""Successive halving (`--prune halving`) against the full `--select` grid: wall time and the choices.

Two grids on digits5-offline (efficientnet-lite0 features), lr chosen per method and alpha on validation and the
choice tested once, each run in full and pruned, alternating in this process (--trials of each arm, fresh
directories). The time is the whole `fedcache.grid` call. Per group (method, alpha) the benchmark records whether
both arms chose the same lr and, where not, the test accuracy of both choices (mean and sample std over seeds).
It also replays the halving on the full grid's validation curves (every round is evaluated): a continued
candidate's numbers are its full run's, so the replay must choose what the pruned grid chose.

    .venv/bin/python benchmarks/halving.py [--store PATH] [--grid worked|wide|both] [--trials 2] [--jobs 2]
    .venv/bin/python benchmarks/halving.py --replay DIR [--reduction-factor 3] [--min-rounds N]
        # what halving would have chosen on a finished full --select grid in DIR, without training anything
    .venv/bin/python benchmarks/halving.py --from-dirs DIR   # the results of a run's --keep DIR (one stopped early too)
    .venv/bin/python benchmarks/halving.py --replay DIR --search
        # other rules (smoothed scores, near ties kept) at every reduction factor and first cut, replayed on DIR
    .venv/bin/python benchmarks/halving.py --render     # the section of docs/performance.md

"worked": docs/getting-started.md's grid (fedavg, fedprox, fedproto x alpha {0.1, 1} x lr {1e-3, 1e-2}, 10 clients,
subsample 0.8, 20 rounds, seeds 0-2). "wide": fedavg, fedprox, fedntd, fedproto x lr {1e-4 ... 3e-2} (6) x alpha
{0.1, 1} x seeds 0-2, 50 rounds.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import features, write  # noqa: E402

log = logging.getLogger("benchmarks.halving")
RESULT = Path(__file__).resolve().parent / "results" / "halving.json"
SEARCH = RESULT.with_name("halving_search.json")
DATA = ("digits5-offline", "efficientnet-lite0")
BASE = {"partition": ["dirichlet"], "clients": ["10"], "subsample": ["0.8"]}
GRIDS = {
    "worked": (["fedavg", "fedprox", "fedproto"], {**BASE, "alpha": ["0.1", "1"], "rounds": ["20"], "lr": ["1e-3", "1e-2"]}, [0, 1, 2]),
    "wide": (["fedavg", "fedprox", "fedntd", "fedproto"],
             {**BASE, "alpha": ["0.1", "1"], "rounds": ["50"], "lr": ["1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2"]}, [0, 1, 2]),
}
TINY = (["fedavg"], {"partition": ["iid"], "clients": ["2"], "subsample": ["0.5"], "rounds": ["4"],
                     "lr": ["1e-3", "1e-2", "1e-1"]}, [0, 1])
TINY_DATA = ("test-toy", "tiny-timm-random")
ARMS = ("full", "halving")


def run_arm(arm: str, store: Path, data, grid, out: Path, jobs: int, eta: int, min_rounds: int | None,
            plans: list[str]) -> tuple[float, float]:
    """Its wall time and CPU time (this process and its finished workers: on a shared machine the CPU time
    is what the other sessions' load disturbs least)."""
    import fedcache

    methods, sweep, seeds = grid
    prune = {"prune": "halving", "reduction_factor": eta, "min_rounds": min_rounds} if arm == "halving" else {}
    t0, c0 = time.perf_counter(), _cpu()
    fedcache.grid(store=store, dataset=data[0], backbones=data[1], methods=methods, sweep=sweep, seeds=seeds, out=out,
                  jobs=jobs, select=["lr"], on_plan=plans.append, **prune)
    return time.perf_counter() - t0, _cpu() - c0


def _cpu() -> float:
    use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in use)


def measure(name: str, store: Path, jobs: int, trials: int, eta: int, min_rounds: int | None, tiny: bool = False,
            keep: Path | None = None) -> dict:
    data, grid = (TINY_DATA, TINY) if tiny else (DATA, GRIDS[name])
    features(store, data)
    walls: dict[str, list[float]] = {a: [] for a in ARMS}
    cpus: dict[str, list[float]] = {a: [] for a in ARMS}
    plans: dict[str, list[str]] = {a: [] for a in ARMS}
    out: dict = {"grid": {"methods": grid[0], "sweep": grid[1], "seeds": grid[2]}, "trials": trials,
                 "load_average_at_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = keep / name if keep else Path(scratch)
        for t in range(trials):
            for arm in ARMS if t % 2 == 0 else ARMS[::-1]:
                said = plans[arm] if t == 0 else []
                wall, cpu = run_arm(arm, store, data, grid, Path(tmp) / f"{arm}-{t}", jobs, eta, min_rounds, said)
                walls[arm].append(round(wall, 1))
                cpus[arm].append(round(cpu, 1))
                log.info("%s grid, trial %d, %s: %.1f s, %.1f s of CPU", name, t, arm, wall, cpu)
        out.update(summarize(Path(tmp), walls, eta, min_rounds))
        out["cpu_seconds"] = cpus
        out["cpu_full_over_halving_per_trial"] = [round(f / h, 2) for f, h in zip(cpus["full"], cpus["halving"])]
    out["plans"] = plans
    return out


def summarize(tmp: Path, walls: dict[str, list[float]], eta: int, min_rounds: int | None) -> dict:
    """The ratios of the trials that both arms finished, and the choices of the first trial's grids."""
    n = min(len(walls["full"]), len(walls["halving"]))
    full, pruned = tmp / "full-0", tmp / "halving-0"
    return {"choices": compare(full, pruned), "replay_matches_pruned_grid": replay_choices(full, eta, min_rounds) == chosen(pruned),
            "validation_rounds": _rounds_caption(pruned), "wall_seconds": walls,
            "full_over_halving_per_trial": [round(f / h, 2) for f, h in zip(walls["full"][:n], walls["halving"][:n])],
            "full_over_halving": round(statistics.median(walls["full"][:n]) / statistics.median(walls["halving"][:n]), 2),
            "reduction_factor": eta, "min_rounds": min_rounds}


def from_dirs(keep: Path, eta: int, min_rounds: int | None) -> dict:
    """A run's kept grids (--keep DIR), measured from their files: an arm's time is from its first file written
    to its last (the test stage's table.md); an arm cut off before its end does not count. For a run stopped
    before its last trial: the trials both arms finished, and their choices, are kept."""
    grids = {}
    for d in sorted(p for p in keep.iterdir() if p.is_dir()):
        walls = {a: [] for a in ARMS}
        for t in range(len(list(d.iterdir()))):
            for arm in ARMS:
                end = d / f"{arm}-{t}" / "test" / "table.md"
                if end.exists():
                    start = min(f.stat().st_mtime for f in (d / f"{arm}-{t}").rglob("*") if f.is_file())
                    walls[arm].append(round(end.stat().st_mtime - start, 1))
        if walls["full"] and walls["halving"]:
            grid = json.loads((d / "full-0" / "grid.json").read_text())
            grids[d.name] = {"grid": {k: grid.get(k) for k in ("methods", "sweep", "seeds")}, "trials": len(walls["full"]),
                             "timed_from": "the files' modification times", **summarize(d, walls, eta, min_rounds),
                             "replays": frontier(d / "full-0", eta)}
    return grids


def frontier(full: Path, eta: int) -> list[dict]:
    """The replay with the first cut at the default round and at 1/5 ... 1/2 of the rounds: the share of
    validation rounds each trains against how often it chooses what the full grid chose."""
    rounds = int(json.loads((full / "grid.json").read_text())["sweep"]["rounds"][0])
    out = []
    for first in (None, *sorted({max(1, round(rounds * f)) for f in (0.2, 0.3, 0.4, 0.5)})):
        r = replay(full, eta, first)
        out.append({k: r[k] for k in ("min_rounds", "same", "of", "validation_rounds_share")}
                   | {"rungs": sorted({tuple(g["rungs"]) for g in r["groups"]}),
                      "most_below_full_in_stds": max(g["below_full_in_stds"] for g in r["groups"])})
    return out


def chosen(grid_dir: Path) -> dict[str, str]:
    """Group (method and its other settings) -> the chosen lr, from selection.json; of a full grid stopped before
    its choices, of its groups whose every cell finished, chosen as --select chooses (see ``_curves``)."""
    if not (grid_dir / "selection.json").exists():
        return {group: _best_at_end(by_lr) for group, by_lr in _curves(grid_dir).items()}
    doc = json.loads((grid_dir / "selection.json").read_text())
    return {_group(c): c["chosen"]["lr"] for c in doc["choices"]}


def _best_at_end(by_lr: dict) -> str:
    """--select's choice: the highest mean over seeds at the last round, among values no seed of which diverged."""
    last = max(max(s) for seeds in by_lr.values() for s in seeds)
    scored = {lr: _mean_at(seeds, last) for lr, seeds in by_lr.items()}
    return max((lr for lr in by_lr if scored[lr] is not None), key=lambda lr: scored[lr])


def _group(c: dict) -> str:
    skip = {"chosen", "validation_score", "candidates", "cuts", "full_rounds"}
    return " ".join(f"{k}={v}" for k, v in c.items() if k not in skip)


def compare(full: Path, pruned: Path) -> dict:
    """Per group: both choices; where they differ, the test accuracy of each (mean, sample std over seeds) and
    whether the pruned grid's is within the seeds' std of the full grid's."""
    a, b = chosen(full), chosen(pruned)
    tests = {arm: _test_accuracy(d) for arm, d in (("full", full), ("halving", pruned))}
    groups = []
    for g in a:
        row = {"group": g, "full": a[g], "halving": b[g], "same": a[g] == b[g]}
        if not row["same"]:
            (fm, fs), (hm, hs) = tests["full"][g], tests["halving"][g]
            row.update(full_test=[fm, fs], halving_test=[hm, hs], within_full_std=abs(hm - fm) <= fs)
        groups.append(row)
    same = sum(r["same"] for r in groups)
    return {"groups": groups, "same": same, "of": len(groups), "same_share": round(same / len(groups), 3),
            "differing_within_std": all(r.get("within_full_std", True) for r in groups)}


def _test_accuracy(grid_dir: Path) -> dict[str, tuple[float, float]]:
    """Group -> (mean, sample std over seeds) of the test accuracy of its chosen value."""
    doc = json.loads((grid_dir / "selection.json").read_text())
    with open(grid_dir / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    out = {}
    for c in doc["choices"]:
        fixed = {k: str(v) for k, v in c.items() if k not in {"chosen", "validation_score", "candidates", "cuts", "full_rounds"}}
        accs = [float(r["mean_accuracy"]) for r in rows if all(str(r.get(k)) == v for k, v in fixed.items())]
        out[_group(c)] = (round(statistics.mean(accs), 3), round(statistics.stdev(accs), 3) if len(accs) > 1 else 0.0)
    return out


def _rounds_caption(pruned: Path) -> str:
    text = (pruned / "table.md").read_text()
    start = text.find("candidates cut by successive halving")
    return text[start:text.find(";", text.find("trained", start))] if start >= 0 else ""


# ---- replay: halving on a full grid's validation curves ---------------------------------------------------
def replay_choices(full: Path, eta: int = 3, min_rounds: int | None = None) -> dict[str, str]:
    """What --prune halving chooses, from a finished full --select grid's validation curves (each candidate's
    score at a rung is its mean over seeds of the mean over clients at that round)."""
    return {group: r["choice"] for group, r in _replay(_curves(full), eta, min_rounds).items()}


def replay(full: Path, eta: int = 3, min_rounds: int | None = None) -> dict:
    """The replay against the full grid: per group both choices and, where they differ, how far below the full
    grid's choice the pruned one scores on validation at the last round, in the seeds' standard deviations of the
    full grid's choice; and the share of the full grid's validation rounds the pruned grid trains."""
    curves, best = _curves(full), chosen(full)
    played, groups = _replay(curves, eta, min_rounds), []
    for group, r in played.items():
        by_lr, last = curves[group], r["rounds"]
        own = [statistics.mean(s[last]["per_client"]) for s in by_lr[best[group]]]
        gap = (statistics.mean(own) - _mean_at(by_lr[r["choice"]], last)) / statistics.stdev(own)
        behind = [t for t in range(1, last + 1) if _lower(by_lr, best[group], r["choice"], t)]
        groups.append({"group": group, "full": best[group], "halving": r["choice"], "rungs": r["rungs"],
                       "below_full_in_stds": round(gap, 2), "full_choice_behind_until": max(behind, default=None)})
    share = sum(r["trained"] for r in played.values()) / sum(len(curves[g]) * r["rounds"] for g, r in played.items())
    return {"reduction_factor": eta, "min_rounds": min_rounds, "same": sum(g["full"] == g["halving"] for g in groups),
            "of": len(groups), "validation_rounds_share": round(share, 3), "groups": groups,
            "full_grid_without_one_seed": without_one_seed(curves)}


def _lower(by_lr: dict, a: str, b: str, r: int) -> bool:
    """Whether ``a`` scores below ``b`` on validation at round ``r`` (both evaluated there)."""
    sa, sb = _mean_at(by_lr[a], r), _mean_at(by_lr[b], r)
    return sa is not None and sb is not None and sa < sb


def without_one_seed(curves: dict) -> dict:
    """How often the full grid itself chooses the same value when one of its seeds is left out: the noise floor
    of "the same choice" (a pruned grid can hardly agree with the full grid more than the full grid agrees with
    itself on other seeds)."""
    groups = {}
    for group, by_lr in curves.items():
        n, last = len(next(iter(by_lr.values()))), max(max(s) for seeds in by_lr.values() for s in seeds)

        def choice(keep):
            scored = {lr: _mean_at([by_lr[lr][i] for i in keep], last) for lr in by_lr}
            return max((lr for lr in by_lr if scored[lr] is not None), key=lambda lr: scored[lr])
        full = choice(range(n))
        left_out = [choice([i for i in range(n) if i != out]) for out in range(n)] if n > 1 else []  # one seed: none
        groups[_short(group)] = {"all_seeds": full, "each_left_out": left_out}
    agree = [c == g["all_seeds"] for g in groups.values() for c in g["each_left_out"]]
    return {"groups_where_every_subset_agrees": sum(all(c == g["all_seeds"] for c in g["each_left_out"]) for g in groups.values()),
            "of": len(groups), "subsets_agreeing": round(sum(agree) / len(agree), 3) if agree else None, "groups": groups}


def _curves(full: Path) -> dict[str, dict[str, list[dict]]]:
    """Group -> lr -> each seed's metrics lines by round. Of a full grid stopped before its choices (no
    selection.json), only the groups whose every cell finished: a replay on a grid stopped part of the way."""
    curves: dict[str, dict[str, list[dict]]] = {}
    cells = sorted((full / "validation" / "cells").iterdir())
    if not (full / "selection.json").exists():
        cells = _finished_groups(full, cells)
    for cell in cells:
        meta = json.loads((cell / "cell.json").read_text())
        setting = {k: v for k, v in meta["setting"].items() if k != "validation"}
        lr = setting.pop("lr")
        group = " ".join([f"method={meta['method']}"] + [f"{k}={v}" for k, v in setting.items()])
        lines = {l["round"]: l for l in map(json.loads, (cell / "metrics.jsonl").read_text().splitlines())}
        curves.setdefault(group, {}).setdefault(lr, []).append(lines)
    return curves


def _replay(curves: dict, eta: int, min_rounds: int | None) -> dict[str, dict]:
    from fedcache.grids.rungs import rungs

    out = {}
    for group, by_lr in curves.items():
        rounds = max(max(s) for seeds in by_lr.values() for s in seeds)
        cuts = rungs(rounds, len(by_lr), eta, min_rounds)
        choice, trained = _play(by_lr, cuts, eta, rounds, RULES["halving"])
        out[group] = {"choice": choice, "rounds": rounds, "rungs": cuts, "trained": trained}
    return out


def _finished_groups(full: Path, cells: list[Path]) -> list[Path]:
    """The cells of the groups (method and every setting but lr and the seed) whose every cell of the grid's sweep
    finished (summary.json, or diverged.json)."""
    grid = json.loads((full / "grid.json").read_text())
    expected = len(grid["sweep"]["lr"]) * len(grid["seeds"])
    by_group: dict[str, list[Path]] = {}
    for cell in cells:
        meta = json.loads((cell / "cell.json").read_text())
        key = json.dumps([meta["method"], {k: v for k, v in meta["setting"].items() if k != "lr"}])
        by_group.setdefault(key, []).append(cell)
    return [c for group in by_group.values() if len(group) == expected and all(map(_finished, group)) for c in group]


def _finished(cell: Path) -> bool:
    return (cell / "summary.json").exists() or (cell / "diverged.json").exists()


# ---- search: which rules could have chosen as the full grid did, at what share of its rounds ----------------
def _seed_scores(seeds: list[dict], r: int) -> list[float] | None:
    if any(r not in s for s in seeds):
        return None
    return [statistics.mean(s[r]["per_client"]) for s in seeds]


def _last_rounds(k: int):
    """Rank by the mean score over the last ``k`` evaluated rounds up to the cut (smoother than one round's)."""
    def rank(by_lr: dict, alive: list[str], r: int) -> dict[str, float]:
        out = {}
        for lr in alive:
            scores = [m for t in range(max(1, r - k + 1), r + 1) if (m := _mean_at(by_lr[lr], t)) is not None]
            if scores:
                out[lr] = statistics.mean(scores)
        return out
    return rank


def _trend(weight: float, window: float = 0.5):
    """Rank by where a candidate's recent trend points at the full rounds: a line fitted to its mean score against
    log(round) over the last ``window`` of the rounds so far, its rise from the cut to the full rounds counted at
    ``weight`` (a falling curve keeps its fitted score). A late bloomer is one still rising at a cut where a faster
    candidate has levelled off; the weight below one hedges against a line through a few noisy rounds."""
    import numpy as np

    def rank(by_lr: dict, alive: list[str], r: int) -> dict[str, float]:
        full = max(max(s) for seeds in by_lr.values() for s in seeds)
        out = {}
        for lr in alive:
            pts = [(t, m) for t in range(max(1, int(r * (1 - window))), r + 1) if (m := _mean_at(by_lr[lr], t)) is not None]
            if len(pts) < 3:  # too few rounds for a line: its score at the cut
                if pts:
                    out[lr] = pts[-1][1]
                continue
            slope, at0 = np.polyfit(np.log([t for t, _ in pts]), [m for _, m in pts], 1)
            out[lr] = float(at0 + slope * math.log(r) + weight * max(slope, 0.0) * math.log(full / r))
        return out
    return rank


def _within(z: float):
    """Keep, beyond the best ceil(n/eta), any candidate within ``z`` standard errors (over seeds) of the last of
    them: a near tie at a cut is not decided by one seed's noise."""
    def keep(by_lr: dict, ranked: list[str], n_keep: int, r: int) -> set[str]:
        sc = {lr: _seed_scores(by_lr[lr], r) for lr in ranked}
        se = {lr: statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0 for lr, v in sc.items()}
        mean, last = {lr: statistics.mean(v) for lr, v in sc.items()}, ranked[n_keep - 1]
        return set(ranked[:n_keep]) | {lr for lr in ranked if mean[lr] >= mean[last] - z * math.hypot(se[lr], se[last])}
    return keep


def _top(by_lr: dict, ranked: list[str], n_keep: int, r: int) -> set[str]:
    return set(ranked[:n_keep])


RULES = {"halving": (_last_rounds(1), _top), **{f"mean of last {k} rounds": (_last_rounds(k), _top) for k in (3, 5)},
         **{f"keep within {z} SE": (_last_rounds(1), _within(z)) for z in (1, 2)},
         **{f"trend to the full rounds x{w}": (_trend(w), _top) for w in (0.25, 0.5, 1.0)}}


def _play(by_lr: dict, cuts: list[int], eta: int, rounds: int, rule) -> tuple[str, int]:
    """The choice and the candidate rounds trained of one group under ``rule`` (rank, keep)."""
    rank, keep = rule
    alive, trained, done = list(by_lr), 0, 0
    for r in cuts + [rounds]:
        trained, done = trained + len(alive) * (r - done), r
        score = rank(by_lr, alive, r) if r < rounds else _last_rounds(1)(by_lr, alive, r)
        ranked = sorted(score, key=lambda lr: -score[lr])
        kept = set(ranked[:1]) if r == rounds else keep(by_lr, ranked, math.ceil(len(alive) / eta), r)
        alive = [lr for lr in alive if lr in kept]
        if len(alive) <= 1:
            break
    return alive[0], trained


def search(full: Path, etas=(2, 3, 4, 6), shares=(0.15, 0.2, 0.3)) -> dict:
    """Every rule of RULES at every reduction factor and first cut, replayed on a finished full --select grid: per
    rule, the frontier of (share of the full grid's validation rounds, groups choosing as the full grid did), and
    the most groups any setting reaches within each share."""
    from fedcache.grids.rungs import rungs

    curves, best = _curves(full), chosen(full)
    rounds = {g: max(max(s) for seeds in by_lr.values() for s in seeds) for g, by_lr in curves.items()}
    total = sum(len(by_lr) * rounds[g] for g, by_lr in curves.items())
    out = {}
    for name, rule in RULES.items():
        points = []
        for eta in etas:
            for first in range(1, max(rounds.values()) // 2 + 1):
                played = {g: _play(by_lr, rungs(rounds[g], len(by_lr), eta, first), eta, rounds[g], rule) for g, by_lr in curves.items()}
                points.append({"share": round(sum(t for _, t in played.values()) / total, 3),
                               "same": sum(c == best[g] for g, (c, _) in played.items()), "reduction_factor": eta, "first_cut": first})
        default = {g: _play(by_lr, rungs(rounds[g], len(by_lr), 3), 3, rounds[g], rule) for g, by_lr in curves.items()}
        out[name] = {"frontier": _frontier(points), "most_same_within": {
            str(s): max((p["same"] for p in points if p["share"] <= s), default=0) for s in shares},
            "default_cuts": {"same": sum(c == best[g] for g, (c, _) in default.items()),  # reduction factor 3
                             "share": round(sum(t for _, t in default.values()) / total, 3)}}
    return {"groups": len(curves), "rules": out}


def _frontier(points: list[dict]) -> list[dict]:
    """The points no other beats: each one chooses as the full grid did in more groups than any cheaper point."""
    front, most = [], -1
    for p in sorted(points, key=lambda p: (p["share"], -p["same"])):
        if p["same"] > most:
            front.append(p)
            most = p["same"]
    return front


def _mean_at(seeds: list[dict], r: int) -> float | None:
    scores = _seed_scores(seeds, r)  # None: not evaluated there (or diverged before)
    return None if scores is None else statistics.mean(scores)


# ---- the docs section ---------------------------------------------------------------------------------
def _short(group: str) -> str:
    """A group by what varies between the benchmark's groups: the method and alpha."""
    return " ".join(t.split("=", 1)[1] if t.startswith("method=") else t for t in group.split() if t.split("=")[0] in ("method", "alpha"))


def _cpu_model() -> str:
    try:
        return next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or platform.machine()


def render_search(doc: dict) -> str:
    """The search's table: per rule, the most groups choosing as the full grid did within each share of its
    validation rounds, and the cheapest setting choosing as it did in every group."""
    shares = list(next(iter(doc["search"]["rules"].values()))["most_same_within"])
    n = doc["search"]["groups"]
    lines = ["| rule | " + " | ".join(f"within {100 * float(s):.0f}% of the rounds" for s in shares)
             + f" | fewest rounds for {n} of {n} (reduction factor, first cut) |", "|---" * (len(shares) + 2) + "|"]
    for name, r in doc["search"]["rules"].items():
        every = next((p for p in r["frontier"] if p["same"] == n), None)
        cheapest = f"{100 * every['share']:.0f}% ({every['reduction_factor']}, {every['first_cut']})" if every else "none"
        lines.append(f"| {name} | " + " | ".join(f"{r['most_same_within'][s]} of {n}" for s in shares) + f" | {cheapest} |")
    return "\n".join(lines)


def render(res: dict) -> str:
    lines = ["| grid | cells (validation) | full / halving wall time (per trial) | same choice | where different: test accuracy, full vs halving |",
             "|---|---|---|---|---|"]
    for name, r in res["grids"].items():
        g = r["grid"]
        n = len(g["methods"]) * math.prod(len(v) for v in g["sweep"].values()) * len(g["seeds"])
        diff = "; ".join(f"{_short(d['group'])}: lr {d['full']} {d['full_test'][0]:.2f} ± {d['full_test'][1]:.2f} vs lr {d['halving']} "
                         f"{d['halving_test'][0]:.2f} ± {d['halving_test'][1]:.2f}" for d in r["choices"]["groups"] if not d["same"]) or "-"
        per = ", ".join(f"{x:.2f}" for x in r["full_over_halving_per_trial"])
        lines.append(f"| {name} | {n} | **{r['full_over_halving']:.2f}x** ({per}) | {r['choices']['same']} of "
                     f"{r['choices']['of']} groups | {diff} |")
    for name, r in res["grids"].items():
        if r.get("replays"):
            lines += ["", f"The {name} grid replayed (first cut; validation rounds trained; same choice as the full grid; the "
                      "furthest a different choice scores below the full grid's, in its seeds' standard deviations):", "",
                      "| first cut | cuts | validation rounds | same choice | furthest below |", "|---|---|---|---|---|"]
            lines += [f"| {p['min_rounds'] or 'default'} | {', '.join(map(str, p['rungs'][0]))} | {100 * p['validation_rounds_share']:.0f}% "
                      f"| {p['same']} of {p['of']} | {p['most_below_full_in_stds']:.2f} |" for p in r["replays"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=Path("/tmp/grid-speed-store.zarr"))
    ap.add_argument("--grid", choices=["worked", "wide", "both"], default="both")
    ap.add_argument("--trials", type=int, default=2, help="interleaved trials of each arm")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--reduction-factor", type=int, default=3)
    ap.add_argument("--min-rounds", type=int, default=None)
    ap.add_argument("--replay", type=Path, default=None, help="a finished full --select grid: replay halving on it")
    ap.add_argument("--search", action="store_true", help="with --replay: every rule at every reduction factor and first "
                    "cut, their frontiers of rounds trained against choices kept (results/halving_search.json)")
    ap.add_argument("--tiny", action="store_true", help="a 6-cell grid of 4 rounds on test-toy: checks the script, measures nothing")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--render-search", action="store_true", help="the table of results/halving_search.json")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the grids under this directory (for --replay, --from-dirs)")
    ap.add_argument("--from-dirs", type=Path, default=None,
                    help="a run's --keep directory: its results from the grids there (also of a run stopped early)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = a.out or RESULT
    if a.render:
        print(render(json.loads(out.read_text())))
        return
    if a.render_search:
        print(render_search(json.loads((a.out or SEARCH).read_text())))
        return
    if a.from_dirs:
        write({"grids": from_dirs(a.from_dirs, a.reduction_factor, a.min_rounds),
               "command": "benchmarks/halving.py " + " ".join(argv if argv is not None else sys.argv[1:])}, out)
        return
    if a.replay and a.search:
        played = replay(a.replay, a.reduction_factor, a.min_rounds)
        alone = played["full_grid_without_one_seed"]
        write({"search": search(a.replay), "grid": json.loads((a.replay / "grid.json").read_text()),
               "default_replay": {k: played[k] for k in ("same", "of", "validation_rounds_share")},
               "full_grid_without_one_seed": alone,  # with each group's choice of all seeds and without each
               "cpu": _cpu_model(),  # another CPU rounds otherwise, and over 50 rounds some choices move
               "command": "benchmarks/halving.py " + " ".join(argv if argv is not None else sys.argv[1:])}, a.out or SEARCH)
        return
    if a.replay:
        print(json.dumps(replay(a.replay, a.reduction_factor, a.min_rounds), indent=1))
        return
    names = ["tiny"] if a.tiny else ["worked", "wide"] if a.grid == "both" else [a.grid]
    res = {"grids": {n: measure(n, a.store, a.jobs, a.trials, a.reduction_factor, a.min_rounds, a.tiny, a.keep) for n in names},
           "command": "benchmarks/halving.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    write(res, out)


if __name__ == "__main__":
    main()
