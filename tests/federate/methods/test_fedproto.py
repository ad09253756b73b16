"""FedProto's reference-algorithm options (docs/methods/fedproto.md): each arrives from --set and does
what its equation says."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcache.federate.methods import METHODS, LocalResult, MethodContext
from fedcache.federate.methods.fedproto import PFLLIB, drop_incomplete
from fedcache.federate.optim import OptimConfig
from fedcache.federate.train import resolve_settings
from tests.federate.conftest import synthetic


def make(data, **params):
    cls = METHODS.get("fedproto")
    ctx = MethodContext(data, "mlp", OptimConfig("sgd", 0.01, 0.0, 0.0), local_epochs=2, batch_size=16, seed=0, rounds=2)
    return cls(ctx, cls.Params(**params))


@pytest.fixture(scope="module")
def data():
    return synthetic(n_clients=3, sizes=[40, 37, 52], dim=16)


def test_every_option_arrives_from_set():
    r = resolve_settings("fedproto", [f"method.{k}={v}" for k, v in PFLLIB.items()])
    assert {k: getattr(r.params, k) for k in PFLLIB} == PFLLIB
    defaults = resolve_settings("fedproto", []).params
    assert all(getattr(defaults, k) != v for k, v in PFLLIB.items())  # each option changes something


def test_uniform_aggregation_is_the_plain_mean_over_holders(data):
    m = make(data, aggregation="uniform")
    server = {"protos": torch.zeros(3, 2), "counts": torch.zeros(3)}
    uploads = {"protos": torch.tensor([[[1.0, 1], [9, 9], [0, 0]], [[4.0, 4], [2, 0], [0, 0]]]),
               "counts": torch.tensor([[2.0, 0, 0], [1.0, 3, 0]])}
    new = m.aggregate(server, LocalResult({}, uploads, torch.tensor([2.0, 4])), [0, 1], 0)
    # class 0: ([1,1] + [4,4]) / 2 whatever the counts (weighted would give [2,2]); class 1: its one holder
    torch.testing.assert_close(new["protos"][:2], torch.tensor([[2.5, 2.5], [2, 0]]))


def test_missing_drop_forgets_a_class_nobody_uploaded(data):
    server = {"protos": torch.tensor([[5.0, 5], [7, 7]]), "counts": torch.tensor([3.0, 4])}
    uploads = {"protos": torch.tensor([[[1.0, 1], [0, 0]]]), "counts": torch.tensor([[2.0, 0]])}
    result = LocalResult({}, uploads, torch.tensor([2.0]))
    kept = make(data).aggregate(server, result, [0], 0)
    dropped = make(data, missing="drop").aggregate(server, result, [0], 0)
    assert kept["counts"].tolist() == [2.0, 4.0] and kept["protos"][1].tolist() == [7.0, 7.0]
    assert dropped["counts"].tolist() == [2.0, 0.0]


def test_shared_init_gives_every_client_the_same_head(data):
    shared, own = make(data, init="shared").init_clients(3), make(data).init_clients(3)
    assert all(torch.equal(t[0], t[2]) for t in shared.values())
    assert not torch.equal(own["fc1.weight"][0], own["fc1.weight"][2])


def test_drop_incomplete_keeps_each_clients_full_batches_in_order():
    plan = np.array([[[0, 1], [2, -1], [3, 4]], [[5, 6], [7, 8], [-1, -1]]])
    assert drop_incomplete(plan).tolist() == [[[0, 1], [3, 4]], [[5, 6], [7, 8]]]


def test_every_epoch_prototypes_count_every_trained_row(data):
    """local_protos=every-epoch with drop_last: each class counted once per epoch per row trained on,
    2 epochs of floor(n / 16) full batches; last-epoch counts one epoch."""
    down = {"protos": torch.zeros(10, 256), "counts": torch.zeros(10)}
    for mode, epochs in (("every-epoch", 2), ("last-epoch", 1)):
        m = make(data, local_protos=mode, drop_last=True)
        r = m.local_update(0, [0, 1, 2], down, m.init_clients(3))
        assert r.uploads["counts"].sum(1).tolist() == [epochs * 32.0, epochs * 32.0, epochs * 48.0]


def test_loss_rows_all_averages_over_every_row(data):
    """With a prototype for class 0 only: loss_rows=all divides the squared distances by every row,
    with-prototype by the class-0 rows only (the cross-entropy term is the same in both)."""
    m_all, m_with = make(data, loss_rows="all", lam=1.0), make(data, lam=1.0)
    p = {n: t[:1] for n, t in m_all.init_clients(1).items()}
    xb, yb = data.x_train[None, :8], torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    mask = torch.ones(1, 8, dtype=torch.bool)
    protos = torch.zeros(10, 256)
    info = {"protos": protos, "has": torch.arange(10) == 0}
    z, _ = m_all.head.train_features(p, xb, mask)
    d = (z[0, :2] ** 2).mean(-1).sum()
    ce, _ = m_all.loss(p, xb, yb, mask, {**info, "has": torch.zeros(10, dtype=torch.bool)})
    torch.testing.assert_close(m_all.loss(p, xb, yb, mask, info)[0], ce + d / 8)
    torch.testing.assert_close(m_with.loss(p, xb, yb, mask, info)[0], ce + d / 2)


def test_reference_options_batched_equals_per_client(data):
    from fedcache.federate.loop import RunConfig, run

    a = run(make(data, **PFLLIB), RunConfig(rounds=2, batched=True)).summary
    b = run(make(data, **PFLLIB), RunConfig(rounds=2, batched=False)).summary
    assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
