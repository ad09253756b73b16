"""promptfl, tpfl, atpfl: CoOp prompts through the (tiny, random) CLIP text tower on cached features."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.federate.schedule import Schedule
from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.extract.loading import load_backbone
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.federate.data import FederatedData
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods._prompt import PLACEHOLDER, PromptedText, info_nce
from fedcache.federate.optim import OptimConfig
from fedcache.federate.source import FeatureSource, RowSource
from fedcache.training import TrainConfig, prepare

CLIP = "tiny-clip-random"  # 32-d embeddings, text width 64
WIDTH, DIM = 64, 32
CLASSES = ("red", "green", "blue", "cat", "dog", "car", "tree", "ship")
PROMPT_METHODS = ("promptfl", "tpfl", "atpfl")


@pytest.fixture(scope="module")
def clip():
    return load_backbone(CLIP)


def forged_source(n_train: int, n_test: int, weights_hash: str) -> FeatureSource:
    key = ({"backbone": CLIP, "weights_hash": weights_hash},)
    rows = lambda n: RowSource(np.zeros(n, np.int16), np.arange(n), key)
    return FeatureSource(("all",), rows(n_train), rows(n_test))


@pytest.fixture(scope="module")
def hidden(clip):
    """Image features drawn around the class-text features of a hidden context ctx*: zero-shot with
    the initial context is weak (the random tower's class features are 0.98-0.999 alike), but a
    learned context can recover the truth. 4 clients of 100 rows, 8 classes."""
    true_ctx = torch.randn(1, 16, WIDTH, generator=torch.Generator().manual_seed(123))
    with torch.no_grad():
        anchors = PromptedText(clip, CLASSES, 16).encode(true_ctx)[0]
    rng = np.random.default_rng(0)

    def draw(n):
        y = rng.integers(0, len(CLASSES), n)
        return anchors[y] + 0.01 * torch.from_numpy(rng.normal(size=(n, DIM)).astype(np.float32)), torch.from_numpy(y)

    (xtr, ytr), (xte, yte) = draw(400), draw(400)
    rows = [np.arange(k * 100, (k + 1) * 100) for k in range(4)]
    return FederatedData(xtr, ytr, xte, yte, rows, [r.copy() for r in rows], CLASSES, random_weights=True,
                         info={"source": forged_source(400, 400, clip.weights_hash)})


def make(name, data, seed=0, lr=2e-2, **params):
    cls = METHODS.get(name)
    ctx = MethodContext(data, "linear", OptimConfig("adam", lr, weight_decay=0.0), schedule=Schedule(local_epochs=2, batch_size=32, seed=seed, rounds=10))
    return cls(ctx, cls.Params(**params))


def accuracy(m, server, data) -> float:
    return 100.0 * float((m.global_logits(server, data.x_test).argmax(1) == data.y_test).float().mean())


# ---- learning --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, margin", [("promptfl", 25.0), ("tpfl", 40.0), ("atpfl", 40.0)])
def test_learned_prompts_beat_the_initial_prompt(name, margin, hidden):
    m = make(name, hidden)
    zero_shot = accuracy(m, m.init_server(), hidden)
    result = run(m, RunConfig(rounds=10))
    assert zero_shot < 25.0  # chance is 12.5%
    assert result.summary["global_accuracy"] > zero_shot + margin, (zero_shot, result.summary["global_accuracy"])


@pytest.mark.parametrize("name", PROMPT_METHODS)
def test_deterministic_and_batched_equals_per_client(name, hidden):
    a = run(make(name, hidden), RunConfig(rounds=2))
    b = run(make(name, hidden), RunConfig(rounds=2))
    assert {k: v for k, v in a.summary.items() if k != "seconds"} == {k: v for k, v in b.summary.items() if k != "seconds"}
    for n in a.server:
        assert torch.equal(a.server[n], b.server[n])
    c = run(make(name, hidden), RunConfig(rounds=1, batched=True))
    d = run(make(name, hidden), RunConfig(rounds=1, batched=False))
    for got, want in ((d.server, c.server), (d.clients, c.clients)):
        assert got.keys() == want.keys()
        for n in want:
            torch.testing.assert_close(got[n], want[n], atol=1e-4, rtol=1e-4)


def test_atpfl_with_mu_zero_is_tpfl(hidden):
    a = run(make("atpfl", hidden, mu=0.0), RunConfig(rounds=3, fraction=0.5))
    b = run(make("tpfl", hidden), RunConfig(rounds=3, fraction=0.5))
    assert a.server.keys() == b.server.keys() == {"ctx", "vprompt"}
    for n in a.server:
        assert torch.equal(a.server[n], b.server[n])
    assert a.summary["per_client_accuracy"] == b.summary["per_client_accuracy"]
    c = run(make("atpfl", hidden, mu=1.0), RunConfig(rounds=3, fraction=0.5))
    assert not torch.equal(c.server["ctx"], a.server["ctx"])  # the InfoNCE terms do change training


# ---- the contrastive term ----------------------------------------------------------------------------
def test_info_nce_by_hand():
    z = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    pos = torch.tensor([[2.0, 0.0], [3.0, 4.0]])
    neg = torch.tensor([[0.0, 5.0], [-3.0, -4.0]])
    # row 0: cos = 1 and 0 -> -log(e^2 / (e^2 + e^0)); row 1: cos = 1 and -1 -> -log(e^2 / (e^2 + e^-2)); tau 0.5
    want = torch.tensor([math.log(1 + math.exp(-2)), math.log(1 + math.exp(-4))])
    torch.testing.assert_close(info_nce(z, pos, neg, 0.5), want)


def cosine_nce(z, pos, neg, tau):
    """ATPFL Eq. 4 written out: log(1 + exp((cos(z, neg) - cos(z, pos)) / tau)) per row."""
    return torch.log1p(torch.exp((F.cosine_similarity(z, neg, dim=-1) - F.cosine_similarity(z, pos, dim=-1)) / tau))


def atpfl_regulariser(m, clients, server, states, p, rows, mask=None):
    info = m.local_extra(clients, server, states)
    mask = torch.ones(*rows.shape, dtype=torch.bool) if mask is None else mask
    image, text = m.visual.train_features(p, rows, mask), m.text.encode(p["ctx"])
    return m.regulariser(p, rows, mask, image, text, info)


def test_atpfl_global_prompt_is_the_positive_and_previous_the_negative(hidden):
    """Eq. 4-5 by hand for clients that trained before: the global prompts' features are the positive,
    the client's previous prompts' the negative; a local prompt equal to the global one scores below
    log 2 per term, one equal to the previous prompt above."""
    m = make("atpfl", hidden, mu=0.5, tau=0.7)
    server = m.init_server()
    g = torch.Generator().manual_seed(3)
    prev = {n: t.expand(2, *t.shape[1:]) + 0.5 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    states = {**{"prev_" + n: t for n, t in prev.items()}, "trained": torch.ones(2, 1)}
    clients = [1, 3]
    rows = torch.from_numpy(np.stack([hidden.client_train[k][:5] for k in clients]))
    p = {n: t.expand(2, *t.shape[1:]) + 0.2 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    glob = {n: t.expand(2, *t.shape[1:]) for n, t in server.items()}
    with torch.no_grad():
        text, text_g, text_prev = (m.text.encode(q["ctx"]) for q in (p, glob, prev))
        image, image_g, image_prev = (m.visual.train_features(q, rows, torch.ones(rows.shape, dtype=torch.bool))
                                      for q in (p, glob, prev))
    want = 0.5 * (cosine_nce(text, text_g, text_prev, 0.7).mean(-1) + cosine_nce(image, image_g, image_prev, 0.7).mean(-1))
    torch.testing.assert_close(atpfl_regulariser(m, clients, server, states, p, rows), want)
    two_log_two = torch.full((2,), 0.5 * 2 * math.log(2))
    assert (atpfl_regulariser(m, clients, server, states, glob, rows) < two_log_two).all()
    assert (atpfl_regulariser(m, clients, server, states, prev, rows) > two_log_two).all()


def test_atpfl_default_temperature_is_clips_and_padding_rows_do_not_count(hidden):
    """tau=0 (default) is Eq. 2's Gamma, 1 / logit_scale; the image term averages over the real rows
    of the batch only (a client with fewer rows is padded in batched training)."""
    m = make("atpfl", hidden, mu=1.0)
    assert m.p.tau == 0 and abs(1.0 / m.scale - 1.0) > 0.1  # a wrong default (e.g. 1) would show
    server = m.init_server()
    g = torch.Generator().manual_seed(5)
    prev = {n: t.expand(2, *t.shape[1:]) + 0.5 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    states = {**{"prev_" + n: t for n, t in prev.items()}, "trained": torch.ones(2, 1)}
    clients = [0, 2]
    rows = torch.from_numpy(np.stack([hidden.client_train[k][:6] for k in clients]))
    mask = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    p = {n: t.expand(2, *t.shape[1:]) + 0.2 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    glob = {n: t.expand(2, *t.shape[1:]) for n, t in server.items()}
    tau = 1.0 / m.scale
    with torch.no_grad():
        text, text_g, text_prev = (m.text.encode(q["ctx"]) for q in (p, glob, prev))
        image, image_g, image_prev = (m.visual.train_features(q, rows, mask) for q in (p, glob, prev))
    per_row = cosine_nce(image, image_g, image_prev, tau)
    l_image = torch.stack([per_row[0].mean(), per_row[1, :2].mean()])
    want = cosine_nce(text, text_g, text_prev, tau).mean(-1) + l_image
    torch.testing.assert_close(atpfl_regulariser(m, clients, server, states, p, rows, mask), want)


def test_atpfl_previous_prompt_of_a_client_that_never_trained_is_the_global_one(hidden):
    """After a round with half the clients, those that trained have their upload as previous prompt;
    the others take the global prompt they receive (not the random initial one), so their terms are
    -log(1/2) each whatever the local prompt: mu * 2 log 2."""
    m = make("atpfl", hidden, mu=0.5)
    result = run(m, RunConfig(rounds=1, fraction=0.5))
    trained = [k for k in range(hidden.n_clients) if result.clients["trained"][k]]
    fresh = [k for k in range(hidden.n_clients) if k not in trained]
    assert len(trained) == len(fresh) == 2
    server = result.server
    states = {n: t[fresh] for n, t in result.clients.items()}
    prev = m.previous_prompts({n: t.expand(2, *t.shape[1:]) for n, t in server.items()}, states)
    for n, t in server.items():
        assert not torch.equal(t, m.init_server()[n])  # the global prompt has moved away from the initial one
        torch.testing.assert_close(prev[n], t.expand(2, *t.shape[1:]))
    rows = torch.from_numpy(np.stack([hidden.client_train[k][:5] for k in fresh]))
    p = {n: t.expand(2, *t.shape[1:]) + 0.1 for n, t in server.items()}  # a moved local prompt
    torch.testing.assert_close(atpfl_regulariser(m, fresh, server, states, p, rows), torch.full((2,), 0.5 * 2 * math.log(2)))
    mine = m.previous_prompts({n: t.expand(2, *t.shape[1:]) for n, t in server.items()},
                              {n: t[trained] for n, t in result.clients.items()})
    for n in server:
        torch.testing.assert_close(mine[n], result.clients["prev_" + n][trained])


# ---- the text tower --------------------------------------------------------------------------------
def test_prompted_text_is_open_clips_own_text_encoder(clip):
    """With the placeholder's own embedding as context, the (truncated, batched) prompt encoder gives
    exactly what open_clip's encode_text gives on the tokenised prompt."""
    pt = PromptedText(clip, CLASSES, 16)
    assert pt.tokens.shape[1] < 77  # cut after the last EOS
    with torch.no_grad():
        x_emb = clip.model.token_embedding(clip.tokenize([PLACEHOLDER]))[0, 1]
        got = pt.encode(x_emb.expand(2, 16, -1))
        want = clip.model.encode_text(clip.tokenize([" ".join([PLACEHOLDER] * 16) + f" {c}." for c in CLASSES]))
    torch.testing.assert_close(got[0], F.normalize(want, dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], got[0])


def test_ctx_init_from_words_equals_the_hand_written_template(clip, hidden):
    m = make("promptfl", hidden, n_ctx=4, ctx_init="a photo of a")
    with torch.no_grad():
        text = m.text.encode(m.init_server()["ctx"])[0]
        want = F.normalize(clip.model.encode_text(clip.tokenize([f"a photo of a {c}." for c in CLASSES])), dim=-1)
    torch.testing.assert_close(text, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="n_ctx=4"):
        make("promptfl", hidden, ctx_init="a photo of a")


def test_other_weights_than_the_cached_ones_are_refused(hidden):
    data = FederatedData(hidden.x_train, hidden.y_train, hidden.x_test, hidden.y_test, hidden.client_train,
                         hidden.client_test, CLASSES, info={"source": forged_source(400, 400, "0" * 24)})
    with pytest.raises(ConfigError, match="not the ones the cached features were extracted with"):
        make("promptfl", data)
    with pytest.raises(ConfigError, match="fedcache train"):
        make("promptfl", FederatedData(*[getattr(hidden, f) for f in ("x_train", "y_train", "x_test", "y_test",
                                                                        "client_train", "client_test")], CLASSES))


# ---- end to end on a store ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=[CLIP], store=path, workers=0))
    return path


# parameters each client sends per round: 16 x 64 context, plus the visual prompt
VISUAL_SIZE = {"promptfl": 0, "tpfl": DIM, "atpfl": DIM, "tpfl-pixel": 3 * (32 * 32 - 24 * 24)}


@pytest.mark.parametrize("name, extra", [("promptfl", []), ("tpfl", []), ("atpfl", []),
                                         ("tpfl-pixel", ["--set", "visual=pixel", "--set", "pad=4"])])
def test_cli_runs_and_counts_exact_bytes(name, extra, store, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--store", str(store), "-d", "test-toy", "-b", CLIP, "-m", name.split("-")[0],
                 "--partition", "domain", "--clients", "2", "--rounds", "2", "--out", str(out), *extra])
    printed = " ".join(capsys.readouterr().out.split())  # undo the console's line wrapping
    assert code == 0 and "RANDOM WEIGHTS" in printed
    s = json.loads((out / "summary.json").read_text())
    per_client = (16 * WIDTH + VISUAL_SIZE[name]) * 4
    assert s["bytes_up"] == s["bytes_down"] == 2 * 2 * per_client and s["random_weights"] is True
    assert s.get("bypasses_cache", False) == name.endswith("pixel") == ("BYPASSED THE FEATURE CACHE" in printed)


