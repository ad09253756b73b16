"""Store formats: a store written by fedcache before format 2 (tests/store/data/store-format-1, kept byte for
byte) reads, verifies, resumes and upgrades bit for bit; format-2 tables are the entry's file memory-mapped, or
one copy in a preallocated array (several domains, fused backbones, float16)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from fedcache.cli import main
from fedcache.errors import DamagedEntryError, StoreError
from fedcache.federate.tables import load_fused
from fedcache.store import upgrade as upgrade_module
from fedcache.store.feature_store import FeatureStore
from fedcache.store.keys import EntryKey
from fedcache.store.upgrade import upgrade_store
from fedcache.store.writer import open_writer

DATA = Path(__file__).parent / "data"
V1 = DATA / "store-format-1"
PARTIAL = "2b483227479458be"  # extracted/test/all: 2 of its 3 chunks written
EXTRACTED = "41ab763820bc40b8"  # extracted/train/all: float16, rows 3 and 17 skipped
ATTRS = {"classes": ["a", "b", "c"], "domains": ["all"], "random_weights": True, "backbone_source": "test"}
PARTIAL_KEY = EntryKey("extracted", "fp", "test", "all", "tiny", "w0", {"size": 16})


@pytest.fixture
def old(tmp_path) -> Path:
    path = tmp_path / "old.zarr"
    shutil.copytree(V1, path)
    return path


def zarr_table(path: Path, dataset: str, split: str) -> dict[str, np.ndarray]:
    """The valid rows of a slot's entries as Zarr itself decodes them, domain by domain: the reference."""
    g = zarr.open_group(str(path), mode="r")["entries"]
    chosen = sorted((a["key"]["domain"], eid) for eid, e in g.groups() if (a := dict(e.attrs))["key"]["dataset"] == dataset
                    and a["key"]["split"] == split and a.get("complete"))
    order = list(dict(g[chosen[0][1]].attrs)["domains"])
    chosen.sort(key=lambda d: order.index(d[0]))
    parts = [{n: g[eid][n][:] for n in ("features", "labels", "ids", "valid")} for _, eid in chosen]
    return {n: np.concatenate([p[n][p["valid"]] for p in parts]).astype(np.float32 if n == "features" else np.int64)
            for n in ("features", "labels", "ids")}


def same_table(table, ref: dict) -> None:
    for n in ("features", "labels", "ids"):
        np.testing.assert_array_equal(getattr(table, n), ref[n])


def run(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_format_1_store_reads_as_it_was_written(old):
    store = FeatureStore(old)
    for dataset, split in (("imported", "train"), ("imported", "test"), ("extracted", "train")):
        same_table(store.read(dataset, split, "enc" if dataset == "imported" else "tiny"), zarr_table(old, dataset, split))
    t = store.read("extracted", "train", "tiny")
    given = np.load(DATA / "v1-extracted-features.npy")
    valid = np.ones(21, bool)
    valid[[3, 17]] = False
    np.testing.assert_array_equal(t.features, given[valid].astype(np.float16).astype(np.float32))
    assert {store.verify(e)[0] for e in store.entries()} == {"ok", "partial"}
    assert store.root.attrs["fedcache_store"] == 1  # reading writes nothing


def test_damage_to_a_format_1_chunk_is_named(old):
    (old / "entries" / EXTRACTED / "features" / "c" / "1" / "0").unlink()  # Zarr reads a deleted chunk as zeros
    with pytest.raises(DamagedEntryError, match=rf"{EXTRACTED}.*features chunk 1 do not hold what was written"):
        FeatureStore(old).read("extracted", "train", "tiny")


def test_a_partial_format_1_entry_resumes_in_format_1_bit_for_bit(old, tmp_path):
    given = np.load(DATA / "v1-partial-features.npy")
    store = FeatureStore(old)
    with open_writer(store, PARTIAL_KEY, 20, 6, 4, ATTRS, chunk_rows=8) as w:
        assert w.pending() == [2]
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, given[lo:hi], np.arange(lo, hi) % 3, np.arange(lo, hi), np.ones(hi - lo, bool))
        assert w.finish()
    # The same entry written whole by the format-1 writer, in a store of its own.
    ref = FeatureStore(tmp_path / "ref.zarr")
    with open_writer(ref, PARTIAL_KEY, 20, 6, 4, ATTRS, chunk_rows=8, entry_format=1) as w:
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, given[lo:hi], np.arange(lo, hi) % 3, np.arange(lo, hi), np.ones(hi - lo, bool))
        assert w.finish()
    a, b = (FeatureStore(p).info(PARTIAL) for p in (old, tmp_path / "ref.zarr"))
    assert a.format == b.format == 1 and a.attrs["crc32"] == b.attrs["crc32"]
    for name in ("features", "labels", "ids", "valid"):
        np.testing.assert_array_equal(zarr.open_array(str(old / "entries" / PARTIAL / name))[:],
                                      zarr.open_array(str(tmp_path / "ref.zarr" / "entries" / PARTIAL / name))[:])
    codecs = zarr.open_array(str(old / "entries" / PARTIAL / "features")).compressors
    assert [type(c).__name__ for c in codecs] == ["ZstdCodec"]


