"""Per-FedAvg's local meta-step against values computed by hand (Algorithm 1 of Fallah et al. 2020)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.errors import ConfigError
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.schedule import Schedule
from fedcache.federate.data import FederatedData
from fedcache.federate.local import masked_mean
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods.perfedavg import ADAPT, meta_gradient
from fedcache.federate.optim import OPTIMIZER_PRESETS, OptimConfig
from tests.resolve import resolve_settings

from .. import test_methods as generic
from ..conftest import synthetic

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
    m = cls(MethodContext(data, "linear", optim, schedule=Schedule(local_epochs=1, batch_size=2)), cls.Settings(**params))
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
    m = make(dataclasses.replace(OPTIMIZER_PRESETS["perfedavg"], lr=beta), alpha=alpha)
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
    m = make(dataclasses.replace(OPTIMIZER_PRESETS["perfedavg"], lr=beta), alpha=alpha, variant="hf")
    got = m.local_update(0, [1], {"w": torch.tensor([[w]])}, {}).uploads["w"]
    torch.testing.assert_close(got, torch.tensor([[w - beta * (1 - alpha) * (w - alpha * (w - 3.0) - 3.0)]]))


@pytest.mark.parametrize("aggregate, weights, want", [("uniform", (1.0, 1.0), 4.5), ("samples", (4.0, 2.0), 4.0)])
def test_server_averages_uniformly_or_by_samples(aggregate, weights, want):
    m = make(OPTIMIZER_PRESETS["perfedavg"], aggregate=aggregate)
    result = m.local_update(0, [0, 1], {"w": torch.tensor([[0.0]])}, {})
    torch.testing.assert_close(result.weights, torch.tensor(weights))
    result.uploads = {"w": torch.tensor([[3.0], [6.0]])}
    torch.testing.assert_close(m.aggregate({"w": torch.tensor([[1.0]])}, result, [0, 1], 0)["w"], torch.tensor([[want]]))


def quartic(p, xb, yb, mask, info):
    """f(w; D) = mean over D of (w - x)^4 / 4: gradient mean (w - x)^3, Hessian 3 mean (w - x)^2, which
    depends on the point and the batch (a quadratic's Hessian depends on neither)."""
    return masked_mean(0.25 * (p["w"] - xb[..., 0]) ** 4, mask)


def batch_of(*values):
    x = torch.tensor(values).view(1, -1, 1)
    return x, torch.zeros(1, len(values), dtype=torch.long), torch.ones(1, len(values), dtype=torch.bool)


def test_hessian_free_step_takes_the_hessian_at_w_on_the_third_batch():
    """HF: (I - alpha H(w; D'')) grad f(temp; D'), the Hessian at w (not at temp) on D'' (not on D or D')."""
    alpha, w = 0.05, 2.0
    d, d1, d2 = batch_of(1.0), batch_of(0.0), batch_of(4.0, 1.0)
    temp = w - alpha * (w - 1.0) ** 3  # 1.95
    g = temp**3  # grad f(temp; D'), D' = {0}
    h = 3 * ((w - 4.0) ** 2 + (w - 1.0) ** 2) / 2  # H(w; D'') = 7.5; H(w; D) = 3, H(w; D') = 12, H(temp; D'') = 7.66
    got, _ = meta_gradient(quartic, {"w": torch.tensor([[w]])}, ("w",), [d, d1, d2], alpha)
    torch.testing.assert_close(got["w"], torch.tensor([[(1 - alpha * h) * g]]))


def test_personalised_score_is_one_alpha_step_on_a_fixed_training_batch():
    """Each client's score: the global head after one step w - alpha grad f(w; D) on the first batch of a fixed
    shuffle of its training rows; the cross-entropy gradient of a linear head written out in closed form."""
    alpha, clients = 0.5, [0, 1]
    data = synthetic(n_clients=2, per_client=20, n_classes=3, dim=4)
    cls = METHODS.get("perfedavg")
    m = cls(MethodContext(data, "linear", OPTIMIZER_PRESETS["perfedavg"], schedule=Schedule(batch_size=8)), cls.Settings(alpha=alpha))
    server = m.init_server()
    x = data.x_test[:5].expand(2, -1, -1)
    got = m.client_logits(server, {}, clients, x)
    for i, k in enumerate(clients):
        rows = torch.from_numpy(m.plan(ADAPT, [k], epochs=1)[0, 0])
        assert bool((rows >= 0).all()) and set(rows.tolist()) <= set(data.client_train[k].tolist())
        xb, yb = data.x_train[rows], data.y_train[rows]
        err = torch.softmax(xb @ server["weight"][0] + server["bias"][0], -1) - F.one_hot(yb, 3)
        weight = server["weight"][0] - alpha * xb.T @ err / len(rows)
        bias = server["bias"][0] - alpha * err.mean(0)
        torch.testing.assert_close(got[i], x[i] @ weight + bias)
    assert not torch.allclose(got[0], x[0] @ server["weight"][0] + server["bias"][0])
    torch.testing.assert_close(m.client_logits(server, {}, clients, x), got)  # the same batch at every evaluation


def test_perfedavg_first_order_and_hessian_free_steps():
    w, alpha = {"w": torch.tensor([[2.0]])}, 0.1
    d1, d2 = batch_of(0.5, 1.5), batch_of(3.0, 3.0)  # means 1 and 3
    g, _ = meta_gradient(quadratic, w, ("w",), [d1, d2], alpha)
    # temp = 2 - 0.1 * (2 - 1) = 1.9; FO gradient at temp on D2: 1.9 - 3 = -1.1
    torch.testing.assert_close(g["w"], torch.tensor([[-1.1]]))
    g, _ = meta_gradient(quadratic, w, ("w",), [d1, d2, d1], alpha)
    torch.testing.assert_close(g["w"], torch.tensor([[(1 - alpha) * -1.1]]))  # (I - alpha H) g, H = 1


# ---- on test_methods.py's skewed problem -------------------------------------------------------------------
def test_perfedavg_steps_pair_consecutive_batches(skewed):
    m = generic.make("perfedavg", skewed)
    plan = torch.from_numpy(m.plan(0, [0, 1]))
    groups = list(m.step_batches(0, [0, 1]))
    assert len(groups) == math.ceil(plan.shape[1] / 2) and all(len(g) == 2 for g in groups)
    x0 = skewed.x_train[plan[0, 0].clamp_min(0)]
    torch.testing.assert_close(groups[0][0][0][0], x0)
    hf = generic.make("perfedavg", skewed, variant="hf")
    assert all(len(g) == 3 for g in hf.step_batches(0, [0]))
    assert run(hf, RunConfig(rounds=generic.ROUNDS)).summary["mean_accuracy"] > 60
    with pytest.raises(ConfigError, match="variant"):
        generic.make("perfedavg", skewed, variant="so")