def test_pixel_prompt_reads_the_cached_images_and_learns(store):
    cfg = TrainConfig(store=store, dataset="test-toy", backbones=[CLIP], method="tpfl", partition="domain", clients=2,
                      rounds=3, local_epochs=3, settings=["visual=pixel", "pad=4", "lr=0.05"])
    m, _ = prepare(cfg)
    d = m.ctx.data
    server = m.init_server()
    with torch.no_grad():
        # Zero frame: re-read images through the image tower land on their own cached rows.
        again = m.visual.eval_features(server, d.x_test)
        sim = again @ F.normalize(d.x_test, dim=-1).T
        assert bool((sim.argmax(1) == torch.arange(len(d.x_test))).all()) and float(sim.diagonal().min()) > 0.99
        before = F.cross_entropy(m.global_logits(server, d.x_train), d.y_train)
    result = run(m, RunConfig(rounds=3))
    with torch.no_grad():
        after = F.cross_entropy(m.global_logits(result.server, d.x_train), d.y_train)
    assert float(after) < float(before) - 0.05, (float(before), float(after))
    assert result.server["vprompt"].abs().sum() > 0
    with pytest.raises(ConfigError, match="pad"):
        prepare(TrainConfig(store=store, dataset="test-toy", backbones=[CLIP], method="tpfl", settings=["visual=pixel"]))


