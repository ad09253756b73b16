"""Evaluating a personal method at thousands of clients: every client evaluated every round, the never-trained ones'
scores kept from the evaluation that first scored them, against the same run scoring every client at every
evaluation (``--reference rescored``, the default), or against the draws of never-trained clients' random heads as
fedcache made them before (``--reference stacked``: each head copied out of its block with ``torch.stack``, scaled
out of place).

One run of --method (fedproto: each client's own random mlp head, ``heads/draws.py``; pfedme: every client starting
from one copy of the initial global model) on synthetic features, --sampled clients a round out of --clients (IID),
every client evaluated every round on its local test rows (--local-test each), in this process. The two arms
alternate --trials times each (the order reversed every other pair); each arm's run is timed whole, its rounds'
local training (``InProcess._round``) on its own, and the time spent making never-trained clients' initial states
(``ClientStates``' maker: draws, and copies of a shared start) on its own. Every arm's per-client accuracies and
trained heads must be equal, bit for bit (``same_outputs``).

    .venv/bin/python benchmarks/personal_eval.py [--clients 1000] [--rounds 3] [--trials 5] [--method pfedme]
    .venv/bin/python benchmarks/personal_eval.py --tiny --out /tmp/p.json      # seconds: a smoke run
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "personal_eval.json"
DATA = ("personal-eval", "synthetic")
REFERENCES = ("rescored", "stacked")  # the arms fedcache's (current) is run against (below)


def write_features(store: Path, dim: int, classes: int, rows: int) -> None:
    """Random ``dim``-dimensional rows around random class means, imported into ``store``."""
    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.interchange import import_file

    rng = np.random.default_rng(0)
    means = 2 * rng.normal(size=(classes, dim))
    arrays = {}
    for split, n in (("train", rows), ("test", rows // 5)):
        labels = rng.integers(0, classes, n)
        arrays[f"{split}__features"] = (rng.normal(size=(n, dim)) + means[labels]).astype(np.float32)
        arrays[f"{split}__labels"] = labels
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "f.npz", **arrays, classes=np.array(json.dumps([f"c{i}" for i in range(classes)])))
        import_file(FeatureStore(store), Path(tmp) / "f.npz", *DATA)


# ---- the reference: the draws as fedcache made them before --------------------------------------------------
def stacked_rows(self, clients):
    """``ClientHeads.rows`` before: every asked client's head copied out of its drawn block with ``torch.stack``."""
    from fedcache.heads import draws

    clients = [int(c) for c in clients]
    blocks = sorted({c // draws.BLOCK for c in clients})
    out = {}
    for p in self.layout:
        if p.name not in self.states:
            out[p.name] = torch.full((len(clients), *p.shape), p.fill)
            continue
        drawn = {b: self._block(p, b) for b in blocks}
        out[p.name] = torch.stack([drawn[c // draws.BLOCK][c % draws.BLOCK] for c in clients]) if clients \
            else torch.zeros(0, *p.shape)
    return out


def scaled_out_of_place(shape, fan_in, gen):
    """``heads.base.uniform_init`` before: three tensors of the draws, where it now scales one in place."""
    bound = 1.0 / fan_in**0.5
    return ((torch.rand(shape, generator=gen, device=gen.device) * 2 - 1) * bound).to(torch.get_default_device())


def rescored(method, state) -> bool:
    """``inprocess._scores_kept`` before: no score kept, every client scored at every evaluation."""
    return False


# arm -> the functions it runs with in place of fedcache's, by name (owners: where each name lives)
REPLACED = {"current": {}, "stacked": {"rows": stacked_rows, "uniform_init": scaled_out_of_place},
            "rescored": {"_scores_kept": rescored}}


def owners() -> dict:
    from fedcache.federate import inprocess
    from fedcache.heads import base, draws

    return {"rows": draws.ClientHeads, "uniform_init": base, "_scores_kept": inprocess}


@contextlib.contextmanager
def arm(name: str):
    where = owners()
    saved = {k: getattr(where[k], k) for k in REPLACED[name]}
    for k, f in REPLACED[name].items():
        setattr(where[k], k, f)
    try:
        yield
    finally:
        for k, f in saved.items():
            setattr(where[k], k, f)


# ---- one run ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def timing_initial_states(spent: list[float]):
    """Adds to ``spent`` the seconds ``ClientStates`` spends making never-trained clients' initial states."""
    from fedcache.federate import clients

    real = clients.ClientStates.take

    def take(self, who, names=None):
        made = self._initial
        if made is not None:
            def timed(ids):
                t0 = time.perf_counter()
                out = made(ids)
                spent.append(time.perf_counter() - t0)
                return out
            self._initial = timed
        try:
            return real(self, who, names)
        finally:
            self._initial = made

    clients.ClientStates.take = take
    try:
        yield
    finally:
        clients.ClientStates.take = real


@contextlib.contextmanager
def timing_rounds(spent: list[float]):
    """Adds to ``spent`` the seconds of each round's local training (``InProcess._round``)."""
    from fedcache.federate import inprocess

    real = inprocess.InProcess._round

    def timed(self, *args):
        t0 = time.perf_counter()
        try:
            return real(self, *args)
        finally:
            spent.append(time.perf_counter() - t0)

    inprocess.InProcess._round = timed
    try:
        yield
    finally:
        inprocess.InProcess._round = real


def one_run(store: Path, args, name: str) -> dict:
    from fedcache.federate.inprocess import RunConfig, run
    from fedcache.spec import RunSpec
    from fedcache.training import prepare

    spec = RunSpec.of(store=store, dataset=DATA[0], backbones=[DATA[1]], method=args.method, head="mlp",
                      partition="iid", clients=args.clients, local_test=args.local_test,
                      fraction=args.sampled / args.clients, rounds=args.rounds)
    spent, rounds = [], []
    with arm(name), tempfile.TemporaryDirectory() as out:
        method, _ = prepare(spec)  # setup (the draw points of every client's head) is not timed
        t0 = time.perf_counter()
        with timing_initial_states(spent), timing_rounds(rounds):
            result = run(method, RunConfig(args.rounds, args.sampled / args.clients, eval_every=1, out=Path(out)))
        wall = time.perf_counter() - t0
    trained = result.clients.checkpoint()["clients"]  # the trained clients' heads, byte for byte
    digest = hashlib.sha256(b"".join(trained[k].contiguous().numpy().tobytes() for k in sorted(trained))).hexdigest()
    per_client = [h.get("per_client") for h in result.history]  # every evaluation's
    return {"run_s": wall, "initial_states_s": sum(spent), "rounds_s": sum(rounds), "outputs": [per_client, digest]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--sampled", type=int, default=10, help="clients a round")
    ap.add_argument("--rounds", type=int, default=3, help="each evaluated")
    ap.add_argument("--local-test", type=int, default=1000, help="local test rows per client (the partition's default)")
    ap.add_argument("--dim", type=int, default=1280, help="feature dimensions (1280: the mlp head has 331,530 parameters)")
    ap.add_argument("--method", choices=("fedproto", "pfedme"), default="fedproto")
    ap.add_argument("--reference", choices=REFERENCES, default="rescored")
    ap.add_argument("--trials", type=int, default=5, help="runs of each arm")
    ap.add_argument("--tiny", action="store_true", help="64 clients of 32 dimensions: checks the benchmark runs")
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    if args.tiny:
        args.clients, args.dim, args.local_test, args.trials = 64, 32, 50, 1
    arms = ("current", args.reference)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store.zarr"
        write_features(store, args.dim, 10, max(20 * args.clients, 5000))
        one_run(store, args, "current")  # warms the imports, the page cache and the allocator
        runs: dict[str, list[dict]] = {a: [] for a in arms}
        for t in range(args.trials):
            for name in (arms if t % 2 == 0 else arms[::-1]):
                runs[name].append(one_run(store, args, name))
    first = runs["current"][0]["outputs"]
    same = all(r["outputs"] == first for rs in runs.values() for r in rs)
    res = {"what": __doc__.strip().split("\n\n")[0].replace("\n", " "),
           "command": "benchmarks/personal_eval.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "settings": {k: getattr(args, k) for k in ("method", "reference", "clients", "sampled", "rounds",
                                                      "local_test", "dim", "trials")},
           "same_outputs": same, **summary(runs, args.reference)}
    write(res, args.out)
    return res


def summary(runs: dict[str, list[dict]], reference: str) -> dict:
    cur, ref = runs["current"], runs[reference]
    pair = lambda key: [a[key] / b[key] for a, b in zip(cur, ref)]  # noqa: E731
    share = lambda key: {a: round(statistics.median(r[key] / r["run_s"] for r in rs), 3)  # noqa: E731
                         for a, rs in runs.items()}
    ratio = lambda key: {"median": round(statistics.median(pair(key)), 3),  # noqa: E731
                         "per_pair": [round(x, 3) for x in pair(key)]}
    return {"seconds": {a: [{"run": round(r["run_s"], 2), "rounds": round(r["rounds_s"], 2),
                             "initial_states": round(r["initial_states_s"], 2)} for r in rs] for a, rs in runs.items()},
            "rounds_share_of_run": share("rounds_s"), "initial_states_share_of_run": share("initial_states_s"),
            "run_current_over_reference": ratio("run_s"),
            "initial_states_current_over_reference": ratio("initial_states_s")}


if __name__ == "__main__":
    main()