def test_upgrade_rewrites_bit_for_bit_and_keeps_ids_and_times(old, capsys):
    before = {e.entry_id: e for e in FeatureStore(old).entries()}
    tables = {(d, s): zarr_table(old, d, s) for d, s in (("imported", "train"), ("imported", "test"), ("extracted", "train"))}
    code, out = run(capsys, "store", "upgrade", "--store", str(old))
    assert code == 1 and "5 entries upgraded, 1 skipped, 0 in the current format already" in out
    assert f"{PARTIAL} extracted/test/all tiny: skipped (partial" in out
    store = FeatureStore(old)
    after = {e.entry_id: e for e in store.entries()}
    assert after.keys() == before.keys()
    for eid, e in after.items():
        assert e.completed_at == before[eid].completed_at and e.key == before[eid].key
        assert e.format == (1 if eid == PARTIAL else 2) and store.verify(e)[0] in ("ok", "partial")
    for (d, s), ref in tables.items():
        same_table(store.read(d, s, "enc" if d == "imported" else "tiny"), ref)
    assert store.root.attrs["fedcache_store"] == 2  # an older fedcache would misread the format-2 entries: it refuses
    # The partial entry, finished by its extraction (in format 1), then upgraded too.
    given = np.load(DATA / "v1-partial-features.npy")
    with open_writer(store, PARTIAL_KEY, 20, 6, 4, ATTRS, chunk_rows=8) as w:
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, given[lo:hi], np.arange(lo, hi) % 3, np.arange(lo, hi), np.ones(hi - lo, bool))
        assert w.finish()
    code, out = run(capsys, "store", "upgrade", "--store", str(old))
    # The five upgraded before are counted, not each said: a current store's upgrade was a line per entry.
    assert code == 0 and "1 entry upgraded, 0 skipped, 5 in the current format already" in out
    assert ": current" not in out and len(out.strip().splitlines()) == 2
    assert not (old / ".upgrade").exists()
    np.testing.assert_array_equal(FeatureStore(old).read("extracted", "test", "tiny").features,
                                  given.astype(np.float16).astype(np.float32))