def test_pixel_prompt_sends_only_a_step_s_real_rows_through_the_image_tower(store):
    """Every step is the full batch width (local.train): a short client's padding rows would otherwise cost whole
    image-tower passes. Real rows get what encoding every row gives them; padding rows are zeros."""
    cfg = TrainConfig(store=store, dataset="test-toy", backbones=[CLIP], method="tpfl", partition="domain", clients=2,
                      settings=["visual=pixel", "pad=4"])
    m, _ = prepare(cfg)
    v = m.visual
    p = {"vprompt": torch.randn(2, *m.init_server()["vprompt"].shape[1:], generator=torch.Generator().manual_seed(0))}
    rows = torch.tensor([[0, 1, 2, 0], [3, 4, 0, 0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    seen, encode = [], v.model.encode_image
    v.model.encode_image = lambda x: seen.append(len(x)) or encode(x)
    with torch.no_grad():
        got = v.train_features(p, rows, mask)
        every = v._encode(p["vprompt"], v.images.get("train", rows.numpy()))
    assert seen[0] == 5  # the real rows only (then all 8 for the comparison)
    torch.testing.assert_close(got[mask], every[mask], atol=1e-5, rtol=1e-5)
    assert not got[~mask].any()


def test_clear_errors_for_a_head_and_for_fused_backbones(hidden, clip):
    cls = METHODS.get("promptfl")
    with pytest.raises(ConfigError, match="drop --head"):
        cls(MethodContext(hidden, "mlp"), cls.Params())
    keys = ({"backbone": CLIP, "weights_hash": clip.weights_hash}, {"backbone": "tiny-timm-random", "weights_hash": "h"})
    rows = RowSource(np.zeros(400, np.int16), np.arange(400), keys)
    fused = FederatedData(hidden.x_train, hidden.y_train, hidden.x_test, hidden.y_test, hidden.client_train,
                          hidden.client_test, CLASSES, info={"source": FeatureSource(("all",), rows, rows)})
    with pytest.raises(ConfigError, match="exactly one backbone"):
        cls(MethodContext(fused), cls.Params())
