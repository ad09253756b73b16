"""The CLIP-like problem of the CLIP-feature methods' tests (clip-zs, clip-fc-centralized, fst-cbdg): features whose
zero-shot errors have a known, correctable cause, and how the tests build and score a method on it."""
from __future__ import annotations

import numpy as np
import torch

from fedcache.federate.data import FederatedData
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OPTIMIZER_PRESETS, OptimConfig
from fedcache.federate.schedule import Schedule


CLIP_METHODS = ["clip-zs", "fst-cbdg", "clip-fc-centralized"]


def biased_problem(shards: int | None = None, seed: int = 0, n_clients: int = 20, per_client: int = 250,
                   dim: int = 64, n_classes: int = 10) -> FederatedData:
    """CLIP-like features whose zero-shot errors have a known, correctable cause.

    "Text" anchors T_k are unit vectors; image class centres are noisy copies of them; every image
    also carries a shared offset u (CLIP's modality gap) and the anchors lean on u by different
    amounts, so zero-shot over-predicts the classes that lean most (about 58% accuracy instead of
    ~100% without the offset). Balancing the pseudo-classes, what FST-CBDG's synthetic sampling
    does, removes that class-prior bias; self-training alone cannot (its first targets equal the
    model's own predictions). Without the offset, zero-shot's errors would be purely directional and
    FST-CBDG would have little to correct (docs/results/fst-cbdg-synthetic.md has this problem's table)."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=dim)
    u /= np.linalg.norm(u)
    g = rng.normal(size=(n_classes, dim))
    g -= np.outer(g @ u, u)
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    text = g + 2.0 * rng.permutation(np.linspace(0, 1, n_classes))[:, None] * u
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    centres = text + rng.normal(size=(n_classes, dim)) / np.sqrt(dim)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def draw(n):
        y = rng.integers(0, n_classes, n)
        x = centres[y] + u + rng.normal(size=(n, dim)) / np.sqrt(dim)
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)

    n = n_clients * per_client
    (xtr, ytr), (xte, yte) = draw(n), draw(2000)
    if shards:  # sort by label, cut into n_clients * shards pieces, deal them out (the paper's sharding)
        pieces = np.array_split(np.argsort(ytr.numpy(), kind="stable"), n_clients * shards)
        order = rng.permutation(len(pieces))
        rows = [np.sort(np.concatenate([pieces[j] for j in order[k * shards:(k + 1) * shards]])) for k in range(n_clients)]
    else:
        rows = [np.sort(r) for r in np.array_split(rng.permutation(n), n_clients)]
    data = FederatedData(xtr, ytr, xte, yte, rows, [np.arange(2000)] * n_clients, tuple(f"c{i}" for i in range(n_classes)))
    data.info["text"] = torch.from_numpy(text).float()
    return data


def make(name: str, data: FederatedData, seed: int = 0, rounds: int = 10, optim: OptimConfig = OPTIMIZER_PRESETS["fst-cbdg"], **params):
    cls = METHODS.get(name)
    return cls(MethodContext(data, "linear", optim, Schedule(seed=seed, rounds=rounds)), cls.Settings(**params))


def accuracy(name: str, data: FederatedData, rounds: int = 10, **params) -> float:
    return run(make(name, data, rounds=rounds, **params), RunConfig(rounds=rounds)).summary["global_accuracy"]
