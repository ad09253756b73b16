"""FedPCL against hand-computed values: the prototype sets and their padding, the loss terms (Eq. 8, Eq. 10,
the official ConLoss of contrast=batch, SupCon), prediction by the nearest local prototype, bytes, noise, that
training beats the untrained projection, and the paper presets' heads and data protocol."""
import math

import numpy as np
import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, LocalResult, MethodContext
from fedcache.federate.methods import _fedpcl_losses as L
from fedcache.federate.methods.fedpcl import FedPCLSettings
from fedcache.federate.optim import OptimConfig
from fedcache.federate.prototypes import nearest
from fedcache.federate.schedule import Schedule
from fedcache.presets import PRESETS

from ..conftest import synthetic


def fedpcl(data, **params):
    return METHODS.get("fedpcl")(MethodContext(data, head="projection"), FedPCLSettings(**params))


def test_server_keeps_latest_local_sets_and_padding_fills_missing_classes():
    data = synthetic(n_clients=3, n_classes=2, dim=4)
    m = fedpcl(data)
    server = m.init_server()
    h = m.h
    up = {"protos": torch.zeros(2, 2, h), "count": torch.tensor([[2.0, 0.0], [1.0, 1.0]])}
    up["protos"][0, 0, 0], up["protos"][1, 0, 0], up["protos"][1, 1, 1] = 1.0, 4.0, 1.0
    server = m.aggregate(server, LocalResult({}, up, up["count"].sum(1)), [0, 2], 0)
    assert server["global"][0, 0, 0] == pytest.approx((2 * 1 + 1 * 4) / 3)
    # Held for the clients that sent a set (0 and 2), in client order: client 1 was never sampled.
    assert server["local_ids"].tolist() == [0, 2] and server["local_count"][1].tolist() == [1.0, 1.0]
    sets = L.proto_sets(m, m.broadcast(server, 1))
    (g, g_present), (local, present) = sets
    assert local.shape[0] == 2  # only the clients that reported
    # Client 0 lacks class 1: its set holds the global prototype of class 1 instead (Eq. 7's padding).
    torch.testing.assert_close(local[0, 1], server["global"][0, 1])
    assert present.all()


def test_prototype_sets_touch_only_the_clients_that_reported(monkeypatch):
    # proto_sets runs at every local step: filling all N clients' sets (N x C x H) made a step of 10,000 clients
    # cost 1.7 s of which the loss was a sliver, though only the clients sampled so far have any prototype.
    n, reported = 1000, [3, 700]
    m = fedpcl(synthetic(n_clients=n, n_classes=2, dim=4))
    server = m.init_server()
    up = {"protos": torch.ones(2, 2, m.h), "count": torch.tensor([[2.0, 0.0], [1.0, 1.0]])}
    server = m.aggregate(server, LocalResult({}, up, up["count"].sum(1)), reported, 0)
    shapes, where = [], torch.where
    monkeypatch.setattr(torch, "where", lambda *a: shapes.append([t.shape for t in a if isinstance(t, torch.Tensor)]) or where(*a))
    (_, _), (local, present) = L.proto_sets(m, m.broadcast(server, 1))
    assert local.shape[0] == present.shape[0] == 2
    assert shapes and all(s[0] != n for call in shapes for s in call if s)  # no tensor of every client's sets


def test_paper_term_matches_hand_computation():
    z = torch.tensor([[[1.0, 0.0]]])  # one client, one row of class 0
    P = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])  # one set, three classes
    present = torch.ones(1, 3, dtype=torch.bool)
    loss, valid = L.paper_term(z, torch.tensor([[0]]), P, present, tau=0.5)
    # -log( e^{1/0.5} / (e^{0/0.5} + e^{-1/0.5}) ): the denominator holds negatives only (A(y)).
    expected = -(2.0 - math.log(math.exp(0.0) + math.exp(-2.0)))
    assert loss.item() == pytest.approx(expected) and valid.all()


# Eq. 10's combination L_g + L_p by hand. Two classes, so each term is (z.P_other - z.P_y) / tau.
# Rows: z0 = (1, 0) of class 0, z1 = (0, 1) of class 1; tau = 0.5.
# Global G = [(1, 0), (0, 1)]: L_g = (0 - 1) / 0.5 = -2 for both rows.
# Client 0 holds both classes, L0 = [(0.6, 0.8), (0.8, -0.6)]: row 0 (0.8 - 0.6) / 0.5 = 0.4; row 1 (0.8 + 0.6) / 0.5 = 2.8.
# Client 1 holds class 0 only, (0, 1): class 1 is padded with G_1 = (0, 1), so both terms are 0.
# Client 2 has reported nothing: no set. Loss = mean over the two rows.
_EQ10 = {("both", "sum"): ((-2 + 0.4 + 0) + (-2 + 2.8 + 0)) / 2, ("both", "mean"): ((-2 + 0.2) + (-2 + 1.4)) / 2,
         ("global", "sum"): -2.0, ("local", "sum"): (0.4 + 2.8) / 2, ("local", "mean"): (0.2 + 1.4) / 2}


