"""How long torch's OpenMP threads spin between parallel regions, and what it costs: rounds.py case
(a) (fedavg and fedproto, 5 clients x 100 rows x 1280-d, 50 rounds) in a fresh process per
setting, on an idle machine and beside a busy single-threaded process (a stand-in for a second job,
a data loader or a grid worker on the same cores).

Settings: torch's default (libgomp spins for a long time before sleeping), shorter spins
(GOMP_SPINCOUNT=100000, 10000, 1000), and OMP_WAIT_POLICY=PASSIVE (sleep at once). rounds.py itself imports torch
first, so its table is measured with torch's default.

Usage: .venv/bin/python benchmarks/spin_count.py [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _results import write  # benchmarks/ is on sys.path when a script here runs

HERE = Path(__file__).parent
SETTINGS = {"torch default": {}, "GOMP_SPINCOUNT=100000": {"GOMP_SPINCOUNT": "100000"},
            "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"}, "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"},
            "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}
# torch is imported before fedcache here, so fedcache's own default does not reach libgomp.
CHILD = """
import json, sys
sys.path.insert(0, {here!r})
import torch
from rounds import synthetic, timed
data = synthetic(5, 100, 1280)
timed("fedavg", data, 2, repeat=1)
print(json.dumps({{m: round(timed(m, data, 50, repeat={repeat})["seconds"], 3) for m in ("fedavg", "fedproto")}}))
"""
BUSY = "import numpy as np\na = np.random.rand(300, 300)\nwhile True:\n    a @ a"


def child_env(setting: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    return {**env, **setting}


def measure(setting: dict, busy: bool, repeat: int) -> dict:
    competitor = None
    if busy:
        competitor = subprocess.Popen([sys.executable, "-c", BUSY], env={**os.environ, "OMP_NUM_THREADS": "1",
                                      "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    try:
        out = subprocess.run([sys.executable, "-c", CHILD.format(here=str(HERE), repeat=repeat)], env=child_env(setting),
                             capture_output=True, text=True, check=True, timeout=900)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE / "results" / "spin_count.json")
    args = ap.parse_args()
    rows = []
    for trial in range(2):  # settings alternate, so a change of the machine's speed reaches all of them
        for busy in (False, True):
            for name, setting in SETTINGS.items():
                rows.append({"trial": trial + 1, "setting": name, "busy_neighbour": busy,
                             **measure(setting, busy, repeat=1 if busy else 3)})
                print(rows[-1], flush=True)
    write({"case": "a", "rows": rows}, args.out)


if __name__ == "__main__":
    main()
