"""A finished store damaged in every way we know: each gives a clear error or a named damaged entry, never garbage.

Chunk damage (deleted, copied from another entry, corrupt) is caught by the per-chunk checksums; metadata damage
(a truncated or deleted entry zarr.json) is listed as a damaged entry that `store ls/info/rm/verify` handle and a
re-extraction replaces.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fedcache.cli import main
from fedcache.errors import DamagedEntryError
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.federate.tables import load_fused, load_splits
from fedcache.federate.partitions import PartitionRequest
from fedcache.flower.shard import ShardSpec, write_shards
from fedcache.store.feature_store import FeatureStore
from tests.conftest import open_files

BB = "tiny-timm-random"


def cfg(store: Path) -> ExtractConfig:
    # 30 training rows per domain in chunks of 8: 4 chunks, the last one short.
    return ExtractConfig(dataset="test-toy", backbones=[BB], store=store, batch_size=4, chunk_rows=8, workers=0)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("finished") / "store.zarr"
    extract(cfg(path))
    return path


@pytest.fixture
def store(finished, tmp_path) -> Path:
    path = tmp_path / "store.zarr"
    shutil.copytree(finished, path)
    return path


def entry_of(store: Path, split: str, domain: str) -> str:
    (e,) = [e for e in FeatureStore(store).entries() if e.key["split"] == split and e.key["domain"] == domain]
    return e.entry_id


def rows_file(store: Path, eid: str, array: str) -> Path:
    """A format-2 row array's one file (one Zarr chunk spanning every row)."""
    return store / "entries" / eid / array / "c" / "0" / ("0" if array == "features" else "")


def chunk_span(store: Path, eid: str, array: str, c: int) -> slice:
    """The bytes of checksummed chunk ``c`` of ``array`` in its file."""
    meta = json.loads((store / "entries" / eid / array / "zarr.json").read_text())
    row = int(np.prod(meta["shape"][1:])) * np.dtype(meta["data_type"]).itemsize
    rows = json.loads((store / "entries" / eid / "zarr.json").read_text())["attributes"]["chunk_rows"]
    return slice(c * rows * row, (c + 1) * rows * row)


def splice(target: Path, span: slice, data: bytes) -> None:
    content = bytearray(target.read_bytes())
    content[span] = data
    target.write_bytes(bytes(content))


def delete_features_file(store, eid, other):
    rows_file(store, eid, "features").unlink()


def truncate_features_file(store, eid, other):
    path = rows_file(store, eid, "features")
    path.write_bytes(path.read_bytes()[:chunk_span(store, eid, "features", 2).start + 10])


def delete_valid_file(store, eid, other):
    rows_file(store, eid, "valid").unlink()


def replace_features_file(store, eid, other):
    shutil.copyfile(rows_file(store, other, "features"), rows_file(store, eid, "features"))


def copy_chunk_from_other_entry(store, eid, other):
    span = chunk_span(store, eid, "features", 1)
    splice(rows_file(store, eid, "features"), span, rows_file(store, other, "features").read_bytes()[span])


def copy_labels_chunk_from_other_entry(store, eid, other):
    # Both domains' training labels are alike; the test split's first chunk holds other labels.
    source = entry_of(store, "test", "light")
    splice(rows_file(store, eid, "labels"), chunk_span(store, eid, "labels", 1),
           rows_file(store, source, "labels").read_bytes()[chunk_span(store, source, "labels", 0)])


def corrupt_chunk(store, eid, other):
    span = chunk_span(store, eid, "features", 2)
    half = (span.stop - span.start) // 2
    splice(rows_file(store, eid, "features"), slice(span.start + half, span.stop), b"\xff" * (span.stop - span.start - half))


def truncate_entry_json(store, eid, other):
    meta = store / "entries" / eid / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])


def delete_entry_json(store, eid, other):
    (store / "entries" / eid / "zarr.json").unlink()


def delete_features_json(store, eid, other):
    (store / "entries" / eid / "features" / "zarr.json").unlink()


