"""FLESD against fedavg-ssl, fedprox-ssl, min-local and the raw-feature linear probe, measured.

Dirichlet label skew over 6 clients (alpha in {100, 1, 0.01}); every self-supervised method trains
the same MLP encoder with SimCLR on two cached augmented views per training image, for
``--local-epochs`` epochs per round; accuracy is the linear probe of the encoder's representation
on the labelled test split after 1, 2 and 5 rounds (one 5-round run, evaluated every round).
Min-local's encoders are probed one by one on the whole test split (worst and mean client).
Bytes are what all clients sent (up) and received (down) up to that round.

    .venv/bin/python benchmarks/flesd_results.py --store /work/stores/flesd.zarr --dataset cifar10-1k \\
        --out benchmarks/results/flesd.json
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from fedcache.federate.data import load_fused
from fedcache.federate.loop import RunConfig, run
from fedcache.federate.methods._simclr import probe_logits
from fedcache.federate.train import TrainConfig, prepare, train
from fedcache.store.feature_store import FeatureStore

REPORT_ROUNDS = (1, 2, 5)
ALPHAS = (100.0, 1.0, 0.01)
# Encoder and training sizes: chosen so the whole grid runs in about 20 minutes on one CPU thread.
ENCODER = ["hidden=256", "out=64", "probe_rows=0"]
FLESD = ["public_rows=1024", "distill_epochs=20", "distill_batch=128", "queue=1024", "momentum=0.99"]
RUNS = {  # row label -> (method, its settings besides ENCODER)
    "flesd": ("flesd", FLESD),
    "flesd, top 1% int8": ("flesd", FLESD + ["top_percent=1", "precision=int8"]),
    "fedavg-ssl": ("fedavg-ssl", []),
    "fedprox-ssl": ("fedprox-ssl", []),
}


def config(args, method: str, alpha: float, rounds: int, extra: list[str] = ()) -> TrainConfig:
    settings = [] if method == "linear-probe" else ENCODER + list(extra)
    return TrainConfig(store=args.store, dataset=args.dataset, backbones=[args.backbone], method=method,
                       partition="dirichlet", clients=args.clients, alpha=alpha, rounds=rounds,
                       local_epochs=args.local_epochs, batch_size=args.batch_size, seed=args.seed,
                       settings=settings)


def federated(args, tables, label: str, alpha: float) -> dict:
    method, extra = RUNS[label]
    t0 = time.perf_counter()
    result = train(config(args, method, alpha, max(REPORT_ROUNDS), extra), tables=tables)
    rows = {h["round"]: h for h in result.history}
    return {"seconds": round(time.perf_counter() - t0, 1),
            "rounds": {r: {"accuracy": round(rows[r]["global_accuracy"], 2), "bytes_up": rows[r]["bytes_up"],
                           "bytes_down": rows[r]["bytes_down"]} for r in REPORT_ROUNDS}}


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return 100.0 * float((logits.argmax(1) == y).float().mean())


def min_local(args, tables, alpha: float) -> dict:
    """One run per round count (a run's first R rounds equal an R-round run); each client's encoder is
    probed on the whole test split."""
    t0, out = time.perf_counter(), {}
    for r in REPORT_ROUNDS:
        method, _ = prepare(config(args, "min-local", alpha, r), tables)
        states = run(method, RunConfig(rounds=r, eval_every=r)).clients
        d = method.ctx.data
        acc = [accuracy(probe_logits({n: t[k: k + 1] for n, t in states.items()}, d, method.eval_rows, d.x_test,
                                     method.p.probe_c, args.seed), d.y_test) for k in range(d.n_clients)]
        out[r] = {"accuracy": round(min(acc), 2), "mean_accuracy": round(float(np.mean(acc)), 2),
                  "per_client": [round(a, 2) for a in acc], "bytes_up": 0, "bytes_down": 0}
    return {"seconds": round(time.perf_counter() - t0, 1), "rounds": out}


def references(args, tables, alpha: float) -> dict:
    """The linear probe of the raw cached features, and of the untrained (random) encoder."""
    raw = train(config(args, "linear-probe", alpha, 1), tables=tables).summary["global_accuracy"]
    method, _ = prepare(config(args, "fedavg-ssl", alpha, 1), tables)
    untrained = accuracy(method.global_logits(method.init_server(), method.ctx.data.x_test), method.ctx.data.y_test)
    return {"raw_probe": round(raw, 2), "untrained_encoder": round(untrained, 2)}


def render(path: Path) -> str:
    """The markdown tables of docs/methods/flesd.md from the results JSON."""
    res = json.loads(path.read_text())["results"]
    cols = [(r, n) for r in res for n in REPORT_ROUNDS]
    lines = ["| method | " + " | ".join(f"alpha={r['alpha']:g}, R={n}" for r, n in cols) + " |", "|---" * (1 + len(cols)) + "|"]
    for key, label in (("raw_probe", "raw-feature probe"), ("untrained_encoder", "untrained encoder")):
        lines.append(f"| {label} | " + " | ".join(f"{r[key]:.2f}" for r, _ in cols) + " |")
    for m in res[0]["methods"]:
        cells = []
        for r, n in cols:
            c = r["methods"][m]["rounds"][str(n)]
            cells.append(f"{c['accuracy']:.2f}" + (f" (mean {c['mean_accuracy']:.2f})" if "mean_accuracy" in c else ""))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "| bytes per round, all clients (up / down) | " + " | ".join(
        f"alpha={r['alpha']:g} (public rows {r['public_rows']})" for r in res) + " |", "|---" * (1 + len(res)) + "|"]
    for m in RUNS:
        cells = [r["methods"][m]["rounds"]["1"] for r in res]
        lines.append(f"| {m} | " + " | ".join(f"{c['bytes_up']:,} / {c['bytes_down']:,}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--dataset", default="cifar10-1k")
    ap.add_argument("--backbone", default="efficientnet-lite0")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--local-epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/flesd.json"))
    ap.add_argument("--render", action="store_true", help="print the markdown tables of --out and exit")
    args = ap.parse_args()
    if args.render:
        print(render(args.out))
        return
    torch.set_num_threads(1)
    store = FeatureStore(args.store, create=False)
    tables = tuple(load_fused(store, args.dataset, [args.backbone], s) for s in ("train", "test"))
    results = []
    for alpha in ALPHAS:
        row = {"alpha": alpha, **references(args, tables, alpha), "methods": {}}
        method, _ = prepare(config(args, "flesd", alpha, 1, FLESD), tables)
        row["public_rows"] = len(method.public)
        row["client_sizes"] = [len(r) for r in method.ctx.data.client_train]  # FLESD's trainers: clients 1..5
        for label in RUNS:
            row["methods"][label] = federated(args, tables, label, alpha)
            print(alpha, label, row["methods"][label], flush=True)
        row["methods"]["min-local"] = min_local(args, tables, alpha)
        print(alpha, "min-local", row["methods"]["min-local"], flush=True)
        results.append(row)
    meta = {"command": "benchmarks/flesd_results.py", "args": {k: str(v) for k, v in vars(args).items()},
            "encoder_settings": ENCODER, "runs": RUNS, "machine": platform.processor() or platform.machine(),
            "threads": 1}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
