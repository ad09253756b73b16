"""Per-FedAvg's local meta-step against values computed by hand (Algorithm 1 of Fallah et al. 2020)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedcache.federate.data import FederatedData
from fedcache.federate.local import masked_mean
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import PRESETS, OptimConfig
from fedcache.federate.train import resolve_settings

# Client 0: four rows, so one local step pairs two batches D, D' of two rows (their means differ
# whichever way the rows are shuffled); client 1: one batch, which stands in for D' as well.
VALUES = (0.0, 1.0, 4.0, 6.0, 3.0, 3.0)


def quadratic(p, xb, yb, mask, info):
    """f(w; D) = mean over D of (w - x)^2 / 2: gradient w - mean(D), Hessian 1."""
    return masked_mean(0.5 * (p["w"] - xb[..., 0]) ** 2, mask)


def make(optim: OptimConfig, **params):
    x = torch.tensor(VALUES).view(-1, 1)
    y = torch.zeros(len(VALUES), dtype=torch.long)
    rows = [np.arange(4), np.arange(4, 6)]
    data = FederatedData(x, y, x, y, rows, [r.copy() for r in rows], ("a", "b"))
    cls = METHODS.get("perfedavg")
    m = cls(MethodContext(data, "linear", optim, local_epochs=1, batch_size=2), cls.Params(**params))
    m.ce_loss = quadratic
    return m


def batch_means(m, client: int) -> list[float]:
    plan = m.plan(0, [client])[0]
    return [float(np.mean([VALUES[i] for i in b if i >= 0])) for b in plan]


def test_the_default_is_the_papers_update():
    r = resolve_settings("perfedavg", [])
    assert (r.optim.optimizer, r.optim.lr, r.optim.momentum, r.optim.weight_decay) == ("sgd", 0.001, 0.0, 0.0)
    assert r.params.aggregate == "uniform"
    assert resolve_settings("perfedavg", [], preset="fedpcl").optim.optimizer == "adam"


def test_meta_step_matches_hand_computation():
    """temp = w - alpha grad f(w; D); w <- w - beta grad f(temp; D') (first order)."""
    alpha, beta, w = 0.1, 0.5, 2.0
    m = make(dataclasses.replace(PRESETS["perfedavg"], lr=beta), alpha=alpha)
    a, b = batch_means(m, 0)
    assert a != b
    want = []
    for d, d2 in ((a, b), (3.0, 3.0)):
        temp = w - alpha * (w - d)
        want.append(w - beta * (temp - d2))
    # client 1 written out: temp = 2 - 0.1 * (2 - 3) = 2.1; w = 2 - 0.5 * (2.1 - 3) = 2.45
    assert want[1] == pytest.approx(2.45)
    result = m.local_update(0, [0, 1], {"w": torch.tensor([[w]])}, {})
    torch.testing.assert_close(result.uploads["w"], torch.tensor([[want[0]], [want[1]]]))


def test_hessian_free_step_matches_hand_computation():
    """HF: w <- w - beta (I - alpha H(w; D'')) grad f(temp; D'); H = 1 here. Client 1's single batch is
    D, D' and D''."""
    alpha, beta, w = 0.1, 0.5, 2.0
    m = make(dataclasses.replace(PRESETS["perfedavg"], lr=beta), alpha=alpha, variant="hf")
    got = m.local_update(0, [1], {"w": torch.tensor([[w]])}, {}).uploads["w"]
    torch.testing.assert_close(got, torch.tensor([[w - beta * (1 - alpha) * (w - alpha * (w - 3.0) - 3.0)]]))


@pytest.mark.parametrize("aggregate, weights, want", [("uniform", (1.0, 1.0), 4.5), ("samples", (4.0, 2.0), 4.0)])
def test_server_averages_uniformly_or_by_samples(aggregate, weights, want):
    m = make(PRESETS["perfedavg"], aggregate=aggregate)
    result = m.local_update(0, [0, 1], {"w": torch.tensor([[0.0]])}, {})
    torch.testing.assert_close(result.weights, torch.tensor(weights))
    result.uploads = {"w": torch.tensor([[3.0], [6.0]])}
    torch.testing.assert_close(m.aggregate({"w": torch.tensor([[1.0]])}, result, [0, 1], 0)["w"], torch.tensor([[want]]))