def test_the_latest_set_replaces_a_client_s_older_one_and_an_older_server_state_reads_the_same():
    from fedcache.federate.methods.fedpcl import latest_sets

    m = fedpcl(synthetic(n_clients=4, n_classes=2, dim=4))
    h = m.h
    first = {"protos": torch.rand(2, 2, h), "count": torch.tensor([[1.0, 2.0], [3.0, 0.0]])}
    then = {"protos": torch.rand(2, 2, h), "count": torch.tensor([[2.0, 2.0], [1.0, 1.0]])}
    server = m.aggregate(m.init_server(), LocalResult({}, first, first["count"].sum(1)), [3, 1], 0)
    server = m.aggregate(server, LocalResult({}, then, then["count"].sum(1)), [1, 0], 1)
    assert server["local_ids"].tolist() == [0, 1, 3]
    torch.testing.assert_close(server["local"], torch.stack([then["protos"][1], then["protos"][0], first["protos"][0]]),
                               rtol=0, atol=0)
    # fedcache before local_ids held a row for every client (zeros for one never sampled): read as the same sets.
    dense = {"local": torch.zeros(4, 2, h), "local_count": torch.zeros(4, 2)}
    dense["local"][[0, 1, 3]], dense["local_count"][[0, 1, 3]] = server["local"], server["local_count"]
    again = {**server, **latest_sets(dense, torch.tensor([2]), torch.zeros(1, 2, h), torch.zeros(1, 2))}
    for (p1, m1), (p2, m2) in zip(L.proto_sets(m, m.broadcast(server, 2)), L.proto_sets(m, m.broadcast(again, 2))):
        torch.testing.assert_close(p1, p2, rtol=0, atol=0)
        torch.testing.assert_close(m1, m2, rtol=0, atol=0)


@pytest.mark.parametrize(("prototypes", "local_reduce"), list(_EQ10))
def test_eq10_combination_and_local_reduce_match_hand_computation(prototypes, local_reduce):
    down = {"global": torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), "global_mask": torch.ones(1, 2, dtype=torch.bool),
            "local": torch.tensor([[[[0.6, 0.8], [0.8, -0.6]], [[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]]),
            "local_count": torch.tensor([[[3.0, 2.0], [4.0, 0.0], [0.0, 0.0]]])}  # one run's sets, as broadcast sends
    m = fedpcl(synthetic(n_clients=3, n_classes=2), tau=0.5, prototypes=prototypes, local_reduce=local_reduce)
    z, y, mask = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool)
    got = L.fedpcl(m, z, y, mask, L.proto_sets(m, down), m.p.tau)
    assert got.item() == pytest.approx(_EQ10[prototypes, local_reduce], abs=1e-6)


def test_batch_term_is_the_official_conloss_by_hand():
    # Rows z0 = (1, 0) of class 0 and z1 = (0, 1) of class 1, two identical views; one prototype set
    # P0 = (0.6, 0.8), P1 = (0.8, -0.6); tau = 0.5. The anchor of a view is its class prototype; the
    # contrast set is every other view; the positive is the other view of the same row.
    z = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    y = torch.tensor([[0, 1]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    P = torch.tensor([[[0.6, 0.8], [0.8, -0.6]]])
    per_row, valid = L.batch_term(z, y, mask, P, torch.ones(1, 2, dtype=torch.bool), tau=0.5)
    # anchor P0: s = (1.2, 1.6, 1.2, 1.6) over (z0, z1, z0', z1'); own view out; positive 1.2
    row0 = -(1.2 - math.log(2 * math.exp(1.6) + math.exp(1.2)))
    # anchor P1: s = (1.6, -1.2, 1.6, -1.2); positive -1.2
    row1 = -(-1.2 - math.log(2 * math.exp(1.6) + math.exp(-1.2)))
    torch.testing.assert_close(per_row[0, :, 0], torch.tensor([row0, row1]))
    assert valid.all()


def test_paper_term_leaves_classes_absent_from_the_set_out_of_the_denominator():
    z = torch.tensor([[[1.0, 0.0]]])
    P = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]])  # class 2: nobody holds it (zeros)
    present = torch.tensor([[True, True, False]])
    loss, valid = L.paper_term(z, torch.tensor([[0]]), P, present, tau=0.5)
    assert loss.item() == pytest.approx(-(2.0 - math.log(math.exp(0.0)))) and valid.all()


