"""FLESD against fedavg-ssl, fedprox-ssl, min-local and the raw-feature linear probe, measured with the
structure of the paper's Table 1 at a size one CPU runs in minutes.

Dirichlet label skew over 6 clients (alpha in {100, 1, 0.01}; client 0 is FLESD's public set and an
ordinary client for the others), all clients every round. A fixed budget of local epochs, split as in
Table 1: FedAvg/FedProx R = 10 rounds, FLESD R = 2, Min-Local 1 round. Every self-supervised method
trains the same MLP encoder with local SimCLR on two cached augmented views per training image;
accuracy is the linear probe of the final encoder's representation on the test split. Min-Local's
encoders are probed one by one on the whole test split (worst and mean client, as the paper's row).
Bytes are per sending client and round.

    .venv/bin/python benchmarks/flesd_results.py --store STORE --dataset cifar10-1k --out benchmarks/results/flesd.json
    .venv/bin/python benchmarks/flesd_results.py --render benchmarks/results/flesd*.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _results import meta  # noqa: E402

from fedcache.federate.data import load_fused  # noqa: E402
from fedcache.federate.loop import RunConfig, run  # noqa: E402
from fedcache.federate.methods._simclr import probe_logits  # noqa: E402
from fedcache.federate.train import TrainConfig, prepare, train  # noqa: E402
from fedcache.store.feature_store import FeatureStore  # noqa: E402

ALPHAS = (100.0, 1.0, 0.01)
# A smaller encoder than the default 512 / 128 and a probe on 2,000 labelled rows, for CPU time.
ENCODER = ["hidden=256", "out=64", "probe_rows=2000"]
# The official distillation settings with K 2048 scaled to the public set (4 batches) and its per-epoch queue fill;
# 20 distillation epochs instead of 200, for CPU time.
FLESD = ["distill_epochs=20", "distill_batch=128", "queue=512", "queue_warmup=epoch"]
RUNS = {  # row label -> (method, rounds, settings besides ENCODER, alphas or None for all)
    "flesd": ("flesd", 2, FLESD, None),
    "flesd, method.momentum=0.99": ("flesd", 2, FLESD + ["method.momentum=0.99"], None),
    "flesd, upload=similarities": ("flesd", 2, FLESD + ["upload=similarities"], (1.0,)),
    "flesd, upload=similarities, top 1% int8": ("flesd", 2, FLESD + ["upload=similarities", "top_percent=1",
                                                                     "precision=int8"], (1.0,)),
    "fedavg-ssl": ("fedavg-ssl", 10, [], None),
    "fedprox-ssl": ("fedprox-ssl", 10, [], None),
}


def config(args, method: str, alpha: float, rounds: int, extra: list[str] = ()) -> TrainConfig:
    settings = [] if method == "linear-probe" else ENCODER + list(extra)
    return TrainConfig(store=args.store, dataset=args.dataset, backbones=[args.backbone], method=method,
                       partition="dirichlet", clients=args.clients, alpha=alpha, rounds=rounds,
                       local_epochs=args.total_epochs // rounds, batch_size=args.batch_size, seed=args.seed,
                       settings=settings, eval_every=rounds)


def federated(args, tables, label: str, alpha: float) -> dict:
    method, rounds, extra, _ = RUNS[label]
    t0 = time.perf_counter()
    s = train(config(args, method, alpha, rounds, extra), tables=tables).summary
    senders = len(s["per_client_accuracy"])
    return {"seconds": round(time.perf_counter() - t0, 1), "rounds": rounds, "accuracy": round(s["global_accuracy"], 2),
            "bytes_up_per_client_round": s["bytes_up"] // (rounds * senders),
            "bytes_down_per_client_round": s["bytes_down"] // (rounds * senders)}


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return 100.0 * float((logits.argmax(1) == y).float().mean())


def min_local(args, tables, alpha: float) -> dict:
    """Each client's encoder, trained alone for the whole budget, probed on the whole test split."""
    t0 = time.perf_counter()
    method, _ = prepare(config(args, "min-local", alpha, 1), tables)
    states = run(method, RunConfig(rounds=1, eval_every=1)).clients
    d = method.ctx.data
    acc = [accuracy(probe_logits({n: t[k: k + 1] for n, t in states.items()}, d, method.eval_rows, d.x_test,
                                 method.p.probe_c, args.seed), d.y_test) for k in range(d.n_clients)]
    return {"seconds": round(time.perf_counter() - t0, 1), "rounds": 1, "accuracy": round(min(acc), 2),
            "mean_accuracy": round(float(np.mean(acc)), 2), "per_client": [round(a, 2) for a in acc],
            "bytes_up_per_client_round": 0, "bytes_down_per_client_round": 0}


