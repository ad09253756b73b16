"""FLESD against hand computations and the official code: the ensemble (Eq. 5-6) and the server's top-n% filter
of the representation upload, distillation targets and loss (Eq. 7-9), the momentum update (Eq. 10) and its FIFO
queue with the per-epoch warm-up, Adam's weight decay in distillation, a neighbourhood structure that distillation
must transfer, exact bytes, determinism, that `momentum` reaches the momentum encoder (or is refused), and the CLI
on a multi-view store."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import _flesd as esd
from fedcache.federate.methods._simclr import embed, init_encoder
from fedcache.training import TrainConfig, prepare
from tests.resolve import resolve_settings

from ..conftest import synthetic
from ..test_methods import make
from .test__simclr import tagged_views


@pytest.fixture(scope="module")
def viewed():
    data = synthetic(per_client=40)
    data.views = data.x_train[:, None] + 0.3 * torch.randn(len(data.x_train), 2, data.dim,
                                                           generator=torch.Generator().manual_seed(1))
    return data


SMALL = {"hidden": 16, "out": 8, "distill_epochs": 3, "distill_batch": 8, "queue": 16}


# ---- Eq. 5-6 ----------------------------------------------------------------------------------
def test_ensemble_matches_hand_computation():
    s1 = torch.tensor([[1.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 1.0]])
    s2 = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.7], [0.5, 0.7, 1.0]])
    got = esd.ensemble([(s1, None), (s2, None)], t=0.5)
    # Row maxima are the diagonal (1): entry = mean_k exp((s_k - 1) / 0.5).
    e = math.exp
    want = torch.tensor([[1.0, (e(-1) + e(-2)) / 2, (e(-2) + e(-1)) / 2],
                         [(e(-1) + e(-2)) / 2, 1.0, (e(-1.6) + e(-0.6)) / 2],
                         [(e(-2) + e(-1)) / 2, (e(-1.6) + e(-0.6)) / 2, 1.0]])
    torch.testing.assert_close(got, want)
    # A row whose maximum is not 1 is shifted by its own maximum (official code; a row-constant).
    got = esd.ensemble([(torch.tensor([[0.2, 0.6]]), None)], t=0.2)
    torch.testing.assert_close(got, torch.tensor([[e(-2.0), 1.0]]))


def test_ensemble_of_sparse_uploads_weighs_unsent_entries_zero():
    angles = torch.tensor([0.0, 0.3, 2.0, 2.4])  # two pairs of close unit vectors
    z = torch.stack([angles.cos(), angles.sin()], -1)[None]
    s = z @ z.transpose(1, 2)
    up = esd.encode(z, "similarities", top_percent=25, precision="float32")  # one neighbour per row of 4
    assert up["values"].shape == (1, 4, 1) and up["indices"].dtype == torch.int16
    assert up["indices"][0, :, 0].tolist() == [1, 0, 3, 2]
    ens = esd.ensemble(esd.client_matrices(up, 25), t=0.1)
    want = torch.zeros(4, 4)
    for i, j in enumerate([1, 0, 3, 2]):
        want[i, i], want[i, j] = 1.0, math.exp((s[0, i, j].item() - 1) / 0.1)
    torch.testing.assert_close(ens, want)


@pytest.mark.parametrize("precision, tol", [("float32", 0), ("float16", 1e-3), ("int8", 0.5 / 127)])
def test_quantised_similarities_round_trip(precision, tol):
    z = F.normalize(torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    s = z @ z.transpose(1, 2)
    for upload, slack in (("similarities", tol), ("representations", 4 * tol)):  # 4 = 2 factors x 2 renormalising
        back = list(esd.client_matrices(esd.encode(z, upload, 100, precision), 100))
        assert all(known is None for _, known in back)
        assert (torch.stack([b for b, _ in back]) - s).abs().max() <= slack + 1e-6


def test_server_normalises_representations_and_filters_rows_as_the_official_code():
    z = torch.tensor([[2.0, 0.0], [3.0, 3.0], [0.0, -1.0], [-4.0, 0.0], [1.0, 0.0]])
    r = 1 / math.sqrt(2)
    cos = torch.tensor([[1, r, 0, -1, 1], [r, 1, -r, -r, r], [0, -r, 1, 0, 0], [-1, -r, 0, 1, -1], [1, r, 0, -1, 1]])
    torch.testing.assert_close(esd.server_similarities(z), cos)
    # top 20% of P = 5 keeps int(0.2 * 5) + 1 = 2 per row (self included); ties with the 2nd are kept too,
    # everything else becomes similarity 0 (not "unknown").
    want = torch.tensor([[1, 0, 0, 0, 1], [r, 1, 0, 0, r], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [1, 0, 0, 0, 1]])
    want[2] = torch.tensor([0.0, 0, 1, 0, 0])  # row 2: 1 then three zeros tied at 0 -> all kept, still 0
    torch.testing.assert_close(esd.top_filter(cos, 20), want)
    assert esd.kept_per_row(5, 20) == 2 and esd.kept_per_row(2048, 1) == 21
    # Zeroed entries weigh exp((0 - 1) / T) in the ensemble, as in the official ensemble_sims.
    ens = esd.ensemble(esd.client_matrices({"reps": z[None]}, 20), t=0.5)
    assert ens[0, 1].item() == pytest.approx(math.exp(-2.0)) and ens[0, 4].item() == pytest.approx(1.0)


def test_representation_upload_gives_the_similarity_upload_ensemble():
    z = torch.nn.functional.normalize(torch.randn(3, 7, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    reps = esd.ensemble(esd.client_matrices(esd.encode(z, "representations", 100, "float32"), 100), 0.1)
    sims = esd.ensemble(esd.client_matrices(esd.encode(z, "similarities", 100, "float32"), 100), 0.1)
    torch.testing.assert_close(reps, sims)
    assert esd.encode(z, "representations", 100, "float16")["reps"].shape == (3, 7, 4)


# ---- Eq. 7-9 ---------------------------------------------------------------------------------------
def test_distillation_targets_and_loss_match_hand_computation():
    ens = torch.tensor([[1.0, 0.2, 0.6], [0.2, 1.0, 0.3], [0.6, 0.3, 1.0]])
    tgt = esd.targets(ens, torch.tensor([0, 1]), torch.tensor([0, 2]))  # Eq. 8 over anchors {0, 2}
    torch.testing.assert_close(tgt, torch.tensor([[1 / 1.6, 0.6 / 1.6], [0.2 / 0.5, 0.3 / 0.5]]))
    q = torch.tensor([[1.0, 0.0]])
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    logits = esd.student_logits(q, anchors, t=0.5)  # Eq. 7: cos / T = [2, 0]
    torch.testing.assert_close(logits, torch.tensor([[2.0, 0.0]]))
    ps = [math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1)]
    pt = [0.75, 0.25]
    kl = sum(a * math.log(a / b) for a, b in zip(pt, ps))  # Eq. 9
    torch.testing.assert_close(esd.distill_loss(logits, torch.tensor([pt])), torch.tensor(kl))
    assert esd.distill_loss(logits, torch.softmax(logits, 1)).abs() < 1e-6  # matching gives zero


def test_queue_is_fifo_and_sizes_fit_the_public_set():
    qu = esd.Queue(4, 1)
    for r in range(3):
        qu.push(torch.full((2, 1), float(r)), torch.tensor([2 * r, 2 * r + 1]))
        assert qu.full == (r >= 1)
    assert qu.rows.tolist() == [4, 5, 2, 3] and qu.keys[:, 0].tolist() == [2.0, 2.0, 1.0, 1.0]
    assert esd.sizes(p=1000, batch=256, queue=2048) == (256, 768)
    assert esd.sizes(p=20, batch=256, queue=2048) == (20, 20)
    assert not esd.trains_nothing(p=1100, batch=256, queue=512, warmup="epoch")  # 2 of 4 steps train
    assert esd.trains_nothing(p=1000, batch=256, queue=2048, warmup="epoch")  # 3 steps, queue 768 = 3 steps
    assert not esd.trains_nothing(p=1000, batch=256, queue=2048, warmup="round")


def test_distillation_transfers_a_neighbourhood_structure():
    """The teacher groups 64 random points into 4 arbitrary clusters the raw features do not show;
    after distillation the student's 5 nearest neighbours lie in the teacher's cluster."""
    p, dim, groups = 64, 96, 4
    g = torch.Generator().manual_seed(3)
    x = torch.randn(p, dim, generator=g)
    views = x[:, None] + 0.05 * torch.randn(p, 2, dim, generator=g)
    cluster = torch.arange(p) % groups
    same = cluster[:, None] == cluster[None, :]
    teacher = torch.where(same, 0.9, -0.1).fill_diagonal_(1.0)
    ens = esd.ensemble([(teacher, None)], t=0.1)
    cfg = SimpleNamespace(distill_lr=3e-3, distill_wd=0.0, distill_batch=16, queue=64, out=16, distill_epochs=50,
                          momentum=0.99, target_t=0.1, queue_warmup="round")
    enc = init_encoder(dim, 64, 16, torch.Generator().manual_seed(0))

    def knn_purity(params):
        z = embed(params, x[None])[0]
        sim = (z @ z.T).fill_diagonal_(-2)
        nn = sim.topk(5, dim=1).indices
        return same.gather(1, nn).float().mean().item()

    before = knn_purity(enc)
    after = knn_purity(esd.distil(enc, ens, views, cfg, torch.Generator().manual_seed(0)))
    assert before < 0.5 and after > 0.95, (before, after)


def test_momentum_update_matches_eq_10():
    teacher, student = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, -2.0])}
    esd.ema(teacher, student, 0.9)
    torch.testing.assert_close(teacher["w"], torch.tensor([0.9 * 1 + 0.1 * 3, 0.9 * 2 - 0.1 * 2]))


def _cfg(**kw):
    base = dict(distill_lr=1e-3, distill_wd=0.0, distill_batch=8, queue=16, out=4, distill_epochs=3,
                momentum=0.999, target_t=0.1, queue_warmup="epoch")
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("warmup, steps", [("epoch", 3 * (4 - 2)), ("round", 3 * 4 - 1)])
def test_queue_warmup_skips_the_loss_per_epoch_or_once(monkeypatch, warmup, steps):
    """32 public rows, batch 8: 4 steps an epoch; a queue of 16 keys is full after the 2nd push. The
    official loop skips steps i < K / B = 2 of every epoch; ``round`` trains from the step that fills it."""
    calls = []
    real = esd.distill_loss
    monkeypatch.setattr(esd, "distill_loss", lambda *a: calls.append(1) or real(*a))
    views = torch.randn(32, 2, 6, generator=torch.Generator().manual_seed(0))
    enc = init_encoder(6, 5, 4, torch.Generator().manual_seed(0))
    esd.distil(enc, torch.ones(32, 32), views, _cfg(queue_warmup=warmup), torch.Generator().manual_seed(0))
    assert len(calls) == steps


def test_a_queue_that_fills_every_epoch_trains_nothing_and_says_so(monkeypatch, caplog):
    """As the official loop: with the per-epoch warm-up and 2 steps an epoch, a 2-batch queue leaves none."""
    calls = []
    monkeypatch.setattr(esd, "distill_loss", lambda *a: calls.append(1))
    views = torch.randn(16, 2, 6, generator=torch.Generator().manual_seed(0))
    enc = init_encoder(6, 5, 4, torch.Generator().manual_seed(0))
    out = esd.distil(enc, torch.ones(16, 16), views, _cfg(queue=16), torch.Generator())
    assert not calls and all(torch.equal(out[n], enc[n]) for n in enc)
    from tests.federate.conftest import synthetic
    from tests.federate.test_methods import make

    data = synthetic(per_client=20)
    data.views = data.x_train[:, None].expand(-1, 2, -1)
    with caplog.at_level("WARNING"):
        make("flesd", data, hidden=4, out=4, distill_batch=8, queue=16, queue_warmup="epoch")
    assert "trains nothing" in caplog.text


def test_distillation_adam_has_the_weight_decay_setting(monkeypatch):
    seen = {}
    real = torch.optim.Adam

    def spy(params, **kw):
        seen.update(kw)
        return real(params, **kw)

    monkeypatch.setattr(esd.torch.optim, "Adam", spy)
    views = torch.randn(32, 2, 6, generator=torch.Generator().manual_seed(0))
    enc = init_encoder(6, 5, 4, torch.Generator().manual_seed(0))
    esd.distil(enc, torch.ones(32, 32), views, _cfg(distill_wd=1e-6, distill_epochs=1), torch.Generator())
    assert seen == {"lr": 1e-3, "weight_decay": 1e-6}


# ---- who encodes what: momentum keys into the queue, two different views ------------------------------------
def test_queue_holds_momentum_encoder_keys_of_the_other_view(monkeypatch):
    """Eq. 10 and Algorithm 1: each step the momentum encoder (the copy that ``ema`` updates) encodes one
    view into the FIFO queue; the student encodes the other view and is scored against exactly the queued
    keys. Fails if the keys come from the student or if both sides see the same view."""
    seen = {"teacher": None, "student": None}
    real_ema, real_embed, real_logits = esd.ema, esd.embed, esd.student_logits
    encodes, pushes, scored = [], [], []

    def ema(t, s, m):
        seen["teacher"], seen["student"] = t, s
        real_ema(t, s, m)

    def embed(p, x):
        out = real_embed(p, x)
        who = "teacher" if p is seen["teacher"] else "student" if p is seen["student"] else "other"
        encodes.append((who, set(x[..., -1].flatten().tolist()), out))
        return out

    def push(self, keys, rows):
        pushes.append(keys.clone())
        real_push(self, keys, rows)

    real_push = esd.Queue.push
    monkeypatch.setattr(esd, "ema", ema)
    monkeypatch.setattr(esd, "embed", embed)
    monkeypatch.setattr(esd.Queue, "push", push)
    monkeypatch.setattr(esd, "student_logits", lambda q, anchors, t: scored.append(anchors.clone()) or real_logits(q, anchors, t))
    views = tagged_views(32, 3, 6)
    enc = init_encoder(6, 5, 4, torch.Generator().manual_seed(0))
    esd.distil(enc, torch.ones(32, 32), views, _cfg(queue_warmup="round", distill_epochs=2), torch.Generator().manual_seed(0))

    steps = 2 * 4  # 32 rows in batches of 8, 2 epochs
    keys = [e for e in encodes if e[0] == "teacher"]
    queries = [e for e in encodes if e[0] == "student"]
    assert len(keys) == len(pushes) == steps and len(queries) == len(scored) == steps - 1  # the first step only fills
    assert all(torch.equal(k[2][0], pushed) for k, pushed in zip(keys, pushes))  # the queue holds the momentum keys
    assert all(len(k[1]) == 1 for k in encodes)  # one view per encoding
    for step in range(1, steps):  # the student's view differs from the keys' view of the same step
        assert queries[step - 1][1] != keys[step][1]
    assert {v for k in keys for v in k[1]} == {0.0, 1.0, 2.0}  # the views cycle
    # The student is scored against the FIFO queue: the last 16 / 8 = 2 pushes, in ring order.
    for step in range(1, steps):
        slot = {i % 2: pushes[i] for i in (step - 1, step)}
        torch.testing.assert_close(scored[step - 1], torch.cat([slot[0], slot[1]]))


# ---- the method in the loop --------------------------------------------------------------------------
def test_bytes_per_round_follow_the_formula(viewed):
    m = make("flesd", viewed, **SMALL)
    p = len(viewed.client_train[0])  # public set: all of client 0's rows (< public_rows)
    trainers = viewed.n_clients - 1
    enc = (viewed.dim * 16 + 16 + 16 * 8 + 8) * 4
    s = run(m, RunConfig(rounds=2)).summary  # the paper's upload: P x out representations
    assert s["bytes_up"] == 2 * trainers * p * 8 * 4 and s["bytes_down"] == 2 * trainers * enc
    s = run(make("flesd", viewed, upload="similarities", **SMALL), RunConfig(rounds=2)).summary
    assert s["bytes_up"] == 2 * trainers * p * p * 4
    n = esd.kept_per_row(p, 10) - 1
    s = run(make("flesd", viewed, upload="similarities", top_percent=10, precision="int8", **SMALL),
            RunConfig(rounds=2)).summary
    assert n == p // 10 and s["bytes_up"] == 2 * trainers * p * n * (1 + 2)  # int8 value + int16 index
    s = run(make("flesd", viewed, upload="similarities", precision="float16", **SMALL), RunConfig(rounds=1)).summary
    assert s["bytes_up"] == trainers * p * p * 2
    s = run(make("flesd", viewed, top_percent=10, precision="int8", **SMALL), RunConfig(rounds=1)).summary
    assert s["bytes_up"] == trainers * p * 8  # the server filters: representations cost the same


def test_public_client_never_trains_and_data_stays_untouched(viewed):
    m = make("flesd", viewed, **SMALL)
    assert m.ctx.data.n_clients == viewed.n_clients - 1 and viewed.n_clients == 5
    assert np.array_equal(m.public.numpy(), np.sort(viewed.client_train[0]))
    planned = m.plan(0, list(range(m.ctx.data.n_clients)))
    assert not np.isin(planned[planned >= 0], viewed.client_train[0]).any()
    capped = make("flesd", viewed, public_rows=10, queue_warmup="round", **SMALL)
    assert len(capped.public) == 10 and np.isin(capped.public.numpy(), viewed.client_train[0]).all()


def test_flesd_is_deterministic_and_seed_dependent(viewed):
    def once(seed):
        r = run(make("flesd", viewed, seed=seed, upload="similarities", top_percent=20, precision="int8", **SMALL),
                RunConfig(rounds=2))
        return {k: v for k, v in r.summary.items() if k != "seconds"}, r.server

    (a, sa), (b, sb), (_, sc) = once(0), once(0), once(1)
    assert a == b and all(torch.equal(sa[n], sb[n]) for n in sa)
    assert not torch.equal(sa["w1"], sc["w1"])


def test_flesd_needs_views_and_two_clients(viewed):
    plain = synthetic(per_client=20)
    with pytest.raises(ConfigError, match="--views 2"):
        make("flesd", plain)
    one = synthetic(n_clients=1, per_client=20)
    one.views = one.x_train[:, None].expand(-1, 2, -1)
    with pytest.raises(ConfigError, match="at least 2 clients"):
        make("flesd", one)
    with pytest.raises(ConfigError, match="top_percent"):
        make("flesd", viewed, top_percent=0.0)


def test_clients_upload_the_plain_public_features_representations(viewed, monkeypatch):
    """Each client sends Z of the public set's plain (unaugmented) cached features, as the official
    pubset_infer: with local training stubbed out, Z is the received encoder's embedding of x_train[public]."""
    import fedcache.federate.methods.flesd as flesd_module

    monkeypatch.setattr(flesd_module, "local_simclr", lambda m, rnd, clients, start: start)
    m = make("flesd", viewed, **SMALL)
    down = m.init_server()
    up = m.local_update(0, [0, 2], down, {}).uploads
    want = embed(down, viewed.x_train[m.public][None])[0]
    assert up.keys() == {"reps"}
    for z in up["reps"]:
        torch.testing.assert_close(z, want)