def test_prediction_is_the_nearest_local_prototype_by_squared_l2():
    data = synthetic(n_clients=1, n_classes=2, dim=2)
    m = METHODS.get("fedpcl")(MethodContext(data, head="projection"), FedPCLSettings())
    h = m.h
    states = {"proj.weight": torch.zeros(1, 2, h), "proj.bias": torch.zeros(1, 1, h),
              "protos": torch.zeros(1, 2, h), "proto_count": torch.ones(1, 2)}
    states["proj.weight"][0, 0, 0] = states["proj.weight"][0, 1, 1] = 1.0  # z = normalise(relu(x)) in 2 of h dims
    # z = (1, 0). Local: class 0 at (0.5, 0) (squared distance 0.25), class 1 at (1, 0.6) (0.36), but
    # class 1 has the larger dot product (1 > 0.5). The global prototype of class 1 sits on z.
    states["protos"][0, 0, 0] = 0.5
    states["protos"][0, 1, 0], states["protos"][0, 1, 1] = 1.0, 0.6
    server = {"global": torch.zeros(1, 2, h), "global_mask": torch.ones(1, 2, dtype=torch.bool)}
    server["global"][0, 0, 1] = server["global"][0, 1, 0] = 1.0
    logits = m.client_logits(server, states, [0], torch.tensor([[[1.0, 0.0]]]))
    assert logits.argmax(-1).item() == 0
    assert logits[0, 0].tolist() == pytest.approx([-0.25, -0.36], abs=1e-6)


def test_a_client_without_prototypes_of_its_own_predicts_with_the_global_ones():
    """Under --fraction < 1 a client never sampled has no local prototypes; it classifies by the nearest global
    prototype in its own (initial) projection rather than scoring every class -inf (argmax: class 0)."""
    data = synthetic(n_clients=6, n_classes=3, dim=8)
    m = fedpcl(data)
    r = run(m, RunConfig(rounds=1, fraction=0.34))
    never = r.clients["proto_count"].sum(1) == 0
    assert never.any() and not never.all()
    x, y, mask = data.rows_of("test", list(range(6)))
    got = m.client_logits(r.server, r.clients, list(range(6)), x)
    z = m.head.features(r.clients, x)
    k = len(z)
    by_global = nearest(z, r.server["global"].expand(k, -1, -1), r.server["global_mask"].expand(k, -1))
    by_own = nearest(z, r.clients["protos"], r.clients["proto_count"] > 0)
    assert torch.equal(got[never], by_global[never]) and torch.equal(got[~never], by_own[~never])
    assert torch.isfinite(got[never]).all()


def test_summary_tells_what_one_client_sends_from_the_total():
    data = synthetic(n_clients=5, n_classes=10, dim=16)
    s = run(fedpcl(data), RunConfig(rounds=2)).summary
    assert s["params_up_per_client"] == 10 * 256  # Table 2: 2,560 per client for 10 classes x 256
    assert s["params_up_per_round"] == 5 * 10 * 256  # the 5 clients together
    assert s["bytes_up_per_client"] == 10 * (256 * 4 + 16) and s["bytes_up"] == 2 * 5 * 10 * (256 * 4 + 16)
    # Two of five clients per round: per client is still 2,560, per round 5,120.
    s = run(fedpcl(data), RunConfig(rounds=3, fraction=0.4)).summary
    assert (s["params_up_per_client"], s["params_up_per_round"]) == (2560, 2 * 2560)
    assert s["bytes_up_per_client"] == 10 * (256 * 4 + 16) and s["bytes_up"] == 3 * 2 * 10 * (256 * 4 + 16)


def test_with_the_plain_mean_a_client_sends_no_counts():
    """aggregation=mean (the official code) weighs every holder alike: per class only the prototype and its index
    (one int64) travel, where the weighted Eq. 6 needs the class count too."""
    data = synthetic(n_clients=5, n_classes=10, dim=16)
    s = run(fedpcl(data, aggregation="mean"), RunConfig(rounds=2)).summary
    assert s["params_up_per_client"] == 10 * 256
    assert s["bytes_up_per_client"] == 10 * (256 * 4 + 8) and s["bytes_up"] == 2 * 5 * 10 * (256 * 4 + 8)