def test_an_upgrade_interrupted_mid_swap_is_finished_by_the_next(old, monkeypatch):
    ref = zarr_table(old, "extracted", "train")
    renames = []

    def crash_on_second(src, dst):
        renames.append(src)
        if len(renames) == 2:
            raise KeyboardInterrupt
        return real(src, dst)

    real = upgrade_module.os.rename
    monkeypatch.setattr(upgrade_module.os, "rename", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        upgrade_store(FeatureStore(old))
    monkeypatch.setattr(upgrade_module.os, "rename", real)
    assert len(FeatureStore(old).entries()) == 5  # one entry is moved aside
    upgrade_store(FeatureStore(old))
    store = FeatureStore(old)
    assert len(store.entries()) == 6 and {store.verify(e)[0] for e in store.entries()} == {"ok", "partial"}
    same_table(store.read("extracted", "train", "tiny"), ref)


def test_a_second_upgrade_while_one_runs_is_refused(old, capsys):
    """Two upgrades of a store at once: the second rewrote the entries the first had just upgraded (from the format
    it had listed them in), and each one's last step, removing the staging folder, took the other's entries being
    swapped in with it (the second ended `No such file or directory: .../entries/<id>`)."""
    from fedcache.store.upgrade import UPGRADE_LOCK

    with FeatureStore(old).lock(UPGRADE_LOCK, "an upgrade of this store"):
        code, out = run(capsys, "store", "upgrade", "--store", str(old))
    assert code == 1 and f"the store {old} is being written by another process" in out and "upgraded" not in out
    assert {e.format for e in FeatureStore(old).entries()} == {1}


def test_a_damaged_format_1_entry_is_not_upgraded(old, capsys):
    (old / "entries" / EXTRACTED / "labels" / "c" / "2").unlink()
    code, out = run(capsys, "store", "upgrade", "--store", str(old))
    assert code == 1 and f"{EXTRACTED} extracted/train/all tiny: skipped (damaged (labels chunk 2" in out
    assert FeatureStore(old).info(EXTRACTED).format == 1


def test_a_new_entry_in_an_old_store_raises_its_format_and_a_newer_one_is_refused(old):
    store = FeatureStore(old)
    key = EntryKey("new", "fp", "train", "all", "enc", "w", {"imported": True}, dtype="float32")
    with open_writer(store, key, 3, 6, 1, ATTRS) as w:
        w.write_chunk(0, np.ones((3, 6)), np.zeros(3), np.arange(3), np.ones(3, bool))
        assert w.finish()
    assert store.info(key.entry_id).format == 2 and FeatureStore(old).root.attrs["fedcache_store"] == 2
    store.root.attrs.update({"fedcache_store": 3})
    with pytest.raises(StoreError, match="newer fedcache"):
        FeatureStore(old)


def write(store: FeatureStore, key: EntryKey, feats, ids, valid=None, chunk_rows=4) -> None:
    valid = np.ones(len(feats), bool) if valid is None else valid
    with open_writer(store, key, len(feats), feats.shape[1], 1, {**ATTRS, "domains": ["d0", "d1"]}, chunk_rows=chunk_rows) as w:
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, feats[lo:hi], ids[lo:hi] % 3, ids[lo:hi], valid[lo:hi])
        assert w.finish()


def key(backbone="a", domain="d0", dtype="float32") -> EntryKey:
    return EntryKey("ds", "fp", "train", domain, backbone, "w", {"s": 1}, dtype=dtype)


def test_one_float32_entry_is_read_as_its_file_memory_mapped(store_path):
    feats = np.random.default_rng(0).normal(size=(10, 5)).astype(np.float32)
    store = FeatureStore(store_path)
    write(store, key(), feats, np.arange(10))
    t = store.read("ds", "train", "a", domains=["d0"])
    np.testing.assert_array_equal(t.features, feats)
    assert t.features.base is not None and not t.features.flags.owndata  # a view of the mapping, not a copy
    with pytest.raises(ValueError, match="read-only"):  # unmapping a written page would undo the write (store.mapping)
        t.features[0] = 7


def test_domains_fused_backbones_float16_and_skipped_rows_are_one_copy(store_path):
    rng = np.random.default_rng(1)
    store = FeatureStore(store_path)
    fa = {d: rng.normal(size=(9, 4)).astype(np.float32) for d in ("d0", "d1")}
    fb = {d: rng.normal(size=(10, 3)).astype(np.float32) for d in ("d0", "d1")}
    valid = np.ones(9, bool)
    valid[4] = False
    for d in ("d0", "d1"):
        write(store, key("a", d), fa[d], np.arange(9), valid)
        # Backbone b: the same samples in another order, one more sample (id 9) the fused table leaves out.
        order = rng.permutation(10)
        write(store, key("b", d, "float16"), fb[d][order], np.arange(10)[order], chunk_rows=3)
    t = load_fused(store, "ds", ["a", "b"], "train")
    ref_a = np.concatenate([fa[d][valid] for d in ("d0", "d1")])
    ids = np.concatenate([np.arange(9)[valid]] * 2)
    ref_b = np.concatenate([fb[d][np.arange(9)[valid]] for d in ("d0", "d1")]).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(t.features, np.concatenate([ref_a, ref_b], axis=1))
    np.testing.assert_array_equal(t.ids, ids)
    assert t.features.flags.owndata and t.features.dtype == np.float32
    assert list(t.domains) == [0] * 8 + [1] * 8 and len(t.entry_ids) == 4


