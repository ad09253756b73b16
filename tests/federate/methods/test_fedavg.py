"""FedAvg's and FedNTD's ``init=text``: FST-CBDG's classifier, starting as CLIP's zero-shot classifier."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedcache.errors import ConfigError
from fedcache.federate.local import cross_entropy
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig

from ..conftest import synthetic


def with_text():
    data = synthetic(n_clients=2, per_client=30, n_classes=4, dim=6)
    data.info["text"] = F.normalize(torch.randn(4, 6, generator=torch.Generator().manual_seed(1)), dim=-1)
    return data


def make(name, data, head="linear", **params):
    cls = METHODS.get(name)
    return cls(MethodContext(data, head, OptimConfig("sgd", 0.1)), cls.Settings(**params))


@pytest.mark.parametrize("name", ["fedavg", "fedntd", "fedprox"])
def test_text_init_starts_at_the_zero_shot_classifier(name):
    data = with_text()
    m = make(name, data, init="text")
    server = m.init_server()
    torch.testing.assert_close(server["weight"][0], data.info["text"].T)
    assert not server["bias"].any()
    # Round 0 predicts what CLIP zero-shot predicts: the class text most cosine-similar to the image.
    zs = METHODS.get("clip-zs")(MethodContext(data), None)
    assert torch.equal(m.global_logits(server, data.x_test).argmax(1), zs.global_logits(zs.init_server(), data.x_test).argmax(1))
    # ... and scores cosines without a scale, as FST-CBDG's classifier (the scores, not only their argmax).
    cos = F.normalize(data.x_test, dim=-1) @ data.info["text"].T
    torch.testing.assert_close(m.global_logits(server, data.x_test), cos)


@pytest.mark.parametrize("name", ["fedavg", "fedntd"])
def test_text_init_trains_on_unit_norm_features(name):
    """The local loss of init=text sees unit-norm features: scaling the features changes nothing, where
    the random-init head on the cached features sees the scale."""
    data = with_text()
    x, y = data.x_train[None, :10], data.y_train[None, :10]
    mask = torch.ones(1, 10, dtype=torch.bool)
    for init, invariant in (("text", True), ("random", False)):
        m = make(name, data, init=init)
        p = m.init_server()
        p = {n: t + 0.1 * torch.randn(t.shape, generator=torch.Generator().manual_seed(2)) for n, t in p.items()}
        info = {"anchor": m.init_server()}
        a, b = m.loss(dict(p), x, y, mask, info)[0], m.loss(dict(p), 7.0 * x, y, mask, info)[0]
        assert torch.allclose(a, b) == invariant, init
    # FedAvg's text-init loss by hand: cross-entropy of W unit(x) + b.
    m = make("fedavg", data, init="text")
    p = m.init_server()
    want = cross_entropy((F.normalize(x, dim=-1) @ p["weight"][0] + p["bias"][0]), y, mask)
    torch.testing.assert_close(m.loss(p, x, y, mask, {"anchor": p})[0], want)


def test_text_init_needs_the_linear_head_and_a_text_tower():
    with pytest.raises(ConfigError, match="linear"):
        make("fedavg", with_text(), head="mlp", init="text")
    with pytest.raises(ConfigError, match="text tower"):
        make("fedntd", synthetic(n_clients=2, per_client=10, n_classes=4, dim=6), init="text")
    assert METHODS.get("fedavg").Settings().init == "random"