METADATA = [truncate_entry_json, delete_entry_json]
DAMAGE = [delete_features_file, truncate_features_file, delete_valid_file, replace_features_file, copy_chunk_from_other_entry,
          copy_labels_chunk_from_other_entry, corrupt_chunk, truncate_entry_json, delete_entry_json, delete_features_json]
# What the error names for each: the chunks whose bytes are not what was written, or the file that is gone.
NAMED = {truncate_features_file: "features chunk 2 (missing: the file ends", copy_chunk_from_other_entry: "features chunk 1",
         copy_labels_chunk_from_other_entry: "labels chunk 1", corrupt_chunk: "features chunk 2",
         replace_features_file: "features chunk 0", delete_features_file: "features cannot be read",
         delete_valid_file: "valid cannot be read"}


def run(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__)
def test_damage_is_named_never_read_and_repaired_by_re_extracting(damage, store, capsys):
    before = FeatureStore(store).read("test-toy", "train", BB)
    eid, other = entry_of(store, "train", "light"), entry_of(store, "train", "dark")
    damage(store, eid, other)

    with pytest.raises(DamagedEntryError, match=eid) as raised:
        FeatureStore(store).read("test-toy", "train", BB)
    assert NAMED.get(damage, "") in str(raised.value)
    # The rest of the store still works: the other domain, the test split, and every store command.
    assert len(FeatureStore(store).read("test-toy", "train", BB, domains=["dark"])) == 30
    assert len(FeatureStore(store).read("test-toy", "test", BB)) == 24
    code, out = run(capsys, "store", "ls", "--store", str(store))
    # ls reads metadata only (cheap): it flags metadata damage; chunks are checked by reads and `store verify`.
    assert code == 0 and eid in out and (damage not in METADATA or re.search(rf"{eid}.*damaged", out))
    code, out = run(capsys, "store", "info", eid, "--store", str(store))
    assert code == 0 and eid in out
    code, out = run(capsys, "store", "verify", "--store", str(store))
    assert code == 1 and re.search(rf"{eid} .*damaged", out) and f"{other} test-toy/train/dark tiny-timm-random: ok" in out
    # Training on the damaged features stops with one clear line naming the entry.
    code, out = run(capsys, "train", "--store", str(store), "-d", "test-toy", "-b", BB, "-m", "fedavg", "--rounds", "1",
                    "--clients", "2", "--partition", "iid", "--out", str(store.parent / "run"))
    assert code == 1 and eid in out and "damaged" in out and "Traceback" not in out

    # Re-extracting replaces the damaged entry, bit for bit as before.
    reports = extract(cfg(store))
    assert [r.status for r in reports if r.entry_id == eid] == ["extracted"]
    again = FeatureStore(store).read("test-toy", "train", BB)
    np.testing.assert_array_equal(again.features, before.features)
    np.testing.assert_array_equal(again.labels, before.labels)
    code, out = run(capsys, "store", "verify", "--store", str(store))
    assert code == 0 and re.search(r"checked \d+ entries: \d+ ok$", out.strip())


@pytest.mark.parametrize("damage", [truncate_features_file, truncate_entry_json], ids=lambda f: f.__name__)
def test_verify_repair_and_rm_remove_a_damaged_entry(damage, store, capsys):
    eid, other = entry_of(store, "train", "light"), entry_of(store, "train", "dark")
    damage(store, eid, other)
    code, out = run(capsys, "store", "verify", "--repair", "--store", str(store))
    assert code == 0 and "removed" in out and not (store / "entries" / eid).exists()
    assert re.search(r"checked \d+ entries: \d+ ok, 1 damaged and removed$", out.strip())  # said "1 damaged"
    assert run(capsys, "store", "verify", "--store", str(store))[0] == 0
    damage(store, eid if (store / "entries" / eid).exists() else other, eid)
    code, out = run(capsys, "store", "verify", "--store", str(store))
    assert code == 1 and "1 damaged entry: " in out and "or remove it with" in out  # "remove them", of one
    damage(store, other, eid)
    code, out = run(capsys, "store", "rm", other, "--store", str(store))
    assert code == 0 and f"removed {other}" in out and not (store / "entries" / other).exists()


