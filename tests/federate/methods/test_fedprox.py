"""FedProx's proximal term against hand-computed gradients."""
from __future__ import annotations

import pytest
import torch

from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods.base import gradients
from fedcache.federate.optim import OptimConfig

from ..conftest import synthetic


def fedprox(mu: float, head: str):
    data = synthetic(n_clients=2, per_client=8, n_classes=3, dim=4)
    cls = METHODS.get("fedprox")
    return cls(MethodContext(data, head, OptimConfig("sgd", 0.1)), cls.Settings(mu=mu)), data


def test_proximal_gradient_is_mu_times_the_distance_to_the_global_head():
    mu = 0.2
    m, data = fedprox(mu, "linear")
    anchor = {"weight": torch.arange(12.0).view(1, 4, 3) / 10, "bias": torch.tensor([[[1.0, -2.0, 0.5]]])}
    # Two clients, each at its own distance from the received head.
    shift = torch.tensor([0.5, -1.5]).view(2, 1, 1)
    p = {n: t.expand(2, *t.shape[1:]) + shift for n, t in anchor.items()}
    batch = m.batch(torch.tensor([data.client_train[0][:4].tolist(), data.client_train[1][:4].tolist()]))
    g, _ = gradients(m.loss, p, ("weight", "bias"), batch, {"anchor": anchor})
    g_ce, _ = gradients(m.ce_loss, p, ("weight", "bias"), batch, {"anchor": anchor})
    for n in p:
        # d/dw [mu/2 ||w - w_g||^2] = mu (w - w_g): 0.2 * 0.5 = 0.1 for client 0, 0.2 * -1.5 = -0.3 for client 1.
        want = torch.tensor([0.1, -0.3]).view(2, 1, 1).expand_as(p[n])
        torch.testing.assert_close(g[n] - g_ce[n], want)


def test_proximal_term_skips_batchnorm_statistics_and_vanishes_at_the_global_head():
    m, data = fedprox(0.7, "mlp")
    anchor = m.init_server()
    p = {n: t.clone() for n, t in anchor.items()}
    batch = m.batch(torch.tensor([data.client_train[0][:5].tolist()]))
    keys = m.trainable(p)
    assert not set(keys) & set(m.head.buffer_keys)
    g, _ = gradients(m.loss, p, keys, batch, {"anchor": anchor})
    g_ce, _ = gradients(m.ce_loss, p, keys, batch, {"anchor": anchor})
    for n in keys:
        torch.testing.assert_close(g[n], g_ce[n])
    # The loss value itself: CE + mu/2 * squared distance over the trainable entries only, here
    # 0.7 / 2 * (number of trainable entries * 0.3^2). The running statistics have drifted from the
    # received ones too (as they do after any training step); a sum that included them would add
    # 0.35 * 2H * 0.5^2 here.
    moved = {n: t + (0.3 if n in keys else 0.5) for n, t in p.items()}
    extra = (m.loss({n: t.clone() for n, t in moved.items()}, *batch, {"anchor": anchor})[0]
             - m.ce_loss({n: t.clone() for n, t in moved.items()}, *batch, {"anchor": anchor})[0])
    count = sum(moved[n][0].numel() for n in keys)
    torch.testing.assert_close(extra, torch.tensor([0.35 * count * 0.09]))


def test_a_negative_mu_is_refused():
    from fedcache.errors import ConfigError
    from tests.resolve import resolve_settings

    with pytest.raises(ConfigError, match="mu"):
        resolve_settings("fedprox", ["mu=-1"])
