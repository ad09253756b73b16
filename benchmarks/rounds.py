"""Round-loop speed on cached features, in one run (issue 3's four measurements).

(a) fedavg and fedproto, 5 clients x 100 samples x 1280-d, 50 rounds
(b) fedavg, 100 clients x 500 samples x 1024-d, 10% participation, 10 rounds
(c) as (a) for fedavg, but with the backbone in the loop: every local epoch re-encodes the
    client's images with efficientnet-lite0 at 64 px, as the papers' code does
(d) batched vs per-client-loop execution, fedavg, 100 clients, all participating, 5 rounds
(e) fedpcl, 5 clients x 100 samples (10 per class) x 3840-d (three fused 1280-d backbones), 50 rounds

(a) and (e) are also timed as the papers' official code evaluates: FedProto's once at the end, with
prototypes from the last local epoch's training steps (local_protos=last-epoch); FedPCL's every 20 rounds.

Times are whole runs of the round loop (evaluation every round included), excluding imports
and data loading; each is the best of 3 runs (1 for the slow backbone-in-the-loop case). Usage: .venv/bin/python benchmarks/rounds.py [--out FILE] [--skip-c]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from _results import write  # benchmarks/ is on sys.path when a script here runs

from fedcache.federate.data import FederatedData
from fedcache.federate.loop import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods.fedavg import FedAvg


def synthetic(n_clients: int, per_client: int, dim: int, n_classes: int = 10, seed: int = 0) -> FederatedData:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)).astype(np.float32)
    n = n_clients * per_client
    y = rng.integers(0, n_classes, 2 * n)
    x = means[y] + rng.normal(size=(2 * n, dim)).astype(np.float32)
    rows = [np.arange(k * per_client, (k + 1) * per_client) for k in range(n_clients)]
    return FederatedData(torch.from_numpy(x[:n]), torch.from_numpy(y[:n]), torch.from_numpy(x[n:]), torch.from_numpy(y[n:]),
                         rows, [r.copy() for r in rows], tuple(str(c) for c in range(n_classes)))


def timed(method_name: str, data: FederatedData, rounds: int, fraction: float = 1.0, batched: bool = True, cls=None,
          repeat: int = 3, eval_every: int = 1, **params) -> dict:
    """Best of ``repeat`` whole runs (each a fresh method), as timeit does: the least disturbed one."""
    cls = cls or METHODS.get(method_name)
    times = []
    for _ in range(repeat):
        method = cls(MethodContext(data, head=cls.default_head, rounds=rounds), cls.Params(**params))
        t0 = time.perf_counter()
        result = run(method, RunConfig(rounds=rounds, fraction=fraction, batched=batched, eval_every=eval_every))
        times.append(time.perf_counter() - t0)
    return {"method": method_name, **({"params": params} if params else {}), "eval_every": eval_every,
            "seconds": min(times), "all_seconds": times, "accuracy": result.summary["mean_accuracy"]}


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


def backbone_case(rounds: int) -> dict:
    """(c): digits5-offline images, one client per domain with 100 images, efficientnet-lite0 at 64 px."""
    from fedcache.extract.datasets import DatasetOptions
    from fedcache.extract.loading import load_backbone, load_dataset
    from fedcache.extract.transforms import Preprocess

    ds = load_dataset("digits5-offline", DatasetOptions())
    bb = load_backbone("efficientnet-lite0")
    pre = Preprocess.for_backbone(bb.spec, 64, backend="torch")
    imgs, labels = [], []
    for dom in ds.domains:
        s = ds.samples("train", dom)
        imgs += [torch.from_numpy(np.array(s.source.load_array(i))).permute(2, 0, 1) for i in range(100)]
        labels.append(s.labels[:100])
    images = torch.stack(imgs)
    with torch.inference_mode():
        feats = torch.cat([bb.image_encoder(pre.per_batch(images[i:i + 64])) for i in range(0, len(images), 64)])
    y = torch.from_numpy(np.concatenate(labels))
    rows = [np.arange(k * 100, (k + 1) * 100) for k in range(len(ds.domains))]
    data = FederatedData(feats.clone(), y, feats.clone(), y.clone(), rows, [r.copy() for r in rows], ds.classes)
    cached = timed("fedavg", data, rounds)
    loop = timed("fedavg", data, rounds, cls=in_the_loop_class(images, bb.image_encoder, pre), repeat=1)
    return {"cached_seconds": cached["seconds"], "backbone_in_loop_seconds": loop["seconds"],
            "speedup": loop["seconds"] / cached["seconds"]}


def case_a() -> list:
    small = synthetic(5, 100, 1280)
    timed("fedavg", small, 2)  # warm-up: first calls into BLAS / allocator
    res = [timed(m, small, 50) for m in ("fedavg", "fedproto")]
    # As FedProto's official code runs: prototypes from the last epoch's training steps, one evaluation at the end.
    return res + [timed("fedproto", small, 50, eval_every=50, local_protos="last-epoch")]


def case_d() -> dict:
    many = synthetic(100, 100, 256)
    batched, looped = timed("fedavg", many, 5, batched=True), timed("fedavg", many, 5, batched=False)
    return {"batched_seconds": batched["seconds"], "loop_seconds": looped["seconds"],
            "speedup": looped["seconds"] / batched["seconds"], "same_accuracy": batched["accuracy"] == looped["accuracy"]}


def case_e() -> dict:
    fused = synthetic(5, 100, 3 * 1280)
    # FedPCL's code evaluates every 20 rounds: timed that way too.
    return {**timed("fedpcl", fused, 50), "official_eval": timed("fedpcl", fused, 50, eval_every=20)}


CASES = {"a": case_a, "b": lambda: timed("fedavg", synthetic(100, 500, 1024), 10, fraction=0.1),
         "c": lambda: backbone_case(50), "d": case_d, "e": case_e}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rounds.json")
    ap.add_argument("--skip-c", action="store_true", help="skip the (slow) backbone-in-the-loop case")
    ap.add_argument("--only", default="", help="comma-separated cases to run (default: all), e.g. --only e")
    ap.add_argument("--plain-affine", action="store_true",
                    help="compute every classifier as z @ W (the B side of heads.base.affine's layout A/B)")
    args = ap.parse_args()
    if args.plain_affine:
        import fedcache.heads.base as heads_base

        heads_base.FEW_CLASSES = 0
    torch.manual_seed(0)
    chosen = args.only.split(",") if args.only else [c for c in CASES if not (c == "c" and args.skip_c)]
    res = {c: CASES[c]() for c in chosen}
    if args.only:
        print(res)
    else:
        write(res, args.out)


if __name__ == "__main__":
    main()
