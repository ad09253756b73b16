"""A 100-cell grid of FedAvg-style runs on digits5-offline (efficientnet-lite0 features), timed end to end on both grid engines.

fedavg and fedprox x lr {0.003, 0.01, 0.03, 0.1, 0.3} x Dirichlet alpha {0.1, 1} x seeds 0-4, 10 clients
holding all of digits5-offline's training rows, 20 rounds each, evaluation every round; run by the process
engine (each cell its own run, --jobs worker processes of one torch thread) and by the batched engine (cells
stacked into one computation per method), one after the other in this process. The time is the whole
`fedcache.grid` call: writing the shared features, making the 10 partitions, the runs and every cell's files
(the store's extraction is not timed; it is built first if missing, reused otherwise).

    .venv/bin/python benchmarks/grid_speed.py [--store PATH] [--jobs 2] [--out benchmarks/results/grid_speed.json]
    .venv/bin/python benchmarks/grid_speed.py --large    # also the 1,000-cell grid (10 lrs x 25 seeds), batched engine only
    .venv/bin/python benchmarks/grid_speed.py --render   # the markdown section of docs/performance.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

RESULT = Path(__file__).resolve().parent / "results" / "grid_speed.json"
SWEEP = {"lr": ["0.003", "0.01", "0.03", "0.1", "0.3"], "alpha": ["0.1", "1"], "partition": ["dirichlet"],
         "clients": ["10"], "rounds": ["20"]}
LARGE = {**SWEEP, "lr": ["0.002", "0.003", "0.005", "0.01", "0.02", "0.03", "0.05", "0.1", "0.2", "0.3"]}
TINY = {"lr": ["0.01", "0.1"], "alpha": ["0.1", "1"], "partition": ["dirichlet"], "clients": ["3"], "rounds": ["2"]}
TINY_DATA = ("test-toy", "tiny-timm-random")  # extracted in seconds: the smoke test checks the script, not speed
METHODS, SEEDS, DATASET, BACKBONE = ["fedavg", "fedprox"], [0, 1, 2, 3, 4], "digits5-offline", "efficientnet-lite0"
ENGINES = ("processes", "batched")


def timed_grid(store: Path, data: tuple[str, str], out: Path, engine: str, jobs: int, sweep: dict, seeds: list[int]
               ) -> tuple[float, object, list[str]]:
    import fedcache

    plans: list[str] = []
    t0 = time.perf_counter()
    table = fedcache.grid(store=store, dataset=data[0], backbones=data[1], methods=METHODS, sweep=sweep, seeds=seeds,
                          out=out, jobs=jobs, engine=engine, on_plan=plans.append)
    return time.perf_counter() - t0, table, plans


def measure(store: Path, jobs: int, tiny: bool = False, large: bool = False) -> dict:
    import fedcache

    data, sweep, seeds = (TINY_DATA, TINY, [0]) if tiny else ((DATASET, BACKBONE), SWEEP, SEEDS)
    fedcache.extract_features(data[0], [data[1]], store=store)  # cached after the first time
    out: dict = {"load_average_at_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        tables = {}
        for engine in ENGINES:
            wall, table, plans = timed_grid(store, data, Path(tmp) / engine, engine, jobs, sweep, seeds)
            tables[engine] = (Path(tmp) / engine / "table.md").read_text()
            out[engine] = {"cells": len(table), "wall_seconds": round(wall, 1),
                           "cells_per_minute": round(60 * len(table) / wall, 1), "plan": plans,
                           "load_average_after": os.getloadavg()}
        out["same_table_md"] = tables["processes"] == tables["batched"]
        out["batched_over_processes_cells_per_minute"] = round(out["batched"]["cells_per_minute"] / out["processes"]["cells_per_minute"], 2)
        # The batched engine trains in this process; its peak resident memory bounds the stacks'.
        out["peak_rss_mb_of_this_process"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        if large:
            wall, table, plans = timed_grid(store, data, Path(tmp) / "large", "batched", jobs, LARGE, list(range(25)))
            out["large_batched"] = {"cells": len(table), "wall_seconds": round(wall, 1), "plan": plans,
                                    "cells_per_minute": round(60 * len(table) / wall, 1),
                                    "peak_rss_mb_of_this_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                                    "load_average_after": os.getloadavg()}
    return out


def render(path: Path = RESULT) -> str:
    """The section of docs/performance.md, from the JSON (a test keeps the page equal to it)."""
    d = json.loads(path.read_text())
    r = d["result"]
    p, b = r["processes"], r["batched"]
    load = ", ".join(f"{x:.1f}" for x in r["load_average_at_start"])
    lines = [
        "## A 100-cell grid: batched engine vs process engine",
        "`.venv/bin/python benchmarks/grid_speed.py" + (" --large" if "large_batched" in r else "") + "`: " + d["what"]
        + f" (`benchmarks/results/grid_speed.json`, {d['measured_at']}, {d['machine']}; load average {load} at the start).", "",
        "| engine | cells per minute | relative |", "|---|---|---|",
        f"| processes (`--engine processes --jobs {d['jobs']}`) | {p['cells_per_minute']} | 1 |",
        f"| batched (`--engine batched`) | {b['cells_per_minute']} | {r['batched_over_processes_cells_per_minute']}x |", "",
        f"The two engines' table.md were {'identical' if r['same_table_md'] else 'NOT identical'}. The batched engine "
        f"grouped the cells as: {' '.join(b['plan'])}. Peak resident memory of the benchmark process (where the "
        f"batched engine trains): {r['peak_rss_mb_of_this_process']} MB.",
    ]
    if "large_batched" in r:
        L = r["large_batched"]
        lines += ["", f"The 1,000-cell grid (lr x 10, seeds 0-24, batched engine only): {L['cells_per_minute']} cells per "
                  f"minute, peak resident memory {L['peak_rss_mb_of_this_process']} MB ({' '.join(L['plan'])})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=Path("/tmp/grid-speed-store.zarr"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--tiny", action="store_true", help="8 cells of 2 rounds on test-toy: checks the script runs, measures nothing")
    ap.add_argument("--large", action="store_true", help="also the 1,000-cell grid with the batched engine")
    ap.add_argument("--render", action="store_true")
    args = ap.parse_args(argv)
    if args.render:
        print(render(args.out))
        return
    import torch

    result = measure(args.store, args.jobs, args.tiny, args.large)
    doc = {"what": __doc__.strip().split("\n\n")[1].replace("\n", " "), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, torch {torch.__version__}, {torch.get_num_threads()} torch threads",
           "jobs": args.jobs, "tiny": args.tiny, "result": result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