def test_defaults_are_the_papers_and_official_codes():
    """Paper Sec. 5.1 and the official README / options.py: tau_T = 0.1 (also the student's), m = 0.999,
    K = 2048, 200 distillation epochs in batches of 256, Adam 1e-3 (wd 1e-6); local SimCLR T = 0.4;
    the representations of the public set are what a client sends (Eq. 11)."""
    from fedcache.federate.methods.flesd import FLESDSettings

    p = FLESDSettings()
    assert (p.target_t, p.momentum, p.queue, p.distill_epochs, p.distill_batch) == (0.1, 0.999, 2048, 200, 256)
    assert (p.distill_lr, p.distill_wd, p.temperature) == (1e-3, 1e-6, 0.4)
    assert (p.upload, p.top_percent, p.precision, p.public_rows) == ("representations", 100.0, "float32", 0)


# ---- settings -------------------------------------------------------------------------------------------------
def test_short_momentum_is_refused_as_ambiguous_for_flesd():
    with pytest.raises(ConfigError) as e:
        resolve_settings("flesd", ["momentum=0.99"])
    assert "--set method.momentum=" in str(e.value) and "--set optim.momentum=" in str(e.value)


# ---- on a store with augmented views: settings reach the momentum encoder, the command line -------------------
@pytest.fixture(scope="module")
def view_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("views") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0, views=2))
    return path