def unfinished(store: Path, eid: str) -> Path:
    """The entry as an extraction stopped after its first two chunks leaves it; its ``done`` folder."""
    meta = store / "entries" / eid / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"] = {k: v for k, v in doc["attributes"].items() if k not in ("crc32", "n_valid", "completed_at")}
    meta.write_text(json.dumps({**doc, "attributes": {**doc["attributes"], "complete": False}}))
    done = store / "entries" / eid / "done"
    for c in (2, 3):
        (done / "c" / str(c)).unlink()
    return done


@pytest.mark.parametrize("flags", ["their zarr.json", "a flag's file", "their zarr.json, deleted"])
def test_an_unfinished_entry_with_damaged_done_flags_is_called_the_same_by_ls_and_verify(flags, store, capsys):
    """`store ls` said "damaged" and `store verify` "partial ... resumed by re-running its extraction" of the same
    entry; with its flags' zarr.json damaged, that extraction then stopped with a traceback. Now both say what its
    extraction does: a torn flag is a chunk not written yet (resumed), flags it cannot read are damage (replaced).
    Their zarr.json deleted, Zarr found no flags: "partial (no chunk written)", and the extraction's traceback."""
    before = FeatureStore(store).read("test-toy", "train", BB)
    eid = entry_of(store, "train", "light")
    done = unfinished(store, eid)
    if flags == "their zarr.json":
        (done / "zarr.json").write_text("{")
    elif flags == "their zarr.json, deleted":
        (done / "zarr.json").unlink()
    else:
        (done / "c" / "1").write_bytes(b"\x01\x01")  # torn (not one flag): the writer sets it again
    said = {"a flag's file": "partial 8/30 rows"}.get(flags, "damaged")  # chunk 0 done, of 8 rows
    code, out = run(capsys, "store", "ls", "--store", str(store))
    assert code == 0 and re.search(rf"{eid} .* {said}", out), out
    code, out = run(capsys, "store", "verify", "--store", str(store))
    status = said.split()[0]
    assert code == (1 if status == "damaged" else 0) and f"{eid} test-toy/train/light {BB}: {status} (" in out, out
    extract(cfg(store))  # resumes the entry, or replaces it
    np.testing.assert_array_equal(FeatureStore(store).read("test-toy", "train", BB).features, before.features)
    assert run(capsys, "store", "verify", "--store", str(store))[0] == 0


@pytest.mark.parametrize("flags", ["deleted", "damaged"])
def test_a_complete_entry_without_its_done_flags_metadata_is_complete_everywhere(flags, store, capsys):
    """A complete entry's done flags are no longer read (its checksums are its attributes): reads, `store ls` and
    `store verify` found it intact, but the extraction that made it, run again, opened its flags and stopped with a
    FileNotFoundError (or a JSON) traceback. It is complete and ok in all of them, and the extraction says so."""
    before = FeatureStore(store).read("test-toy", "train", BB)
    eid = entry_of(store, "train", "light")
    meta = store / "entries" / eid / "done" / "zarr.json"
    meta.unlink() if flags == "deleted" else meta.write_text("{")
    code, out = run(capsys, "store", "ls", "--store", str(store))
    assert code == 0 and re.search(rf"{eid} .* complete", out), out
    code, out = run(capsys, "store", "verify", "--store", str(store))
    assert code == 0 and f"{eid} test-toy/train/light {BB}: ok" in out, out
    reports = extract(cfg(store))
    assert {r.status for r in reports} == {"already complete"}
    np.testing.assert_array_equal(FeatureStore(store).read("test-toy", "train", BB).features, before.features)