def test_a_table_from_both_formats_reads_whole(old):
    """A slot whose domains were written by two fedcache versions (one re-imported since)."""
    store = FeatureStore(old)
    ref = zarr_table(old, "imported", "train")
    right = next(e for e in store.entries() if e.key["dataset"] == "imported" and e.key["split"] == "train"
                 and e.key["domain"] == "right")
    upgrade_module._rewrite(store, right, EntryKey(**right.key))
    upgrade_module._swap(store, right.entry_id)
    store = FeatureStore(old)
    assert sorted(e.format for e in store.entries() if e.key["dataset"] == "imported" and e.key["split"] == "train") == [1, 2]
    same_table(store.read("imported", "train", "enc"), ref)


def test_a_partial_format_2_entry_reads_through_zarr_as_in_format_1(store_path):
    """Zarr reads the rows no writer reached yet as the fill value (its row files are allocated whole)."""
    store = FeatureStore(store_path)
    feats = np.arange(30, dtype=np.float32).reshape(10, 3)
    with open_writer(store, key(), 10, 3, 1, ATTRS, chunk_rows=4) as w:
        w.write_chunk(1, feats[4:8], np.ones(4), np.arange(4, 8), np.ones(4, bool))
        assert not w.finish()
    entry = zarr.open_group(str(store_path), mode="r")["entries"][key().entry_id]
    np.testing.assert_array_equal(entry["features"][:], np.r_[np.zeros((4, 3)), feats[4:8], np.zeros((2, 3))])
    np.testing.assert_array_equal(entry["labels"][:], [-1] * 4 + [1] * 4 + [-1] * 2)
    np.testing.assert_array_equal(entry["valid"][:], [False] * 4 + [True] * 4 + [False] * 2)
    assert list(entry["done"][:]) == [False, True, False]


D0 = {**ATTRS, "domains": ["d0"]}  # an entry of the one domain of key()


def _rows(lo: int, hi: int, dim: int = 3) -> tuple[np.ndarray, ...]:
    return (np.arange(lo * dim, hi * dim, dtype=np.float32).reshape(-1, dim), np.arange(lo, hi) % 3, np.arange(lo, hi),
            np.ones(hi - lo, bool))


def _kept_record(store_path: Path) -> Path:
    (record,) = (store_path / "entries" / key().entry_id / "done").glob(".rows_kept.*")
    return record


def test_the_rows_kept_of_a_chunk_are_resumed_after(store_path):
    """The reference for the refusals below: a record that holds is resumed after."""
    store = FeatureStore(store_path)
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert not w.write_rows(0, 0, *_rows(0, 4))
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert w.resume_row(0) == 4


def test_a_resume_checks_the_space_of_the_rows_it_still_writes(store_path, monkeypatch):
    """The space a resumed entry needs was counted by whole pending chunks: a chunk with most of its rows kept was
    refused on a disk with room for the rest of them."""
    from fedcache import disk
    from fedcache.errors import DiskFullError
    from fedcache.store.writer import entry_bytes

    store, dim = FeatureStore(store_path), 1000
    with open_writer(store, key(), 10, dim, 2, D0, chunk_rows=8) as w:
        assert not w.write_rows(0, 0, *_rows(0, 6, dim))
    rest = entry_bytes(2 + 2, 0, dim, 4, 2)  # rows 6..7 of chunk 0, 8..9 of chunk 1
    monkeypatch.setattr(disk, "free_bytes", lambda path: rest - 1)  # a byte short of them: refused
    with pytest.raises(DiskFullError, match="the batches written so far are kept"):
        with open_writer(store, key(), 10, dim, 2, D0, chunk_rows=8):
            pass
    monkeypatch.setattr(disk, "free_bytes", lambda path: rest)
    with open_writer(store, key(), 10, dim, 2, D0, chunk_rows=8) as w:
        assert w.write_rows(0, 6, *_rows(6, 8, dim)) and w.write_rows(1, 8, *_rows(8, 10, dim)) and w.finish()
    np.testing.assert_array_equal(store.read("ds", "train", "a").features, _rows(0, 10, dim)[0])