def test_method_momentum_arrives_in_the_momentum_update(view_store, monkeypatch):
    seen = []
    real = esd.ema
    monkeypatch.setattr(esd, "ema", lambda t, s, m: seen.append(m) or real(t, s, m))
    cfg = TrainConfig(store=view_store, dataset="test-toy", backbones=["tiny-timm-random"], method="flesd", clients=3,
                      rounds=1, batch_size=8, settings=["method.momentum=0.99", "hidden=8", "out=4", "distill_epochs=1",
                                                        "distill_batch=4", "queue=4", "probe_rows=0"])
    method, resolved = prepare(cfg)
    assert method.p.momentum == 0.99 and method.ctx.optim.momentum == 0.9  # Adam's field untouched
    run(method, RunConfig(rounds=1))
    assert seen and set(seen) == {0.99}


def test_cli_trains_flesd_on_a_multi_view_store(view_store, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--store", str(view_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "flesd",
            "--clients", "3", "--rounds", "2", "--batch-size", "8", "--set", "hidden=16", "--set", "out=8",
            "--set", "distill_epochs=2", "--set", "distill_batch=4", "--set", "queue=8", "--set", "probe_rows=0",
            "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    p = json.loads((out / "config.json").read_text())["data"]["client_train_sizes"][0]
    assert summary["bytes_up"] == 2 * 2 * p * 8 * 4 and len(summary["per_client_accuracy"]) == 2
    assert 0 <= summary["global_accuracy"] <= 100
    code = main(["train", "--store", str(view_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
                 "--clients", "2", "--rounds", "1"])
    assert code == 0  # methods that do not use views ignore them


def test_a_grid_of_flesd_runs_on_a_multi_view_store(view_store, tmp_path):
    """A grid builds each method on its data before any cell trains: flesd's with the views it reads."""
    from fedcache.api import grid

    table = grid(store=view_store, dataset="test-toy", backbones="tiny-timm-random", methods="flesd,fedavg", seeds=[0],
                 out=tmp_path / "grid", sweep={"clients": 3, "rounds": 1, "batch_size": 8})
    assert len(table) == 2 and all(0 <= r["mean_accuracy"] <= 100 for r in table)


# ---- the paper preset ---------------------------------------------------------------------------------------
def test_table1_preset_runs_the_official_local_simclr_protocol():
    """The official README's local SimCLR: batch 1024, Adam 1e-3 with wd 1e-6, 200 local epochs in all,
    6 clients all sampled (the preset's notes say so; this keeps them true)."""
    from fedcache.presets import PRESETS

    for e in PRESETS.get("flesd-table1").experiments:
        s = e.sweep
        assert (s["batch_size"], s["clients"], s["fraction"]) == (1024, 6, 1.0), e.key
        assert s["rounds"] * s["local_epochs"] == 200, e.key
        for method in e.methods:
            o = resolve_settings(method, [], s.get("preset")).optim
            assert (o.optimizer, o.lr, o.weight_decay) == ("adam", 1e-3, 1e-6), (e.key, method)
