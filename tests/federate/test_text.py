"""Class text embeddings (fedcache/federate/text.py): anchors read from the store's text entries and attached to
the data of a backbone with a text tower."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.federate.text import attach_text, load_text_anchors, text_anchors
from fedcache.store.feature_store import FeatureStore
from fedcache.store.keys import TextKey

from .conftest import synthetic


def test_text_anchors_come_from_the_store(tmp_path):
    store = FeatureStore(tmp_path / "s.zarr")
    emb = np.random.default_rng(0).normal(size=(3, 4, 8)).astype(np.float32)  # 3 templates, 4 classes
    classes = ("a", "b", "c", "d")
    store.put_text(TextKey("clip-x", "h", classes, ("{}", "a {}", "the {}"), "ensemble"), emb, False)
    got = load_text_anchors(store, "clip-x", classes, "ensemble")
    want = F.normalize(F.normalize(torch.from_numpy(emb), dim=-1).mean(0), dim=-1)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(text_anchors(emb[:1]), F.normalize(torch.from_numpy(emb[0]), dim=-1))
    data = synthetic(n_classes=4, dim=8)
    data.class_names = classes
    assert "text" not in attach_text(data, store, ["clip-x", "other"]).info  # fused: no text tower
    attach_text(data, store, ["clip-x"])
    assert set(data.info["text_sets"]) == {"ensemble"}
    torch.testing.assert_close(data.info["text"], want)  # no "single" set: the one there is
    assert "text" not in attach_text(synthetic(), store, ["no-text-backbone"]).info


def test_the_text_read_is_that_of_the_weights_of_the_features(tmp_path):
    """Weights A, then B, then A again (extraction finds A's text complete and writes nothing), an interrupted
    extraction, or a shard's copies can leave another weights' text the newest: a run reads its features' own."""
    store = FeatureStore(tmp_path / "s.zarr")
    rng = np.random.default_rng(1)
    emb = {w: rng.normal(size=(1, 2, 4)).astype(np.float32) for w in ("A", "B")}
    for w in ("A", "B"):
        store.put_text(TextKey("clip-x", w, ("a", "b"), ("{}",), "single"), emb[w], False)
    np.testing.assert_array_equal(store.read_text("clip-x", ["a", "b"], "single", weights_hash="A"), emb["A"])
    np.testing.assert_array_equal(store.read_text("clip-x", ["a", "b"], "single", weights_hash="C"), emb["B"])
