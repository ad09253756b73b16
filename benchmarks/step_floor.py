"""The arithmetic floor under rounds.py's cases (a) fedproto and (e) fedpcl: the time of the matrix
products and optimizer updates that any implementation of those runs must do, measured on the same
shapes in this process, next to the whole runs.

Per local step (5 clients, batch rows b = 32, 32, 32, 4 per epoch of 100 rows): the first layer's
forward x W (5, b, D) x (5, D, 256), its weight gradient x^T g, and fused Adam over the 5 x D x 256
weights, run one after the other as a local pass runs them. Per round: one forward pass over the 5 x 100 training rows (the prototypes) and one over
the 5 x 100 test rows (evaluation every round), or as the official code runs: FedProto takes its
prototypes from the last epoch's steps and evaluates once at the end; FedPCL evaluates every 20
rounds (and after the last). The layers after the first (256 -> 10) and every elementwise operation
are left out, so the true floor is higher.

Usage: .venv/bin/python benchmarks/step_floor.py [--out FILE]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _results import best_ms, write  # benchmarks/ is on sys.path when a script here runs
from rounds import synthetic, timed

from fedcache.federate.optim import OptimConfig, _fused

K, HIDDEN, ROWS, BATCH = 5, 256, 100, 32
BATCHES = [BATCH] * (ROWS // BATCH) + ([ROWS % BATCH] if ROWS % BATCH else [])


def op_times(dim: int) -> dict:
    """Best-of times (ms) of one local epoch's first-layer products and Adam steps, run in sequence as a
    local pass runs them (so each step's Adam evicts the weights the next step's products read, as in
    a real run), and of one forward pass over a client's rows."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(K, dim, HIDDEN, generator=gen) / dim**0.5
    b = torch.zeros(K, 1, HIDDEN)
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    xs = [torch.randn(K, rows, dim, generator=gen) for rows in BATCHES]
    gs = [torch.randn(K, rows, HIDDEN, generator=gen) for rows in BATCHES]

    def epoch() -> None:
        for x, g in zip(xs, gs):
            torch.baddbmm(b, x, w)
            _fused(OptimConfig(), [w], [torch.bmm(x.transpose(1, 2), g)], [m], [v], 1.0)

    full = torch.randn(K, ROWS, dim, generator=gen)
    return {"epoch_ms": best_ms(epoch, 10, 5), "row_pass_ms": best_ms(lambda: torch.baddbmm(b, full, w), 30, 5)}


def floor_seconds(ops: dict, train_rounds: int, passes: int) -> float:
    return round((train_rounds * ops["epoch_ms"] + passes * ops["row_pass_ms"]) / 1e3, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "step_floor.json")
    args = ap.parse_args()
    res = {}
    # (name, method params, eval_every, row passes: prototypes after training + evaluations)
    settings = {"fedproto": [("every round", {}, 1, 100), ("official code", {"local_protos": "last-epoch"}, 50, 1)],
                "fedpcl": [("every round", {}, 1, 100), ("official code", {}, 20, 53)]}
    for case, dim, train_rounds, method in (("a", 1280, 50, "fedproto"), ("e", 3840, 49, "fedpcl")):
        data = synthetic(K, ROWS, dim)
        timed("fedavg", data, 2, repeat=1)  # warm-up
        ops = op_times(dim)
        res[case] = {"method": method, "dim": dim, **ops, "settings": [
            {"setting": name, "params": params, "eval_every": every, "row_passes": passes,
             "floor_seconds": floor_seconds(ops, train_rounds, passes),
             "run_seconds": round(timed(method, data, 50, eval_every=every, **params)["seconds"], 3)}
            for name, params, every, passes in settings[method]]}
    write(res, args.out)


if __name__ == "__main__":
    main()
