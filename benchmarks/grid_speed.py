"""A 100-cell grid of FedAvg-style runs on digits5-offline (efficientnet-lite0 features), timed end to end.

fedavg and fedprox x lr {0.003, 0.01, 0.03, 0.1, 0.3} x Dirichlet alpha {0.1, 1} x seeds 0-4, 10 clients
holding all of digits5-offline's training rows, 20 rounds each, evaluation every round. The time is the
whole `fedcache.grid` call: writing the shared features, making the 10 partitions, spawning the workers
and all 100 runs (the store's extraction is not timed; it is built first if missing, reused otherwise).

    .venv/bin/python benchmarks/grid_speed.py [--store PATH] [--jobs 2] [--out benchmarks/results/grid_speed.json]
    .venv/bin/python benchmarks/grid_speed.py --render    # the markdown section of docs/performance.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

RESULT = Path(__file__).resolve().parent / "results" / "grid_speed.json"
SWEEP = {"lr": ["0.003", "0.01", "0.03", "0.1", "0.3"], "alpha": ["0.1", "1"], "partition": ["dirichlet"],
         "clients": ["10"], "rounds": ["20"]}
METHODS, SEEDS, DATASET, BACKBONE = ["fedavg", "fedprox"], [0, 1, 2, 3, 4], "digits5-offline", "efficientnet-lite0"


def measure(store: Path, jobs: int) -> dict:
    import fedcache

    fedcache.extract_features(DATASET, [BACKBONE], store=store)  # cached after the first time
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        table = fedcache.grid(store=store, dataset=DATASET, backbones=BACKBONE, methods=METHODS, sweep=SWEEP,
                              seeds=SEEDS, out=Path(tmp) / "grid", jobs=jobs)
        wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        fedcache.grid(store=store, dataset=DATASET, backbones=BACKBONE, methods=METHODS, sweep=SWEEP,
                      seeds=SEEDS, out=Path(tmp) / "grid", jobs=jobs)
        rerun = time.perf_counter() - t0
    run_seconds = sum(table.column("seconds"))
    best = max(table.to_records(), key=lambda r: r["mean_accuracy"])
    return {"cells": len(table), "jobs": jobs, "wall_seconds": round(wall, 1), "rerun_seconds": round(rerun, 1),
            "sum_of_run_seconds": round(run_seconds, 1), "cells_per_minute": round(60 * len(table) / wall, 1),
            "best_cell": {k: best[k] for k in ("method", "lr", "alpha", "seed", "mean_accuracy")},
            "load_average_at_start": os.getloadavg()[0]}


def render(path: Path = RESULT) -> str:
    """The section of docs/performance.md, from the JSON (a test keeps the page equal to it)."""
    d = json.loads(path.read_text())
    r = d["result"]
    busy = r["sum_of_run_seconds"] / r["wall_seconds"]
    return "\n".join([
        "## A 100-cell grid",
        "`.venv/bin/python benchmarks/grid_speed.py`: " + d["what"] + f" ({r['jobs']} worker processes of one torch "
        f"thread; `benchmarks/results/grid_speed.json`, {d['measured_at']}).", "",
        f"The sum of the runs' own times over the grid's wall time was {busy:.2f} of the {r['jobs']} cores: the rest "
        "is spawning workers, writing the shared features once (workers memory-map one float32 copy instead of "
        "each reading the store), making the partitions and each cell's checkpoints. A re-run with every cell "
        f"finished takes {100 * r['rerun_seconds'] / r['wall_seconds']:.1f}% of the first run's time.",
    ]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=Path("/tmp/grid-speed-store.zarr"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--render", action="store_true")
    args = ap.parse_args()
    if args.render:
        print(render(args.out))
        return
    import torch

    result = measure(args.store, args.jobs)
    doc = {"what": __doc__.strip().split("\n\n")[1].replace("\n", " "), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, torch {torch.__version__}", "result": result}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
