"""What promptfl, tpfl and atpfl share (fedcache/federate/methods/_prompt.py, _visual_prompt.py): CoOp prompts
through the (tiny, random) CLIP text tower on cached features, learning, determinism, the InfoNCE term, the pixel
prompt through the image tower, exact bytes, and the errors."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.federate.data import FederatedData
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods._prompt import PLACEHOLDER, PromptedText, info_nce
from fedcache.federate.source import FeatureSource, RowSource
from fedcache.training import TrainConfig, prepare

from .prompt_problem import CLASSES, CLIP, DIM, PROMPT_METHODS, WIDTH, accuracy, forged_source, make


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


# ---- the contrastive term ----------------------------------------------------------------------------
def test_info_nce_by_hand():
    z = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    pos = torch.tensor([[2.0, 0.0], [3.0, 4.0]])
    neg = torch.tensor([[0.0, 5.0], [-3.0, -4.0]])
    # row 0: cos = 1 and 0 -> -log(e^2 / (e^2 + e^0)); row 1: cos = 1 and -1 -> -log(e^2 / (e^2 + e^-2)); tau 0.5
    want = torch.tensor([math.log(1 + math.exp(-2)), math.log(1 + math.exp(-4))])
    torch.testing.assert_close(info_nce(z, pos, neg, 0.5), want)


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


def test_features_extracted_before_clip_ran_quickgelu_are_to_be_extracted_again(clip):
    """An OpenAI CLIP's entry made with nn.GELU hashed its tensors alone; the model now hashes its activation too."""
    from pathlib import Path
    from types import SimpleNamespace

    from fedcache.extract.backbones.base import hash_state
    from fedcache.federate.methods._prompt import _not_these_weights

    bb = SimpleNamespace(model=clip.model, weights_hash=hash_state(clip.model, "quick_gelu"))
    key = {"backbone": "clip-rn50", "dataset": "pacs"}
    said = _not_these_weights(bb, hash_state(clip.model), "tpfl", key, Path("/data/my store.zarr"))
    assert "before fedcache ran OpenAI's CLIPs with QuickGELU" in said
    assert "`fedcache extract --store '/data/my store.zarr' --dataset pacs --backbones clip-rn50`" in said
    assert "`fedcache store rm --stale --store '/data/my store.zarr'`" in said and "PATH" not in said
    assert "weights=PATH" in _not_these_weights(bb, "0" * 24, "tpfl", key)


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


def test_pixel_prompt_scored_on_validation_reads_the_images_of_the_spare_rows(store):
    cfg = TrainConfig(store=store, dataset="test-toy", backbones=[CLIP], method="tpfl", partition="domain", clients=2,
                      validation=True, subsample=0.5, settings=["visual=pixel", "pad=4"])
    m, _ = prepare(cfg)
    d, server = m.ctx.data, m.init_server()
    assert d.global_rows is not None and len(d.global_rows) < len(d.x_test)
    with torch.no_grad():
        whole = m.visual.eval_features(server, d.x_test)
        scored = m.visual.eval_features(server, d.scored_test())
    torch.testing.assert_close(scored, whole[torch.from_numpy(d.global_rows)], atol=1e-5, rtol=1e-5)


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
        cls(MethodContext(hidden, "mlp"), cls.Settings())
    keys = ({"backbone": CLIP, "weights_hash": clip.weights_hash}, {"backbone": "tiny-timm-random", "weights_hash": "h"})
    rows = RowSource(np.zeros(400, np.int16), np.arange(400), keys)
    fused = FederatedData(hidden.x_train, hidden.y_train, hidden.x_test, hidden.y_test, hidden.client_train,
                          hidden.client_test, CLASSES, info={"source": FeatureSource(("all",), rows, rows)})
    with pytest.raises(ConfigError, match="exactly one backbone"):
        cls(MethodContext(fused), cls.Settings())
