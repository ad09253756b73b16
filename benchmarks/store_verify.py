"""What checking every chunk's CRC-32 costs a reader: reading a store's entries verified vs unverified.

A store of 4 entries (domains) of 25,000 rows x 512 float16 features (about 100 MB, 4 MB chunks, as
`fedcache extract` writes them) is read whole, entry by entry, with and without the checksum check,
interleaved A/B (the order alternates per trial) with a warm page cache; the ratio is verified / unverified
per trial (median and range reported), and the fastest verified over the fastest unverified read.
`FeatureStore.read` (what `train` calls) always verifies.

    .venv/bin/python benchmarks/store_verify.py [--trials 9] [--out benchmarks/results/store_verify.json]
    .venv/bin/python benchmarks/store_verify.py --tiny --out /tmp/v.json    # seconds: a smoke run
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "store_verify.json"
FULL = {"domains": 4, "rows": 25_000, "dim": 512}
TINY = {"domains": 2, "rows": 600, "dim": 32}


def build(path: Path, domains: int, rows: int, dim: int) -> None:
    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.keys import EntryKey
    from fedcache.store.writer import open_writer

    store = FeatureStore(path)
    rng = np.random.default_rng(0)
    attrs = {"classes": [str(c) for c in range(10)], "domains": [f"d{d}" for d in range(domains)], "random_weights": True}
    for d in range(domains):
        key = EntryKey("bench", "synthetic", "train", f"d{d}", "bench-encoder", "w", {"synthetic": True})
        feats = rng.normal(size=(rows, dim)).astype(np.float32)
        with open_writer(store, key, rows, dim, 64, attrs) as w:
            for c in w.pending():
                lo, hi = w.chunk_range(c)
                w.write_chunk(c, feats[lo:hi], rng.integers(0, 10, hi - lo), np.arange(lo, hi), np.ones(hi - lo, bool))
            assert w.finish([])


def read_all(store, infos, verify: bool) -> float:
    t0 = time.perf_counter()
    for info in infos:
        store.read_arrays(info, verify=verify)
    return time.perf_counter() - t0


def measure(path: Path, trials: int) -> dict:
    from fedcache.store.feature_store import FeatureStore

    store = FeatureStore(path, create=False)
    infos = [e for e in store.entries() if e.complete]
    read_all(store, infos, True)  # warm the page cache and the imports
    times: dict[bool, list[float]] = {True: [], False: []}
    for t in range(trials):
        for verify in ((True, False) if t % 2 else (False, True)):
            times[verify].append(read_all(store, infos, verify))
    ratios = [v / u for v, u in zip(times[True], times[False])]
    t0 = time.perf_counter()
    store.read("bench", "train", "bench-encoder")
    return {"entries": len(infos), "bytes": sum(e.n_rows * e.dim * 2 for e in infos),
            "verified_s": times[True], "unverified_s": times[False],
            "verified_over_unverified": {"median_ratio": round(statistics.median(ratios), 3),
                                         "min": round(min(ratios), 3), "max": round(max(ratios), 3),
                                         # the least disturbed read of each arm, as timeit reports
                                         "best_over_best": round(min(times[True]) / min(times[False]), 3)},
            "store_read_s": round(time.perf_counter() - t0, 4)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a few hundred rows: checks the benchmark runs")
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    size = TINY if args.tiny else FULL
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp) / "store.zarr", **size)
        res = {"what": __doc__.strip().split("\n\n")[0].replace("\n", " "), "size": size, "trials": args.trials,
               "result": measure(Path(tmp) / "store.zarr", args.trials)}
    write(res, args.out)
    return res


if __name__ == "__main__":
    main()
