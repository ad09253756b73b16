"""A 100-cell grid of FedAvg-style runs on digits5-offline (efficientnet-lite0 features), timed end to end on both grid engines.

fedavg and fedprox x lr {0.003, 0.01, 0.03, 0.1, 0.3} x Dirichlet alpha {0.1, 1} x seeds 0-4, 10 clients
holding all of digits5-offline's training rows, 20 rounds each, evaluation every round; run by the process
engine (each cell its own run, --jobs worker processes of one torch thread) and by the batched engine (cells
stacked into one computation per method), alternating in this process (--trials of each). The time is the whole
`fedcache.grid` call: writing the shared features, making the 10 partitions, the runs and every cell's files
(the store's extraction is not timed; it is built first if missing, reused otherwise).

    .venv/bin/python benchmarks/grid_speed.py [--store PATH] [--jobs 2] [--trials 2] [--out benchmarks/results/grid_speed.json]
    .venv/bin/python benchmarks/grid_speed.py --large    # the 1,000-cell grid (10 lrs x 25 seeds), batched engine only
    .venv/bin/python benchmarks/grid_speed.py --worked   # the worked example's grid (5 rounds): small stacks, cells alone
    .venv/bin/python benchmarks/grid_speed.py --device cuda --stacking   # a GPU grid's stacks: across draws vs by them
    .venv/bin/python benchmarks/grid_speed.py --heads [--data DATASET,BACKBONE]   # on a CPU: cells stacked vs alone, per head
    .venv/bin/python benchmarks/grid_speed.py --render   # the markdown section of docs/performance.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import features, stored  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "grid_speed.json"
LARGE_RESULT = RESULT.with_name("grid_speed_large.json")
WORKED_RESULT = RESULT.with_name("grid_speed_worked.json")
STACKING_RESULT = RESULT.with_name("grid_speed_gpu_stacking.json")
HEADS_RESULT = RESULT.with_name("grid_speed_heads.json")
SWEEP = {"lr": ["0.003", "0.01", "0.03", "0.1", "0.3"], "alpha": ["0.1", "1"], "partition": ["dirichlet"],
         "clients": ["10"], "rounds": ["20"]}
LARGE = {**SWEEP, "lr": ["0.002", "0.003", "0.005", "0.01", "0.02", "0.03", "0.05", "0.1", "0.2", "0.3"]}
TINY = {"lr": ["0.01", "0.1"], "alpha": ["0.1", "1"], "partition": ["dirichlet"], "clients": ["3"], "rounds": ["2"]}
# The worked example's grid (docs/getting-started.md; lr chosen on validation, then tested), 5 rounds instead of 20.
WORKED = {"partition": ["dirichlet"], "alpha": ["0.1", "1"], "clients": ["10"], "subsample": ["0.8"], "rounds": ["5"],
          "lr": ["1e-3", "1e-2"]}
WORKED_METHODS = ["fedavg", "fedprox", "fedproto"]
TINY_DATA = ("test-toy", "tiny-timm-random")  # extracted in seconds: the smoke test checks the script, not speed
METHODS, SEEDS, DATASET, BACKBONE = ["fedavg", "fedprox"], [0, 1, 2, 3, 4], "digits5-offline", "efficientnet-lite0"
ENGINES = ("processes", "batched")
DEVICE = "cpu"  # --device: where the cells' rounds run (on a GPU both engines run in one process, jobs aside)


def timed_grid(store: Path, data: tuple[str, str], out: Path, engine: str, jobs: int, sweep: dict, seeds: list[int],
               methods: list[str] = METHODS, select: list[str] | None = None) -> tuple[float, object, list[str]]:
    import fedcache

    plans: list[str] = []
    t0 = time.perf_counter()
    table = fedcache.grid(store=store, dataset=data[0], backbones=data[1], methods=methods, sweep=sweep, seeds=seeds,
                          out=out, jobs=jobs, engine=engine, on_plan=plans.append, select=select, device=DEVICE)
    return time.perf_counter() - t0, table, plans


def measure_worked(store: Path, jobs: int, tiny: bool = False, trials: int = 2) -> dict:
    """docs/getting-started.md's worked grid at 5 rounds, both engines interleaved as for the 100-cell grid: for
    fedavg and fedprox the validation stage stacks the two lrs of each partition and seed, the test stage (one lr
    each) stacks cells of different partitions and seeds; fedproto's cells (a 331,530-parameter head) train alone
    on a CPU; each method's cells spread over the two workers."""
    data, sweep, seeds = (TINY_DATA, {**WORKED, "clients": ["3"], "rounds": ["1"]}, [0, 1]) if tiny else ((DATASET, BACKBONE), WORKED, [0, 1, 2])
    features(store, data)
    out: dict = {"load_average_at_start": os.getloadavg(), "trials": trials}
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    tables: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for t in range(trials):
            for engine in ENGINES if t % 2 == 0 else ENGINES[::-1]:
                where = Path(tmp) / f"{engine}-{t}"
                wall, table, plans = timed_grid(store, data, where, engine, jobs, sweep, seeds, WORKED_METHODS, ["lr"])
                tables.add((where / "table.md").read_text())
                runs[engine].append({"wall_seconds": round(wall, 1), "plan": plans, "load_average_after": os.getloadavg()})
    for engine, rs in runs.items():
        out[engine] = {"wall_seconds": round(statistics.median(r["wall_seconds"] for r in rs), 1), "trials": rs}
    out["same_table_md"] = len(tables) == 1
    out["batched_over_processes_per_trial"] = [round(p["wall_seconds"] / b["wall_seconds"], 2)
                                               for p, b in zip(runs["processes"], runs["batched"])]
    return out