def test_an_unfinished_entry_whose_flags_the_file_system_fails_to_read_is_not_replaced(store, capsys, monkeypatch):
    """Any error reading an unfinished entry's done flags made it "damaged": a second `--part` writer opening the
    entry, or `store verify --repair`, met with a passing EIO (EMFILE, a network file system) removed a partial
    entry another writer was filling. Such an error says nothing of the entry: it is raised, and the entry kept."""
    import errno

    from types import SimpleNamespace

    from fedcache.store import feature_store
    from fedcache.store.writer import _discard_if_damaged

    eid = entry_of(store, "train", "light")
    unfinished(store, eid)
    real = feature_store.RawMeta.open

    def failing(path):
        if Path(path).name == "done":
            raise OSError(errno.EIO, "Input/output error", str(Path(path) / "zarr.json"))
        return real(path)

    monkeypatch.setattr(feature_store.RawMeta, "open", staticmethod(failing))
    fs = FeatureStore(store)
    with pytest.raises(OSError):
        _discard_if_damaged(fs, SimpleNamespace(entry_id=eid, label=lambda: "test-toy/train/light"))  # as open_writer
    code, out = run(capsys, "store", "verify", "--repair", "--store", str(store))
    assert code != 0 and "Input/output error" in out and "removed" not in out, out
    assert (store / "entries" / eid / "done" / "zarr.json").is_file()
    monkeypatch.undo()
    assert FeatureStore(store).chunks_done(FeatureStore(store).info(eid)) == (2, 4)


def test_an_entry_whose_data_cannot_be_known_is_labelled_so(store, capsys):
    """Its zarr.json and its features' both damaged, the entry was labelled "key unreadable"."""
    eid = entry_of(store, "train", "light")
    truncate_entry_json(store, eid, None)
    delete_features_json(store, eid, None)
    code, out = run(capsys, "store", "verify", "--store", str(store))
    assert code == 1 and f"{eid} data unknown, metadata damaged: damaged (" in out, out
    with pytest.raises(DamagedEntryError, match=f"entry {eid} \\(data unknown, metadata damaged\\) in"):
        FeatureStore(store).read("test-toy", "train", BB)


def test_extract_says_it_replaces_a_damaged_complete_entry(store):
    eid = entry_of(store, "test", "dark")
    rows_file(store, eid, "features").unlink()
    messages = []
    extract(cfg(store), progress=lambda e: messages.append(e.message))
    assert any(f"entry {eid} was damaged" in m and "extracting it again" in m for m in messages)


def test_damaged_text_embeddings_are_named_and_written_again(tmp_path):
    from fedcache.store.keys import TextKey

    fs = FeatureStore(tmp_path / "s.zarr")
    key = TextKey("clip", "w", ("a", "b"), ("a photo of {}",), "single")
    emb = np.arange(2 * 3, dtype=np.float32).reshape(1, 2, 3)
    fs.put_text(key, emb, False)
    np.testing.assert_array_equal(fs.read_text("clip", ["a", "b"]), emb)
    (tmp_path / "s.zarr" / "text" / key.entry_id / "embeddings" / "c" / "0" / "0" / "0").unlink()
    with pytest.raises(DamagedEntryError, match=key.entry_id):
        fs.read_text("clip", ["a", "b"])
    assert fs.verify_text(key.entry_id)[0] == "damaged" and not fs.has_text(key)
    (tmp_path / "s.zarr" / "text" / key.entry_id / "zarr.json").write_text("{")
    assert fs.verify_text(key.entry_id)[0] == "damaged" and not fs.has_text(key)
    with pytest.raises(Exception, match="no 'single' text embeddings"):
        fs.read_text("clip", ["a", "b"])
    fs.put_text(key, emb, False)
    np.testing.assert_array_equal(fs.read_text("clip", ["a", "b"]), emb)


def test_store_info_of_an_empty_id_is_refused(store, capsys):
    code, out = run(capsys, "store", "info", "", "--store", str(store))
    assert code == 2 and "an empty argument after info" in out
    code, out = run(capsys, "store", "rm", " ", "--store", str(store))
    assert code == 2 and "not an entry id" in out


def test_damaged_metadata_of_the_entries_group_says_which_file_to_delete(store, capsys):
    meta = store / "entries" / "zarr.json"
    meta.write_text("{")
    code, out = run(capsys, "store", "ls", "--store", str(store))
    assert code == 1 and f"delete {meta}" in out and "Traceback" not in out
    meta.unlink()
    code, out = run(capsys, "store", "verify", "--store", str(store))
    assert code == 0 and out.count(": ok") == 4


