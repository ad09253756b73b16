"""One large product without a gradient (a head over a test split) at one and two torch threads: fedcache's
``heads.bmm`` (pieces of rows or columns as one batch) against torch's own product, which splits it across
threads and so sums in another order at another thread count, and against the first of two products (what
``bmm`` computed before: the same bits at any thread count, on one thread).

Each shape is a head's evaluation: (rows, features) @ (features, classes); ten classes or fewer run in the
transposed layout (heads/base.py ``transposed_affine``). The three arms alternate; each time is the best of
``--repeat`` calls, and a ratio is the median over ``--trials`` of one trial's times.

    .venv/bin/python benchmarks/single_product.py [--trials 5] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "single_product.json"
SHAPES = [(50_000, 1280, 65), (50_000, 512, 10), (10_000, 512, 345), (3_000, 512, 65), (1_500, 1280, 10)]
TINY_SHAPES = [(1_100, 16, 65), (1_100, 16, 10)]


def arms(rows: int, dim: int, classes: int) -> dict:
    import torch

    from fedcache.heads.base import FEW_CLASSES, affine

    g = torch.Generator().manual_seed(0)
    z, w, b = torch.randn(1, rows, dim, generator=g), torch.randn(1, dim, classes, generator=g), torch.randn(1, 1, classes, generator=g)
    if classes > FEW_CLASSES:
        a_, b_, add = z, w, b
    else:
        a_, b_, add = w.transpose(1, 2), z.transpose(1, 2), None

    def product(a, c, k=1):
        a, c = a.expand(k, *a.shape[1:]), c.expand(k, *c.shape[1:])
        return (torch.bmm(a, c) if add is None else torch.baddbmm(add, a, c))[:1]
    return {"torch": lambda: product(a_, b_), "first_of_two": lambda: product(a_, b_, 2), "fedcache": lambda: affine(w, b, z)}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(shapes: list, threads: list[int], trials: int, repeat: int) -> list[dict]:
    import torch

    rows, before = [], torch.get_num_threads()
    try:
        with torch.no_grad():
            for shape in shapes:
                fns = arms(*shape)
                for t in threads:
                    torch.set_num_threads(t)
                    rows.append(row(shape, t, alternating(fns, trials, repeat)))
    finally:
        torch.set_num_threads(before)
    return rows


def alternating(fns: dict, trials: int, repeat: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for trial in range(trials):
        for name in (list(fns) if trial % 2 == 0 else list(fns)[::-1]):
            times[name].append(best(fns[name], repeat))
    return times


def row(shape: tuple, threads: int, times: dict) -> dict:
    def ratio(other: str) -> float:
        return round(statistics.median(f / o for f, o in zip(times["fedcache"], times[other])), 2)
    return {"rows": shape[0], "features": shape[1], "classes": shape[2], "threads": threads,
            "fedcache_over_torch": ratio("torch"), "fedcache_over_first_of_two": ratio("first_of_two"),
            "torch_ms": round(1e3 * statistics.median(times["torch"]), 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5, help="calls per time (the best is kept)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tiny", action="store_true", help="small shapes, one trial: checks the script, measures nothing")
    ap.add_argument("--out", type=Path, default=RESULT)
    a = ap.parse_args(argv)
    threads = [int(t) for t in a.threads.split(",")]
    res = {"what": __doc__.split("\n\n")[0], "result": measure(TINY_SHAPES if a.tiny else SHAPES, threads, a.trials, a.repeat),
           "command": "benchmarks/single_product.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    write(res, a.out)


if __name__ == "__main__":
    main()
