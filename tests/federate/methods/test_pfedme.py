"""pFedMe's updates against values computed by hand (Algorithm 1 of Dinh et al. 2020)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedcache.federate.schedule import Schedule
from fedcache.federate.data import FederatedData
from fedcache.federate.local import masked_mean
from fedcache.federate.methods import METHODS, LocalResult, MethodContext
from fedcache.federate.methods.base import gradients
from fedcache.federate.optim import OPTIMIZER_PRESETS, OptimConfig
from tests.resolve import resolve_settings
from fedcache.heads import expand

from .. import test_methods as generic
from ..conftest import synthetic

# Client 0 holds four rows of value 1, client 1 two rows of value 3; batches of 2 give client 0 two
# steps and client 1 one (it sits out the second step).
VALUES = (1.0, 1.0, 1.0, 1.0, 3.0, 3.0)


def quadratic(p, xb, yb, mask, info):
    """f(theta; D) = mean over D of (theta - x)^2 / 2: gradient theta - mean(D)."""
    return masked_mean(0.5 * (p["w"] - xb[..., 0]) ** 2, mask)


def two_clients() -> FederatedData:
    x = torch.tensor(VALUES).view(-1, 1)
    y = torch.zeros(len(VALUES), dtype=torch.long)
    rows = [np.arange(4), np.arange(4, 6)]
    return FederatedData(x, y, x, y, rows, [r.copy() for r in rows], ("a", "b"))


def make(optim: OptimConfig, **params):
    cls = METHODS.get("pfedme")
    m = cls(MethodContext(two_clients(), "linear", optim, schedule=Schedule(local_epochs=1, batch_size=2)), cls.Settings(**params))
    m.ce_loss = quadratic  # the data term f, replaced by one whose gradient is known in closed form
    return m


def by_hand(w: float, target: float, steps: int, k: int, personal_lr: float, lam: float, eta: float):
    """Algorithm 1, one client: per batch, K steps theta <- theta - lr (theta - target + lam (theta - w))
    from the previous theta (the received w at first), then w <- w - eta lam (w - theta)."""
    theta = w
    for _ in range(steps):
        for _ in range(k):
            theta = theta - personal_lr * ((theta - target) + lam * (theta - w))
        w = w - eta * lam * (w - theta)
    return w, theta


def test_the_default_is_the_papers_update():
    r = resolve_settings("pfedme", [])
    assert (r.optim.optimizer, r.optim.lr, r.optim.momentum, r.optim.weight_decay) == ("sgd", 0.005, 0.0, 0.0)
    assert r.params.aggregate == "uniform" and r.params.personal_l2 == 0.0
    assert resolve_settings("pfedme", ["aggregate=samples"]).params.aggregate == "samples"
    assert resolve_settings("pfedme", [], preset="fedpcl").optim.optimizer == "adam"


def test_w_update_after_k_inner_steps_matches_hand_computation():
    eta, lam, lr, k = 0.25, 2.0, 0.1, 2
    m = make(dataclasses.replace(OPTIMIZER_PRESETS["pfedme"], lr=eta), lam=lam, personal_lr=lr, inner_steps=k)
    result = m.local_update(0, [0, 1], {"w": torch.tensor([[0.5]])}, {})
    w0, theta0 = by_hand(0.5, 1.0, steps=2, k=k, personal_lr=lr, lam=lam, eta=eta)
    w1, theta1 = by_hand(0.5, 3.0, steps=1, k=k, personal_lr=lr, lam=lam, eta=eta)
    # Written out for client 1: theta = 0.5 + 0.1 * 2.5 = 0.75, then 0.75 - 0.1 * (-2.25 + 0.5) = 0.925;
    # w = 0.5 - 0.25 * 2 * (0.5 - 0.925) = 0.7125.
    assert (w1, theta1) == pytest.approx((0.7125, 0.925))
    torch.testing.assert_close(result.uploads["w"], torch.tensor([[w0], [w1]]))
    torch.testing.assert_close(result.states["w"], torch.tensor([[theta0], [theta1]]))


@pytest.mark.parametrize("aggregate, weights", [("uniform", (1.0, 1.0)), ("samples", (4.0, 2.0))])
def test_aggregation_weights(aggregate, weights):
    m = make(OPTIMIZER_PRESETS["pfedme"], aggregate=aggregate)
    result = m.local_update(0, [0, 1], {"w": torch.tensor([[0.5]])}, {})
    torch.testing.assert_close(result.weights, torch.tensor(weights))


@pytest.mark.parametrize("aggregate, beta, want", [
    # uniform: average (3 + 6) / 2 = 4.5; samples (4 and 2 rows): (4 * 3 + 2 * 6) / 6 = 4
    ("uniform", 1.0, 4.5), ("uniform", 0.5, 0.5 * 1 + 0.5 * 4.5), ("uniform", 2.0, -1 * 1 + 2 * 4.5),
    ("samples", 1.0, 4.0), ("samples", 0.5, 0.5 * 1 + 0.5 * 4.0),
])
def test_server_mixes_the_average_with_beta(aggregate, beta, want):
    """w_global <- (1 - beta) w_global + beta * average of the sampled clients' w."""
    m = make(OPTIMIZER_PRESETS["pfedme"], aggregate=aggregate, beta=beta)
    weights = m.local_update(0, [0, 1], {"w": torch.tensor([[0.0]])}, {}).weights
    result = LocalResult({}, {"w": torch.tensor([[3.0], [6.0]])}, weights)
    torch.testing.assert_close(m.aggregate({"w": torch.tensor([[1.0]])}, result, [0, 1], 0)["w"], torch.tensor([[want]]))


