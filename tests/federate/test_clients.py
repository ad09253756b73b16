"""Clients' personal state (fedcache/federate/clients.py): held for the clients a round has written where the method
can make a client's initial state alone, every client's where it cannot; reads, writes and checkpoints of either
give what a stack of every client's state gives."""
import numpy as np
import pytest
import torch

from fedcache.federate.clients import ClientStates
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.federate.schedule import Schedule

from .conftest import synthetic


def initial(clients):
    """Client k starts at k (a state each client has alone, as a method's initial_states makes it)."""
    k = torch.tensor(clients, dtype=torch.float32)
    return {"w": k[:, None, None].expand(-1, 2, 3).clone(), "n": torch.zeros(len(clients), 1)}


def stack(n):
    return initial(list(range(n)))


@pytest.mark.parametrize("lazy", [True, False])
def test_reads_and_writes_equal_those_of_a_stack_of_every_client(lazy):
    n, g = 50, torch.Generator().manual_seed(0)
    held = ClientStates(n, initial, initial([0])) if lazy else ClientStates(n, None, stack(n))
    dense = stack(n)
    for step in range(12):
        clients = sorted(torch.randperm(n, generator=g)[: 1 + step % 7].tolist())
        got = held.take(clients)
        assert all(torch.equal(got[k], dense[k][clients]) for k in dense)
        new = {k: t + step + 1 for k, t in got.items()}
        held.put(clients, new)
        for k in dense:
            dense[k][clients] = new[k]
    mixed = [3, 0, 49, 17, 17, 8]  # any order, repeats, written and never-written clients together
    assert all(torch.equal(held.take(mixed)[k], dense[k][mixed]) for k in dense)
    assert all(torch.equal(held[k], dense[k]) for k in dense) and list(held) == ["w", "n"]
    trained = sorted(np.flatnonzero(held.trained).tolist())
    assert held.used == (len(trained) if lazy else n) and len(trained) < n
    assert len(held.rows["w"]) < (2 * len(trained) + 16 if lazy else n + 1)  # room grows by doubling
    ck = held.checkpoint()
    assert ck["client_ids"].tolist() == trained and len(ck["clients"]["w"]) == len(trained)
    again = ClientStates(n, initial, initial([0])).restore(ck["clients"], ck["client_ids"])
    assert all(torch.equal(again[k], dense[k]) for k in dense)
    assert ClientStates(n, initial, initial([0])).restore(dense, None).trained.all()  # an older checkpoint: every client's


def test_a_round_of_every_client_trains_the_held_tensors_in_place():
    held = ClientStates(6, initial, initial([0]))
    everyone = list(range(6))
    held.put(everyone, held.take(everyone))
    given = held.take(everyone)
    assert all(given[k] is held.rows[k] for k in given)
    given["w"].add_(1)  # in place, as local training updates weights
    held.put(everyone, given)
    assert torch.equal(held["w"], stack(6)["w"] + 1)


@pytest.mark.parametrize("name, settings", [("pfedme", {}), ("fedrep", {}), ("fedproto", {"init": "shared"}),
                                            ("fedproto", {}), ("fedpcl", {})])
def test_a_run_of_many_clients_holds_only_those_it_trained(name, settings):
    """400 clients, 4 a round, 3 rounds: at most 12 clients' state held, also where every client's random head comes
    from one stream (fedproto's default per-client heads, fedpcl), and a never-trained client's state is its row of
    every client's made at once."""
    data = synthetic(n_clients=400, per_client=3)
    head = "projection" if name == "fedpcl" else "mlp"
    ctx = MethodContext(data, head, OptimConfig("adam", 1e-2), Schedule(batch_size=4))
    method = METHODS.get(name)(ctx, METHODS.get(name).Settings(**settings))
    r = run(method, RunConfig(rounds=3, fraction=0.01, eval_every=3))
    assert 0 < r.clients.trained.sum() <= 12 and len(next(iter(r.clients.rows.values()))) <= 16
    dense = method.init_clients(data.n_clients)
    untouched = np.flatnonzero(~r.clients.trained)
    assert all(torch.equal(r.clients.take(untouched)[k], dense[k][untouched]) for k in dense)


def test_client_states_of_another_number_of_clients_are_init_clients_rows():
    """A head drawn for every client depends on how many there are: asked for n clients other than the run's,
    the states are ``init_clients(n)``'s."""
    data = synthetic(n_clients=20, per_client=3)
    method = METHODS.get("fedproto")(MethodContext(data, "mlp", OptimConfig("adam", 1e-2), Schedule(batch_size=4)))
    for n in (5, 40):
        dense = method.init_clients(n)
        got = ClientStates.of(method, n).take([n - 1, 0])
        assert all(torch.equal(got[k], dense[k][[n - 1, 0]]) for k in dense)