def floor_seconds(n_train: int, n_test: int, dim: int, classes: int, clients: int, rounds: int, batch: int = 32) -> float:
    """One cell's arithmetic floor on one torch thread, the fastest of three: its clients' local steps (each
    client's share of the training rows in mini-batches; per step the forward product, the weight gradient and
    Adam's update of the weights, a round's clients stacked as the round loop stacks them) and per round one
    forward pass over the test rows. What a cell adds to it (the bias, the loss, autograd, padding of
    unequal clients, sampling, aggregation, files) is what an engine can save; the floor it cannot, as long
    as it computes the same products."""
    import torch

    from fedcache.federate.optim import OptimConfig, StackedOptimizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        rows = n_train // clients
        sizes = [batch] * (rows // batch) + ([rows % batch] if rows % batch else [])
        xs = [torch.randn(clients, b, dim, generator=gen) for b in sizes]
        gs = [torch.randn(clients, b, classes, generator=gen) for b in sizes]
        test = torch.randn(1, n_test, dim, generator=gen)
        best = float("inf")
        for _ in range(3):
            params = {"w": torch.randn(clients, dim, classes, generator=gen) / dim**0.5}
            opt, active = StackedOptimizer(params, OptimConfig(), ("w",)), torch.ones(clients, dtype=torch.bool)
            t0 = time.perf_counter()
            for _ in range(rounds):
                for x, g in zip(xs, gs):
                    torch.bmm(x, params["w"])
                    opt.step(params, {"w": torch.bmm(x.transpose(1, 2), g)}, active)
                torch.bmm(test, params["w"][:1])
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        torch.set_num_threads(threads)


def floor_cells_per_minute(store: Path, data: tuple[str, str], sweep: dict, jobs: int) -> float:
    """The floor's cells per minute with ``jobs`` cells at a time, each on a core of its own (perfect scaling):
    what no engine computing the cells' products can beat here."""
    from fedcache.federate.tables import load_fused
    from fedcache.store.feature_store import FeatureStore

    fs = FeatureStore(store, create=False)
    train, test = (load_fused(fs, data[0], [data[1]], split) for split in ("train", "test"))
    seconds = floor_seconds(len(train.labels), len(test.labels), train.features.shape[1], len(train.class_names),
                            int(sweep["clients"][0]), int(sweep["rounds"][0]))
    return round(60 * jobs / seconds, 1)


def stack_steps(store: Path, data: tuple[str, str], sweep: dict, seeds: list[int], batch: int = 32) -> dict:
    """Why the batched engine stacks cells of one partition and seed together first, in mini-batch steps per epoch:
    a run's clients step as long as its largest client, a stack's as long as the largest client of any of its
    cells. Per method, the grid's cells stacked by partition and seed vs all in one stack (every partition)."""
    import math

    from fedcache.federate.tables import load_fused
    from fedcache.federate.partitions.core import PartitionRequest, make_partition
    from fedcache.store.feature_store import FeatureStore

    fs = FeatureStore(store, create=False)
    train, test = (load_fused(fs, data[0], [data[1]], split) for split in ("train", "test"))
    steps = [math.ceil(max(len(c) for c in make_partition(
        PartitionRequest.of(sweep["partition"][0], int(sweep["clients"][0]), seed, alpha=float(alpha)),
        train.labels, train.domains, test.labels, test.domains).train) / batch)
        for alpha in sweep["alpha"] for seed in seeds]
    one_stack = max(steps) * len(steps)
    return {"per_partition": steps, "by_partition": sum(steps), "one_stack": one_stack,
            "one_stack_over_by_partition": round(one_stack / sum(steps), 2)}


def measure(store: Path, jobs: int, tiny: bool = False, trials: int = 2) -> dict:
    """Both engines, alternating (trial t runs processes first when t is even, batched first when odd), each
    trial into fresh directories; per engine the median of its trials' cells per minute."""
    data, sweep, seeds = (TINY_DATA, TINY, [0]) if tiny else ((DATASET, BACKBONE), SWEEP, SEEDS)
    features(store, data)
    out: dict = {"load_average_at_start": os.getloadavg(), "trials": trials}
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    floors: list[float] = []  # per trial, after its two grids
    accuracies: dict[str, dict[str, float]] = {}  # per grid, cell -> its mean accuracy
    tables: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for t in range(trials):
            for engine in ENGINES if t % 2 == 0 else ENGINES[::-1]:
                where = Path(tmp) / f"{engine}-{t}"
                wall, table, plans = timed_grid(store, data, where, engine, jobs, sweep, seeds)
                tables[f"{engine}-{t}"] = (where / "table.md").read_text()
                accuracies[f"{engine}-{t}"] = _accuracies(where / "results.csv")
                runs[engine].append({"cells": len(table), "wall_seconds": round(wall, 1), "plan": plans,
                                     "cells_per_minute": round(60 * len(table) / wall, 1), "load_average_after": os.getloadavg()})
            if DEVICE == "cpu":  # the floor is the CPU's arithmetic
                floors.append(floor_cells_per_minute(store, data, sweep, jobs))
    for engine, rs in runs.items():
        out[engine] = {"cells": rs[0]["cells"], "plan": rs[0]["plan"],
                       "cells_per_minute": round(statistics.median(r["cells_per_minute"] for r in rs), 1), "trials": rs}
    out["same_table_md"] = len(set(tables.values())) == 1  # every trial of both engines
    out["cells_differing"] = _differing(accuracies["processes-0"], accuracies["batched-0"])
    if not out["same_table_md"]:  # say where, so a difference can be looked into
        first, *rest = tables
        out["table_md_differences"] = {k: _diff(tables[first], tables[k], first, k) for k in rest if tables[k] != tables[first]}
    out["batched_over_processes_per_trial"] = [round(b["cells_per_minute"] / p["cells_per_minute"], 2)
                                               for p, b in zip(runs["processes"], runs["batched"])]
    out["stack_steps"] = stack_steps(store, data, sweep, seeds)
    if floors:
        out["floor"] = {"cells_per_minute": round(statistics.median(floors), 1), "trials": floors,
                        "what": " ".join(floor_seconds.__doc__.split())}
        out["floor_over_processes_per_trial"] = [round(f / p["cells_per_minute"], 2) for f, p in zip(floors, runs["processes"])]
    out["batched_over_processes_cells_per_minute"] = round(out["batched"]["cells_per_minute"] / out["processes"]["cells_per_minute"], 2)
    # Worker processes: the process engine's runs, and the batched engine's batches when --jobs > 1 and several.
    out["peak_rss_mb_of_this_process"] = _peak_mb(resource.RUSAGE_SELF)
    out["peak_rss_mb_of_a_worker_process"] = _peak_mb(resource.RUSAGE_CHILDREN)
    return out


def measure_large(store: Path, jobs: int) -> dict:
    """The 1,000-cell grid (lr x 10, seeds 0-24), batched engine only."""
    out: dict = {"load_average_at_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        wall, table, plans = timed_grid(store, (DATASET, BACKBONE), Path(tmp) / "large", "batched", jobs, LARGE, list(range(25)))
    return {**out, "cells": len(table), "wall_seconds": round(wall, 1), "plan": plans,
            "cells_per_minute": round(60 * len(table) / wall, 1), "peak_rss_mb_of_this_process": _peak_mb(resource.RUSAGE_SELF),
            "peak_rss_mb_of_a_worker_process": _peak_mb(resource.RUSAGE_CHILDREN), "load_average_after": os.getloadavg()}


def measure_stacking(store: Path, trials: int, tiny: bool = False) -> dict:
    """The batched engine on a GPU, stacks across partitions and seeds (what a GPU grid does) vs stacks of one
    partition and seed (what a CPU grid does), alternating in this process; every cell compared."""
    from fedcache.grids import batches

    data, sweep, seeds = (TINY_DATA, TINY, [0, 1]) if tiny else ((DATASET, BACKBONE), SWEEP, SEEDS)
    features(store, data)
    runs: dict[str, list[dict]] = {"across": [], "by_draws": []}
    accuracies = {}
    default = batches.ACROSS_DRAWS_ON_GPU
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for t in range(trials):
                for kind in ("across", "by_draws") if t % 2 == 0 else ("by_draws", "across"):
                    batches.ACROSS_DRAWS_ON_GPU = kind == "across"
                    where = Path(tmp) / f"{kind}-{t}"
                    wall, _, plans = timed_grid(store, data, where, "batched", 1, sweep, seeds)
                    accuracies.setdefault(kind, _accuracies(where / "results.csv"))
                    runs[kind].append({"wall_seconds": round(wall, 1), "plan": plans})
    finally:
        batches.ACROSS_DRAWS_ON_GPU = default
    return {"runs": runs, "by_draws_over_across_per_trial": [round(b["wall_seconds"] / a["wall_seconds"], 2)
                                                            for a, b in zip(runs["across"], runs["by_draws"])],
            "cells_differing": _differing(accuracies["by_draws"], accuracies["across"])}


# One method per head: linear (fedavg), FedPCL's projection, FedProto's MLP. "same draws": the six lrs of one
# partition and seed; "across draws": one lr, two alphas x three seeds (a --select grid's test stage).
HEAD_METHODS = ["fedavg", "fedpcl", "fedproto"]
HEAD_CASES = {"same draws": ({"alpha": ["0.1"], "lr": ["1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2"]}, [0]),
              "across draws": ({"alpha": ["0.1", "1"], "lr": ["1e-3"]}, [0, 1, 2])}
HEAD_BASE = {"partition": ["dirichlet"], "clients": ["10"], "subsample": ["0.8"]}
HEAD_ROUNDS = {"fedavg": "150", "fedpcl": "20", "fedproto": "20"}  # 10-70 s a grid here: its setup is small beside it


def measure_heads(store: Path, trials: int, tiny: bool = False, data: tuple[str, str] = (DATASET, BACKBONE)) -> dict:
    """On a CPU, one worker: six cells of one method trained as one stack vs each as its own run, alternating in
    this process (the batched engine's bound on a stacked head's size set above every head, then to none), per
    method (head) and case (the six cells share their partition and seed, or are of three seeds and two alphas);
    every cell compared. Rounds per method: HEAD_ROUNDS."""
    from fedcache.grids import batches

    data = TINY_DATA if tiny else data
    base = {**HEAD_BASE, "clients": ["3"]} if tiny else HEAD_BASE
    features(store, data)
    default, out = batches.LARGEST_STACKED_HEAD_ON_CPU, {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for method in HEAD_METHODS:
                for case, (sweep, seeds) in HEAD_CASES.items():
                    walls, accuracies, said = {"stacked": [], "alone": []}, {}, {}
                    for t in range(trials):
                        for arm in ("stacked", "alone") if t % 2 == 0 else ("alone", "stacked"):
                            batches.LARGEST_STACKED_HEAD_ON_CPU = 2**62 if arm == "stacked" else 0
                            where = Path(tmp) / f"{method}-{case}-{arm}-{t}".replace(" ", "-")
                            rounds = {"rounds": ["1" if tiny else HEAD_ROUNDS[method]]}
                            wall, _, plans = timed_grid(store, data, where, "batched", 1, {**base, **sweep, **rounds}, seeds, [method])
                            walls[arm].append(round(wall, 1))
                            accuracies.setdefault(arm, _accuracies(where / "results.csv"))
                            said.setdefault(arm, plans)
                    out.setdefault(method, {"head_parameters": _head_parameters(method, where)})[case] = {
                        "wall_seconds": walls, "alone_over_stacked_per_trial": [round(s / a, 2) for s, a in zip(walls["stacked"], walls["alone"])],
                        "cells_differing": _differing(accuracies["stacked"], accuracies["alone"]), "plans": said}
    finally:
        batches.LARGEST_STACKED_HEAD_ON_CPU = default
    return out


def _head_parameters(method: str, grid: Path) -> int:
    """One client's head's parameters and buffers (the method's default head, on the grid's features)."""
    from fedcache.grids.batches import head_parameters
    from fedcache.grids.features import read_features
    from fedcache.spec import method_class

    return head_parameters(method_class(method).default_head, read_features(grid / "features"))


def synthetic(store: Path, shape: str) -> tuple[str, str]:
    """``DxC``: random D-dimensional embeddings of C classes around random class means (7,000 training rows and
    2,000 test rows, about digits5-offline's), imported into ``store`` once: heads of other sizes than the real
    features give. The (dataset, backbone) to read them as."""
    import numpy as np

    from fedcache.store.interchange import import_file

    dim, classes = map(int, shape.lower().split("x"))
    data = ("synthetic", f"random-{dim}d-{classes}c")
    if stored(store, data):
        return data
    rng = np.random.default_rng(0)
    means = 2 * rng.normal(size=(classes, dim))
    arrays = {}
    for split, n in (("train", 7000), ("test", 2000)):
        labels = rng.integers(0, classes, n)
        arrays[f"{split}__features"] = (rng.normal(size=(n, dim)) + means[labels]).astype(np.float32)
        arrays[f"{split}__labels"] = labels
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "synthetic.npz", **arrays, classes=np.array(json.dumps([f"c{i}" for i in range(classes)])))
        import_file(store, Path(tmp) / "synthetic.npz", *data)
    return data


def render_heads(path: Path = HEADS_RESULT) -> str:
    """The table of docs/performance.md's section on head size, from the JSON."""
    d = json.loads(path.read_text())
    lines = ["| method (head) | head parameters | same draws: alone over stacked (speed) | across draws: alone over stacked (speed) |",
             "|---|---|---|---|"]
    for method, r in d["result"].items():
        cells = [", ".join(f"{x}x" for x in r[case]["alone_over_stacked_per_trial"]) for case in HEAD_CASES]
        lines.append(f"| {method} | {r['head_parameters']:,} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _floor_rows(r: dict) -> list[str]:
    if "floor" not in r:
        return []
    f, ratio = r["floor"], round(r["floor"]["cells_per_minute"] / r["processes"]["cells_per_minute"], 2)
    per_trial = ", ".join(f"{x}x" for x in r["floor_over_processes_per_trial"])
    return [f"| arithmetic floor (see below) | {f['cells_per_minute']} | {ratio}x (per trial {per_trial}) |", "",
            f"The floor: {f['what']}"]


def _loads(p: dict, b: dict) -> str:
    return ", ".join(f"{t['load_average_after'][0]:.1f} ({name})" for name, e in (("processes", p), ("batched", b))
                     for t in e["trials"])


def _tables_sentence(r: dict) -> str:
    if r["same_table_md"]:
        return "Every trial's table.md was identical across engines."
    text = ("The trials' table.md files were not all identical, though a stacked cell should compute its own run's "
            "numbers bit for bit (tests/federate/test_stacked.py): a defect to look into")
    d = r.get("cells_differing")
    if d:
        text += (f": in the first trial {d['differing']} of {d['cells']} cells ended with another mean accuracy than on the "
                 f"process engine, by up to {d['max_points']} points")
    return text + "."


def _stack_sentence(r: dict) -> str:
    if "stack_steps" not in r:
        return ""
    st = r["stack_steps"]
    return (f" Stacking all of a method's cells, every partition and seed, in one stack would also cost steps: its clients "
            f"would step as long as the largest client of any partition, {max(st['per_partition'])} steps per epoch, while "
            f"the partitions' own runs take {', '.join(map(str, st['per_partition']))}: "
            f"{st['one_stack_over_by_partition']}x the mini-batch steps of stacks by partition and seed, which is why the "
            f"batched engine stacks cells of one partition and seed together first.")


def _accuracies(results_csv: Path) -> dict[str, float]:
    import csv

    with results_csv.open() as f:
        return {row["run_dir"]: float(row["mean_accuracy"]) for row in csv.DictReader(f)}


def _differing(a: dict[str, float], b: dict[str, float]) -> dict:
    """How many cells' mean accuracies differ between two grids of the same cells, and by how much at most."""
    gaps = [abs(a[k] - b[k]) for k in a]
    return {"cells": len(gaps), "differing": sum(g > 0 for g in gaps), "max_points": round(max(gaps, default=0.0), 2)}


def _diff(a: str, b: str, name_a: str, name_b: str) -> list[str]:
    import difflib

    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, n=0, lineterm=""))[:40]


def _peak_mb(who: int) -> int:
    return round(resource.getrusage(who).ru_maxrss / 1024)


def render(path: Path = RESULT, large: Path = LARGE_RESULT, worked: Path = WORKED_RESULT) -> str:
    """The section of docs/performance.md, from the JSON files."""
    d = json.loads(path.read_text())
    r = d["result"]
    p, b = r["processes"], r["batched"]
    load = ", ".join(f"{x:.1f}" for x in r["load_average_at_start"])
    per_trial = ", ".join(f"{x}x" for x in r["batched_over_processes_per_trial"])
    lines = [
        "## A 100-cell grid: batched engine vs process engine",
        f"`.venv/bin/python benchmarks/grid_speed.py --trials {r['trials']}`: " + d["what"]
        + f" (`benchmarks/results/grid_speed.json`, {d['measured_at'][:10]}, {d['machine']}; load average {load} at the start).", "",
        "| engine | cells per minute (median of trials) | relative |", "|---|---|---|",
        f"| processes (`--engine processes --jobs {d['jobs']}`) | {p['cells_per_minute']} | 1 |",
        f"| batched (`--engine batched`) | {b['cells_per_minute']} | {r['batched_over_processes_cells_per_minute']}x |",
        *_floor_rows(r), "",
        f"Per interleaved trial, batched over processes: {per_trial}. " + _tables_sentence(r) + _stack_sentence(r) + " The batched engine grouped the cells "
        f"as: {' '.join(b['plan'])}. Peak resident memory: {r['peak_rss_mb_of_this_process']} MB for the benchmark "
        f"process, {r['peak_rss_mb_of_a_worker_process']} MB for the largest worker process (either engine's; the "
        "batched engine trains in this process when it has one batch or --jobs 1). The machine is shared: its "
        f"1-minute load average after each trial was {_loads(p, b)}.",
    ]
    if large.exists():
        L = json.loads(large.read_text())
        R = L["result"]
        lines += ["", f"`.venv/bin/python benchmarks/grid_speed.py --large` (`benchmarks/results/{large.name}`, "
                  f"{L['measured_at'][:10]}): the 1,000-cell grid (lr x 10, seeds 0-24), batched engine only: "
                  f"{R['cells_per_minute']} cells per minute ({R['wall_seconds']} s; no reference in this run: for scale "
                  f"only, not comparable across runs), peak resident memory "
                  f"{R['peak_rss_mb_of_this_process']} MB in the benchmark process"
                  + (f", {R['peak_rss_mb_of_a_worker_process']} MB in the largest worker process" if "peak_rss_mb_of_a_worker_process" in R else "")
                  + f" ({' '.join(R['plan'])}); load average {', '.join(f'{x:.1f}' for x in R['load_average_at_start'])} "
                  f"at the start, {', '.join(f'{x:.1f}' for x in R['load_average_after'])} at the end."
                  + (f" {L['note']}" if "note" in L else "")]
    if worked.exists():
        lines += ["", _worked_paragraph(json.loads(worked.read_text()))]
    return "\n".join(lines) + "\n"


def _worked_paragraph(d: dict) -> str:
    r = d["result"]
    p, b = r["processes"], r["batched"]
    per_trial = ", ".join(f"{x}x" for x in r["batched_over_processes_per_trial"])
    return (f"`.venv/bin/python benchmarks/grid_speed.py --worked --trials {r['trials']}` (`benchmarks/results/{WORKED_RESULT.name}`, "
            f"{d['measured_at'][:10]}): {' '.join(measure_worked.__doc__.split())} Median wall time {p['wall_seconds']} s on the "
            f"process engine, {b['wall_seconds']} s on the batched engine; batched over processes per interleaved trial "
            f"(wall time ratio): {per_trial}; " + ("identical tables" if r["same_table_md"] else "the tables differ")
            + f". The batched engine's plan: {' / '.join(b['trials'][0]['plan'])}. The machine is shared: its 1-minute "
            f"load average after each trial was {_loads(p, b)}.")


def _data_arg(text: str) -> str:
    """--data: ``DATASET,BACKBONE`` or ``synthetic:DxC``, checked before anything is measured."""
    if re.fullmatch(r"synthetic:[1-9][0-9]*x[1-9][0-9]*", text, re.IGNORECASE) or re.fullmatch(r"[^,:\s]+,[^,\s]+", text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: give DATASET,BACKBONE (e.g. {DATASET},{BACKBONE}) or synthetic:DxC "
                                     "(e.g. synthetic:512x10)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=Path("/tmp/grid-speed-store.zarr"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--trials", type=int, default=2, help="interleaved trials of each engine")
    ap.add_argument("--out", type=Path, default=None, help=f"default {RESULT} ({LARGE_RESULT.name} with --large)")
    ap.add_argument("--tiny", action="store_true", help="8 cells of 2 rounds on test-toy: checks the script runs, measures nothing")
    ap.add_argument("--large", action="store_true", help="the 1,000-cell grid with the batched engine alone")
    ap.add_argument("--worked", action="store_true", help="docs/getting-started.md's worked grid (5 rounds), both engines")
    ap.add_argument("--stacking", action="store_true", help="with --device cuda: stacks across partitions and seeds vs by them")
    ap.add_argument("--heads", action="store_true", help="on a CPU: cells stacked vs alone, per head size")
    ap.add_argument("--data", type=_data_arg, default=None,
                    help=f"with --heads: DATASET,BACKBONE of the store (default {DATASET},{BACKBONE}), or synthetic:DxC "
                         "(random D-dim features of C classes)")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the cells' rounds run: cpu (default), cuda, ...")
    args = ap.parse_args(argv)
    if args.data and (args.tiny or not args.heads):
        ap.error("--data goes with --heads, without --tiny (which runs on test-toy)")
    global DEVICE
    DEVICE = args.device
    if args.render:
        print(render_heads(args.out or HEADS_RESULT) if args.heads else render(args.out or RESULT))
        return
    import torch

    out = args.out or (LARGE_RESULT if args.large else WORKED_RESULT if args.worked else STACKING_RESULT if args.stacking
                       else HEADS_RESULT if args.heads else RESULT)
    if args.heads:
        given = args.data or f"{DATASET},{BACKBONE}"
        data = synthetic(args.store, given.split(":", 1)[1]) if given.startswith("synthetic:") else tuple(given.split(","))
        result = measure_heads(args.store, args.trials, args.tiny, data)
    elif args.stacking:
        result = measure_stacking(args.store, args.trials, args.tiny)
    elif args.large:
        result = measure_large(args.store, args.jobs)
    elif args.worked:
        result = measure_worked(args.store, args.jobs, args.tiny, args.trials)
    else:
        result = measure(args.store, args.jobs, args.tiny, args.trials)
    what = (measure_worked.__doc__ if args.worked else measure_stacking.__doc__ if args.stacking
            else measure_heads.__doc__ if args.heads else __doc__.strip().split("\n\n")[1])
    doc = {"what": " ".join(what.split()), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, torch {torch.__version__}, {torch.get_num_threads()} torch threads"
                      + (f", {torch.cuda.get_device_name()}" if args.device.startswith("cuda") else ""),
           "device": args.device, **({"data": given} if args.heads else {}),
           "jobs": 1 if args.heads else args.jobs, "tiny": args.tiny, "result": result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
