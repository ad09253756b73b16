"""The mlp head's training step with and without the no-padding shortcut (heads/mlp.py: a step
whose rows are all real computes BatchNorm's statistics without the mask arithmetic), inside
FedProto's full local pass of rounds.py case (a): 5 clients x 100 rows x 1280-d, batches of 32,
loss, gradients and Adam. Also the batch moments over the row axis, torch.var_mean against the
mean / centre / mean-of-squares the head uses.

The two variants alternate within one process, so a change of the machine's speed reaches both.
Usage: .venv/bin/python benchmarks/mlp_step.py [--out FILE]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _results import best_ms, write  # benchmarks/ is on sys.path when a script here runs
from rounds import synthetic

from fedcache.federate.local import step_plan, train
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.heads.mlp import MLPHead, _update_running, train_body

KEYS = ("fc1.weight", "fc1.bias", "bn.weight", "bn.bias")


def masked_features(self, p, x, mask=None, train=False):
    """MLPHead.features taking the masked path on every step (an all-ones mask where no row is
    padding): the shortcut is the only difference."""
    if not train:
        return SHORTCUT(self, p, x, mask, train)
    real = torch.ones(x.shape[:2], dtype=x.dtype).unsqueeze(-1) if mask is None else mask.unsqueeze(-1).to(x.dtype)
    z, mean, var = train_body(x, real, *(p[k] for k in KEYS))
    _update_running(p, mean.detach(), var.detach(), real, x.shape[1])
    return z


SHORTCUT = MLPHead.features


def local_pass_ms(repeat: int) -> dict:
    data = synthetic(5, 100, 1280)
    cls = METHODS.get("fedproto")
    method = cls(MethodContext(data, head="mlp"), cls.Params())
    states = method.init_clients(5)
    info = {"protos": torch.randn(10, 256, generator=torch.Generator().manual_seed(0)), "has": torch.ones(10, dtype=torch.bool)}
    clients = list(range(5))
    plan = step_plan(method.client_rows(clients), 32, 1, 0, 0, clients)
    # train() updates its input in place: every pass starts from a copy of the same weights
    one_pass = lambda: train({n: t.clone() for n, t in states.items()}, method.trainable(states), method.loss,
                             data.x_train, data.y_train, plan, method.ctx.optim, info)
    best = {"shortcut": float("inf"), "masked": float("inf")}
    for _ in range(repeat):  # alternate, so both see the same moments of the machine
        for name, features in (("shortcut", SHORTCUT), ("masked", masked_features)):
            MLPHead.features = features
            best[name] = min(best[name], best_ms(one_pass, 3, 1))
    MLPHead.features = SHORTCUT
    return {"steps": plan.shape[1], **{f"{k}_ms": round(v, 3) for k, v in best.items()},
            "shortcut_over_masked": round(best["shortcut"] / best["masked"], 3)}


def moments_us() -> dict:
    h = torch.randn(5, 32, 256)

    def three_ops():
        mean = h.mean(1, keepdim=True)
        c = h - mean
        return (c * c).mean(1, keepdim=True)

    return {"var_mean_us": round(1e3 * best_ms(lambda: torch.var_mean(h, 1, correction=0, keepdim=True), 200, 20), 1),
            "mean_centre_square_us": round(1e3 * best_ms(three_ops, 200, 20), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mlp_step.json")
    args = ap.parse_args()
    write({"local_pass": local_pass_ms(10), "moments": moments_us()}, args.out)


if __name__ == "__main__":
    main()