def test_a_stack_s_memory_estimate_counts_the_batch_contrast_s_similarities():
    """contrast=batch holds, per client of a step and per prototype set, the similarities of its anchors to the
    step's 2B views (five copies at its peak, forward and backward): quadratic in the batch, where the paper's
    form holds only the prototype sets."""
    from fedcache.federate.stacking import stacking_of

    memory = stacking_of(METHODS.get("fedpcl")).memory

    def estimate(batch=32, **params):
        return memory(FedPCLSettings(**params), 5000, 20, 512, 10, batch)

    sets = 4 * 3 * 20 * 10 * 256
    assert estimate() == estimate(batch=64) == sets
    similarities = 4 * 20 * 21 * 64 * 64  # float32 (K, M, 2B, 2B): 20 clients, 20 local sets and the global one
    assert estimate(contrast="batch") >= sets + 5 * similarities
    assert estimate(contrast="batch", batch=64) - sets > 2.5 * (estimate(contrast="batch") - sets)  # more than linear
    assert estimate(contrast="batch", prototypes="global") - sets < (estimate(contrast="batch") - sets) / 20


def test_summary_per_client_is_the_mean_over_the_clients_that_sent():
    data = synthetic(n_clients=5, n_classes=10, dim=16)
    data.y_train[data.client_train[0]] = 0  # client 0 holds class 0 only: 1 prototype, the others 10
    s = run(fedpcl(data), RunConfig(rounds=2)).summary
    assert s["params_up_per_client"] == pytest.approx((1 + 4 * 10) * 256 / 5)
    assert s["bytes_up_per_client"] == pytest.approx((1 + 4 * 10) * (256 * 4 + 16) / 5)


def test_summary_states_which_std_it_reports():
    s = run(fedpcl(synthetic()), RunConfig(rounds=2)).summary
    acc = np.array(s["per_client_accuracy"])
    assert s["std_accuracy"] == pytest.approx(np.std(acc, ddof=0)) and s["std_accuracy"] ** 2 == pytest.approx(s["variance"])
    assert "over clients" in s["definitions"]["std_accuracy"] and "ddof=0" in s["definitions"]["std_accuracy"]
    assert "Comm Params" in s["definitions"]["params_up_per_client"]


def test_clients_send_only_the_classes_they_hold():
    data = synthetic(n_clients=2, n_classes=4, dim=8)
    data.y_train[data.client_train[0]] = 0  # client 0 holds class 0 only
    r = run(fedpcl(data), RunConfig(rounds=1))
    assert r.summary["params_up_per_round"] == (1 + 4) * 256


def test_learns_a_separable_problem():
    data = synthetic(n_clients=5, per_client=80, spread=0.5)
    for kw in ({}, {"contrast": "batch"}):
        acc = run(fedpcl(data, **kw), RunConfig(rounds=15)).summary["mean_accuracy"]
        assert acc > 95, kw


