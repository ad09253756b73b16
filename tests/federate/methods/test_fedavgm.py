"""FedAvgM's server step against hand-computed momentum, and what stays on the server."""
from __future__ import annotations

import pytest
import torch

from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, LocalResult, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.federate.schedule import Schedule

from ..conftest import synthetic


def fedavgm(head: str = "linear", **settings):
    data = synthetic(n_clients=4, per_client=30, n_classes=3, dim=4)
    cls = METHODS.get("fedavgm")
    ctx = MethodContext(data, head, OptimConfig("sgd", 0.05), Schedule(local_epochs=1, batch_size=8))
    return cls(ctx, cls.Settings(**settings))


def uploads(values: list[float], like: dict) -> LocalResult:
    """Two clients whose heads are every entry equal to values[k], with 1 and 3 training rows."""
    stacked = {n: torch.stack([torch.full(t.shape[1:], v) for v in values]) for n, t in like.items()}
    return LocalResult({}, stacked, torch.tensor([1.0, 3.0]))


def test_the_server_steps_along_the_momentum_of_the_averaged_updates():
    m = fedavgm(server_momentum=0.5, server_lr=2.0)
    server = {n: torch.ones_like(t) if not n.startswith("v.") else t for n, t in m.init_server().items()}
    model = m.broadcast(server, 0)
    # Round 1: average (1*0 + 3*0.8) / 4 = 0.6; update w - avg = 0.4; v = 0.4; w = 1 - 2 * 0.4 = 0.2.
    server = m.aggregate(server, uploads([0.0, 0.8], model), [0, 1], 0)
    for n in model:
        torch.testing.assert_close(server[f"v.{n}"], torch.full_like(model[n], 0.4))
        torch.testing.assert_close(server[n], torch.full_like(model[n], 0.2))
    # Round 2: average (0.2 + 3*0.1) / 4 = 0.125; update 0.2 - 0.125 = 0.075; v = 0.5 * 0.4 + 0.075 = 0.275;
    # w = 0.2 - 2 * 0.275 = -0.35 (FedAvg would be at 0.125: the momentum carries the first round's step on).
    server = m.aggregate(server, uploads([0.2, 0.1], model), [0, 1], 1)
    for n in model:
        torch.testing.assert_close(server[f"v.{n}"], torch.full_like(model[n], 0.275))
        torch.testing.assert_close(server[n], torch.full_like(model[n], -0.35))


def test_batchnorm_statistics_take_the_plain_average_and_have_no_momentum():
    # server_lr = 2: at 1 a first momentum step from v = 0 lands on the average too, and could not tell them apart.
    m = fedavgm("mlp", server_lr=2.0)
    server = m.init_server()
    keys = set(m.head.init(1, m.generator(0, 0)))
    assert set(server) == keys | {f"v.{n}" for n in keys - set(m.head.buffer_keys)}
    model = m.broadcast(server, 0)
    out = m.aggregate(server, uploads([0.0, 0.8], model), [0, 1], 0)
    for n in m.head.buffer_keys:
        torch.testing.assert_close(out[n], torch.full_like(model[n], 0.6))


@pytest.mark.parametrize("head", ["linear", "mlp"])
def test_without_momentum_at_unit_rate_it_is_fedavg_and_sends_what_fedavg_sends(head):
    plain = METHODS.get("fedavg")
    still = run(fedavgm(head, server_momentum=0.0, server_lr=1.0), RunConfig(rounds=4, fraction=0.5))
    m = fedavgm(head)
    ref = run(plain(m.ctx, plain.Settings()), RunConfig(rounds=4, fraction=0.5))
    # Bit for bit: w - (w - average) would round away from FedAvg's average (by ~1e-7 over 4 rounds).
    assert still.history == ref.history
    for n in ref.server:
        assert torch.equal(still.server[n], ref.server[n]), n
    moving = run(fedavgm(head), RunConfig(rounds=4, fraction=0.5))
    assert not all(torch.allclose(moving.server[n], ref.server[n], atol=1e-3) for n in ref.server)
    # The momentum buffers stay on the server: the same bytes travel as for FedAvg.
    for key in ("bytes_up", "bytes_down", "params_up_per_round"):
        assert moving.summary[key] == ref.summary[key]
    assert not any(n.startswith("v.") for n in m.broadcast(m.init_server(), 0))


def test_a_resumed_run_continues_its_momentum(tmp_path):
    full = run(fedavgm(), RunConfig(rounds=4))

    def stop_after_two(done, total, line):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(fedavgm(), RunConfig(rounds=4, out=tmp_path), on_round=stop_after_two)
    resumed = run(fedavgm(), RunConfig(rounds=4, out=tmp_path, resume=True))
    assert resumed.history == full.history
    for n in full.server:
        assert torch.equal(resumed.server[n], full.server[n]), n
