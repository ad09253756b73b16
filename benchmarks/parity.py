"""fedcache's fedavg and fedproto against a plain per-client reference loop, on the same cached features.

The reference is written here with ordinary ``torch.nn`` modules, one client at a time, in the order
of operations of PFLlib's FedAvg and FedProto (serveravg/clientavg, serverproto/clientproto, which
train as the FedProto authors' code does):
- every client starts from one deep-copied model (``torch.manual_seed`` then one draw);
- each round every client trains one local epoch with SGD on shuffled batches, dropping the
  incomplete last batch (``DataLoader(drop_last=True)``);
- FedAvg: the server averages the parameters weighted by training-set sizes;
- FedProto: loss CE + lam * MSELoss(target, representation), the target being a copy of the
  representation with each row whose class has a global prototype replaced by it (no term before
  the first global prototypes exist); the client's prototypes are the class means of the
  representations its training steps produced; the server takes the plain mean over clients of
  each class's prototypes; prediction is the nearest global prototype (MSE) in evaluation mode;
- accuracy is pooled over all clients' test sets (correct / total), after every round; PFLlib prints
  the best round, this reports the last and the best.

fedcache runs ``fedavg`` (linear head) and ``fedproto`` with PFLLIB's options (fedproto.PFLLIB), and
``fedproto`` with its defaults for comparison. Its accuracy is pooled the same way from its per-client
accuracies. Each seed times fedcache and the reference on the same data back to back (alternating
which goes first); the speed ratio is fedcache's seconds over the reference's, whole 50-round runs with
evaluation every round, data loading excluded.

Usage: .venv/bin/python benchmarks/parity.py --store parity.zarr (after `fedcache extract -d digits5-offline -b efficientnet-lite0 --store parity.zarr`) [--seeds 3] [--rounds 50]
       .venv/bin/python benchmarks/parity.py --tiny --out /tmp/parity.json   # smoke run on a synthetic store
"""
from __future__ import annotations

import argparse
import json
import copy
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from fedcache.federate.data import FederatedData
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods.fedproto import PFLLIB
from fedcache.training import TrainConfig, prepare

SGD = ["optim.optimizer=sgd", "optim.lr=0.01", "optim.momentum=0", "optim.weight_decay=0"]
LR, BATCH, LAM = 0.01, 32, 1.0
# (label, fedcache method, head, fedcache settings, reference algorithm)
CASES = [
    ("fedavg", "fedavg", "linear", [], "fedavg"),
    ("fedproto (PFLlib options)", "fedproto", "mlp", [f"method.{k}={v}" for k, v in PFLLIB.items()], "fedproto"),
    # the same reference as above: its run is not repeated
    ("fedproto (fedcache defaults, predict=proto)", "fedproto", "mlp", ["method.predict=proto"], None),
    # the defaults with one PFLlib option each (docs/results/fedproto-parity.md)
    *((f"fedproto (defaults, predict=proto, {opt})", "fedproto", "mlp", ["method.predict=proto", f"method.{opt}"], None)
      for opt in ("init=shared", "drop_last=true", "local_protos=every-epoch")),
]
Batches = Callable[[int, int], list[np.ndarray]]  # (round, client) -> the row indices of each step


# ---- the reference ------------------------------------------------------------------------------
def make_model(dim: int, n_classes: int, head: str) -> nn.ModuleDict:
    """PFLlib's BaseHeadSplit: ``base`` (the representation) and ``head`` (the classifier)."""
    if head == "linear":
        return nn.ModuleDict({"base": nn.Identity(), "head": nn.Linear(dim, n_classes)})
    return nn.ModuleDict({"base": nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.BatchNorm1d(256)),
                          "head": nn.Linear(256, n_classes)})


def shuffled_batches(data: FederatedData, seed: int, batch: int) -> Batches:
    """DataLoader(shuffle=True, drop_last=True) over each client's rows, one generator per run."""
    gen = torch.Generator().manual_seed(seed)

    def batches(rnd: int, k: int) -> list[np.ndarray]:
        rows = data.client_train[k][torch.randperm(len(data.client_train[k]), generator=gen).numpy()]
        return [rows[i:i + batch] for i in range(0, len(rows) - batch + 1, batch)]

    return batches


