"""FedProto's reference-algorithm options (docs/methods/fedproto.md): each arrives from --set and does
what its equation says."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.schedule import Schedule
from fedcache.federate.methods import METHODS, LocalResult, MethodContext
from fedcache.federate.methods.fedproto import PFLLIB, drop_incomplete
from fedcache.federate.optim import OptimConfig
from fedcache.federate.prototypes import class_means
from tests.resolve import resolve_settings
from tests.federate.conftest import HELD, synthetic

from .. import test_methods as generic


def make(data, **params):
    cls = METHODS.get("fedproto")
    ctx = MethodContext(data, "mlp", OptimConfig("sgd", 0.01, 0.0, 0.0), schedule=Schedule(local_epochs=2, batch_size=16, seed=0, rounds=2))
    return cls(ctx, cls.Settings(**params))


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


def test_epoch_prototypes_are_weighted_by_the_clients_class_rows(data):
    """local_protos=every-epoch / last-epoch: the prototypes average the counted steps' representations,
    but the uploaded weight is the client's rows per class (the paper's |D_ij|), never epochs x rows:
    a server refuses counts above a client's rows."""
    down = {"protos": torch.zeros(1, 10, 256), "counts": torch.zeros(1, 10)}  # as broadcast sends
    for mode in ("every-epoch", "last-epoch"):
        m = make(data, local_protos=mode, drop_last=True)
        r = m.local_update(0, [0, 1, 2], down, m.init_clients(3))
        for k, counts in enumerate(r.uploads["counts"]):
            held = torch.bincount(data.y_train[torch.as_tensor(data.client_train[k])], minlength=10).float()
            assert torch.equal(counts, torch.where(counts > 0, held, 0.0)) and counts.sum() > 0, mode
        assert (r.uploads["counts"].sum(1) <= torch.tensor([40.0, 37.0, 52.0])).all()


def test_loss_rows_all_averages_over_every_row(data):
    """With a prototype for class 0 only: loss_rows=all divides the squared distances by every row,
    with-prototype by the class-0 rows only (the cross-entropy term is the same in both)."""
    m_all, m_with = make(data, loss_rows="all", lam=1.0), make(data, lam=1.0)
    p = {n: t[:1] for n, t in m_all.init_clients(1).items()}
    xb, yb = data.x_train[None, :8], torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    mask = torch.ones(1, 8, dtype=torch.bool)
    protos = torch.zeros(1, 10, 256)  # one set per client row, as local_update hands the loss
    info = {"protos": protos, "has": (torch.arange(10) == 0).unsqueeze(0)}
    z, _ = m_all.head.train_features(p, xb, mask)
    d = (z[0, :2] ** 2).mean(-1).sum()
    ce, _ = m_all.loss(p, xb, yb, mask, {**info, "has": torch.zeros(1, 10, dtype=torch.bool)})
    torch.testing.assert_close(m_all.loss(p, xb, yb, mask, info)[0], ce + d / 8)
    torch.testing.assert_close(m_with.loss(p, xb, yb, mask, info)[0], ce + d / 2)


def test_reference_options_batched_equals_per_client(data):
    from fedcache.federate.inprocess import RunConfig, run

    a = run(make(data, **PFLLIB), RunConfig(rounds=2, batched=True)).summary
    b = run(make(data, **PFLLIB), RunConfig(rounds=2, batched=False)).summary
    assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}


def _batch(m, data):
    p = {n: t[:1] for n, t in m.init_clients(1).items()}
    xb, yb = data.x_train[None, :8], torch.tensor([[0, 0, 1, 1, 1, 1, 2, 2]])
    mask = torch.ones(1, 8, dtype=torch.bool)
    protos = torch.randn(1, 10, 256, generator=torch.Generator().manual_seed(1))  # one set per client row
    info = {"protos": protos, "has": (torch.arange(10) < 2).unsqueeze(0)}  # classes 0 and 1 have a prototype, 2 not
    return p, xb, yb, mask, info