def test_an_unreadable_entry_error_crosses_a_process_boundary():
    """Grid workers read the store: an entry made unreadable under a running grid came back from a worker as an
    error the pool could not unpickle (its problem was a required argument), and the grid said a worker died."""
    import pickle

    from fedcache.errors import UnreadableEntryError

    exc = pickle.loads(pickle.dumps(UnreadableEntryError("cannot read the feature store S (...)", "no permission")))
    assert str(exc) == "cannot read the feature store S (...)" and exc.problem


def test_store_verify_names_each_text_entrys_backbone_and_templates(tmp_path, capsys):
    """Every text entry was listed as just 'text embeddings': two backbones' could not be told apart."""
    from fedcache.store.keys import TextKey

    fs = FeatureStore(tmp_path / "s.zarr")
    emb = np.zeros((1, 2, 3), np.float32)
    for backbone in ("clip-a", "clip-b"):
        fs.put_text(TextKey(backbone, "w", ("a", "b"), ("a photo of {}",), "single"), emb, False)
    code, out = run(capsys, "store", "verify", "--store", str(tmp_path / "s.zarr"))
    assert code == 0
    assert "clip-a text embeddings, single templates: ok" in out and "clip-b text embeddings, single templates: ok" in out



def test_a_text_entry_whose_key_attribute_is_damaged_stops_no_other_read(tmp_path):
    """A text entry whose attributes hold something else than a dict as its key: every read of the store's text, of
    any backbone, failed with AttributeError ('str' object has no attribute 'get')."""
    from fedcache.errors import EntryNotFoundError
    from fedcache.store.keys import TextKey

    fs = FeatureStore(tmp_path / "s.zarr")
    emb = np.zeros((1, 2, 3), np.float32)
    damaged = fs.put_text(TextKey("clip-a", "w", ("a", "b"), ("a photo of {}",), "single"), emb, False)
    fs.root["text"][damaged].attrs["key"] = "not a key"
    with pytest.raises(EntryNotFoundError):
        fs.read_text("clip-b", ["a", "b"])
    assert fs.texts_of({"clip-b": (["a", "b"], "w")}) == []
    assert fs.verify_text(damaged)[0] == "ok"


FEATURE_DAMAGE = [delete_features_file, truncate_features_file, replace_features_file, corrupt_chunk, delete_features_json]
PARTITION = ("--partition", "dirichlet", "--clients", "3", "--seed", "5")


@pytest.mark.parametrize("damage", FEATURE_DAMAGE, ids=lambda f: f.__name__)
def test_partition_reads_labels_not_features(damage, store, finished, capsys):
    """A partition is made of the labels, domains and ids: `fedcache partition` read and checked every feature of a
    million rows (most of its time) for nothing. Damaged features make the same partition, and still stop a run."""
    intact = store.parent / "intact.zarr"
    shutil.copytree(finished, intact)
    eid, other = entry_of(store, "train", "light"), entry_of(store, "train", "dark")
    damage(store, eid, other)
    data = ("--store", str(store), "-d", "test-toy", "-b", BB)
    made = [run(capsys, "partition", "--store", str(s), "-d", "test-toy", "-b", BB, *PARTITION) for s in (store, intact)]
    line = [[ln for ln in out.splitlines() if re.match(r"partition [0-9a-f]+ \(", ln)] for _, out in made]
    assert [code for code, _ in made] == [0, 0] and len(line[0]) == 1 and line[0] == line[1], made
    code, out = run(capsys, "train", *data, "-m", "fedavg", "--rounds", "1", *PARTITION, "--out", str(store.parent / "run"))
    assert code == 1 and eid in out and "damaged" in out


@pytest.mark.parametrize("damage", [copy_labels_chunk_from_other_entry, delete_valid_file, truncate_entry_json],
                         ids=lambda f: f.__name__)