def reference_fedavg(data: FederatedData, rounds: int, model: nn.Module, batches: Batches, lr: float = LR) -> list[float]:
    """Pooled test accuracy of the global model after each round; ``model`` ends as the last global model."""
    glob, accs = model, []
    sizes = torch.tensor([float(len(r)) for r in data.client_train])
    for rnd in range(rounds):
        states = []
        for k in range(data.n_clients):
            local = copy.deepcopy(glob)
            opt = torch.optim.SGD(local.parameters(), lr=lr)
            _local_epoch(local, opt, data, batches(rnd, k), lambda m, x, y: nn.functional.cross_entropy(m["head"](m["base"](x)), y))
            states.append(local.state_dict())
        w = sizes / sizes.sum()
        glob.load_state_dict({n: sum(wk * s[n].float() for wk, s in zip(w, states)) for n in states[0]})
        accs.append(_pooled(data, [glob] * data.n_clients, lambda m, x: m["head"](m["base"](x))))
    return accs


def reference_fedproto(data: FederatedData, rounds: int, models: list[nn.Module], batches: Batches,
                       lr: float = LR, lam: float = LAM) -> list[float]:
    """Pooled test accuracy (nearest global prototype) of the clients' own models after each round;
    ``models`` are trained in place."""
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in models]
    glob: dict[int, torch.Tensor] = {}
    accs = []
    for rnd in range(rounds):
        uploads = [_proto_epoch(models[k], opts[k], data, batches(rnd, k), glob, lam) for k in range(data.n_clients)]
        glob = {c: torch.stack([u[c] for u in uploads if c in u]).mean(0) for c in sorted(set().union(*uploads))}
        accs.append(_pooled(data, models, lambda m, x: _nearest(m["base"](x), glob, data.n_classes)))
    return accs


def _proto_epoch(model: nn.Module, opt, data: FederatedData, steps: list[np.ndarray], glob: dict, lam: float) -> dict:
    reps: dict[int, list[torch.Tensor]] = {}
    mse = nn.MSELoss()

    def loss(m, x, y):
        rep = m["base"](x)
        out = nn.functional.cross_entropy(m["head"](rep), y)
        if glob:
            target = rep.detach().clone()
            for i, c in enumerate(y.tolist()):
                if c in glob:
                    target[i] = glob[c]
            out = out + lam * mse(target, rep)
        for i, c in enumerate(y.tolist()):
            reps.setdefault(c, []).append(rep[i].detach())
        return out

    _local_epoch(model, opt, data, steps, loss)
    return {c: torch.stack(r).mean(0) for c, r in reps.items()}


def _local_epoch(model: nn.Module, opt, data: FederatedData, steps: list[np.ndarray], loss) -> None:
    model.train()
    for rows in steps:
        idx = torch.from_numpy(rows)
        opt.zero_grad()
        loss(model, data.x_train[idx], data.y_train[idx]).backward()
        opt.step()


def _nearest(rep: torch.Tensor, glob: dict, n_classes: int) -> torch.Tensor:
    """Minus the per-dimension mean squared distance to each global prototype; -inf without one."""
    scores = torch.full((len(rep), n_classes), float("-inf"))
    for c, p in glob.items():
        scores[:, c] = -((rep - p) ** 2).mean(-1)
    return scores


def _pooled(data: FederatedData, models: list[nn.Module], predict) -> float:
    correct = total = 0
    with torch.no_grad():
        for k, m in enumerate(models):
            m.eval()
            idx = torch.from_numpy(data.client_test[k])
            correct += int((predict(m, data.x_test[idx]).argmax(-1) == data.y_test[idx]).sum())
            total += len(idx)
    return 100.0 * correct / total


# ---- the data ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Data:
    store: Path
    dataset: str = "digits5-offline"
    backbone: str = "efficientnet-lite0"
    few_shot: int = 10


def tiny_store(path: Path) -> Data:
    """5 domains x 10 classes x 4 training rows of 16-d Gaussian classes, imported as a store entry: the
    benchmark's shapes without an extraction (checks that the script runs; measures nothing)."""
    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.interchange import import_file

    rng = np.random.default_rng(0)
    means = rng.normal(size=(10, 16)).astype(np.float32)
    arrays = {"classes": np.array(json.dumps([str(c) for c in range(10)])),
              "domains": np.array(json.dumps([f"d{k}" for k in range(5)]))}
    for split, per in (("train", 4), ("test", 2)):
        y = np.tile(np.repeat(np.arange(10), per), 5)
        arrays |= {f"{split}__features": means[y] + rng.normal(size=(len(y), 16)).astype(np.float32),
                   f"{split}__labels": y, f"{split}__domains": np.repeat(np.arange(5), 10 * per)}
    path.mkdir(parents=True, exist_ok=True)
    np.savez(path / "tiny.npz", **arrays)
    import_file(FeatureStore(path / "store.zarr"), path / "tiny.npz", "tiny-domains", "imported")
    return Data(path / "store.zarr", "tiny-domains", "imported", few_shot=4)


