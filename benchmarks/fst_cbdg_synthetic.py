"""The synthetic-problem table of docs/methods/fst-cbdg.md ("Results"): zero-shot, FST-CBDG and its
ablations on tests/federate/test_fst_cbdg.py's CLIP-like problem with a known class-prior bias, IID
and sharded (s=2), seed 0, plus the sharded problem's seeds 1 and 2; batch 32 (the test's), the
fst-cbdg optimizer preset, 20 clients, 10 rounds. A few minutes.

Usage: .venv/bin/python benchmarks/fst_cbdg_synthetic.py [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _results import write  # benchmarks/ is on sys.path when a script here runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.federate.test_fst_cbdg import accuracy, biased_problem  # noqa: E402

ROWS = {"zero-shot": ("clip-zs", {}), "fst-cbdg": ("fst-cbdg", {}), "ist-only": ("fst-cbdg", {"losses": "ist"}),
        "equal-sampling": ("fst-cbdg", {"sampling": "equal"}), "fst-cbdg-explicit": ("fst-cbdg", {"synthetic": "explicit"}),
        "tsamp-weight-sum": ("fst-cbdg", {"tsamp_weight": "sum"}), "tsamp-weight-step": ("fst-cbdg", {"tsamp_weight": "step"})}


def table(shards: int | None, seed: int, rows: dict) -> dict:
    data = biased_problem(shards=shards, seed=seed)
    return {name: round(accuracy(method, data, **params), 2) for name, (method, params) in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fst_cbdg_synthetic.json")
    args = ap.parse_args()
    res = {"iid": table(None, 0, {**ROWS, "centralized": ("clip-fc-centralized", {})}), "shards-2": table(2, 0, ROWS)}
    short = {k: ROWS[k] for k in ("zero-shot", "fst-cbdg", "equal-sampling")}
    res["shards-2 other seeds"] = {seed: table(2, seed, short) for seed in (1, 2)}
    write(res, args.out)


if __name__ == "__main__":
    main()
