"""x W + b (torch.baddbmm) vs (W^T x^T)^T + b (heads.base.transposed_affine) for stacked linear
layers, forward and forward + backward, by number of outputs C: the measurement behind
heads.base.FEW_CLASSES. Best of 300 calls each, milliseconds.

Usage: .venv/bin/python benchmarks/linear_layout.py [--out FILE]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _results import best_ms, write  # benchmarks/ is on sys.path when a script here runs

from fedcache.heads.base import transposed_affine

SHAPES = [(5, 32, 1280, c) for c in (2, 7, 8, 10, 12, 16, 20, 32, 64, 100)] + [(16, 100, 1280, 10), (10, 100, 1024, 32),
                                                                             (5, 32, 512, 345)]


def _ms(fn) -> float:
    return round(best_ms(fn, 300, 10), 4)


def case(k: int, rows: int, dim: int, c: int) -> dict:
    x, w, b = torch.randn(k, rows, dim), torch.randn(k, dim, c) / dim**0.5, torch.zeros(k, 1, c)
    layouts = {"x W": lambda w_, b_: torch.baddbmm(b_, x, w_), "(W^T x^T)^T": lambda w_, b_: transposed_affine(w_, b_, x)}
    out = {"shape": [k, rows, dim, c]}
    for name, f in layouts.items():
        def train_step(f=f):
            w_, b_ = w.detach().requires_grad_(True), b.detach().requires_grad_(True)
            torch.autograd.grad(f(w_, b_).sum(), [w_, b_])
        with torch.no_grad():
            out[f"{name} forward"] = _ms(lambda f=f: f(w, b))
        out[f"{name} forward+backward"] = _ms(train_step)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "linear_layout.json")
    args = ap.parse_args()
    write({"cases": [case(*s) for s in SHAPES]}, args.out)


if __name__ == "__main__":
    main()