@pytest.mark.parametrize("size", [0, 5, 8 * 5 + 3, 8 * 6])  # empty, short of one number, torn mid-number, one too many
def test_a_record_of_kept_rows_of_the_wrong_length_starts_its_chunk_again(store_path, size):
    """A record whose length was not a multiple of 8 bytes raised numpy's ValueError on every re-run."""
    store = FeatureStore(store_path)
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert not w.write_rows(0, 0, *_rows(0, 4))
    record = _kept_record(store_path)
    record.write_bytes((record.read_bytes() + bytes(8))[:size])
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert w.resume_row(0) == 0
        assert w.write_rows(0, 0, *_rows(0, 8)) and w.write_rows(1, 8, *_rows(8, 10))
        assert w.finish()
    np.testing.assert_array_equal(store.read("ds", "train", "a").features, _rows(0, 10)[0])


def test_kept_rows_that_do_not_end_on_a_batch_are_not_resumed_after(store_path):
    """A re-run computes the batches from the chunk's start: rows kept up to mid-batch (recorded with their right
    checksums) would make it compute other batches, so other bits."""
    store = FeatureStore(store_path)
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert not w.write_rows(0, 0, *_rows(0, 3))
    assert np.frombuffer(_kept_record(store_path).read_bytes(), "<i8")[0] == 3
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert w.resume_row(0) == 0


def test_a_format_1_entry_interrupted_mid_chunk_resumes_by_whole_chunks(tmp_path):
    """An older fedcache's format records no kept rows: the chunk is written again from its start, bit for bit."""
    store, ref = FeatureStore(tmp_path / "s.zarr"), FeatureStore(tmp_path / "ref.zarr")
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8, entry_format=1) as w:
        assert not w.write_rows(0, 0, *_rows(0, 4))
    for s in (store, ref):
        with open_writer(s, key(), 10, 3, 2, D0, chunk_rows=8, entry_format=1) as w:
            assert w.resume_row(0) == 0 and w.resume_row(1) == 8
            w.write_rows(0, 0, *_rows(0, 8))
            w.write_rows(1, 8, *_rows(8, 10))
            assert w.finish()
    assert not list((tmp_path / "s.zarr").rglob(".rows_kept.*"))
    a, b = (s.info(key().entry_id) for s in (store, ref))
    assert a.format == b.format == 1 and a.attrs["crc32"] == b.attrs["crc32"]
    np.testing.assert_array_equal(store.read("ds", "train", "a").features, _rows(0, 10)[0])


@pytest.mark.parametrize("entry_format", [1, 2])
def test_the_rows_a_writer_counts_kept_are_those_an_interruption_keeps(tmp_path, entry_format):
    """A writer counts the rows it has written that a re-run keeps (an interrupted extract says them, a full disk what
    is left): of an entry begun in format 1, which keeps no rows of an unfinished chunk, it counted those too."""
    from fedcache.store.writer import rows_written

    store = FeatureStore(tmp_path / "s.zarr")
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8, entry_format=entry_format) as w:
        assert not w.write_rows(0, 0, *_rows(0, 4))
        assert w.rows_written == (4 if entry_format == 2 else 0) == rows_written(store, store.info(key().entry_id))
        assert w.write_rows(0, 4, *_rows(4, 8))
        assert (w.rows_written, w.chunks_written) == (8, 1)  # the chunk's rows this writer wrote, once, when done
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8, entry_format=entry_format) as w:
        assert w.write_rows(1, 8, *_rows(8, 10)) and (w.rows_written, w.chunks_written) == (2, 1)


def test_completing_an_entry_removes_what_killed_writers_left(store_path):
    """A writer killed after a chunk's done flag, before it removed the chunk's record of kept rows, or in the
    middle of an atomic write, left those files in the complete entry for good."""
    store = FeatureStore(store_path)
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert w.write_rows(0, 0, *_rows(0, 8))
    folder = store_path / "entries" / key().entry_id
    left = [folder / "done" / ".rows_kept.0", folder / "done" / "c" / ".1.4242.partial",
            folder / "chunk_crc32" / "c" / ".1.4242.partial"]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    with open_writer(store, key(), 10, 3, 2, D0, chunk_rows=8) as w:
        assert w.write_rows(1, 8, *_rows(8, 10)) and w.finish()
    assert [p for p in left if p.exists()] == []
