"""benchmarks/parity.py's reference loop and fedcache agree step for step on a tiny problem when they
share the initial weights and the mini-batches (the benchmark itself draws both independently)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedcache.federate.schedule import Schedule
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods.fedproto import PFLLIB, drop_incomplete
from fedcache.federate.optim import OptimConfig
from tests.federate.conftest import synthetic

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import parity  # noqa: E402

ROUNDS, BATCH = 3, 16


@pytest.fixture(scope="module")
def data():
    # One thread for speed; restored afterwards, because a later test in this process (the extraction
    # kill/resume test) compares against a subprocess that runs with the default thread count.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield synthetic(n_clients=3, sizes=[40, 37, 52], dim=16)  # 40 % 16 != 0: drop_last drops rows
    torch.set_num_threads(n)


def fedcache(name, data, head, **params):
    cls = METHODS.get(name)
    ctx = MethodContext(data, head, OptimConfig("sgd", 0.01, 0.0, 0.0), schedule=Schedule(local_epochs=1, batch_size=BATCH, seed=3, rounds=ROUNDS))
    return cls(ctx, cls.Settings(**params))


def modules(params, data, head, k):
    """Client k's stacked fedcache parameters as parity.make_model's torch.nn modules."""
    m = parity.make_model(data.dim, data.n_classes, head)
    with torch.no_grad():
        if head == "linear":
            m["head"].weight.copy_(params["weight"][k].T), m["head"].bias.copy_(params["bias"][k, 0])
            return m
        fc1, bn = m["base"][0], m["base"][2]
        fc1.weight.copy_(params["fc1.weight"][k].T), fc1.bias.copy_(params["fc1.bias"][k, 0])
        bn.weight.copy_(params["bn.weight"][k, 0]), bn.bias.copy_(params["bn.bias"][k, 0])
        bn.running_mean.copy_(params["bn.running_mean"][k, 0]), bn.running_var.copy_(params["bn.running_var"][k, 0])
        m["head"].weight.copy_(params["fc2.weight"][k].T), m["head"].bias.copy_(params["fc2.bias"][k, 0])
    return m


def same_batches(method, drop):
    def batches(rnd, k):
        plan = method.plan(rnd, [k])
        plan = drop_incomplete(plan) if drop else plan
        return [row[row >= 0] for row in plan[0] if (row >= 0).any()]
    return batches


def test_fedproto_with_pfllib_options_matches_the_reference_loop(data):
    m = fedcache("fedproto", data, "mlp", **PFLLIB)
    ours = run(m, RunConfig(rounds=ROUNDS))
    models = [modules(m.init_clients(data.n_clients), data, "mlp", k) for k in range(data.n_clients)]
    theirs = parity.reference_fedproto(data, ROUNDS, models, same_batches(m, drop=True))
    assert parity.pooled_history(m, ours.history) == pytest.approx(theirs, abs=1e-3)
    for k, model in enumerate(models):
        torch.testing.assert_close(model["base"][0].weight, ours.clients["fc1.weight"][k].T, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(model["base"][2].running_var, ours.clients["bn.running_var"][k, 0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(model["head"].weight, ours.clients["fc2.weight"][k].T, atol=1e-5, rtol=1e-4)


def test_fedproto_defaults_differ_from_the_reference_loop(data):
    """The check above can fail: fedcache's paper defaults are another algorithm."""
    m = fedcache("fedproto", data, "mlp", **{**PFLLIB, "init": "per-client", "aggregation": "weighted"})
    ours = run(m, RunConfig(rounds=ROUNDS))
    ref = fedcache("fedproto", data, "mlp", **PFLLIB)
    models = [modules(ref.init_clients(data.n_clients), data, "mlp", k) for k in range(data.n_clients)]
    parity.reference_fedproto(data, ROUNDS, models, same_batches(ref, drop=True))
    assert not torch.allclose(models[0]["base"][0].weight, ours.clients["fc1.weight"][0].T, atol=1e-4)


def test_fedavg_matches_the_reference_loop(data):
    m = fedcache("fedavg", data, "linear")
    ours = run(m, RunConfig(rounds=ROUNDS))
    model = modules(m.init_server(), data, "linear", 0)
    theirs = parity.reference_fedavg(data, ROUNDS, model, same_batches(m, drop=False))
    assert parity.pooled_history(m, ours.history) == pytest.approx(theirs, abs=1e-3)
    torch.testing.assert_close(model["head"].weight, ours.server["weight"][0].T, atol=1e-5, rtol=1e-4)