def _nuisance(n_clients=5, per=80, n_classes=4, signal=4, noise=28, seed=0) -> FederatedData:
    """Classes differ in 4 dims; 28 dims of large noise hide them from an untrained projection."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, signal))

    def draw(n):
        y = rng.integers(0, n_classes, n)
        x = np.concatenate([means[y] + 0.3 * rng.normal(size=(n, signal)), 4.0 * rng.normal(size=(n, noise))], 1)
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)

    xtr, ytr = draw(n_clients * per)
    xte, yte = draw(n_clients * per)
    rows = [np.arange(k * per, (k + 1) * per) for k in range(n_clients)]
    return FederatedData(xtr, ytr, xte, yte, rows, [r.copy() for r in rows], tuple(f"c{i}" for i in range(n_classes)))


@pytest.mark.parametrize("contrast", ["prototypes", "batch"])
def test_training_beats_the_untrained_projection(contrast):
    data = _nuisance()

    def acc(rounds):
        ctx = MethodContext(data, "projection", OptimConfig("adam", 1e-2), schedule=Schedule(local_epochs=5))
        return run(METHODS.get("fedpcl")(ctx, FedPCLSettings(contrast=contrast)), RunConfig(rounds=rounds)).summary["mean_accuracy"]

    untrained, trained = acc(1), acc(20)  # round 1 trains nothing (first_round=idle)
    assert untrained < 40 and trained > untrained + 15, (untrained, trained)


def test_first_round_idle_leaves_heads_untouched_but_computes_prototypes():
    data = synthetic()
    m = fedpcl(data)
    states = m.init_clients(data.n_clients)
    res = m.local_update(0, [0, 1], m.broadcast(m.init_server(), 0), {n: t[[0, 1]] for n, t in states.items()})
    torch.testing.assert_close(res.states["proj.weight"], states["proj.weight"][[0, 1]])
    assert (res.uploads["count"].sum(1) == 60).all()


def _first_round(data, **params):
    m = fedpcl(data, **params)
    return m.local_update(0, [0, 1], m.broadcast(m.init_server(), 0), {n: t[[0, 1]] for n, t in m.init_clients(5).items()})


@pytest.mark.parametrize(("kind", "std", "mean_abs"), [("gaussian", 0.5, 0.5 * math.sqrt(2 / math.pi)),
                                                       ("laplace", 0.5 * math.sqrt(2), 0.5)])
def test_sent_prototypes_are_one_minus_p_times_the_prototype_plus_noise_of_scale_s(kind, std, mean_abs):
    data = synthetic(n_classes=10)
    clean = _first_round(data)
    a = _first_round(data, noise=kind, noise_scale=0.5, perturb=0.2)
    b = _first_round(data, noise=kind, noise_scale=0.5, perturb=0.6)  # the same seeded draw, another p
    protos = clean.uploads["protos"]
    held = clean.uploads["count"] > 0
    # sent(p) = (1 - p) x + e with e independent of p: sent(0.2) - sent(0.6) = 0.4 x exactly.
    torch.testing.assert_close(a.uploads["protos"] - b.uploads["protos"], 0.4 * protos * held.unsqueeze(-1))
    e = (a.uploads["protos"] - 0.8 * protos)[held]  # 2 clients x 10 classes x 256 draws
    assert abs(e.mean().item()) < 0.05
    assert e.std().item() == pytest.approx(std, rel=0.06) and e.abs().mean().item() == pytest.approx(mean_abs, rel=0.06)
    assert (a.uploads["protos"][~held] == 0).all()  # nothing is sent for a class a client lacks
    torch.testing.assert_close(a.uploads["protos"], _first_round(data, noise=kind, noise_scale=0.5, perturb=0.2).uploads["protos"])


def test_clients_classify_with_the_prototypes_they_sent_unless_predict_with_clean():
    data = synthetic()
    clean = _first_round(data)
    sent = _first_round(data, noise="laplace", noise_scale=0.5)
    own = _first_round(data, noise="laplace", noise_scale=0.5, predict_with="clean")
    assert not torch.allclose(sent.uploads["protos"], clean.uploads["protos"])
    torch.testing.assert_close(sent.states["protos"], sent.uploads["protos"])  # the official code (Table 15)
    torch.testing.assert_close(own.states["protos"], clean.states["protos"])
    torch.testing.assert_close(own.uploads["protos"], sent.uploads["protos"])


@pytest.mark.parametrize(("loss", "method"), [("ce", "fedavg"), ("ce+protodist", "fedproto")])
def test_the_papers_cross_entropy_rows_are_refused_and_point_to_the_method_they_are(loss, method):
    with pytest.raises(ConfigError, match=f"-m {method}.*fedpcl-table11"):
        fedpcl(synthetic(), loss=loss)


def test_fedavg_and_fedproto_run_on_the_projection_head():
    data = synthetic(n_clients=3, dim=8)
    for name in ("fedavg", "fedproto"):
        m = METHODS.get(name)(MethodContext(data, head="projection"))
        assert run(m, RunConfig(rounds=2)).summary["params_up_per_client"] > 0


@pytest.mark.parametrize("first_round", ["idle", "decay"])
def test_predicting_with_a_classifier_nothing_trains_is_refused(first_round):
    with pytest.raises(ConfigError, match="nothing trains the classifier.*ce_weight > 0"):
        fedpcl(synthetic(), predict="classifier", first_round=first_round)
    for trained in ({"ce_weight": 0.5, "first_round": first_round}, {"first_round": "ce"}):
        fedpcl(synthetic(), predict="classifier", **trained)


def test_needs_the_projection_head():
    with pytest.raises(ConfigError, match="projection head only"):
        METHODS.get("fedpcl")(MethodContext(synthetic(), head="linear"))


@pytest.mark.parametrize(("setting", "message"), [("tau=-1", "tau=-1: must be > 0"), ("tau=0", "tau=0: must be > 0"),
                                                  ("perturb=1.5", r"must be in \[0, 1\]"),
                                                  ("noise_scale=-0.1", "must be >= 0"), ("ce_weight=-1", "must be >= 0")])
def test_settings_out_of_range_are_refused_before_training(setting, message):
    # tau divides every similarity (0 divides by zero, a negative one inverts the loss);
    # p mixes (1 - p) x + e; a scale or a loss weight below 0 means nothing.
    from tests.resolve import resolve_settings

    with pytest.raises(ConfigError, match=message):
        resolve_settings("fedpcl", [setting])


def test_a_row_whose_class_no_set_holds_adds_nothing():
    # With --fraction < 1 a client sampled for the first time may hold a class nobody has reported: no set has
    # its prototype, and a zero "positive" would push z away from every other class. Rows z0 of class 2
    # (absent) and z1 = (0, 1) of class 0; tau = 0.5. Row 1: -(0 - log e^{1/0.5}) = 2; row 0: nothing.
    z, y, mask = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), torch.tensor([[2, 0]]), torch.ones(1, 2, dtype=torch.bool)
    P, present = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]]), torch.tensor([[True, True, False]])
    _, valid = L.paper_term(z, y, P, present, tau=0.5)
    assert valid[0, :, 0].tolist() == [False, True]
    m = fedpcl(synthetic(n_classes=3), tau=0.5, prototypes="global")
    got = L.fedpcl(m, z, y, mask, L.proto_sets(m, {"global": P, "global_mask": present}), m.p.tau)
    assert got.item() == pytest.approx((0.0 + 2.0) / 2)


def test_supcon_matches_hand_computation():
    # Rows z0 = (1, 0) and z2 = (0.6, 0.8) of class 0, z1 = (0, 1) of class 1, two identical views, tau = 0.5.
    # Each view is an anchor against the five other views (its own position out); positives share its label.
    def lse(*s):
        return math.log(sum(math.exp(v) for v in s))

    z = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    rows = [lse(0, 1.2, 2, 0, 1.2) - (1.2 + 2 + 1.2) / 3,  # z0: positives z2, z0', z2'
            lse(0, 1.6, 2, 0, 1.6) - 2,  # z1: its other view only
            lse(1.2, 1.6, 2, 1.2, 1.6) - (1.2 + 2 + 1.2) / 3]  # z2: positives z0, z2', z0'
    m = fedpcl(synthetic(), tau=0.5, loss="supcon")
    got = L.supcon(m, z, torch.tensor([[0, 1, 0]]), torch.ones(1, 3, dtype=torch.bool), [], 0.5)
    assert got.item() == pytest.approx(sum(rows) / 3, abs=1e-6)


def test_a_client_without_real_rows_in_a_step_gets_a_zero_contrastive_loss_not_nan():
    """A step where one client has finished its rows (all padding) while another trains: that client's anchors
    have no column to normalise over. Its loss is 0, and the other client's is what it computes alone."""
    torch.manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(2, 3, 4), dim=-1)
    y = torch.tensor([[0, 1, 0], [1, 0, 1]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    P = torch.nn.functional.normalize(torch.randn(1, 2, 4), dim=-1)
    present = torch.ones(1, 2, dtype=torch.bool)
    per_row, valid = L.batch_term(z, y, mask, P, present, tau=0.5)
    assert torch.isfinite(per_row).all() and not valid[1].any()
    alone, _ = L.batch_term(z[:1], y[:1], mask[:1], P, present, tau=0.5)
    assert torch.equal(per_row[:1], alone)
    m = fedpcl(synthetic(n_classes=2), tau=0.5, loss="supcon")
    got = L.supcon(m, z, y, mask, [], 0.5)
    assert got[1].item() == 0.0 and torch.equal(got[:1], L.supcon(m, z[:1], y[:1], mask[:1], [], 0.5))


def test_ce_weight_adds_that_much_cross_entropy_of_the_classifier():
    from fedcache.federate.local import cross_entropy

    data = synthetic(n_clients=1, n_classes=4, dim=8)
    g = torch.nn.functional.normalize(torch.randn(1, 4, 256, generator=torch.Generator().manual_seed(0)), dim=-1)
    down = {"global": g, "global_mask": torch.ones(1, 4, dtype=torch.bool)}
    rows = torch.from_numpy(data.client_train[0][:16])
    xb, yb, mask = data.x_train[rows][None], data.y_train[rows][None], torch.ones(1, 16, dtype=torch.bool)

    def loss(w):
        m = fedpcl(data, tau=0.5, prototypes="global", ce_weight=w)
        p = {n: t for n, t in m.init_clients(1).items() if n not in ("protos", "proto_count")}
        info = {"ready": True, "down": down}
        return m.loss(p, xb, yb, mask, info)[0], cross_entropy(m.head.classify(p, m.head.features(p, xb)), yb, mask)

    (plain, ce), (weighted, _) = loss(0.0), loss(0.7)
    assert ce.item() > 0.1
    torch.testing.assert_close(weighted, plain + 0.7 * ce)


def test_first_round_ce_trains_the_projection_and_the_classifier():
    data = synthetic()
    init = {n: t[[0, 1]] for n, t in fedpcl(data).init_clients(5).items()}
    res = _first_round(data, first_round="ce")
    for key in ("proj.weight", "cls.weight"):
        assert not torch.allclose(res.states[key], init[key]), key


def test_first_round_decay_moves_every_weight_by_adams_decay_steps_alone():
    # The official round 1: loss 0 (no prototypes yet), yet Adam(weight_decay=1e-4) steps; its gradient is
    # wd * w alone, so each of the round's steps moves a weight by about lr * sign(w) towards 0 (Adam divides
    # the gradient by its own size). 60 rows in batches of 32: 2 steps of lr 1e-3.
    data = synthetic()
    init = {n: t[[0, 1]] for n, t in fedpcl(data).init_clients(5).items()}
    res = _first_round(data, first_round="decay")
    for key in ("proj.weight", "proj.bias", "cls.weight"):
        w0, w1 = init[key], res.states[key]
        big = w0.abs() > 5e-3
        assert big.float().mean() > 0.5, key
        torch.testing.assert_close((w0 - w1)[big], 2e-3 * w0.sign()[big], rtol=0.05, atol=0.0)
    torch.testing.assert_close(res.uploads["count"], _first_round(data).uploads["count"])


# ---- the paper presets ------------------------------------------------------------------------------------
def test_table11_preset_runs_the_cross_entropy_rows_as_fedavg_and_fedproto_on_the_same_setting():
    p = PRESETS.get("fedpcl-table11")
    exps = {e.key: e for e in p.experiments}
    rows = {n.what.split(" (")[0]: (n.experiment, n.method, n.where) for n in p.paper}
    assert rows["Cross Entropy"][:2] == ("ce-rows", "fedavg") and rows["Cross Entropy + ProtoDist"][:2] == ("ce-rows", "fedproto")
    assert rows["Supervised Contrastive"][2] == {"loss": "supcon"} and rows["Ours"][2] == {"loss": "fedpcl"}
    ce, con = exps["ce-rows"], exps["contrastive"]
    same = {k: v for k, v in con.sweep.items() if k != "loss"}
    assert {k: v for k, v in ce.sweep.items() if k != "head"} == same and "head" not in same
    assert ce.sweep["head"] == "mlp"  # the baselines' FC-ReLU-BN-FC (paper Table 7); fedpcl on its projection head
    assert (ce.dataset, ce.backbones, ce.seeds) == (con.dataset, con.backbones, con.seeds)


def test_table15_preset_uses_the_papers_privacy_protocol():
    p = PRESETS.get("fedpcl-table15")
    exps = {e.key: e for e in p.experiments}
    assert exps["prototype-noise"].sweep["predict_with"] == "sent" and exps["prototype-noise"].sweep["noise_scale"] == 0.05
    images = [e for e in p.experiments if e.key.startswith("image-")]
    assert sorted(e.extract["image_noise"] for e in images) == sorted((k, 0.2, q) for k in ("gaussian", "laplace") for q in (0.1, 0.2))
    assert len({e.store_dataset for e in images}) == 4 and all("noise" in e.store_dataset for e in images)
    assert {n.value for n in p.paper} >= {42.13, 37.95, 39.93, 36.93}


def test_table2_preset_tests_on_the_official_200_rows_per_class():
    # lib/utils.py prepare_data_digits: idx_k[0:200] of each class of the client's domain's test split.
    for e in PRESETS.get("fedpcl-table2").experiments:
        assert (e.sweep["partition"], e.sweep["few_shot"], e.sweep["local_test"]) == ("domain", 10, 2000), e.key


def _label_shift_experiments():
    from fedcache.presets import PRESETS

    for name in ("fedpcl-table3", "fedpcl-table15"):
        for e in PRESETS.get(name).experiments:
            if e.sweep.get("partition") == "dirichlet":
                yield pytest.param(e, id=f"{name}:{e.key}")


@pytest.mark.parametrize("experiment", list(_label_shift_experiments()))
def test_label_shift_presets_keep_the_dirichlet_label_skew(experiment):
    # The official code draws a fixed budget of rows per class (40 x clients for DomainNet Real, 30 x
    # clients for Caltech) and spreads it by Dirichlet(alpha); capping every client at few_shot rows per
    # class on the whole training split flattens that skew: most (client, class) cells hold exactly few_shot.
    from fedcache.federate.partitions import PartitionRequest, make_partition

    s = experiment.sweep
    opts = {k: s[k] for k in ("few_shot", "subsample", "class_budget") if k in s}
    opts["alpha"] = _alpha(s)
    labels = np.repeat(np.arange(10), 500)
    test_labels = np.repeat(np.arange(10), 100)
    p = make_partition(PartitionRequest.of("dirichlet", s["clients"], seed=0, **opts), labels, None, test_labels, None)
    counts = np.array([np.bincount(labels[r], minlength=10) for r in p.train])
    held = counts[counts > 0]
    assert np.mean(held == np.bincount(held).argmax()) < 0.5, counts


def test_fedpcl_comparison_presets_train_the_baselines_on_the_papers_head():
    # Paper Sec. 5.1 / Table 7: every baseline has FC(512K, 256)-ReLU-BN(256)-FC(256, 10) on the frozen
    # backbones (fedcache's `mlp`, as benchmarks/fedpcl_comparison.py uses); without a head in the sweep,
    # fedavg, pfedme, perfedavg and solo fall back to their `linear` default.
    from tests.resolve import resolve_settings
    from fedcache.presets import PRESETS

    wrong = [(name, e.key, m, resolve_settings(m, [], None, e.sweep.get("head")).head)
             for name in ("fedpcl-table2", "fedpcl-table3", "fedpcl-fairness", "fedpcl-table11") for e in PRESETS.get(name).experiments
             for m in e.methods if m != "fedpcl"]
    assert [w for w in wrong if w[3] != "mlp"] == []
    fedpcl = [resolve_settings("fedpcl", [], None, e.sweep.get("head")).head
              for name in ("fedpcl-table2", "fedpcl-table3", "fedpcl-fairness", "fedpcl-table11")
              for e in PRESETS.get(name).experiments if "fedpcl" in e.methods]
    assert fedpcl and set(fedpcl) == {"projection"}


# ---- the presets run the official code's data protocol ----------------------------------------------------------
# (preset, experiment key prefix) -> (scheme, class_budget): lib/utils.py's prepare_data_*_noniid.
_PROTOCOL = {("fedpcl-table3", "office10"): ("domain-dirichlet", 10),
             ("fedpcl-table3", "domainnet-real"): ("dirichlet", 10),
             ("fedpcl-table11", ""): ("domain-dirichlet", 10), ("fedpcl-fairness", ""): ("dirichlet", 10),
             ("fedpcl-table15", ""): ("dirichlet", 9)}


def _protocol_experiments():
    from fedcache.presets import PRESETS

    for (name, prefix), want in _PROTOCOL.items():
        for e in PRESETS.get(name).experiments:
            if e.key.startswith(prefix):
                yield pytest.param(name, e, want, id=f"{name}:{e.key}")


@pytest.mark.parametrize("name, experiment, want", list(_protocol_experiments()))
def test_presets_claiming_a_table_run_the_official_class_budget(name, experiment, want):
    s = experiment.sweep
    assert (s["partition"], s.get("class_budget"), _alpha(s)) == (*want, 1.0)
    assert "few_shot" not in s and "subsample" not in s
    if name == "fedpcl-fairness":  # MNIST-M alone, FedAvg 20 clients a round
        assert experiment.extract["domains"] == ["mnist-m"] and s["clients"] in (40, 80)
        assert s.get("fraction", 1.0) == (20 / s["clients"] if "fedavg" in experiment.methods else 1.0)
    if experiment.key.startswith("office10"):  # the official Office script's --local_bs 16
        assert s["batch_size"] == 16
    # feature & label shift tests on 100 rows per class of the client's domain; label shift on its own mix
    assert s.get("local_test_mix", "client") == ("uniform" if s["partition"] == "domain-dirichlet" else "client")
    assert s.get("local_test", 1000) == 1000


def test_feature_and_label_shift_presets_skew_labels_across_one_client_per_domain():
    # One client per domain: splitting each domain's rows (the former preset) gives every client the same
    # label mix; the official draw over all clients gives each its own. 5 domains of 200 rows per class.
    from fedcache.federate.partitions import PartitionRequest, make_partition
    from fedcache.presets import PRESETS

    s = PRESETS.get("fedpcl-table11").experiments[0].sweep
    labels, domains = np.tile(np.repeat(np.arange(10), 200), 5), np.repeat(np.arange(5), 2000)
    request = PartitionRequest.of(s["partition"], s["clients"], alpha=_alpha(s), class_budget=s["class_budget"])
    p = make_partition(request, labels, domains, labels, domains)
    assert [np.unique(domains[r]).tolist() for r in p.train] == [[d] for d in range(5)]
    counts = np.array([np.bincount(labels[r], minlength=10) for r in p.train])
    assert ((counts.sum(axis=0) > 45) & (counts.sum(axis=0) <= 50)).all()  # 10 x 5, each share floored
    assert counts.std(axis=0).mean() > 3, counts  # equal shares would give 0


def _alpha(sweep: dict) -> float:
    """A preset's Dirichlet alpha, under its short or its qualified key (presets with perfedavg must qualify it)."""
    return sweep["partition.alpha"] if "partition.alpha" in sweep else sweep["alpha"]