@pytest.mark.parametrize("rows", ["with-prototype", "all"])
def test_loss_value_and_gradient_by_hand(data, rows):
    """CE + lam * mean over (rows with / all rows) of mean_d (z - P[y])^2, value and gradient, lam = 2.5."""
    m = make(data, lam=2.5, loss_rows=rows)
    p, xb, yb, mask, info = _batch(m, data)
    leaves = {n: t.clone().requires_grad_(True) for n, t in p.items() if n not in m.head.buffer_keys}
    got = m.loss({**p, **leaves}, xb, yb, mask, info)[0].sum()
    g_got = torch.autograd.grad(got, list(leaves.values()))
    leaves2 = {n: t.clone().requires_grad_(True) for n, t in p.items() if n not in m.head.buffer_keys}
    q = {**p, **leaves2}
    z, _ = m.head.train_features(dict(q), xb, mask)
    ce = torch.nn.functional.cross_entropy(m.head.classify(q, z)[0], yb[0])
    d = ((z[0] - info["protos"][0, yb[0]]) ** 2).mean(-1)
    has = info["has"][0, yb[0]]
    reg = d[has].sum() / (has.sum() if rows == "with-prototype" else len(d))
    want = ce + 2.5 * reg
    g_want = torch.autograd.grad(want, list(leaves2.values()))
    torch.testing.assert_close(got, want)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b)


def test_after_prototypes_are_eval_mode_class_means_of_the_trained_head(data):
    """The default upload: after local training, the class means of the trained head's eval-mode
    representation of every training row, with the class counts as weights."""
    m = make(data)
    clients = [0, 1, 2]
    down = {"protos": torch.zeros(1, 10, 256), "counts": torch.zeros(1, 10)}  # as broadcast sends
    r = m.local_update(0, clients, down, m.init_clients(3))
    x, y, mask = data.rows_of("train", clients)
    with torch.no_grad():
        want, counts = class_means(m.head.features(dict(r.states), x, mask), y, mask, data.n_classes)
    torch.testing.assert_close(r.uploads["protos"], want)
    torch.testing.assert_close(r.uploads["counts"], counts)


def test_proto_prediction_never_picks_a_class_without_prototype(data):
    """predict=proto: a class whose count is 0 has no prototype; its all-zero slot must never win."""
    m = make(data, predict="proto")
    states = {n: t[:1] for n, t in m.init_clients(1).items()}
    x = data.x_train[None, :20]
    # class 3's slot holds zeros but count 0: it must score -inf even if zeros are nearest
    server = {"protos": torch.full((10, 256), 50.0), "counts": torch.ones(10)}
    server["protos"][3] = 0.0
    server["counts"][3] = 0.0
    logits = m.client_logits(server, states, [0], x)
    assert torch.isinf(logits[..., 3]).all() and (logits.argmax(-1) != 3).all()


# ---- on test_methods.py's skewed problem -------------------------------------------------------------------
def test_fedproto_averages_prototypes_weighted_by_class_counts(skewed):
    m = generic.make("fedproto", skewed)
    server = {"protos": torch.tensor([[0.0, 0], [0, 0], [0, 0], [5, 5]]), "counts": torch.tensor([0.0, 0, 0, 7])}
    uploads = {"protos": torch.tensor([[[1.0, 1], [9, 9], [0, 2], [0, 0]], [[4.0, 4], [2, 0], [7, 7], [0, 0]]]),
               "counts": torch.tensor([[2.0, 0, 1, 0], [1.0, 3, 0, 0]])}
    new = m.aggregate(server, LocalResult({}, uploads, torch.tensor([3.0, 4])), [0, 1], 0)
    # class 0: (2*[1,1] + 1*[4,4]) / 3; classes 1, 2: one holder each (the absent clients' rows are
    # ignored); class 3: held by nobody this round, keeps its prototype.
    torch.testing.assert_close(new["protos"], torch.tensor([[2.0, 2], [2, 0], [0, 2], [5, 5]]))
    torch.testing.assert_close(new["counts"], torch.tensor([3.0, 3, 1, 7]))


