"""FedPCL against hand-computed values: prototypes, aggregation, padding, the loss, bytes, noise, learning."""
import math

import numpy as np
import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, LocalResult, MethodContext
from fedcache.federate.methods import _fedpcl_losses as L
from fedcache.federate.methods.fedpcl import FedPCLParams
from fedcache.federate.prototypes import aggregate, class_means
from fedcache.presets import PRESETS

from .conftest import synthetic


def fedpcl(data, **params):
    return METHODS.get("fedpcl")(MethodContext(data, head="projection"), FedPCLParams(**params))


def test_class_means_and_counts():
    z = torch.tensor([[[1.0, 0], [3, 0], [0, 2], [9, 9]]])
    y = torch.tensor([[0, 0, 2, 1]])
    mask = torch.tensor([[True, True, True, False]])  # the last row is padding
    protos, counts = class_means(z, y, mask, 3)
    assert counts.tolist() == [[2.0, 0.0, 1.0]]
    assert protos[0].tolist() == [[2.0, 0.0], [0.0, 0.0], [0.0, 2.0]]


def test_aggregation_weighted_by_class_counts_and_plain_mean():
    protos = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[3.0, 0.0], [0.0, 4.0]]])  # 2 clients, 2 classes
    counts = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    glob, present = aggregate(protos, counts, weighted=True)
    assert glob.tolist() == [[(1 * 1 + 3 * 3) / 4, 0.0], [0.0, 4.0]] and present.tolist() == [True, True]
    glob, _ = aggregate(protos, counts, weighted=False)
    assert glob.tolist() == [[2.0, 0.0], [0.0, 4.0]]  # class 1: only client 1 holds it


def test_server_keeps_latest_local_sets_and_padding_fills_missing_classes():
    data = synthetic(n_clients=3, n_classes=2, dim=4)
    m = fedpcl(data)
    server = m.init_server()
    h = m.h
    up = {"protos": torch.zeros(2, 2, h), "count": torch.tensor([[2.0, 0.0], [1.0, 1.0]])}
    up["protos"][0, 0, 0], up["protos"][1, 0, 0], up["protos"][1, 1, 1] = 1.0, 4.0, 1.0
    server = m.aggregate(server, LocalResult({}, up, up["count"].sum(1)), [0, 2], 0)
    assert server["global"][0, 0, 0] == pytest.approx((2 * 1 + 1 * 4) / 3)
    assert server["local_count"][1].sum() == 0 and server["local_count"][2].tolist() == [1.0, 1.0]
    sets = L.proto_sets(m, m.broadcast(server, 1))
    (g, g_present), (local, present) = sets
    assert local.shape[0] == 2  # only the clients that reported
    # Client 0 lacks class 1: its set holds the global prototype of class 1 instead (Eq. 7's padding).
    torch.testing.assert_close(local[0, 1], server["global"][0, 1])
    assert present.all()


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


@pytest.mark.parametrize(("prototypes", "local_reduce"), list(_EQ10))
def test_eq10_combination_and_local_reduce_match_hand_computation(prototypes, local_reduce):
    down = {"global": torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), "global_mask": torch.ones(1, 2, dtype=torch.bool),
            "local": torch.tensor([[[[0.6, 0.8], [0.8, -0.6]], [[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]]),
            "local_count": torch.tensor([[[3.0, 2.0], [4.0, 0.0], [0.0, 0.0]]])}  # one run's sets, as broadcast sends
    m = fedpcl(synthetic(n_clients=3, n_classes=2), tau=0.5, prototypes=prototypes, local_reduce=local_reduce)
    z, y, mask = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool)
    got = L.fedpcl(m, z, y, mask, L.proto_sets(m, down), m.p.tau)
    assert got.item() == pytest.approx(_EQ10[prototypes, local_reduce], abs=1e-6)


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
    with pytest.raises(ConfigError, match="projection head"):
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


def test_table2_preset_tests_on_the_official_200_rows_per_class():
    # lib/utils.py prepare_data_digits: idx_k[0:200] of each class of the client's domain's test split.
    for e in PRESETS.get("fedpcl-table2").experiments:
        assert (e.sweep["partition"], e.sweep["few_shot"], e.sweep["local_test"]) == ("domain", 10, 2000), e.key


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
