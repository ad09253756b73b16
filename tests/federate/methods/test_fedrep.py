"""FedRep's local update: the personal classifier first (body frozen), then the body (classifier frozen),
the body's epochs shuffled afresh; the server's average (uniform by default, or by sample counts)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.schedule import Schedule
from fedcache.federate.local import step_plan, train
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.heads import expand

from ..conftest import synthetic
from ..test_methods import make

HEAD = ("fc2.weight", "fc2.bias")
BODY = ("fc1.weight", "fc1.bias", "bn.weight", "bn.bias")


def fedrep(head_epochs: int):
    data = synthetic(n_clients=3, per_client=20, n_classes=4, dim=6)
    cls = METHODS.get("fedrep")
    ctx = MethodContext(data, "mlp", OptimConfig("sgd", 0.5, momentum=0.0, weight_decay=0.0), schedule=Schedule(local_epochs=1, batch_size=8))
    return cls(ctx, cls.Settings(head_epochs=head_epochs)), data


def copy(p):
    return {n: t.clone() for n, t in p.items()}


def phase(m, data, p, keys, epochs, clients, rnd=0, first=0):
    """One phase written out with the training primitives: ``epochs`` over the clients' rows (the round's
    epochs ``first``, ``first + 1``, ...), only ``keys`` move. On a copy: training updates its parameters in place."""
    plan = step_plan([data.client_train[k] for k in clients], 8, epochs, m.ctx.seed, rnd, clients, first_epoch=first)
    return train(copy(p), keys, m.ce_loss, data.x_train, data.y_train, plan, m.ctx.optim)


def test_head_is_trained_before_the_body():
    m, data = fedrep(head_epochs=2)
    clients = [0, 2]
    down, states = m.init_server(), m.init_clients(3)
    states = {n: t[clients] for n, t in states.items()}
    got = m.local_update(0, clients, copy(down), copy(states))

    start = copy({**states, **expand(down, 2)})
    head_first = phase(m, data, phase(m, data, start, HEAD, 2, clients), BODY, 1, clients, first=2)
    body_first = phase(m, data, phase(m, data, start, BODY, 1, clients), HEAD, 2, clients, first=1)
    # The order changes the result here, so matching head_first is a test of the order.
    assert not torch.allclose(head_first["fc1.weight"], body_first["fc1.weight"], atol=1e-4)
    for n in BODY:
        torch.testing.assert_close(got.uploads[n], head_first[n])
    for n in HEAD:
        torch.testing.assert_close(got.states[n], head_first[n])
    assert set(got.uploads) == set(BODY)  # the classifier and BatchNorm statistics stay with the client


def test_body_epoch_gets_its_own_shuffle(monkeypatch):
    """The body's epoch is the round's epoch ``head_epochs``: not a replay of the classifier's first epoch."""
    import fedcache.federate.methods.fedrep as mod

    plans = []
    real = mod.train
    monkeypatch.setattr(mod, "train", lambda p, keys, loss, x, y, plan, opt: plans.append(plan) or real(p, keys, loss, x, y, plan, opt))
    m, data = fedrep(head_epochs=1)
    clients = [0, 2]
    down, states = m.init_server(), {n: t[clients] for n, t in m.init_clients(3).items()}
    m.local_update(4, clients, down, states)
    rows = [data.client_train[k] for k in clients]
    head, body = plans
    np.testing.assert_array_equal(head, step_plan(rows, 8, 1, m.ctx.seed, 4, clients))
    np.testing.assert_array_equal(body, step_plan(rows, 8, 1, m.ctx.seed, 4, clients, first_epoch=1))
    assert not np.array_equal(head, body)
    for k in range(2):  # each phase is still one pass over the client's rows
        assert sorted(body[k][body[k] >= 0].tolist()) == sorted(rows[k].tolist())

def test_head_phase_leaves_the_body_alone_and_body_phase_the_head():
    m, data = fedrep(head_epochs=1)
    clients = [1]
    down, states = m.init_server(), {n: t[clients] for n, t in m.init_clients(3).items()}
    start = copy({**states, **expand(down, 1)})
    after_head = phase(m, data, start, HEAD, 1, clients)
    for n in BODY:
        torch.testing.assert_close(after_head[n], start[n])
    got = m.local_update(0, clients, copy(down), copy(states))
    for n in HEAD:  # the body phase did not move the classifier trained in the head phase
        torch.testing.assert_close(got.states[n], after_head[n])
    assert not torch.allclose(got.states["fc2.weight"], start["fc2.weight"])


def test_zero_head_epochs_trains_only_the_body():
    m, data = fedrep(head_epochs=0)
    clients = [0]
    down, states = m.init_server(), {n: t[clients] for n, t in m.init_clients(3).items()}
    got = m.local_update(0, clients, copy(down), copy(states))
    for n in HEAD:
        torch.testing.assert_close(got.states[n], states[n])
    want = phase(m, data, copy({**states, **expand(down, 1)}), BODY, 1, clients)
    torch.testing.assert_close(got.uploads["fc1.weight"], want["fc1.weight"])


