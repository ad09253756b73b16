"""The problem of the prompt methods' tests (promptfl, tpfl, atpfl): cached features of the tiny random CLIP, and
how the tests build and score a method on them."""
from __future__ import annotations

import numpy as np

from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.federate.schedule import Schedule
from fedcache.federate.source import FeatureSource, RowSource

CLIP = "tiny-clip-random"  # 32-d embeddings, text width 64
WIDTH, DIM = 64, 32
CLASSES = ("red", "green", "blue", "cat", "dog", "car", "tree", "ship")
PROMPT_METHODS = ("promptfl", "tpfl", "atpfl")


def forged_source(n_train: int, n_test: int, weights_hash: str) -> FeatureSource:
    key = ({"backbone": CLIP, "weights_hash": weights_hash},)
    rows = lambda n: RowSource(np.zeros(n, np.int16), np.arange(n), key)
    return FeatureSource(("all",), rows(n_train), rows(n_test))


def make(name, data, seed=0, lr=2e-2, **params):
    cls = METHODS.get(name)
    ctx = MethodContext(data, "linear", OptimConfig("adam", lr, weight_decay=0.0), schedule=Schedule(local_epochs=2, batch_size=32, seed=seed, rounds=10))
    return cls(ctx, cls.Settings(**params))


def accuracy(m, server, data) -> float:
    return 100.0 * float((m.global_logits(server, data.x_test).argmax(1) == data.y_test).float().mean())
