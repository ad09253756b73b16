"""One StackedOptimizer Adam step with torch's fused kernel called directly (what fedcache does) vs
through torch.optim's functional wrapper (what it did before), for the parameters of case (a)'s
fedavg (linear head) and fedproto (mlp head), 5 clients. Best of 500 steps each, milliseconds.

Usage: .venv/bin/python benchmarks/optimizer_step.py [--out FILE]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _results import best_ms, write  # benchmarks/ is on sys.path when a script here runs

from fedcache.federate import optim

HEADS = {"fedavg linear 1280->10": [(5, 1280, 10), (5, 1, 10)],
         "fedproto mlp 1280->256->10": [(5, 1280, 256), (5, 1, 256), (5, 1, 256), (5, 1, 256), (5, 256, 10), (5, 1, 10)]}


def _ms(fn) -> float:
    return round(best_ms(fn, 500, 20), 4)


def wrapped(cfg, ps, gs, ms, vs, steps_done):
    optim._torch_step(cfg, ps, gs, ms, vs, steps_done, {"fused": True})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "optimizer_step.json")
    args = ap.parse_args()
    direct, res = dict(optim.KERNELS), {}
    for name, shapes in HEADS.items():
        params = {f"p{i}": torch.randn(s) for i, s in enumerate(shapes)}
        grads = {n: torch.randn_like(t) for n, t in params.items()}
        opt, active = optim.StackedOptimizer(params, optim.OptimConfig()), torch.ones(5, dtype=torch.bool)
        row = {}
        for label, kernels in (("direct kernel", direct), ("torch.optim functional", {"adam": wrapped, "sgd": wrapped})):
            optim.KERNELS = kernels
            row[label] = _ms(lambda: opt.step(params, grads, active))
        optim.KERNELS = direct
        res[name] = row
    write(res, args.out)


if __name__ == "__main__":
    main()
