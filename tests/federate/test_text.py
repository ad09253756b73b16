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
    extraction, or a shard's copies can leave another weights' text the newest: a read that names the weights gets
    theirs, and the newest only where the store has none of them (that a run names its features' weights: below)."""
    store = FeatureStore(tmp_path / "s.zarr")
    rng = np.random.default_rng(1)
    emb = {w: rng.normal(size=(1, 2, 4)).astype(np.float32) for w in ("A", "B")}
    for w in ("A", "B"):
        store.put_text(TextKey("clip-x", w, ("a", "b"), ("{}",), "single"), emb[w], False)
    np.testing.assert_array_equal(store.read_text("clip-x", ["a", "b"], "single", weights_hash="A"), emb["A"])
    np.testing.assert_array_equal(store.read_text("clip-x", ["a", "b"], "single", weights_hash="C"), emb["B"])


def test_a_clip_backbone_without_its_text_says_the_extraction_that_stores_it(tmp_path):
    """clip-zs on a CLIP backbone whose text entries were removed (or whose features were imported: an import stores no
    text) said it needs 'a backbone with a text tower, e.g. clip-rn50': it has one. It says the extraction that stores
    that backbone's text, and that command does."""
    import shlex

    import pytest

    import fedcache
    from fedcache.cli import main
    from fedcache.errors import ConfigError
    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.store.feature_store import TEXT
    from fedcache.store.interchange import import_file

    store_path, clip = tmp_path / "s.zarr", "tiny-clip-random"
    extract(ExtractConfig(dataset="test-toy", backbones=[clip], store=store_path, workers=0))
    store = FeatureStore(store_path)
    for eid in store.entry_ids(TEXT):
        store.discard(eid, TEXT)
    train = lambda path: fedcache.train(path, "test-toy", clip, "clip-zs", clients=2, rounds=1)  # noqa: E731
    with pytest.raises(ConfigError) as missing:
        train(store_path)
    command = (f"fedcache extract --store {store_path} --dataset test-toy --backbones {clip} --splits train "
               "--domains dark,light --random-init")  # the backbone's weights are random
    assert str(missing.value) == (f"clip-zs needs class-text embeddings: the store holds no class-text embeddings of {clip} "
                                  f"for the classes of test-toy (removed, or never extracted); extract them with "
                                  f"`{command}`, which finds the features complete and stores the text")
    assert main(shlex.split(command)[1:] + ["--workers", "0"]) == 0
    train(store_path)

    imported = tmp_path / "imported.zarr"
    assert main(["store", "export", "--store", str(store_path), "-d", "test-toy", "-b", clip, "-o", str(tmp_path / "f.h5")]) == 0
    import_file(imported, tmp_path / "f.h5", "test-toy", clip)
    with pytest.raises(ConfigError) as none:
        train(imported)
    command = f"fedcache extract --store {imported} --dataset test-toy --name test-toy-text --backbones {clip} --splits test"
    assert str(none.value) == (f"clip-zs needs class-text embeddings: the store holds no class-text embeddings of {clip} for "
                               "the classes of test-toy: its features were imported, and an import stores none; extract "
                               f"them with `{command}` (--name keeps the features it extracts apart from the imported ones)")
    assert main(shlex.split(command)[1:] + ["--workers", "0"]) == 0
    train(imported)


def _one_entry_store(path, backbone: str, source: str):
    """A store of one complete train entry of ``backbone`` (3 classes), and that table."""
    from fedcache.store.keys import EntryKey
    from fedcache.store.writer import open_writer

    store = FeatureStore(path)
    key = EntryKey("ds", "fp", "train", "d0", backbone, "w", {"s": 1}, dtype="float32")
    with open_writer(store, key, 6, 4, 1, {"classes": ["a", "b", "c"], "domains": ["d0"], "random_weights": True,
                                           "backbone_source": source}) as w:
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, np.ones((hi - lo, 4), np.float32), np.arange(lo, hi) % 3, np.arange(lo, hi), np.ones(hi - lo, bool))
        w.finish()
    return store, store.read("ds", "train", backbone, domains=["d0"])


def test_a_run_on_a_prefixed_backbone_builds_no_model_for_the_text_hint(tmp_path, monkeypatch):
    """attach_text resolved a timm:/open_clip: name through its registry factory on every run without text: timm built
    the model (seconds, torch's RNG drawn from), and a model the installed timm lacks refused a plain fedavg run."""
    from fedcache.extract.backbones import BACKBONES

    def factory(rest):
        raise AssertionError(f"a factory was called for {rest!r}")

    for prefix in BACKBONES.prefixes():
        monkeypatch.setitem(BACKBONES._prefixes, prefix, (factory, ""))
    store, table = _one_entry_store(tmp_path / "t.zarr", "timm:resnet18", "timm")
    data = synthetic(n_classes=3, dim=4)
    data.class_names = ("a", "b", "c")
    rng = torch.get_rng_state()
    info = attach_text(data, store, ["timm:resnet18"], table).info
    assert not {"text", "text_hint"} & set(info)
    assert torch.equal(torch.get_rng_state(), rng)
    store, table = _one_entry_store(tmp_path / "c.zarr", "open_clip:RN50/openai", "open-clip")
    assert "open_clip:RN50/openai" in attach_text(data, store, ["open_clip:RN50/openai"], table).info["text_hint"]


