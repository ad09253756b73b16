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
    d = json.loads(path.read_text())
    r = d["result"]
    return "\n".join([
        "## A 100-cell grid", "",
        "`.venv/bin/python benchmarks/grid_speed.py`: " + d["what"], "",
        f"Measured {d['measured_at']} ({d['machine']}, {r['jobs']} worker processes, one torch thread each; "
        f"1-minute load average {r['load_average_at_start']:.1f} at the start):", "",
        "| cells | wall time | cells per minute | sum of the runs' own times | re-run (all cells finished) |",
        "|---|---|---|---|---|",
        f"| {r['cells']} | {r['wall_seconds']:.0f} s | {r['cells_per_minute']:.1f} | {r['sum_of_run_seconds']:.0f} s | {r['rerun_seconds']:.1f} s |",
        "",
        "Each worker memory-maps one float32 copy of the fused features that the grid writes once "
        "(`features/` in the grid directory), so workers share its pages instead of each reading the Zarr "
        "store and holding a private copy. Best cell: " + ", ".join(
            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r["best_cell"].items()) + ".",
        "",
        f"The {r['jobs']} workers kept {r['sum_of_run_seconds'] / r['wall_seconds']:.1f} of the 2 cores busy with runs "
        "(sum of the runs' own times / wall time); the rest is spawning workers, writing the shared features, "
        "making the partitions and each cell's checkpoints and results. An earlier measurement with other jobs "
        "loading the machine (load average 5.8) took 843 s: on shared cores, expect several times longer.",
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