def test_a_never_trained_client_s_state_is_made_on_the_run_s_device_and_saved_as_a_plain_dict():
    """Read after the run (a GPU run's result, the default device back to the CPU), a never-trained client's state
    is made where the held rows are; saved, the states are the dict they read as (pickling the object itself, with
    the method behind it, is refused)."""
    import io

    held = ClientStates(5, initial, {k: t.to("meta") for k, t in initial([0]).items()})
    held.put([2], {k: t.to("meta") for k, t in initial([2]).items()})
    assert all(t.device.type == "meta" for t in held.take([0, 2, 4]).values())
    cpu = ClientStates(5, initial, initial([0]))
    cpu.put([1], {k: t + 7 for k, t in initial([1]).items()})
    buf = io.BytesIO()
    with pytest.raises(TypeError, match=r"save dict\(states\)"):
        torch.save(cpu, io.BytesIO())
    torch.save(dict(cpu), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert type(saved) is dict and all(torch.equal(saved[k], cpu[k]) for k in cpu) and "w" in cpu and "x" not in cpu
    with pytest.raises(ValueError, match="a client appears twice"):
        cpu.put([0, 0], initial([0, 0]))


def test_a_method_whose_initial_states_are_empty_has_no_personal_state():
    class Stateless:
        class ctx:
            class data:
                n_clients = 4

        def initial_states(self, clients):
            return {}

        def init_clients(self, n):
            return {}

    held = ClientStates.of(Stateless())
    held.put([1, 3], {})
    assert not held and held.take([0, 2]) == {} and held.checkpoint() == {"clients": {}}


def test_evaluation_draws_each_block_of_never_trained_heads_once_and_scores_it_as_drawn(monkeypatch):
    """Evaluation reads the clients a block of heads/draws.py at a time: never-trained clients' random heads are
    their block's draws, each block drawn once an evaluation and scored without a copy (at 1,000 clients of an mlp
    head, copying each head out of its block made the draws take 1.6x as long: benchmarks/personal_eval.py)."""
    from fedcache.federate.driver import RunState
    from fedcache.federate.inprocess import evaluate
    from fedcache.heads.draws import ClientHeads

    data = synthetic(n_clients=40, per_client=3)  # blocks of 16, 16 and 8 clients
    method = METHODS.get("fedproto")(MethodContext(data, "mlp", OptimConfig("adam", 1e-2), Schedule(batch_size=4)))
    state = RunState(0, method.init_server(), ClientStates.of(method))
    drawn, scored, block, logits = [], [], ClientHeads._block, method.client_logits
    monkeypatch.setattr(ClientHeads, "_block", lambda self, p, b: drawn.append(block(self, p, b)) or drawn[-1])
    monkeypatch.setattr(method, "client_logits", lambda server, states, *a: scored.append(states) or logits(server, states, *a))
    evaluate(method, state)
    per_block = sum(1 for p in method.head.layout() if p.fan_in)
    assert len(drawn) == 3 * per_block and len(scored) == 3
    assert all(any(states[name] is t for t in drawn) for states in scored for name in ("fc1.weight", "fc2.weight"))


def test_a_never_trained_client_is_scored_once_and_a_trained_one_at_every_evaluation(monkeypatch):
    """Where a client's score reads its own state alone (fedproto's classifier), a client no round has written is
    scored at the first evaluation only and keeps that score (scoring them again was most of a run of 10 of 1,000
    clients a round: benchmarks/personal_eval.py); a written client is scored at every evaluation, by itself but
    padded as its whole block is, to the accuracies every client scored again gives."""
    from fedcache.federate.driver import RunState
    from fedcache.federate.inprocess import evaluate

    sizes = [3 + k % 5 for k in range(40)]  # blocks of 16, 16 and 8 clients, of 3 to 7 test rows
    data = synthetic(n_clients=40, sizes=sizes)
    method = METHODS.get("fedproto")(MethodContext(data, "mlp", OptimConfig("adam", 1e-2), Schedule(batch_size=4)))
    state = RunState(0, method.init_server(), ClientStates.of(method))
    scored, logits = [], method.client_logits
    monkeypatch.setattr(method, "client_logits", lambda server, states, clients, x:
                        scored.append((list(clients), x.shape[1])) or logits(server, states, clients, x))
    first = evaluate(method, state)["per_client"]
    assert [k for clients, _ in scored for k in clients] == list(range(40))
    scored.clear()
    assert evaluate(method, state)["per_client"] == first and scored == []
    state.clients.put([20], {k: t + 0.5 for k, t in state.clients.take([20]).items()})  # client 20 trained
    third = evaluate(method, state)["per_client"]
    assert scored == [([20], max(sizes[16:32]))]
    assert third[:20] + third[21:] == first[:20] + first[21:]
    assert evaluate(method, RunState(0, state.server, state.clients))["per_client"] == third  # nothing kept: all scored
