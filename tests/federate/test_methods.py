"""Every registered method on a small separable problem, plus hand-computed checks per method."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.federate.schedule import Schedule
from fedcache.errors import ConfigError
from fedcache.federate.local import masked_mean
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, LocalResult, MethodContext
from fedcache.federate.methods.base import gradients
from fedcache.federate.methods.perfedavg import meta_gradient
from fedcache.federate.optim import OptimConfig

from .conftest import synthetic

ROUNDS = 5
HELD = 6  # classes each client holds (label skew, so FedProto's clients miss some classes)




@pytest.fixture(scope="module")
def skewed():
    """5 clients, 10 classes, 32-d; client k holds classes k..k+5 (mod 10), about 70 rows each."""
    data = synthetic(per_client=120)
    for k in range(data.n_clients):
        held = (k + np.arange(HELD)) % data.n_classes
        data.client_train[k] = data.client_train[k][np.isin(data.y_train[data.client_train[k]].numpy(), held)]
        data.client_test[k] = data.client_test[k][np.isin(data.y_test[data.client_test[k]].numpy(), held)]
    # A stand-in text tower for clip-zs, clip-fc-centralized and fst-cbdg: unit class directions.
    data.info["text"] = F.normalize(F.one_hot(data.y_train).float().T @ F.normalize(data.x_train, dim=-1), dim=-1)
    # Two noisy "augmented views" per row for the self-supervised methods (flesd and its baselines).
    data.views = data.x_train[:, None] + 0.5 * torch.randn(len(data.x_train), 2, data.dim, generator=torch.Generator().manual_seed(5))
    return data


def make(name, data, head=None, seed=0, **params):
    cls = METHODS.get(name)
    ctx = MethodContext(data, head or cls.default_head, OptimConfig("adam", 1e-2), schedule=Schedule(local_epochs=2, batch_size=16, seed=seed, rounds=ROUNDS))
    return cls(ctx, cls.Params(**params))


def summary(result):
    return {k: v for k, v in result.summary.items() if k != "seconds"}


# Methods that run a real CLIP text tower on class names cannot run on these synthetic features; the same
# checks (learning, determinism, batched == per-client, exact bytes) are in tests/federate/test_prompts.py.
NEEDS_CLIP = {"promptfl", "tpfl", "atpfl"}


# FLESD's server trains its own model with Adam on similarities formed from the clients' uploads, so the
# clients' 1e-8 rounding differences pass through a second optimisation within the round (measured: 1.4e-4 on
# 44 of 16384 weights of the server's first layer, scale 0.24, after one round on the 1-thread CPU).
SERVER_TRAINS, SERVER_TRAINS_TOL = {"flesd"}, 1e-3


@pytest.mark.parametrize("name", [n for n in METHODS.names() if n not in NEEDS_CLIP])
def test_method_learns_deterministically_and_counts_bytes(name, skewed):
    sizes = []
    m = make(name, skewed)
    upload_size = m.upload_size
    m.upload_size = lambda up, i: sizes.append(upload_size(up, i)) or sizes[-1]
    a = run(m, RunConfig(rounds=ROUNDS))
    s = a.summary
    assert s["mean_accuracy"] > 60, s  # chance is 1/6 on a client's own classes
    assert all(math.isfinite(v) for v in s["per_client_accuracy"])
    assert all(torch.isfinite(t).all() for t in [*a.server.values(), *a.clients.values()])
    # When every client trains, local training updates the loop's stored client state in place: the
    # server state must never be a view of it.
    client_memory = {t.untyped_storage().data_ptr() for t in a.clients.values()}
    assert not any(t.untyped_storage().data_ptr() in client_memory for t in a.server.values())
    assert (s["global_accuracy"] is not None) == m.has_global_model
    assert summary(run(make(name, skewed), RunConfig(rounds=ROUNDS))) == summary(a)
    assert s["bytes_up"] == sum(b for _, b in sizes)
    assert (s["bytes_up"] > 0 and s["bytes_down"] > 0) == m.federated
    if m.splittable:
        # bmm over K clients and over one client round differently (1e-8); Adam turns that noise on
        # elements whose true gradient is zero (dead ReLU units) into lr-sized steps within a few
        # rounds (FedRep's 10 head epochs), so parameters are compared after one round.
        a = run(make(name, skewed), RunConfig(rounds=1, batched=True))
        b = run(make(name, skewed), RunConfig(rounds=1, batched=False))
        assert b.summary["per_client_accuracy"] == a.summary["per_client_accuracy"]
        for got, want in ((b.server, a.server), (b.clients, a.clients)):
            assert got.keys() == want.keys()
            for n in want:
                tol = SERVER_TRAINS_TOL if name in SERVER_TRAINS else 1e-4
                torch.testing.assert_close(got[n], want[n], atol=tol, rtol=tol)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedntd", "perfedavg", "pfedme"])
def test_whole_head_methods_send_the_whole_head(name, skewed):
    n = skewed.dim * skewed.n_classes + skewed.n_classes  # linear head: W and b
    s = run(make(name, skewed, head="linear"), RunConfig(rounds=2)).summary
    assert s["bytes_up"] == s["bytes_down"] == 2 * 5 * n * 4 and s["params_up_per_round"] == 5 * n


# ---- FedProto ------------------------------------------------------------------------------------
def test_fedproto_averages_prototypes_weighted_by_class_counts(skewed):
    m = make("fedproto", skewed)
    server = {"protos": torch.tensor([[0.0, 0], [0, 0], [0, 0], [5, 5]]), "counts": torch.tensor([0.0, 0, 0, 7])}
    uploads = {"protos": torch.tensor([[[1.0, 1], [9, 9], [0, 2], [0, 0]], [[4.0, 4], [2, 0], [7, 7], [0, 0]]]),
               "counts": torch.tensor([[2.0, 0, 1, 0], [1.0, 3, 0, 0]])}
    new = m.aggregate(server, LocalResult({}, uploads, torch.tensor([3.0, 4])), [0, 1], 0)
    # class 0: (2*[1,1] + 1*[4,4]) / 3; classes 1, 2: one holder each (the absent clients' rows are
    # ignored); class 3: held by nobody this round, keeps its prototype.
    torch.testing.assert_close(new["protos"], torch.tensor([[2.0, 2], [2, 0], [0, 2], [5, 5]]))
    torch.testing.assert_close(new["counts"], torch.tensor([3.0, 3, 1, 7]))


def test_fedproto_sends_only_the_classes_a_client_holds(skewed):
    m = make("fedproto", skewed)
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
    m = make("fedproto", skewed, local_protos=local_protos)  # 2 local epochs, batch 16, unequal clients
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
    after = make("fedproto", skewed).local_update(0, clients, down, start)
    if epochs_used == 1:
        torch.testing.assert_close(result.uploads["counts"], after.uploads["counts"])
    assert not torch.allclose(result.uploads["protos"], after.uploads["protos"])  # train mode, moving weights


def test_fedproto_last_epoch_prototypes_batched_equals_loop(skewed):
    a = run(make("fedproto", skewed, local_protos="last-epoch"), RunConfig(rounds=3, batched=True))
    b = run(make("fedproto", skewed, local_protos="last-epoch"), RunConfig(rounds=3, batched=False))
    assert summary(a) == summary(b)
    with pytest.raises(ConfigError, match="local_protos"):
        make("fedproto", skewed, local_protos="first-epoch")


def test_fedproto_prototype_prediction_and_head_errors(skewed):
    assert run(make("fedproto", skewed, predict="proto"), RunConfig(rounds=ROUNDS)).summary["mean_accuracy"] > 60
    with pytest.raises(ConfigError, match="no representation layers.*use --head mlp"):
        make("fedproto", skewed, head="linear")
    with pytest.raises(ConfigError, match="predict"):
        make("fedproto", skewed, predict="nearest")


# ---- FedRep --------------------------------------------------------------------------------------
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


# ---- FedNTD --------------------------------------------------------------------------------------
# The loss against hand-computed values at tau != 1: tests/federate/methods/test_fedntd.py.
def test_fedntd_equals_fedavg_with_beta_zero(skewed):
    a = run(make("fedntd", skewed, beta=0.0), RunConfig(rounds=2))
    b = run(make("fedavg", skewed), RunConfig(rounds=2))
    for n in a.server:
        torch.testing.assert_close(a.server[n], b.server[n])


# ---- pFedMe --------------------------------------------------------------------------------------
@pytest.mark.parametrize("beta, want", [(1.0, 4.0), (0.5, 2.5), (2.0, 7.0)])
def test_pfedme_server_mixes_the_average_with_beta(beta, want, skewed):
    m = make("pfedme", skewed, beta=beta)
    server = {"w": torch.tensor([[1.0]])}
    result = LocalResult({}, {"w": torch.tensor([[3.0], [6.0]])}, torch.tensor([2.0, 1.0]))  # average 4
    torch.testing.assert_close(m.aggregate(server, result, [0, 1], 0)["w"], torch.tensor([[want]]))


def test_pfedme_inner_solver_matches_hand_computation(skewed):
    # With data gradient g, one inner step is theta - lr * (g + lam (theta - w)).
    m = make("pfedme", skewed, head="linear", inner_steps=1, personal_lr=0.1, lam=2.0)
    w = {"weight": torch.zeros(1, skewed.dim, skewed.n_classes), "bias": torch.zeros(1, 1, skewed.n_classes)}
    theta = {n: t + 0.5 for n, t in w.items()}
    batch = m.batch(torch.from_numpy(skewed.client_train[0][:4])[None])
    g, _ = gradients(m.ce_loss, theta, ("weight", "bias"), batch)
    got = m.personalize(theta, w, ("weight", "bias"), batch, torch.tensor([True]))
    for n in w:
        torch.testing.assert_close(got[n], theta[n] - 0.1 * (g[n] + 2.0 * (theta[n] - w[n])))


# ---- Per-FedAvg ----------------------------------------------------------------------------------
def quadratic(p, xb, yb, mask, info):
    """f(w; D) = mean over D of (w - x)^2 / 2, so grad f = w - mean(D) and the Hessian is 1."""
    return masked_mean(0.5 * (p["w"] - xb[..., 0]) ** 2, mask)


def batch_of(*values):
    x = torch.tensor(values).view(1, -1, 1)
    return x, torch.zeros(1, len(values), dtype=torch.long), torch.ones(1, len(values), dtype=torch.bool)


def test_perfedavg_first_order_and_hessian_free_steps():
    w, alpha = {"w": torch.tensor([[2.0]])}, 0.1
    d1, d2 = batch_of(0.5, 1.5), batch_of(3.0, 3.0)  # means 1 and 3
    g, _ = meta_gradient(quadratic, w, ("w",), [d1, d2], alpha)
    # temp = 2 - 0.1 * (2 - 1) = 1.9; FO gradient at temp on D2: 1.9 - 3 = -1.1
    torch.testing.assert_close(g["w"], torch.tensor([[-1.1]]))
    g, _ = meta_gradient(quadratic, w, ("w",), [d1, d2, d1], alpha)
    torch.testing.assert_close(g["w"], torch.tensor([[(1 - alpha) * -1.1]]))  # (I - alpha H) g, H = 1


def test_perfedavg_steps_pair_consecutive_batches(skewed):
    m = make("perfedavg", skewed)
    plan = torch.from_numpy(m.plan(0, [0, 1]))
    groups = list(m.step_batches(0, [0, 1]))
    assert len(groups) == math.ceil(plan.shape[1] / 2) and all(len(g) == 2 for g in groups)
    x0 = skewed.x_train[plan[0, 0].clamp_min(0)]
    torch.testing.assert_close(groups[0][0][0][0], x0)
    hf = make("perfedavg", skewed, variant="hf")
    assert all(len(g) == 3 for g in hf.step_batches(0, [0]))
    assert run(hf, RunConfig(rounds=ROUNDS)).summary["mean_accuracy"] > 60
    with pytest.raises(ConfigError, match="variant"):
        make("perfedavg", skewed, variant="so")


def test_every_method_has_params_and_a_docs_page():
    docs = Path(__file__).resolve().parents[2] / "docs" / "methods"
    index = (docs / "README.md").read_text()
    for name in METHODS.names():
        assert dataclasses.is_dataclass(METHODS.get(name).Params), name
        assert (docs / f"{name}.md").exists() and f"`{name}`" in index, f"document {name} in docs/methods/"