def test_every_client_starts_from_one_initial_classifier():
    """As the official code's copies of one global network: the clients' classifiers start equal."""
    m, _ = fedrep(head_epochs=1)
    for n, t in m.init_clients(3).items():
        for k in (1, 2):
            torch.testing.assert_close(t[k], t[0])


def test_clients_are_scored_with_the_global_body_and_their_own_classifier():
    """After the round's average: the server's body, the client's classifier and its own BatchNorm statistics."""
    m, data = fedrep(head_epochs=1)
    clients = [0, 1, 2]
    r = m.local_update(0, clients, m.init_server(), m.init_clients(3))
    server, own = m.aggregate(m.init_server(), r, clients, 0), r.states
    x = data.x_test[:5].expand(3, -1, -1)
    h = torch.relu(x @ server["fc1.weight"] + server["fc1.bias"])
    z = (h - own["bn.running_mean"]) / torch.sqrt(own["bn.running_var"] + 1e-5) * server["bn.weight"] + server["bn.bias"]
    torch.testing.assert_close(m.client_logits(server, own, clients, x), z @ own["fc2.weight"] + own["fc2.bias"])
    assert not torch.allclose(server["fc1.weight"], r.uploads["fc1.weight"][:1])  # the client's own body differs


@pytest.mark.parametrize("aggregate, weights", [("uniform", (1.0, 1.0)), ("samples", (8.0, 24.0))])
def test_server_averages_bodies_uniformly_or_by_sample_counts(aggregate, weights):
    data = synthetic(n_clients=2, n_classes=4, dim=6, sizes=[8, 24])
    cls = METHODS.get("fedrep")
    m = cls(MethodContext(data, "mlp", OptimConfig("sgd", 0.5, momentum=0.0, weight_decay=0.0), schedule=Schedule(batch_size=8)),
            cls.Settings(head_epochs=1, aggregate=aggregate))
    got = m.local_update(0, [0, 1], m.init_server(), m.init_clients(2))
    torch.testing.assert_close(got.weights, torch.tensor(weights))
    server = m.aggregate(m.init_server(), got, [0, 1], 0)
    w = torch.tensor(weights) / sum(weights)
    for n in BODY:
        torch.testing.assert_close(server[n][0], w[0] * got.uploads[n][0] + w[1] * got.uploads[n][1])
    assert cls.Settings().aggregate == "uniform"  # Algorithm 1 and the official code's image datasets


@pytest.mark.parametrize("preset", ["fedpcl-table2", "fedpcl-table3"])
def test_fedpcl_comparison_runs_fedrep_at_the_papers_budget(preset, tmp_path):
    """FedPCL sets E = 1 for every method: FedRep's cells resolve to 1 classifier epoch + 1 body epoch."""
    from fedcache.presets import PRESETS
    from fedcache.grids import GridSpec, cells, train_config

    p = PRESETS.get(preset)
    rep = [e for e in p.experiments if "fedrep" in e.methods]
    assert rep and all(e.methods == ("fedrep",) for e in rep)
    assert all(n.experiment.endswith("-fedrep") for n in p.paper if n.method == "fedrep")
    for e in rep:
        spec = GridSpec(tmp_path, e.store_dataset, list(e.backbones), list(e.methods), tmp_path, list(e.seeds), dict(e.sweep))
        for cell in cells(spec):
            run = train_config(spec, cell, None)
            assert run.get("local_epochs") == 1
            assert run.method.params.head_epochs == 1
    assert METHODS.get("fedrep").Settings().head_epochs == 10  # FedRep's own default is untouched


# ---- on test_methods.py's skewed problem -------------------------------------------------------------------
def test_fedrep_sends_only_the_body(skewed):
    m = make("fedrep", skewed)
    body = sum(t[0].numel() for n, t in m.head.init(1, torch.Generator()).items() if n in m.head.body_keys)
    assert body == skewed.dim * 256 + 3 * 256  # fc1 weight and bias, BatchNorm weight and bias
    s = run(m, RunConfig(rounds=2)).summary
    assert s["bytes_up"] == s["bytes_down"] == 2 * 5 * body * 4
    with pytest.raises(ConfigError, match="use --head mlp"):
        make("fedrep", skewed, head="linear")


def test_fedrep_keeps_classifiers_personal(skewed):
    r = run(make("fedrep", skewed), RunConfig(rounds=1))
    assert set(r.server) == {"fc1.weight", "fc1.bias", "bn.weight", "bn.bias"}
    w = r.clients["fc2.weight"]
    assert not torch.allclose(w[0], w[1])  # trained on different data, never averaged
