"""rounds.py case (a) for FedProto, written by hand as the least eager PyTorch can do, next to the
library's run: how much of the whole-run time is the framework's and fedcache's bookkeeping.

The hand-written run does the same arithmetic as ``fedcache train --method fedproto`` (mlp head,
Adam 1e-3 with weight decay 1e-4, batches of 32 from each client's own shuffle, the prototype loss
against last round's global prototypes, prototypes recomputed after training, every client's
personalised accuracy every round), but with nothing else: the backward pass written out, no
autograd, no padding masks (every client has 100 rows, so every step is full), no loop bookkeeping,
no checks. It is a measuring device, not a second implementation: it is not tested against the
library beyond reaching the same accuracy.

Both alternate within one process, best of 3 each per trial. Usage:
.venv/bin/python benchmarks/fedproto_by_hand.py [--out FILE]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _results import write  # benchmarks/ is on sys.path when a script here runs
from rounds import synthetic, timed

from fedcache.federate.local import step_plan

K, ROWS, DIM, HIDDEN, CLASSES, ROUNDS, BATCH = 5, 100, 1280, 256, 10, 50, 32
ADAM = dict(amsgrad=False, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=1e-4, eps=1e-8, maximize=False)
EPS = 1e-5


def init() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    u = lambda shape, fan: (torch.rand(shape, generator=gen) * 2 - 1) / fan**0.5
    return [u((K, DIM, HIDDEN), DIM), u((K, 1, HIDDEN), DIM), torch.ones(K, 1, HIDDEN), torch.zeros(K, 1, HIDDEN),
            u((K, HIDDEN, CLASSES), HIDDEN), u((K, 1, CLASSES), HIDDEN)]


def step(params, stats, xb, yb, protos, has) -> list[torch.Tensor]:
    """Loss gradients of one full batch (K, B, D), and the running statistics updated in place."""
    w1, b1, gamma, beta, w2, b2 = params
    n = xb.shape[1]
    h = torch.baddbmm(b1, xb, w1).clamp_min_(0)
    mean = h.mean(1, keepdim=True)
    hc = h - mean
    var = (hc * hc).mean(1, keepdim=True)
    rstd = (var + EPS).rsqrt()
    hn = hc * rstd
    z = torch.addcmul(beta, hn, gamma)
    dlogits = torch.softmax(few_class_logits(z, w2, b2), -1).sub_(F.one_hot(yb, CLASSES).float()).div_(n)
    near = has[yb].float().unsqueeze(-1)
    dz = torch.bmm(dlogits, w2.transpose(1, 2))
    dz += (z - protos[yb]) * near * (2.0 / HIDDEN) / near.sum(1, keepdim=True).clamp_min(1)
    dhn = dz * gamma
    corr = torch.addcmul(dhn.mean(1, keepdim=True), hn, (dhn * hn).mean(1, keepdim=True))
    da = (dhn - corr).mul_(rstd).mul_(h > 0)
    stats[0].lerp_(mean, 0.1)
    stats[1].lerp_(var * (n / (n - 1)), 0.1)
    return [torch.bmm(xb.transpose(1, 2), da), da.sum(1, keepdim=True), (dz * hn).sum(1, keepdim=True),
            dz.sum(1, keepdim=True), torch.bmm(dlogits.transpose(1, 2), z).transpose(1, 2).contiguous(),
            dlogits.sum(1, keepdim=True)]


def few_class_logits(z, w2, b2) -> torch.Tensor:
    """z W + b as (W^T z^T)^T + b, the library's faster layout for 10 classes (heads.base.affine)."""
    return torch.bmm(w2.transpose(1, 2), z.transpose(1, 2)).transpose(1, 2) + b2


def evaluate(params, stats, x) -> torch.Tensor:
    w1, b1, gamma, beta = params[:4]
    h = torch.baddbmm(b1, x, w1).clamp_min_(0)
    return torch.addcmul(beta, h - stats[0], (stats[1] + EPS).rsqrt() * gamma)


def by_hand(data) -> float:
    """The whole run; returns the mean personalised accuracy after the last round."""
    params, stats = init(), [torch.zeros(K, 1, HIDDEN), torch.ones(K, 1, HIDDEN)]
    protos, has = torch.zeros(CLASSES, HIDDEN), torch.zeros(CLASSES, dtype=torch.bool)
    rows = [data.client_train[k] for k in range(K)]
    x_tr, y_tr = data.x_train[np.stack(rows)], data.y_train[np.stack(rows)]
    x_te, y_te = data.x_test[np.stack(data.client_test)], data.y_test[np.stack(data.client_test)]
    for rnd in range(ROUNDS):
        plan = torch.from_numpy(step_plan(rows, BATCH, 1, 0, rnd, list(range(K))))
        m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        for s in range(plan.shape[1]):
            idx = plan[:, s]
            idx = idx[:, : int((idx >= 0).sum(1).max())]  # the last batch of 100 rows holds 4
            grads = step(params, stats, data.x_train[idx], data.y_train[idx], protos, has)
            torch._fused_adam_(params, grads, m, v, [], [torch.tensor(s + 1.0)] * len(params), **ADAM)
        with torch.no_grad():
            onehot = F.one_hot(y_tr, CLASSES).float()
            sums, counts = torch.bmm(onehot.transpose(1, 2), evaluate(params, stats, x_tr)), onehot.sum(1)
            counts_all = counts.sum(0)
            # count-weighted, as FedProto's server; a class no client holds keeps its prototype
            seen = counts_all > 0
            protos = torch.where(seen.unsqueeze(-1), sums.sum(0) / counts_all.clamp_min(1).unsqueeze(-1), protos)
            has = has | seen
            logits = few_class_logits(evaluate(params, stats, x_te), params[4], params[5])
            acc = 100 * (logits.argmax(-1) == y_te).float().mean()
    return float(acc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fedproto_by_hand.json")
    args = ap.parse_args()
    data = synthetic(K, ROWS, DIM)
    trials = []
    for _ in range(3):
        hand = []
        for _ in range(3):
            t0 = time.perf_counter()
            acc = by_hand(data)
            hand.append(time.perf_counter() - t0)
        lib = timed("fedproto", data, ROUNDS, repeat=3)
        trials.append({"by_hand_seconds": round(min(hand), 3), "library_seconds": round(lib["seconds"], 3),
                       "by_hand_accuracy": acc, "library_accuracy": lib["accuracy"]})
    write({"case": "a", "method": "fedproto", "trials": trials,
           "by_hand_over_library": [round(t["by_hand_seconds"] / t["library_seconds"], 3) for t in trials]}, args.out)


if __name__ == "__main__":
    main()
