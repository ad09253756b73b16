"""FLESD against the official code: the representation upload and the server's top-n% filter by hand,
the momentum update (Eq. 10), the per-epoch queue warm-up, Adam's weight decay in distillation, the
official cross-view local loss, and that `momentum` reaches the momentum encoder (or is refused)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import _flesd as esd
from fedcache.federate.methods._simclr import cross_view, init_encoder
from fedcache.training import TrainConfig, prepare
from tests.resolve import resolve_settings


# ---- what the server forms from representations ----------------------------------------------------
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


# ---- distillation ---------------------------------------------------------------------------------
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


# ---- local loss -----------------------------------------------------------------------------------
def test_cross_view_loss_matches_hand_computation_and_ignores_padding():
    z1 = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    z2 = torch.tensor([[[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    # Row 0: logits (z1_0 . z2_0, z1_0 . z2_1) = (0.6, 0) / t, positive first; row 1: (0.8, 1), positive second.
    t = 0.5
    l0 = -math.log(math.exp(0.6 / t) / (math.exp(0.6 / t) + 1))
    l1 = -math.log(math.exp(1 / t) / (math.exp(0.8 / t) + math.exp(1 / t)))
    torch.testing.assert_close(cross_view(z1, z2, mask, t), torch.tensor([(l0 + l1) / 2]))


# ---- settings reach the momentum encoder ------------------------------------------------------------
def test_short_momentum_is_refused_as_ambiguous_for_flesd():
    with pytest.raises(ConfigError) as e:
        resolve_settings("flesd", ["momentum=0.99"])
    assert "--set method.momentum=" in str(e.value) and "--set optim.momentum=" in str(e.value)


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


# ---- who encodes what: momentum keys into the queue, two different views ------------------------------
def _tagged_views(p: int, n_views: int, dim: int) -> torch.Tensor:
    """(P, V, D) views whose last coordinate is the view's index, so a spy can tell which view it sees."""
    v = torch.randn(p, n_views, dim, generator=torch.Generator().manual_seed(0))
    v[..., -1] = torch.arange(n_views, dtype=v.dtype)
    return v


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
    views = _tagged_views(32, 3, 6)
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


def test_local_simclr_contrasts_two_different_views(monkeypatch):
    """Each local step embeds two different cached views of the same rows (Eq. 3's positive pair)."""
    import fedcache.federate.methods._simclr as simclr
    from tests.federate.conftest import synthetic
    from tests.federate.test_methods import make

    data = synthetic(n_clients=2, per_client=16, n_classes=3, dim=6)
    data.views = _tagged_views(len(data.x_train), 3, 6)
    seen = []
    real = simclr.embed
    monkeypatch.setattr(simclr, "embed", lambda p, x: seen.append(set(x[..., -1].flatten().tolist())) or real(p, x))
    m = make("fedavg-ssl", data, hidden=4, out=3, probe_rows=0)
    m.local_update(0, [0, 1], m.init_server(), {})
    assert seen and len(seen) % 2 == 0
    pairs = list(zip(seen[::2], seen[1::2]))
    assert all(len(a) == 1 and len(b) == 1 and a != b for a, b in pairs)
    assert set().union(*seen) == {0.0, 1.0, 2.0}  # consecutive pairs cycle through every view


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