def references(args, tables, alpha: float) -> dict:
    """The linear probe of the raw cached features, and of the untrained (random) encoder."""
    raw = train(config(args, "linear-probe", alpha, 1), tables=tables).summary["global_accuracy"]
    method, _ = prepare(config(args, "fedavg-ssl", alpha, 1), tables)
    untrained = accuracy(method.global_logits(method.init_server(), method.ctx.data.x_test), method.ctx.data.y_test)
    return {"raw_probe": round(raw, 2), "untrained_encoder": round(untrained, 2)}


def merged(paths: list[Path]) -> list[dict]:
    """The results of several runs of this script (e.g. run in parallel on parts of the grid), by alpha."""
    rows: dict[float, dict] = {}
    for path in paths:
        for r in json.loads(path.read_text())["results"]:
            row = rows.setdefault(r["alpha"], {k: v for k, v in r.items() if k != "methods"} | {"methods": {}})
            row.update({k: v for k, v in r.items() if k != "methods"})
            row["methods"].update(r["methods"])
    return [rows[a] for a in sorted(rows, reverse=True)]


def render(paths: list[Path]) -> str:
    """The markdown table of docs/methods/flesd.md from the results JSON files."""
    res = merged(paths)
    lines = ["| method | R | " + " | ".join(f"alpha={r['alpha']:g}" for r in res) + " | bytes up / down per client and round |",
             "|---" * (3 + len(res)) + "|"]
    for key, label in (("raw_probe", "raw-feature probe"), ("untrained_encoder", "untrained encoder")):
        if all(key in r for r in res):
            lines.append(f"| {label} | - | " + " | ".join(f"{r[key]:.2f}" for r in res) + " | - |")
    for m in RUNS | {"min-local": None}:
        cells = [r["methods"].get(m) for r in res]
        first = next((c for c in cells if c), None)
        if first is None:
            continue
        txt = ["-" if c is None else f"{c['accuracy']:.2f}" + (f" (mean {c['mean_accuracy']:.2f})" if "mean_accuracy" in c else "")
               for c in cells]
        lines.append(f"| {m} | {first['rounds']} | " + " | ".join(txt)
                     + f" | {first['bytes_up_per_client_round']:,} / {first['bytes_down_per_client_round']:,} |")
    sizes = "; ".join(f"alpha={r['alpha']:g}: public set {r['public_rows']} rows, FLESD's trainers {r['client_sizes']}" for r in res)
    return "\n".join(lines) + "\n\n" + sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path)
    ap.add_argument("--dataset", default="cifar10-1k")
    ap.add_argument("--backbone", default="efficientnet-lite0")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--total-epochs", type=int, default=10, help="local epochs in all (split over the rounds)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alphas", default=",".join(f"{a:g}" for a in ALPHAS))
    ap.add_argument("--only", default="", help="semicolon-separated row labels (and 'references', 'min-local'); default all")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/flesd.json"))
    ap.add_argument("--render", nargs="*", type=Path, help="print the markdown table of these result files and exit")
    args = ap.parse_args()
    if args.render:
        print(render(args.render))
        return
    only = set(filter(None, args.only.split(";")))
    torch.set_num_threads(1)
    store = FeatureStore(args.store, create=False)
    tables = tuple(load_fused(store, args.dataset, [args.backbone], s) for s in ("train", "test"))
    results = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        row = {"alpha": alpha, "methods": {}}
        if not only or "references" in only:
            row.update(references(args, tables, alpha))
        method, _ = prepare(config(args, "flesd", alpha, 2, FLESD), tables)
        row["public_rows"] = len(method.public)
        row["client_sizes"] = [len(r) for r in method.ctx.data.client_train]  # FLESD's trainers: clients 1..5
        for label, (_, _, _, alphas) in RUNS.items():
            if (alphas is None or alpha in alphas) and (not only or label in only):
                row["methods"][label] = federated(args, tables, label, alpha)
                print(alpha, label, row["methods"][label], flush=True)
        if not only or "min-local" in only:
            row["methods"]["min-local"] = min_local(args, tables, alpha)
            print(alpha, "min-local", row["methods"]["min-local"], flush=True)
        results.append(row)
    info = {"command": "benchmarks/flesd_results.py " + " ".join(sys.argv[1:]), "encoder_settings": ENCODER,
            "runs": RUNS, **meta()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": info, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
