"""The in-process engine (fedcache/federate/inprocess.py): batched == per-client training, client state trained in
place, and the whole personal state a method must return."""
import pytest
import torch

from fedcache.federate.inprocess import RunConfig, run

from .conftest import synthetic
from .test_driver import make


@pytest.mark.parametrize("head", ["linear", "mlp"])
def test_batched_and_loop_paths_agree_with_unequal_clients(head):
    data = synthetic(sizes=[37, 80, 12, 64, 51])  # different step counts per client
    a = run(make("fedavg", data, head=head), RunConfig(rounds=3, batched=True))
    b = run(make("fedavg", data, head=head), RunConfig(rounds=3, batched=False))
    for n in a.server:
        torch.testing.assert_close(a.server[n], b.server[n], atol=0, rtol=0)  # the optimizer pads rows (optim.LANES)
    assert a.summary["per_client_accuracy"] == b.summary["per_client_accuracy"]


# Methods with personal client state, which the loop hands to local training without a copy when
# every client trains (mlp-head methods replace BatchNorm statistics; fedpcl and pfedme replace
# other state).
STATEFUL = ["solo", "fedproto", "fedrep", "pfedme", "fedpcl"]


@pytest.mark.parametrize("name", STATEFUL)
def test_training_client_state_in_place_equals_training_a_copy(name, monkeypatch):
    from fedcache.federate.clients import ClientStates

    data = synthetic(sizes=[37, 80, 12, 64, 51])
    in_place = run(make(name, data), RunConfig(rounds=3))
    assert ClientStates._all_held_in_order(in_place.clients, list(range(data.n_clients)))  # the path taken
    monkeypatch.setattr(ClientStates, "_all_held_in_order", lambda self, idx: False)  # copies in and out
    copied = run(make(name, data), RunConfig(rounds=3))
    assert in_place.summary["per_client_accuracy"] == copied.summary["per_client_accuracy"]
    for got, want in ((in_place.clients, copied.clients), (in_place.server, copied.server)):
        for n in want:
            torch.testing.assert_close(got[n], want[n], atol=0, rtol=0, msg=n)


def test_a_method_must_return_its_clients_whole_state(data):
    from fedcache.errors import FedcacheError
    from fedcache.federate.methods.solo import Solo

    class Forgetful(Solo):  # returns its weights but not its BatchNorm statistics
        def local_update(self, rnd, clients, down, states):
            r = super().local_update(rnd, clients, down, states)
            r.states = {n: t for n, t in r.states.items() if not n.startswith("bn.running")}
            return r

    m = make("solo", data, head="mlp")
    with pytest.raises(FedcacheError, match=r"solo.local_update returned states .* every entry of the personal state"):
        run(Forgetful(m.ctx, m.p), RunConfig(rounds=1, fraction=0.6))