# ---- fedcache's side --------------------------------------------------------------------------------
def fedcache_method(data: Data, method: str, head: str, settings: list[str], seed: int, rounds: int):
    cfg = TrainConfig(store=data.store, dataset=data.dataset, backbones=[data.backbone], method=method, partition="domain",
                      clients=5, few_shot=data.few_shot, rounds=rounds, batch_size=BATCH, seed=seed, head=head,
                      settings=SGD + settings)
    return prepare(cfg)[0]


def pooled_history(method, history: list[dict]) -> list[float]:
    sizes = np.array([len(r) for r in method.ctx.data.client_test], dtype=np.float64)
    return [float((np.array(h["per_client"]) * sizes).sum() / sizes.sum()) for h in history]


def one_seed(source: Data, case: tuple, seed: int, rounds: int) -> dict:
    label, name, head, settings, algorithm = case
    method = fedcache_method(source, name, head, settings, seed, rounds)
    data = method.ctx.data

    def ours():
        return pooled_history(method, run(method, RunConfig(rounds=rounds)).history)

    def theirs():
        torch.manual_seed(seed)
        model = make_model(data.dim, data.n_classes, head)
        batches = shuffled_batches(data, seed, BATCH)
        if algorithm == "fedavg":
            return reference_fedavg(data, rounds, model, batches)
        return reference_fedproto(data, rounds, [copy.deepcopy(model) for _ in range(data.n_clients)], batches)

    order = [("fedcache", ours), ("reference", theirs)] if algorithm else [("fedcache", ours)]
    out = {}
    for side, fn in order if seed % 2 == 0 else order[::-1]:  # alternate which runs first
        t0 = time.perf_counter()
        accs = fn()
        out[side] = {"seconds": time.perf_counter() - t0, "last": accs[-1], "best": max(accs)}
    return {"case": label, "seed": seed, **out}


def summarize(runs: list[dict]) -> dict:
    def ms(values):
        return {"mean": round(statistics.mean(values), 2), "std": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0}

    sides = [s for s in ("fedcache", "reference") if s in runs[0]]
    out = {side: {k: ms([r[side][k] for r in runs]) for k in ("last", "best")} for side in sides}
    if "reference" in sides:
        ratio = [r["fedcache"]["seconds"] / r["reference"]["seconds"] for r in runs]
        out["speed_ratio_fedcache_over_reference"] = {"median": round(statistics.median(ratio), 3), "per_seed": [round(x, 3) for x in ratio]}
    return out


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from _results import earlier_metas, write

    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, help="a copy of a store with digits5-offline efficientnet-lite0 features (training writes partitions)")
    ap.add_argument("--tiny", action="store_true", help="a synthetic 5-domain store in a temporary directory: checks the script runs")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--only", default="", help="run only the cases whose label contains this text")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "parity.json")
    args = ap.parse_args(argv)
    if (args.store is None) == (not args.tiny):
        ap.error("give --store (the benchmark) or --tiny (a smoke run), not both")
    # With --only, the other cases' stored results stay, and so does the meta of the run that measured them.
    earlier = json.loads(args.out.read_text()) if args.only and args.out.exists() else {}
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        source = tiny_store(Path(tmp)) if args.tiny else Data(args.store)
        results = run_cases(source, args, earlier.get("results", []))
    res = {"setup": {"dataset": source.dataset, "backbone": source.backbone, "partition": "domain", "clients": 5,
                     "few_shot": source.few_shot, "rounds": args.rounds, "batch": BATCH, "optimizer": "SGD lr 0.01, no momentum",
                     "local_epochs": 1, "lam": LAM, "accuracy": "pooled over all clients' test sets"},
           "results": results}
    if any(args.only not in r["case"] for r in results):  # some cases are earlier runs'
        res["meta_of_case"] = earlier_metas(earlier, [r["case"] for r in results if args.only not in r["case"]])
    write(res, args.out)


def run_cases(source: Data, args, earlier: list[dict]) -> list[dict]:
    """The cases --only names, run; the others' results from ``earlier`` (in CASES order)."""
    kept = {r["case"]: r for r in earlier}
    for case in (c for c in CASES if args.only in c[0]):
        runs = [one_seed(source, case, s, args.rounds) for s in range(args.first_seed, args.first_seed + args.seeds)]
        kept[case[0]] = {"case": case[0], "fedcache_settings": case[3], "runs": runs, **summarize(runs)}
    return [kept[c[0]] for c in CASES if c[0] in kept]


if __name__ == "__main__":
    main()
