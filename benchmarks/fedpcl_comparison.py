"""FedPCL against its baselines on cached features: Table-2-style results, measured.

Hyperparameters are chosen on a validation split carved from training data (rows no client
trains on, drawn with each client's class/domain mix; `--validation` in `fedcache train`),
with seed 0 and `--tune-rounds` rounds; the chosen setting of each method is then run for
`--rounds` rounds with every seed on the test split.
The FedPCL comparison uses the paper's heads: the baselines train FedPCL's baseline head
(`mlp`: FC(D,256)-ReLU-BN-FC(256,C)), FedPCL its projection network.

    .venv/bin/python benchmarks/fedpcl_comparison.py --store S --dataset digits5-offline \\
        --backbones efficientnet-lite0 --partition domain --clients 5 --few-shot 10 --out results.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np

from fedcache.federate.train import TrainConfig, train

METHODS = ("solo", "fedavg", "pfedme", "perfedavg", "fedrep", "fedproto", "fedpcl")
HEADS = {"fedpcl": None}  # None: the method's own default (projection); the rest use "mlp"
LRS = ("1e-4", "3e-4", "1e-3", "3e-3")
EXTRA = {"fedpcl": {"tau": ("0.07", "0.2", "0.5")}}
# Fixed settings: the paper's E = 1 for every method; FedRep's own default is 10 classifier + 1 body epochs.
FIXED = {"fedrep": ["head_epochs=1"]}


def grid(method: str) -> list[list[str]]:
    axes = {"lr": LRS, **EXTRA.get(method, {})}
    return [[f"{k}={v}" for k, v in zip(axes, combo)] + FIXED.get(method, []) for combo in itertools.product(*axes.values())]


def run(args, method: str, settings: list[str], seed: int, validation: bool, rounds: int | None = None) -> dict:
    cfg = TrainConfig(
        store=args.store, dataset=args.dataset, backbones=args.backbones.split(","), method=method,
        partition=args.partition, clients=args.clients, alpha=args.alpha, few_shot=args.few_shot,
        subsample=args.subsample, rounds=rounds or args.rounds, seed=seed, head=HEADS.get(method, "mlp"),
        settings=settings, validation=validation, local_test=args.local_test,
    )
    return train(cfg).summary


def tune(args, method: str) -> tuple[list[str], list[dict]]:
    trials = []
    for settings in grid(method):
        s = run(args, method, settings, seed=0, validation=True, rounds=args.tune_rounds)
        trials.append({"settings": settings, "val_accuracy": s["mean_accuracy"]})
    best = max(trials, key=lambda t: t["val_accuracy"])
    return best["settings"], trials


def evaluate(args, method: str, settings: list[str]) -> dict:
    runs = [run(args, method, settings, seed, validation=False) for seed in args.seeds]
    means = np.array([r["mean_accuracy"] for r in runs])
    stds = np.array([r["std_accuracy"] for r in runs])
    fair = {k: float(np.mean([r[k] for r in runs])) for k in ("worst10", "worst20", "worst40", "best10", "variance")}
    return {"settings": settings, "mean": float(means.mean()), "std_over_seeds": float(means.std(ddof=1)),
            "std_over_clients": float(stds.mean()), "params_up_per_round": runs[0]["params_up_per_round"],
            "params_up_per_client": runs[0]["params_up_per_client"],
            "seeds": args.seeds, "per_seed": [float(m) for m in means], **fair,
            "random_weights": runs[0]["random_weights"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--backbones", required=True)
    ap.add_argument("--partition", default="domain")
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--alpha", type=float, default=None)
    ap.add_argument("--few-shot", type=int, default=None)
    ap.add_argument("--subsample", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--tune-rounds", type=int, default=20, help="rounds of each validation run (cheaper than --rounds)")
    ap.add_argument("--local-test", type=int, default=1000)
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.perf_counter()
    results = {}
    for method in args.methods.split(","):
        settings, trials = tune(args, method)
        results[method] = {**evaluate(args, method, settings), "tuning": trials}
        print(f"{method:10s} {results[method]['mean']:6.2f} ({results[method]['std_over_clients']:.2f}) "
              f"seeds-std {results[method]['std_over_seeds']:.2f} with {' '.join(settings)}", flush=True)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": meta, "results": results, "seconds": time.perf_counter() - t0}, indent=2) + "\n")


if __name__ == "__main__":
    main()
