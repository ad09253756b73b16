"""Problems the method tests share, built once per test module."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcache.extract.loading import load_backbone
from fedcache.federate.data import FederatedData
from fedcache.federate.methods._prompt import PromptedText

from .clip_problem import biased_problem
from .prompt_problem import CLASSES, CLIP, DIM, WIDTH, forged_source


@pytest.fixture(scope="module")
def iid():
    return biased_problem()


@pytest.fixture(scope="module")
def sharded():
    return biased_problem(shards=2)


@pytest.fixture(scope="module")
def clip():
    return load_backbone(CLIP)


@pytest.fixture(scope="module")
def hidden(clip):
    """Image features drawn around the class-text features of a hidden context ctx*: zero-shot with
    the initial context is weak (the random tower's class features are 0.98-0.999 alike), but a
    learned context can recover the truth. 4 clients of 100 rows, 8 classes."""
    true_ctx = torch.randn(1, 16, WIDTH, generator=torch.Generator().manual_seed(123))
    with torch.no_grad():
        anchors = PromptedText(clip, CLASSES, 16).encode(true_ctx)[0]
    rng = np.random.default_rng(0)

    def draw(n):
        y = rng.integers(0, len(CLASSES), n)
        return anchors[y] + 0.01 * torch.from_numpy(rng.normal(size=(n, DIM)).astype(np.float32)), torch.from_numpy(y)

    (xtr, ytr), (xte, yte) = draw(400), draw(400)
    rows = [np.arange(k * 100, (k + 1) * 100) for k in range(4)]
    return FederatedData(xtr, ytr, xte, yte, rows, [r.copy() for r in rows], CLASSES, random_weights=True,
                         info={"source": forged_source(400, 400, clip.weights_hash)})