def test_fedproto_sends_only_the_classes_a_client_holds(skewed):
    m = generic.make("fedproto", skewed)
    f = m.head.feature_dim
    uploads = {"protos": torch.randn(2, 10, f), "counts": torch.tensor([[2.0, 0, 1] + [0] * 7, [0.0] * 9 + [5]])}
    assert m.upload_size(uploads, 0) == (2 * f, 2 * f * 4 + 2 * 16)  # prototype + int64 index and count
    assert m.upload_size(uploads, 1) == (f, f * 4 + 16)
    s = run(m, RunConfig(rounds=2)).summary
    assert s["bytes_up"] == 2 * 5 * HELD * (f * 4 + 16)
    # Round 1 receives no prototypes; round 2 every class's (the clients' classes cover all ten).
    assert s["bytes_down"] == 5 * skewed.n_classes * (f * 4 + 8)


@pytest.mark.parametrize("local_protos,epochs_used", [("last-epoch", 1), ("every-epoch", 2)])
def test_fedproto_epoch_prototypes_average_their_epochs_steps(skewed, monkeypatch, local_protos, epochs_used):
    """local_protos=last-epoch (the official code's): class means of the representations that the
    training steps of each client's last local epoch produced; every-epoch (PFLlib's): of every local
    epoch's steps. Recomputed here from every step's."""
    from fedcache.federate.methods import fedproto

    steps = []
    add = fedproto.EpochSums.add
    monkeypatch.setattr(fedproto.EpochSums, "add", lambda self, s, z, y, mask: (steps.append((s, z, y, mask)), add(self, s, z, y, mask)))
    m = generic.make("fedproto", skewed, local_protos=local_protos)  # 2 local epochs, batch 16, unequal clients
    clients = [0, 1, 2]
    down = {"protos": torch.zeros(1, 10, m.head.feature_dim), "counts": torch.zeros(1, 10)}  # as broadcast sends
    start = {n: t[clients] for n, t in m.init_clients(5).items()}
    result = m.local_update(0, clients, down, start)
    sizes = [len(skewed.client_train[k]) for k in clients]
    per_epoch = [-(-n // 16) for n in sizes]
    for i, k in enumerate(clients):
        first = (2 - epochs_used) * per_epoch[i]
        z = torch.cat([st[1][i][st[3][i]] for st in steps if first <= st[0] < 2 * per_epoch[i]])
        y = torch.cat([st[2][i][st[3][i]] for st in steps if first <= st[0] < 2 * per_epoch[i]])
        assert len(y) == epochs_used * sizes[i]
        assert sorted(y.tolist()) == sorted(skewed.y_train[skewed.client_train[k]].tolist() * epochs_used)
        for c in y.unique().tolist():
            torch.testing.assert_close(result.uploads["protos"][i, c], z[y == c].mean(0))
    after = generic.make("fedproto", skewed).local_update(0, clients, down, start)
    if epochs_used == 1:
        torch.testing.assert_close(result.uploads["counts"], after.uploads["counts"])
    assert not torch.allclose(result.uploads["protos"], after.uploads["protos"])  # train mode, moving weights


def test_fedproto_last_epoch_prototypes_batched_equals_loop(skewed):
    a = run(generic.make("fedproto", skewed, local_protos="last-epoch"), RunConfig(rounds=3, batched=True))
    b = run(generic.make("fedproto", skewed, local_protos="last-epoch"), RunConfig(rounds=3, batched=False))
    assert generic.summary(a) == generic.summary(b)
    with pytest.raises(ConfigError, match="local_protos"):
        generic.make("fedproto", skewed, local_protos="first-epoch")


def test_fedproto_prototype_prediction_and_head_errors(skewed):
    assert run(generic.make("fedproto", skewed, predict="proto"), RunConfig(rounds=generic.ROUNDS)).summary["mean_accuracy"] > 60
    with pytest.raises(ConfigError, match="no representation layers.*use --head mlp"):
        generic.make("fedproto", skewed, head="linear")
    with pytest.raises(ConfigError, match="predict"):
        generic.make("fedproto", skewed, predict="nearest")
