"""Fused backbones (fedcache/federate/tables.py: load_fused): rows aligned by sample, whatever order each backbone's
import lists its domains in; backbones that disagree on domains, classes or a sample's class are refused."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedcache.errors import StoreError
from fedcache.federate.tables import load_fused
from fedcache.store.feature_store import FeatureStore
from fedcache.store.interchange import import_file
from tests.conftest import open_files

N = 40


def _save(path, domain_names, renumber, labels=None, classes=("a", "b", "c")):
    """The same samples (ids 0..N-1 in each of two domains; domain 1's features are shifted by 3), listed with
    ``domain_names`` and the domain indices renumbered by ``renumber``."""
    rng = np.random.default_rng(0)
    dom, ids = np.repeat([0, 1], N), np.tile(np.arange(N), 2)
    x = (rng.normal(size=(2 * N, 4)) + 3 * dom[:, None]).astype(np.float32)
    y = rng.integers(0, 3, 2 * N) if labels is None else labels
    np.savez(path, train__features=x, train__labels=y, train__domains=np.asarray(renumber)[dom], train__ids=ids,
             domains=np.array(json.dumps(list(domain_names))), classes=np.array(json.dumps(list(classes))))
    return path


def _fused(tmp_path, second):
    store = FeatureStore(tmp_path / "s.zarr")
    import_file(store, _save(tmp_path / "p.npz", ["photo", "sketch"], [0, 1]), "fz", "e1")
    import_file(store, second, "fz", "e2")
    return load_fused(store, "fz", ["e1", "e2"], "train")


def test_the_same_domains_listed_in_another_order_are_fused_by_name(tmp_path):
    t = _fused(tmp_path, _save(tmp_path / "q.npz", ["sketch", "photo"], [1, 0]))
    np.testing.assert_array_equal(t.features[:, :4], t.features[:, 4:])  # each row's two halves: one sample
    assert t.domain_names == ("photo", "sketch")


def test_backbones_with_other_domains_are_refused(tmp_path):
    with pytest.raises(StoreError, match=r"have the domains \['photo', 'clipart'\] but those of e1 have"):
        _fused(tmp_path, _save(tmp_path / "q.npz", ["photo", "clipart"], [0, 1]))


def test_backbones_with_other_classes_are_refused(tmp_path):
    with pytest.raises(StoreError, match="fused backbones need the same classes"):
        _fused(tmp_path, _save(tmp_path / "q.npz", ["photo", "sketch"], [0, 1], classes=("a", "b", "z")))


def test_backbones_that_disagree_on_a_sample_s_class_are_refused(tmp_path):
    labels = np.random.default_rng(0).integers(0, 3, 2 * N)
    flipped = labels.copy()
    flipped[5] = (flipped[5] + 1) % 3
    store = FeatureStore(tmp_path / "s.zarr")
    import_file(store, _save(tmp_path / "p.npz", ["photo", "sketch"], [0, 1], labels), "fz", "e1")
    import_file(store, _save(tmp_path / "q.npz", ["photo", "sketch"], [0, 1], flipped), "fz", "e2")
    with pytest.raises(StoreError, match="1 samples have another class in the train features of fz for e2"):
        load_fused(store, "fz", ["e1", "e2"], "train")


def test_classes_listed_in_another_order_are_the_same_classes(tmp_path):
    labels = np.random.default_rng(0).integers(0, 3, 2 * N)
    store = FeatureStore(tmp_path / "s.zarr")
    import_file(store, _save(tmp_path / "p.npz", ["photo", "sketch"], [0, 1], labels), "fz", "e1")
    import_file(store, _save(tmp_path / "q.npz", ["photo", "sketch"], [0, 1], 2 - labels, classes=("c", "b", "a")),
                "fz", "e2")
    t = load_fused(store, "fz", ["e1", "e2"], "train")
    np.testing.assert_array_equal(t.labels, labels)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc")
@pytest.mark.parametrize("read", ["load_splits", "load_split_rows", "write_shards"])
def test_backbones_refused_leave_no_file_open(tmp_path, read):
    """The training split's backbones refused (a sample's class differs), the test split's rows, found with them,
    stayed open for as long as the error was held (a caller's traceback, a log)."""
    from fedcache.federate.tables import load_split_rows, load_splits
    from fedcache.federate.partitions import PartitionRequest
    from fedcache.flower.shard import ShardSpec, write_shards

    labels = np.random.default_rng(0).integers(0, 3, 2 * N)
    flipped = labels.copy()
    flipped[5] = (flipped[5] + 1) % 3
    store = FeatureStore(tmp_path / "s.zarr")
    for name, train_labels in (("e1", labels), ("e2", flipped)):
        path = _save(tmp_path / f"{name}.npz", ["photo", "sketch"], [0, 1], train_labels)
        arrays = dict(np.load(path))
        arrays.update({k.replace("train__", "test__"): v for k, v in arrays.items() if k.startswith("train__")})
        arrays["test__labels"] = labels
        np.savez(path, **arrays)
        import_file(store, path, "fz", name)
    reads = {"load_splits": lambda: load_splits(store, "fz", ["e1", "e2"]),
             "load_split_rows": lambda: load_split_rows(store, "fz", ["e1", "e2"]),
             "write_shards": lambda: write_shards(ShardSpec(store.path, "fz", ["e1", "e2"], PartitionRequest.of("iid", 2, 0)),
                                                  tmp_path / "shards")}
    before = open_files()
    with pytest.raises(StoreError, match="1 samples have another class in the train features of fz for e2") as raised:
        reads[read]()
    assert open_files() == before, raised.value  # the error still held, as a caller holds it
