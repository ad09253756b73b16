"""glibc's default malloc thresholds vs fedcache's (fedcache/federate/memory.py), in one process:
runs with the defaults first, then raises the thresholds (they cannot be put back) and runs again.
Case (e) of rounds.py (fedpcl, 5 clients x 100 rows x 3840-d, 50 rounds) and case (a)'s fedproto;
minor page faults and seconds per run.

Usage: FEDCACHE_MALLOC=system .venv/bin/python benchmarks/malloc_thresholds.py [--out FILE]
(FEDCACHE_MALLOC=system keeps the round loop from raising the thresholds before this script does.)
"""
from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path

from _results import write  # benchmarks/ is on sys.path when a script here runs
from rounds import synthetic, timed

from fedcache.federate import memory


def measured(name: str, data, repeat: int = 2) -> dict:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    r = timed(name, data, 50, repeat=repeat)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // repeat
    return {"seconds": [round(t, 3) for t in r["all_seconds"]], "page_faults_per_run": int(faults)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "malloc_thresholds.json")
    args = ap.parse_args()
    if os.environ.get("FEDCACHE_MALLOC") != "system":
        raise SystemExit("run with FEDCACHE_MALLOC=system so that the defaults are measured first")
    cases = {"fedproto": synthetic(5, 100, 1280), "fedpcl": synthetic(5, 100, 3 * 1280)}
    timed("fedavg", cases["fedproto"], 2, repeat=1)  # warm-up
    res = {"glibc defaults": {n: measured(n, d) for n, d in cases.items()}}
    os.environ.pop("FEDCACHE_MALLOC")
    assert memory._apply(), "could not raise the thresholds (not glibc?)"
    res["fedcache thresholds"] = {n: measured(n, d) for n, d in cases.items()}
    write(res, args.out)


if __name__ == "__main__":
    main()
