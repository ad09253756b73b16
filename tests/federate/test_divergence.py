"""Divergence (fedcache/federate/divergence.py): a non-finite upload names its round, client and likely cause."""
import pytest
import torch

from fedcache.federate.divergence import DivergedError
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.optim import OptimConfig

from .test_driver import make


def test_non_finite_features_are_named_not_blamed_on_the_learning_rate(data):
    row = int(data.client_train[3][2])
    data.x_train[row, 5] = float("nan")
    with pytest.raises(DivergedError, match=rf"round 1, client 3.*training features are not finite \(1 of its 60 "
                                            rf"training rows, e.g. rows \[{row}\]") as err:
        run(make("fedavg", data), RunConfig(rounds=2))
    assert "learning rate" not in str(err.value)


def test_divergence_from_finite_inputs_names_round_client_and_the_learning_rate(data):
    # SGD steps of 1e38 overflow float32 within a few steps.
    with pytest.raises(DivergedError, match=r"round 1, client 0: '(weight|bias)'.*diverged from finite inputs: "
                                            r"lower the learning rate"):
        run(make("fedavg", data, optim=OptimConfig("sgd", 1e38, 0.0, 0.0)), RunConfig(rounds=2))


def test_a_non_finite_upload_that_is_not_a_head_weight_is_named(data):
    from fedcache.federate.methods.fedavg import FedAvg

    class Broken(FedAvg):
        def local_update(self, rnd, clients, down, states):
            r = super().local_update(rnd, clients, down, states)
            r.uploads["protos"] = torch.full((len(clients), 2), float("-inf"))
            return r

    m = make("fedavg", data)
    with pytest.raises(DivergedError, match=r"'protos' is not a weight of the linear head.*finite features") as err:
        run(Broken(m.ctx, m.p), RunConfig(rounds=1))
    assert "lower the learning rate" not in str(err.value)
