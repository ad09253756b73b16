"""fedprox-ssl: the official FLESD code's proximal term by hand, its default mu, and that mu reaches training."""
from __future__ import annotations

import torch

from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods._simclr import ENCODER_KEYS, proximal
from fedcache.federate.methods.fedprox_ssl import FedProxSSLSettings

from ..conftest import synthetic
from ..test_methods import make


def test_proximal_term_is_mu_times_the_squared_distance_without_a_half():
    start = {n: torch.zeros(2, 1, 2) for n in ENCODER_KEYS}
    p = {n: torch.zeros(2, 1, 2) for n in ENCODER_KEYS}
    p["w1"][0] = torch.tensor([[1.0, 2.0]])  # client 0: ||dw||^2 = 1 + 4 + 9 = 14
    p["b2"][0] = torch.tensor([[3.0, 0.0]])
    p["w2"][1] = torch.tensor([[0.0, -1.0]])  # client 1: 1
    torch.testing.assert_close(proximal(p, start, 1e-4), torch.tensor([14e-4, 1e-4]))


def test_default_mu_is_the_papers_and_mu_reaches_local_training():
    assert FedProxSSLSettings().mu == 1e-4
    data = synthetic(per_client=24)
    data.views = data.x_train[:, None] + 0.3 * torch.randn(len(data.x_train), 2, data.dim,
                                                           generator=torch.Generator().manual_seed(1))
    small = {"hidden": 8, "out": 4}

    def server(name, **kw):
        return run(make(name, data, **small, **kw), RunConfig(rounds=1)).server["w1"]

    avg = server("fedavg-ssl")
    assert torch.equal(server("fedprox-ssl", mu=0.0), avg)
    assert not torch.equal(server("fedprox-ssl", mu=10.0), avg)


def test_average_by_samples_or_uniformly_as_the_official_code():
    from fedcache.federate.methods.base import LocalResult

    data = synthetic(per_client=24)
    data.views = data.x_train[:, None].expand(-1, 2, -1)
    up = {"w1": torch.tensor([[[1.0]], [[4.0]]])}
    result = LocalResult({}, up, torch.tensor([1.0, 3.0]))
    for avg, want in (("samples", (1 + 3 * 4) / 4), ("uniform", (1 + 4) / 2)):
        m = make("fedprox-ssl", data, hidden=8, out=4, average=avg)
        assert m.aggregate({}, result, [0, 1], 0)["w1"].item() == want
