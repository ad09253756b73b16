"""The reported accuracy is the mean of per-client accuracies (each client's own test rows), not the
accuracy pooled over all test rows: with unequal test sets the two differ."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcache.federate.schedule import Schedule
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from tests.federate.conftest import synthetic


@pytest.mark.parametrize("name", ["fedavg", "solo"])
def test_accuracy_is_the_mean_over_clients_of_their_own_accuracy(name):
    data = synthetic(n_clients=3, sizes=[10, 200, 30], spread=3.0)
    cls = METHODS.get(name)
    m = cls(MethodContext(data, "linear", OptimConfig("sgd", 0.05), schedule=Schedule(local_epochs=1, batch_size=16, seed=0, rounds=2)),
            cls.Settings())
    a = run(m, RunConfig(rounds=2))
    per_client = np.array(a.summary["per_client_accuracy"])
    if m.has_global_model:
        with torch.no_grad():
            hit = (m.global_logits(a.server, data.x_test).argmax(1) == data.y_test).numpy()
        by_hand = [100.0 * hit[r].mean() for r in data.client_test]
        np.testing.assert_allclose(per_client, by_hand, atol=1e-3)
        pooled = 100.0 * hit.mean()
        assert abs(pooled - per_client.mean()) > 1e-3  # the data makes the two readings differ
    assert a.summary["mean_accuracy"] == pytest.approx(per_client.mean(), abs=1e-3)
    assert a.history[-1]["accuracy"] == pytest.approx(per_client.mean(), abs=1e-3)  # the per-round line too


def test_scoring_every_client_at_once_gives_each_clients_own_mean_bit_for_bit():
    from fedcache.federate.inprocess import EVAL_CLIENTS, mean_over_clients

    rng = np.random.default_rng(0)
    correct = rng.random(5000) < 0.37
    # More clients than one block, some without any test rows (their accuracy is NaN, as numpy's mean of nothing).
    rows = [np.sort(rng.choice(5000, rng.integers(0, 40), replace=False)) for _ in range(EVAL_CLIENTS + 300)]
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        one_by_one = np.array([100.0 * correct[r].mean() for r in rows])
    np.testing.assert_array_equal(mean_over_clients(correct, rows), one_by_one)
    assert np.isnan(one_by_one).any()
