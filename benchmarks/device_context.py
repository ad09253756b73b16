"""A run under `with torch.device(...)` against the same run without it, on the CPU, in one process.

`torch.device` as a context manager makes tensors on that device by intercepting every torch call in Python. The
driver needs it on a GPU; on the CPU, the default device, it only costs: this measures what, on whole in-process
`fedcache.train` runs (fedavg with a linear head and fedproto with its mlp head, digits5-offline features), the
two arms alternating, each run's final accuracies compared.

    .venv/bin/python benchmarks/device_context.py [--store PATH] [--trials 10]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import features, write  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "device_context.json"
DATA = ("digits5-offline", "efficientnet-lite0")
TINY_DATA = ("test-toy", "tiny-timm-random")
RUNS = {"fedavg, linear head": {"method": "fedavg", "rounds": 20},
        "fedproto, mlp head": {"method": "fedproto", "rounds": 5}}
COMMON = {"partition": "dirichlet", "alpha": 0.5, "clients": 10, "seed": 0}
TINY = {"rounds": 2, "partition": "iid", "clients": 2}  # the toy data is too small to split by Dirichlet


def one(store: Path, data: tuple[str, str], options: dict, context: bool) -> tuple[float, float]:
    import torch

    import fedcache

    t0 = time.perf_counter()
    with torch.device("cpu") if context else contextlib.nullcontext():
        run = {k: v for k, v in {**COMMON, **options}.items() if v is not None}  # None: left out (iid reads no alpha)
        result = fedcache.train(store=store, dataset=data[0], backbones=data[1], **run)
    return time.perf_counter() - t0, result.summary["mean_accuracy"]


def measure(store: Path, data: tuple[str, str], trials: int, tiny: bool) -> dict:
    out = {}
    for name, options in RUNS.items():
        options = {**options, **({**TINY, "alpha": None} if tiny else {})}
        one(store, data, options, False)  # the partition made and the features in the page cache before timing
        times: dict[str, list[float]] = {"context": [], "none": []}
        accuracies = set()
        for t in range(trials):
            for arm in ("context", "none") if t % 2 == 0 else ("none", "context"):
                seconds, accuracy = one(store, data, options, arm == "context")
                times[arm].append(round(seconds, 3))
                accuracies.add(accuracy)
        pairs = [c / n for c, n in zip(times["context"], times["none"])]
        out[name] = {"seconds": times, "context_over_none_per_trial": [round(p, 2) for p in pairs],
                     "context_over_none": round(statistics.median(pairs), 2), "same_accuracy": len(accuracies) == 1}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=Path("/tmp/grid-speed-store.zarr"))
    ap.add_argument("--trials", type=int, default=10, help="alternating pairs of runs per workload")
    ap.add_argument("--tiny", action="store_true", help="test-toy, 2 rounds: checks the script, measures nothing")
    ap.add_argument("--out", type=Path, default=RESULT)
    a = ap.parse_args(argv)
    data = TINY_DATA if a.tiny else DATA
    features(a.store, data)
    res = {"what": __doc__.split("\n\n")[0], "result": measure(a.store, data, a.trials, a.tiny),
           "command": "benchmarks/device_context.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    write(res, a.out)


if __name__ == "__main__":
    main()
