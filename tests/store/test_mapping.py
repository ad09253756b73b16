"""Rows gathered from a memory-mapped store file leave at most a region of it mapped, and are the rows."""
from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest

from fedcache.store import mapping
from fedcache.store.chunks import RawMeta, RowFile
from fedcache.store.feature_store import FeatureStore
from fedcache.store.keys import EntryKey
from fedcache.store.writer import open_writer

ROWS, DIM = 16_384, 512  # 32 MB of float32: larger than the 2 MB regions the tests gather by


def row_file(folder: Path, rows: int = ROWS, dim: int = DIM) -> np.ndarray:
    """A one-file float32 row array of random rows, written and read back memory-mapped."""
    (folder / "zarr.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "zarr.json").write_text(json.dumps({
        "shape": [rows, dim], "chunk_grid": {"configuration": {"chunk_shape": [rows, dim]}}, "data_type": "float32",
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}], "fill_value": 0,
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}}))
    rows_file = RowFile(RawMeta.open(folder))
    rows_file.allocate()
    rows_file.write(0, np.random.default_rng(0).standard_normal((rows, dim), dtype=np.float32))
    return rows_file.open().mapped()


def rss_file() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssFile in /proc/self/status (not Linux)")


def test_a_gather_is_the_indexed_rows_mapped_or_not(tmp_path):
    mapped = row_file(tmp_path / "a")
    assert mapping.is_mapped(mapped) and mapping.is_mapped(mapped[100:200])
    rows = np.unique(np.random.default_rng(1).integers(0, ROWS, 3000))
    for array in (mapped, np.array(mapped), mapped[:, :7].copy()):
        np.testing.assert_array_equal(mapping.gather(array, rows, region_bytes=2 << 20), array[rows])
    assert not mapping.is_mapped(np.array(mapped))
    assert mapping.gather(mapped, rows[:0]).shape == (0, DIM)


def test_a_gather_leaves_no_more_than_a_region_of_the_file_mapped(tmp_path):
    if not hasattr(__import__("mmap").mmap, "madvise"):
        pytest.skip("no madvise here")
    mapped = row_file(tmp_path / "a")
    rss_file()  # skips where RSS is not reported
    rows = np.unique(np.random.default_rng(2).integers(0, ROWS, ROWS // 20))  # 5% of the rows, all over the file
    before = rss_file()
    mapping.gather(mapped, rows, region_bytes=2 << 20)
    # Indexed through the mapping, these rows would map most of the file (fault-around, large folios); a
    # region and the folios around it are 6 MB of its 32.
    assert rss_file() - before <= 8 << 20


def test_a_store_table_is_registered_and_forgotten_with_its_mapping(store_path):
    feats = np.random.default_rng(3).standard_normal((40, 8)).astype(np.float32)
    store = FeatureStore(store_path)
    key = EntryKey("ds", "fp", "train", "d0", "a", "w", {"s": 1}, dtype="float32")
    with open_writer(store, key, 40, 8, 1, {"classes": ["a", "b", "c"], "domains": ["d0"], "random_weights": True,
                                            "backbone_source": "test"}, chunk_rows=16) as w:
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, feats[lo:hi], np.arange(lo, hi) % 3, np.arange(lo, hi), np.ones(hi - lo, bool))
        assert w.finish()
    table = store.read("ds", "train", "a", domains=["d0"])
    assert mapping.is_mapped(table.features)
    start = table.features.__array_interface__["data"][0]
    assert start in mapping._MAPPED
    del table
    gc.collect()
    assert start not in mapping._MAPPED


def test_a_npy_file_maps_as_np_load_reads_it_and_is_registered(tmp_path):
    a = np.random.default_rng(6).standard_normal((300, 7)).astype(np.float32)
    for name, array in {"c": a, "f": np.asfortranarray(a), "empty": a[:0], "v2": a}.items():
        path = tmp_path / f"{name}.npy"
        if name == "v2":  # a version-2 header, as numpy writes for very wide structured dtypes
            with open(path, "wb") as fh:
                np.lib.format.write_array(fh, array, version=(2, 0))
        else:
            np.save(path, array)
        mapped = mapping.map_npy(path)
        np.testing.assert_array_equal(mapped, np.load(path))
        assert mapped.dtype == array.dtype and mapped.shape == array.shape
        assert mapping.is_mapped(mapped) == (name in ("c", "v2"))
    rows = np.array([0, 5, 299])
    np.testing.assert_array_equal(mapping.gather(mapping.map_npy(tmp_path / "c.npy"), rows), a[rows])


def test_rows_a_region_gather_cannot_take_are_indexed_as_numpy_would(tmp_path):
    mapped = row_file(tmp_path / "a", rows=3000, dim=8)
    for rows in ([-1, 5], [5, 2999], [7, 3, 3], np.array([[1, 2], [3, 4]])):
        np.testing.assert_array_equal(mapping.gather(mapped, np.asarray(rows)), mapped[np.asarray(rows)])
    with pytest.raises(IndexError):
        mapping.gather(mapped, np.array([5, 3000]))
    with pytest.raises(ValueError, match="read-only"):
        mapped[0] = 1


def test_blocks_are_the_rows_in_order_and_leave_a_region_mapped(tmp_path):
    mapped = row_file(tmp_path / "a")
    before = rss_file()
    parts = list(mapping.blocks(mapped, region_bytes=2 << 20))
    assert rss_file() - before <= 8 << 20  # read whole through the mapping, the file would count 32 MB
    np.testing.assert_array_equal(np.concatenate(parts), mapped)
    plain = np.arange(10)
    assert [b.tolist() for b in mapping.blocks(plain, region_bytes=24)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert list(mapping.blocks(mapped[:0])) == []


def test_grid_features_written_block_by_block_read_as_np_save_wrote_them(tmp_path):
    from fedcache.grids.features import _save

    for array in (row_file(tmp_path / "a", rows=5000, dim=8), np.arange(7, dtype=np.int16), np.zeros((0, 3), np.float32)):
        _save(tmp_path / "x.npy", array)
        np.save(tmp_path / "y.npy", array)
        assert (tmp_path / "x.npy").read_bytes() == (tmp_path / "y.npy").read_bytes()
