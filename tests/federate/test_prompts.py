"""promptfl, tpfl, atpfl: CoOp prompts through the (tiny, random) CLIP text tower on cached features."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.extract.loading import load_backbone
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.federate.data import FederatedData
from fedcache.federate.loop import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods._prompt import PLACEHOLDER, PromptedText, info_nce
from fedcache.federate.optim import OptimConfig
from fedcache.federate.source import FeatureSource, RowSource
from fedcache.federate.train import TrainConfig, prepare

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
    ctx = MethodContext(data, "linear", OptimConfig("adam", lr, weight_decay=0.0), local_epochs=2, batch_size=32,
                        seed=seed, rounds=10)
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


def test_atpfl_terms_on_a_first_round_are_two_log_two(hidden):
    """Before a client's first round its previous prompts are the global ones: each InfoNCE term is
    -log(1/2), whatever the features, so the regulariser is mu * 2 log 2."""
    m = make("atpfl", hidden, mu=0.5)
    server, states = m.init_server(), m.init_clients(hidden.n_clients)
    clients = [1, 3]
    info = m.local_extra(clients, server, {n: t[clients] for n, t in states.items()})
    p = {n: t.expand(2, *t.shape[1:]).clone() + 0.1 for n, t in server.items()}  # a moved local prompt
    rows = torch.from_numpy(np.stack([hidden.client_train[k][:5] for k in clients]))
    image, text = m.visual.train_features(p, rows), m.text.encode(p["ctx"])
    reg = m.regulariser(p, rows, torch.ones(2, 5, dtype=torch.bool), image, text, info)
    torch.testing.assert_close(reg, torch.full((2,), 0.5 * 2 * math.log(2)))


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
