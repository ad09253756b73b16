"""How a stored partition's row arrays are compressed: Zarr's default zstd against byte-shuffled LZ4 (what
`fedcache/federate/partitions/storage.py` writes), interleaved in one run.

The arrays are what a partition of 10,000 clients with 1,000 local test rows each stores: every client's sorted
row ids (int64) of a 100,000-row test split and their domain (one domain), written and read back whole with Zarr.

    .venv/bin/python benchmarks/partition_codec.py [--trials 6] [--out benchmarks/results/partition_codec.json]
    .venv/bin/python benchmarks/partition_codec.py --tiny --out /tmp/p.json     # a smoke run
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "partition_codec.json"


def arrays(clients: int, per_client: int, table: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.concatenate([np.sort(rng.choice(table, per_client, replace=False)) for _ in range(clients)])
    return {"id": ids.astype(np.int64), "domain": np.zeros(len(ids), np.int64)}


def one(folder: Path, data: dict[str, np.ndarray], compressors) -> dict:
    g = zarr.open_group(folder, mode="w")
    t0 = time.perf_counter()
    for name, a in data.items():
        g.create_array(name, data=a, compressors=compressors)
    wrote = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = {name: g[name][:] for name in data}
    read = time.perf_counter() - t0
    assert all(np.array_equal(back[n], data[n]) for n in data)
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return {"write_s": wrote, "read_s": read, "bytes": size}


def main(argv: list[str] | None = None) -> dict:
    from fedcache.federate.partitions.storage import _ROWS_CODEC

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="100 clients of 10 rows: checks the benchmark runs")
    ap.add_argument("--trials", type=int, default=6, help="an even number puts each arm first as often as last")
    ap.add_argument("--out", type=Path, default=RESULT)
    a = ap.parse_args(argv)
    clients, per_client, table = (100, 10, 1000) if a.tiny else (10_000, 1000, 100_000)
    data = arrays(clients, per_client, table)
    arms = {"zstd (Zarr's default)": "auto", "lz4, byte-shuffled (fedcache)": _ROWS_CODEC}
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(a.trials):
            for name in (list(arms) if trial % 2 == 0 else list(arms)[::-1]):
                runs[name].append(one(Path(tmp) / f"{trial}-{len(runs[name])}-{hash(name) & 0xffff}", data, arms[name]))
    median = {name: {k: statistics.median(r[k] for r in rs) for k in ("write_s", "read_s", "bytes")} for name, rs in runs.items()}
    ours, theirs = median["lz4, byte-shuffled (fedcache)"], median["zstd (Zarr's default)"]
    res = {"what": __doc__.split("\n")[0], "clients": clients, "rows_per_client": per_client, "trials": a.trials,
           "median": {n: {k: round(v, 4) for k, v in m.items()} for n, m in median.items()},
           "lz4_over_zstd": {k: round(ours[k] / theirs[k], 3) for k in ("write_s", "read_s", "bytes")}}
    write(res, a.out)
    return res


if __name__ == "__main__":
    main()