def test_partition_refuses_damaged_labels(damage, store, capsys):
    """What a partition is made of is still checked: a labels chunk that is not what was written is named."""
    eid, other = entry_of(store, "train", "light"), entry_of(store, "train", "dark")
    damage(store, eid, other)
    code, out = run(capsys, "partition", "--store", str(store), "-d", "test-toy", "-b", BB, *PARTITION)
    assert code == 1 and eid in out and "damaged" in out and NAMED.get(damage, "") in out and "Traceback" not in out


# Each read, and the entry damaged: one it reads after others (the second of the training table; the test split's,
# found after the training split's), or one of the training split read before the test split's (found already).
READS = {"read": (lambda fs: fs.read("test-toy", "train", BB), ("train", "dark")),
         "read_splits": (lambda fs: fs.read_splits("test-toy", ("train", "test"), BB), ("test", "light")),
         "read_splits train": (lambda fs: fs.read_splits("test-toy", ("train", "test"), BB), ("train", "dark")),
         "load_splits": (lambda fs: load_splits(fs, "test-toy", [BB]), ("test", "light")),
         "load_splits train": (lambda fs: load_splits(fs, "test-toy", [BB]), ("train", "dark")),
         "load_fused": (lambda fs: load_fused(fs, "test-toy", [BB, BB], "train"), ("train", "dark")),
         # its partition reads the labels of the test split after the training split's
         "write_shards": (lambda fs: write_shards(ShardSpec(fs.path, "test-toy", [BB], PartitionRequest.of("iid", 2, 0)),
                                                  Path(tempfile.mkdtemp(dir=fs.path.parent))), ("test", "light"))}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc")
@pytest.mark.parametrize("damage", [delete_valid_file, copy_labels_chunk_from_other_entry, corrupt_chunk, delete_features_file],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("read", READS)
def test_a_read_refused_at_a_later_entry_leaves_no_file_open(read, damage, store):
    """Each entry read opens its files: where a later entry was damaged, the earlier entries' stayed open for as long
    as the error was held (a caller's traceback, a log), and a process that skipped damaged stores ran out of them."""
    fs = FeatureStore(store)
    read_it, (split, domain) = READS[read]
    read_it(fs)  # whatever Zarr or a read opens once and keeps is open before the count
    damage(store, entry_of(store, split, domain), entry_of(store, "train", "light"))
    before = open_files()
    with pytest.raises(DamagedEntryError) as raised:
        read_it(fs)
    assert open_files() == before, raised.value  # the error still held, as a caller holds it


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc")
def test_a_damaged_memory_mapped_table_leaves_no_file_open(tmp_path):
    """A table of one float32 entry is its file memory-mapped once every chunk is checked: a damaged chunk left
    the file open."""
    store = tmp_path / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=[BB], store=store, batch_size=4, chunk_rows=8, dtype="float32",
                          workers=0))
    fs = FeatureStore(store)
    fs.read("test-toy", "train", BB, domains=["light"])
    corrupt_chunk(store, entry_of(store, "train", "light"), None)
    before = open_files()
    with pytest.raises(DamagedEntryError, match="features chunk 2") as raised:
        fs.read("test-toy", "train", BB, domains=["light"])
    assert open_files() == before, raised.value


def test_store_ls_lists_class_text_embeddings_and_a_store_holding_only_them_is_not_empty(tmp_path, capsys):
    from fedcache.store.keys import TextKey

    path = tmp_path / "s.zarr"
    fs = FeatureStore(path)
    code, out = run(capsys, "store", "ls", "--store", str(path))
    assert code == 0 and "empty store" in out and "class-text" not in out
    # An extraction interrupted right after its CLIP class texts: they are all it holds.
    fs.put_text(TextKey("clip", "w", ("a", "b"), ("a photo of {}",), "single"), np.zeros((1, 2, 3), np.float32), False)
    code, out = run(capsys, "store", "ls", "--store", str(path))
    assert code == 0 and "empty store" not in out and "no image features" in out
    assert "1 set of class-text embeddings: clip text embeddings, single templates, 2 classes" in out