def test_a_method_without_a_text_tower_names_the_extraction_of_one_and_the_way_without_text(toy_store, capsys):
    """fst-cbdg on a backbone without a text tower said `fedcache extract --dataset DATASET --backbones clip-rn50`
    though the run knows its dataset and store, and not that the method runs without text (anchors=prototypes): both
    are said, the second as the caller names settings (``--set``, or ``settings=`` in an API call)."""
    import pytest

    import fedcache
    from fedcache.errors import ConfigError
    from tests.conftest import BACKBONE
    from tests.faults import one_error_line, run_cli

    run = {"clients": 2, "rounds": 1, "partition": "iid"}
    extraction = f"extract it with `fedcache extract --store {toy_store} --dataset test-toy --backbones clip-rn50` ("
    with pytest.raises(ConfigError) as api:
        fedcache.train(toy_store, "test-toy", BACKBONE, "fst-cbdg", **run)
    said = str(api.value)
    assert extraction in said and said.endswith("; or run fst-cbdg without text: settings={'anchors': 'prototypes'}"), said
    flags = [f"--{k}={v}" for k, v in run.items()]
    code, err = run_cli(["train", "--store", toy_store, "-d", "test-toy", "-b", BACKBONE, "-m", "fst-cbdg", *flags], capsys)
    line = one_error_line(err)
    assert code == 2 and extraction in line and line.endswith("without text: --set anchors=prototypes"), line
    with pytest.raises(ConfigError) as zero_shot:  # needs text whatever its settings: no other way said
        fedcache.train(toy_store, "test-toy", BACKBONE, "clip-zs", **run)
    assert extraction in str(zero_shot.value) and "without text" not in str(zero_shot.value)
    fedcache.train(toy_store, "test-toy", BACKBONE, "fst-cbdg", settings={"anchors": "prototypes"}, **run)  # the way said


def test_features_of_no_entry_are_pointed_to_an_extraction_into_their_store(tmp_path, monkeypatch):
    """Without an entry to say the dataset of, the extraction of a text tower named no store: pasted, it extracted
    into the default one of the folder it was pasted in. Data of no store names its store as a placeholder."""
    import pytest

    from fedcache.errors import ConfigError
    from fedcache.federate.text import text_from_info

    monkeypatch.chdir(tmp_path)
    store = FeatureStore("s.zarr")
    data = attach_text(synthetic(n_classes=4, dim=8), store, ["a", "b"])
    with pytest.raises(ConfigError) as no_tower:
        text_from_info(data, "clip-zs")
    said = f"`fedcache extract --store {tmp_path / 's.zarr'} --dataset DATASET --backbones clip-rn50`"
    assert said in str(no_tower.value), no_tower.value
    with pytest.raises(ConfigError) as no_store:
        text_from_info(synthetic(n_classes=4, dim=8), "clip-zs")
    assert "`fedcache extract --store STORE --dataset DATASET --backbones clip-rn50`" in str(no_store.value)


def test_a_run_attaches_the_text_of_the_weights_that_made_its_features(tmp_path):
    """Another weights' text written after the extraction is the store's newest; the run's features were made by
    the extraction's weights, and it is their text a run attaches."""
    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.store.feature_store import TEXT

    store_path, clip = tmp_path / "s.zarr", "tiny-clip-random"
    extract(ExtractConfig(dataset="test-toy", backbones=[clip], store=store_path, splits=("train",), workers=0))
    store = FeatureStore(store_path)
    train = store.read("test-toy", "train", clip)
    own = store.info(train.entry_ids[0]).key["weights_hash"]
    rng = np.random.default_rng(2)
    for eid in store.entry_ids(TEXT):  # each of its text sets again, of other weights, written after it
        key = store.root[TEXT][eid].attrs["key"]
        shape = store.read_text(clip, key["classes"], key["template_set"], weights_hash=own).shape
        store.put_text(TextKey(clip, "other-weights", tuple(key["classes"]), tuple(key["templates"]),
                               key["template_set"]), rng.normal(size=shape).astype(np.float32), False)
    data = synthetic()
    data.class_names = tuple(store.info(train.entry_ids[0]).attrs["classes"])
    got = attach_text(data, store, [clip], train).info
    assert set(got["text_sets"])
    for name, anchors in got["text_sets"].items():
        stored = store.read_text(clip, list(data.class_names), name, weights_hash=own)
        torch.testing.assert_close(anchors, text_anchors(stored), atol=0, rtol=0)
        newest = store.read_text(clip, list(data.class_names), name)
        assert not np.array_equal(stored, newest)  # the store's newest text is the other weights'