def test_official_l2_in_the_inner_solver():
    """personal_l2 (the official optimizer's mu) adds mu * theta to the inner gradient."""
    m = make(dataclasses.replace(OPTIMIZER_PRESETS["pfedme"], lr=0.25), lam=2.0, personal_lr=0.1, inner_steps=1, personal_l2=0.5)
    theta = m.local_update(0, [1], {"w": torch.tensor([[0.5]])}, {}).states["w"]
    # 0.5 - 0.1 * ((0.5 - 3) + 2 * 0 + 0.5 * 0.5)
    torch.testing.assert_close(theta, torch.tensor([[0.5 - 0.1 * (-2.5 + 0.25)]]))


def small(head: str):
    data = synthetic(n_clients=2, per_client=16, n_classes=3, dim=4)
    cls = METHODS.get("pfedme")
    return cls(MethodContext(data, head, OPTIMIZER_PRESETS["pfedme"], schedule=Schedule(batch_size=8)), cls.Settings()), data


def test_clients_are_scored_with_their_personalised_theta():
    """The personalised score is theta's (the client's state after its last inner solve), not w's."""
    m, data = small("linear")
    server = m.init_server()
    theta = m.local_update(0, [0, 1], server, m.init_clients(2)).states
    x = data.x_test[:5].expand(2, -1, -1)
    want = x @ theta["weight"] + theta["bias"]
    torch.testing.assert_close(m.client_logits(server, theta, [0, 1], x), want)
    assert not torch.allclose(want, x @ server["weight"] + server["bias"])


def test_batchnorm_statistics_travel_from_theta():
    """Only theta runs forward passes, so the running statistics sent beside w are theta's, not the received ones."""
    m, _ = small("mlp")
    down = m.init_server()
    r = m.local_update(0, [0, 1], down, m.init_clients(2))
    for n in m.head.buffer_keys:
        torch.testing.assert_close(r.uploads[n], r.states[n])
        assert not torch.allclose(r.uploads[n], expand(down, 2)[n])


# ---- on test_methods.py's skewed problem -------------------------------------------------------------------
@pytest.mark.parametrize("beta, want", [(1.0, 4.0), (0.5, 2.5), (2.0, 7.0)])
def test_pfedme_server_mixes_the_average_with_beta(beta, want, skewed):
    m = generic.make("pfedme", skewed, beta=beta)
    server = {"w": torch.tensor([[1.0]])}
    result = LocalResult({}, {"w": torch.tensor([[3.0], [6.0]])}, torch.tensor([2.0, 1.0]))  # average 4
    torch.testing.assert_close(m.aggregate(server, result, [0, 1], 0)["w"], torch.tensor([[want]]))


def test_pfedme_inner_solver_matches_hand_computation(skewed):
    # With data gradient g, one inner step is theta - lr * (g + lam (theta - w)).
    m = generic.make("pfedme", skewed, head="linear", inner_steps=1, personal_lr=0.1, lam=2.0)
    w = {"weight": torch.zeros(1, skewed.dim, skewed.n_classes), "bias": torch.zeros(1, 1, skewed.n_classes)}
    theta = {n: t + 0.5 for n, t in w.items()}
    batch = m.batch(torch.from_numpy(skewed.client_train[0][:4])[None])
    g, _ = gradients(m.ce_loss, theta, ("weight", "bias"), batch)
    got = m.personalize(theta, w, ("weight", "bias"), batch, torch.tensor([True]))
    for n in w:
        torch.testing.assert_close(got[n], theta[n] - 0.1 * (g[n] + 2.0 * (theta[n] - w[n])))
