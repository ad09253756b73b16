"""The round loop against named references, as ratios measured in one run.

floor    whole run / its arithmetic floor, for fedavg and fedproto (5 clients x 100 rows x 1280-d,
         linear / mlp head) and fedpcl (three fused 1280-d backbones), 50 rounds, evaluation every
         round. The floor is the work any implementation must do: per local step the first layer's
         forward product and weight gradient and the optimizer's update of those weights (fedcache's
         StackedOptimizer, torch's fused kernels), per round one forward pass over every client's rows
         (prototypes or evaluation). Everything else (BatchNorm, the small last layer, the losses,
         autograd, bookkeeping) is what the ratio measures.
batched  per-client loop / batched (every sampled client in one stacked computation), fedavg,
         100 clients x 100 rows x 256-d, 5 rounds: the speedup, and whether the accuracies are equal.
cached   a backbone re-encoding every client's images every round (efficientnet-lite0 at 64 px on
         digits5-offline, as the papers' code runs) / cached features, fedavg, 5 clients x 100 images:
         the speedup.
A and B alternate within the run (--trials pairs), so a change of the machine's speed reaches both;
the JSON keeps every pair's ratio. --tiny shrinks every shape (the smoke test). --plain-affine is the B
side of the A/B that keeps heads.base.affine's few-class layout (run the script with and without it,
alternating processes).
    .venv/bin/python benchmarks/rounds.py [--out benchmarks/results/rounds.json] [--only floor,batched] [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from _results import earlier_metas, write  # benchmarks/ is on sys.path when a script here runs

from fedcache.federate.schedule import Schedule
from fedcache.federate.data import FederatedData
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods.fedavg import FedAvg
from fedcache.federate.optim import OptimConfig, StackedOptimizer


def synthetic(n_clients: int, per_client: int, dim: int, n_classes: int = 10, seed: int = 0) -> FederatedData:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)).astype(np.float32)
    n = n_clients * per_client
    y = rng.integers(0, n_classes, 2 * n)
    x = means[y] + rng.normal(size=(2 * n, dim)).astype(np.float32)
    rows = [np.arange(k * per_client, (k + 1) * per_client) for k in range(n_clients)]
    return FederatedData(torch.from_numpy(x[:n]), torch.from_numpy(y[:n]), torch.from_numpy(x[n:]), torch.from_numpy(y[n:]),
                         rows, [r.copy() for r in rows], tuple(str(c) for c in range(n_classes)))


def whole_run(method_name: str, data: FederatedData, rounds: int, batched: bool = True, cls=None) -> tuple[float, float]:
    """(seconds, accuracy) of one whole run of the round loop, a fresh method each time."""
    cls = cls or METHODS.get(method_name)
    method = cls(MethodContext(data, head=cls.default_head, schedule=Schedule(rounds=rounds)))
    t0 = time.perf_counter()
    result = run(method, RunConfig(rounds=rounds, batched=batched))
    return time.perf_counter() - t0, result.summary["mean_accuracy"]


def floor_run(data: FederatedData, width: int, rounds: int, batch: int = 32) -> float:
    """Seconds of the floor's operations in the order a run does them (so each update evicts the weights
    the next step reads, as in a real run)."""
    k, rows, dim = len(data.client_train), len(data.client_train[0]), data.dim
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(k, dim, width, generator=gen) / dim**0.5}
    opt = StackedOptimizer(params, OptimConfig(), ("w",))
    sizes = [batch] * (rows // batch) + ([rows % batch] if rows % batch else [])
    xs = [torch.randn(k, b, dim, generator=gen) for b in sizes]
    gs = [torch.randn(k, b, width, generator=gen) for b in sizes]
    full, active = torch.randn(k, rows, dim, generator=gen), torch.ones(k, dtype=torch.bool)
    t0 = time.perf_counter()
    for _ in range(rounds):
        for x, g in zip(xs, gs):
            torch.bmm(x, params["w"])
            opt.step(params, {"w": torch.bmm(x.transpose(1, 2), g)}, active)
        torch.bmm(full, params["w"])
    return time.perf_counter() - t0


def interleaved(a, b, trials: int) -> dict:
    """Alternate A and B ``trials`` times; the ratio b/a of each pair, and their median."""
    pairs = []
    for _ in range(trials):
        ta, tb = a(), b()
        pairs.append((ta, tb))
    ratios = [tb / ta for ta, tb in pairs]
    return {"median_ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            "seconds": [[round(ta, 4), round(tb, 4)] for ta, tb in pairs]}


def case_floor(size: dict, trials: int) -> dict:
    out = {}
    for name, method, dim, width in (("fedavg", "fedavg", 1280, 10), ("fedproto", "fedproto", 1280, 256),
                                     ("fedpcl", "fedpcl", 3 * 1280, 256)):
        data = synthetic(size["clients"], size["rows"], dim // size["shrink"])
        whole_run("fedavg", data, 1)  # warm-up: first calls into BLAS and the allocator
        res = interleaved(lambda: floor_run(data, width, size["rounds"]),
                          lambda: whole_run(method, data, size["rounds"])[0], trials)
        out[name] = {"dim": data.dim, "first_layer_width": width, "rounds": size["rounds"],
                     "run_over_floor": res}
    return out


def case_batched(size: dict, trials: int) -> dict:
    data = synthetic(size["many"], 100, 256)
    accs = {}

    def side(batched: bool):
        def go() -> float:
            seconds, accs[batched] = whole_run("fedavg", data, 5, batched=batched)
            return seconds
        return go

    res = interleaved(side(True), side(False), trials)
    return {"clients": size["many"], "loop_over_batched": res, "same_accuracy": accs[True] == accs[False]}


def in_the_loop_class(images: torch.Tensor, encoder, pre):
    """FedAvg whose clients re-encode their images before local training, every round."""

    class BackboneInTheLoop(FedAvg):
        def local_update(self, rnd, clients, down, states):
            d = self.ctx.data
            for k in clients:
                rows = torch.from_numpy(d.client_train[k])
                with torch.inference_mode():
                    for lo in range(0, len(rows), 64):
                        batch = rows[lo:lo + 64]
                        d.x_train[batch] = encoder(pre.per_batch(images[batch]))
            return super().local_update(rnd, clients, down, states)

    return BackboneInTheLoop


def case_cached(size: dict, trials: int) -> dict:
    from fedcache.extract.datasets import DatasetOptions
    from fedcache.extract.loading import load_backbone, load_dataset
    from fedcache.extract.transforms import Preprocess

    ds = load_dataset("digits5-offline", DatasetOptions())
    bb = load_backbone("efficientnet-lite0")
    pre = Preprocess.for_backbone(bb.spec, 64, backend="torch")
    n = size["images"]
    imgs, labels = [], []
    for dom in ds.domains:
        s = ds.samples("train", dom)
        imgs += [torch.from_numpy(np.array(s.source.load_array(i))).permute(2, 0, 1) for i in range(n)]
        labels.append(s.labels[:n])
    images = torch.stack(imgs)
    with torch.inference_mode():
        feats = torch.cat([bb.image_encoder(pre.per_batch(images[i:i + 64])) for i in range(0, len(images), 64)])
    y = torch.from_numpy(np.concatenate(labels))
    rows = [np.arange(k * n, (k + 1) * n) for k in range(len(ds.domains))]
    data = FederatedData(feats.clone(), y, feats.clone(), y.clone(), rows, [r.copy() for r in rows], ds.classes)
    loop_cls = in_the_loop_class(images, bb.image_encoder, pre)
    res = interleaved(lambda: whole_run("fedavg", data, size["rounds"])[0],
                      lambda: whole_run("fedavg", data, size["rounds"], cls=loop_cls)[0], trials)
    return {"images_per_client": n, "rounds": size["rounds"], "in_loop_over_cached": res}


CASES = {"floor": case_floor, "batched": case_batched, "cached": case_cached}
FULL = {"clients": 5, "rows": 100, "shrink": 1, "rounds": 50, "many": 100, "images": 100}
TINY = {"clients": 2, "rows": 20, "shrink": 40, "rounds": 2, "many": 4, "images": 8}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rounds.json")
    ap.add_argument("--only", default="", help="comma-separated cases (default: all): " + ", ".join(CASES))
    ap.add_argument("--trials", type=int, default=3, help="A/B pairs per ratio")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes: checks the script runs, measures nothing")
    ap.add_argument("--plain-affine", action="store_true",
                    help="every classifier as z @ W: the B side of heads.base.affine's few-class layout A/B")
    args = ap.parse_args(argv)
    if args.plain_affine:
        import fedcache.heads.base as heads_base

        heads_base.FEW_CLASSES = 0
    torch.manual_seed(0)
    size = TINY if args.tiny else FULL
    chosen = args.only.split(",") if args.only else list(CASES)
    res = {c: CASES[c](size, args.trials) for c in chosen}
    res["size"] = size
    if args.only and args.out.exists():  # a partial run updates its cases in the existing results
        kept = json.loads(args.out.read_text())
        earlier = earlier_metas(kept, [c for c in CASES if c in kept and c not in chosen])
        res = {**{k: v for k, v in kept.items() if k not in ("meta", "meta_of_case")}, **res,
               **({"meta_of_case": earlier} if earlier else {})}
    write(res, args.out)
    return res


if __name__ == "__main__":
    main()
