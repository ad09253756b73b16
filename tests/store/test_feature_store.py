"""The store on its own: entry lifecycle, readers refusing incomplete entries, stale slots, locks."""
import numpy as np
import pytest

from fedcache.errors import EntryLockedError, EntryNotFoundError, IncompleteEntryError, StoreError
from fedcache.store.feature_store import FeatureStore
from fedcache.store.keys import EntryKey
from fedcache.store.locks import exclusive_lock
from fedcache.store.writer import Part, chunk_rows_for, open_writer

ATTRS = {"classes": ["a", "b"], "domains": ["all"], "random_weights": False}


def key(weights: str = "w1", size: int = 32, domain: str = "all") -> EntryKey:
    return EntryKey("ds", "fp", "train", domain, "bb", weights, {"size": size})


def write_all(store, k, feats, labels, batch=2, chunk_rows=None, part=Part(), attrs=ATTRS):
    with open_writer(store, k, len(feats), feats.shape[1], batch, attrs, part, chunk_rows=chunk_rows) as w:
        for c in w.pending(part):
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, feats[lo:hi], labels[lo:hi], np.arange(lo, hi), np.ones(hi - lo, bool))
        return w.finish()


def test_chunk_rows_are_whole_batches_of_about_4mb():
    rows = chunk_rows_for(1280, 2, 64)
    assert rows % 64 == 0 and 3e6 < rows * 1280 * 2 <= 4.2e6
    assert chunk_rows_for(100000, 4, 64) == 64  # never below one batch


def test_round_trip_and_float16_storage(store_path):
    store = FeatureStore(store_path)
    feats = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    assert write_all(store, key(), feats, np.arange(10) % 2, chunk_rows=4)
    table = FeatureStore(store_path).read("ds", "train", "bb")
    np.testing.assert_allclose(table.features, feats, atol=2e-3)  # float16 by default
    assert table.features.dtype == np.float32 and table.class_names == ("a", "b")
    entry = store.root["entries"][key().entry_id]
    # Checksummed and resumed by chunks of 4 rows; stored as one file (one Zarr chunk), uncompressed.
    assert entry.attrs["chunk_rows"] == 4 and entry["features"].chunks == (10, 3) and entry["features"].compressors == ()


def test_reader_refuses_incomplete_entries(store_path):
    store = FeatureStore(store_path)
    k = key()
    with open_writer(store, k, 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
        assert not w.finish()
    with pytest.raises(IncompleteEntryError, match="not complete yet"):
        store.read("ds", "train", "bb")
    with pytest.raises(EntryNotFoundError, match="fedcache extract --store"):
        store.read("ds", "train", "other-backbone")


@pytest.mark.parametrize("names", [["other"], []])
def test_an_entry_whose_domains_lack_its_own_is_said_to_be_damaged_with_the_store_rm_that_frees_it(store_path, names, capsys):
    """Its `domains` (the table's, which a read takes from the newest entry) without its own domain: no entry was
    read, and the read said the features not complete yet, finished by an extraction that finds them complete."""
    from fedcache.errors import DamagedEntryError

    store = FeatureStore(store_path)
    assert write_all(store, key(), np.ones((4, 3)), np.zeros(4))
    store.root["entries"][key().entry_id].attrs.update({"domains": names})
    with pytest.raises(DamagedEntryError) as refused:
        FeatureStore(store_path).read("ds", "train", "bb")
    said = str(refused.value)
    assert "not complete" not in said and len(said.splitlines()) == 1
    assert f"entry {key().entry_id} (ds/train/all bb) in {store_path} is damaged or of another store" in said
    assert "it is of domain all but records the domains of its dataset as" in said
    assert f"`fedcache store rm {key().entry_id} --store {store_path}`" in said
    status, detail = FeatureStore(store_path).verify(FeatureStore(store_path).entries()[0])
    assert status == "damaged" and detail.startswith("it is of domain all but records")  # verify called it ok
    from fedcache.cli import main

    assert main(["store", "ls", "--store", str(store_path)]) == 0
    assert "damaged (see `store verify`)" in capsys.readouterr().out  # ls called it complete


def test_an_older_entry_whose_own_domains_lack_its_domain_is_read_and_verified_ok(store_path, capsys):
    """A read takes a table's domains from its newest entry alone: an older entry's own list is never read, and
    verify called it damaged (its rows read), so `verify --repair` removed an entry the read then missed."""
    from fedcache.cli import main

    store = FeatureStore(store_path)
    write_all(store, key(domain="a"), np.ones((4, 3)), np.zeros(4), attrs={**ATTRS, "domains": ["b"]})
    write_all(store, key(domain="b"), np.ones((4, 3)), np.zeros(4), attrs={**ATTRS, "domains": ["a", "b"]})
    assert FeatureStore(store_path).read("ds", "train", "bb").domain_names == ("a", "b")
    assert main(["store", "verify", "--repair", "--store", str(store_path)]) == 0
    assert main(["store", "ls", "--store", str(store_path)]) == 0
    assert "damaged" not in capsys.readouterr().out
    assert len(FeatureStore(store_path).read("ds", "train", "bb")) == 8


def test_verify_repair_checks_a_table_again_once_its_newest_entry_is_removed(store_path, capsys):
    """The newest entry removed as misplaced made the older one, whose own domains lack its domain too, the one a read
    takes the domains from: verify exited 0 and the next read refused the store."""
    from fedcache.cli import main

    store = FeatureStore(store_path)
    write_all(store, key(domain="a"), np.ones((4, 3)), np.zeros(4), attrs={**ATTRS, "domains": ["b"]})
    write_all(store, key(domain="b"), np.ones((4, 3)), np.zeros(4), attrs={**ATTRS, "domains": ["c"]})
    assert main(["store", "verify", "--repair", "--store", str(store_path)]) == 0
    assert f"{key(domain='a').entry_id}, now the newest of its table: damaged" in capsys.readouterr().out
    assert FeatureStore(store_path).entries() == []


def test_what_the_store_lacks_names_the_likeliest_way_on(store_path):
    """A typo was told to run an extraction that then failed on the same typo; an import of one split was told to
    extract; an unfinished float32 extraction was told to run one that would write float16 entries."""
    store = FeatureStore(store_path)
    write_all(store, key(), np.ones((4, 3)), np.zeros(4))
    with pytest.raises(EntryNotFoundError, match=r"no train features of dz for bb; did you mean 'ds'\? \(its datasets: ds\)"):
        store.read("dz", "train", "bb")
    with pytest.raises(EntryNotFoundError, match=r"did you mean 'bb'\? \(its backbones for ds: bb\)"):
        store.read("ds", "train", "bc")
    with pytest.raises(EntryNotFoundError, match=r"no test features of ds for bb \(only train\).*--splits test.*"
                                                 r"fedcache store import FILE .* --split test"):
        store.read("ds", "test", "bb")
    with pytest.raises(EntryNotFoundError, match=r"no trian features of ds for bb \(did you mean 'train'\?\); its "
                                                 r"splits: train; a split of another name comes of an import "
                                                 r"\(`fedcache store import FILE .* --split trian`\)$"):  # not extract
        store.read("ds", "trian", "bb")
    k = EntryKey("ds", "fp", "test", "all", "bb", "w1", {"size": 32}, dtype="float32")
    with open_writer(store, k, 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
    with pytest.raises(IncompleteEntryError, match=r"--splits test --domains all --dtype float32 --image-size 32`"):
        store.read("ds", "test", "bb")
    # One extracted in bfloat16 (a GPU's default): finished at float32 (the CPU's), it wrote another entry.
    k = EntryKey("ds", "fp", "test", "all", "bb", "w1", {"size": 32, "forward": "bfloat16"}, dtype="float32")
    with open_writer(store, k, 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
    with pytest.raises(IncompleteEntryError, match=r"--dtype float32 --image-size 32 --precision bf16`"):
        store.read("ds", "test", "bb")
    # An import's entries: no extraction makes them (the backbone is the file's name for its encoder).
    k = EntryKey("ds", "fp", "train", "all", "enc", "imported:fp", {"imported": True}, dtype="float32")
    with open_writer(store, k, 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
    with pytest.raises(IncompleteEntryError, match=r"finish them with `fedcache store import FILE --store .* --dataset ds "
                                                   r"--backbone enc`"):
        store.read("ds", "train", "enc")


def test_a_missing_domain_is_told_the_extraction_its_table_can_take(store_path):
    # One domain complete in float32, the other interrupted: told to run `fedcache extract` without --dtype, the
    # user wrote new float16 entries instead of finishing it (and a table mixing the two is refused).
    store = FeatureStore(store_path)
    two = {**ATTRS, "domains": ["a", "b"]}
    done = EntryKey("ds", "fp", "train", "a", "bb", "w1", {"size": 32}, dtype="float32")
    with open_writer(store, done, 4, 3, 2, two, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
        assert w.finish()
    half = EntryKey("ds", "fp", "train", "b", "bb", "w1", {"size": 32}, dtype="float32")
    with open_writer(store, half, 8, 3, 2, two, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
    with pytest.raises(IncompleteEntryError, match=r"ds/b for bb are not complete yet.*--domains b --dtype float32"):
        store.read("ds", "train", "bb")
    store.discard(half.entry_id)  # never started: the extraction that makes it as domain a was made
    with pytest.raises(EntryNotFoundError, match=r"no train features of ds/b for bb; run .*--domains b --dtype float32 "
                                                 r"--image-size 32`"):
        store.read("ds", "train", "bb")
    # A domain the dataset does not have is no extraction to run (it was told to extract it, or to --name the rest).
    with pytest.raises(EntryNotFoundError, match=r"^ds has no domain 'bb' \(did you mean 'b'\?\); its domains: a, b$"):
        store.read("ds", "train", "bb", domains=["a", "bb"])


@pytest.mark.parametrize("imported", ["a", "b"])
def test_a_table_takes_the_domains_its_newest_entry_names_whichever_sorts_first(store_path, imported):
    """Extracted domains a and b, an import of one of them, then that extraction of the other again (complete: made
    current): the table took the domains of the first entry found (by domain name). The import of a was read alone,
    the extraction's b left out without a word; the import of b was refused, told to import the file again. Both now
    take the newest entry's domains (the extraction's: a and b), refuse the mix and say to re-run the extraction."""
    store = FeatureStore(store_path)
    rows, both = np.zeros((4, 3), np.float32), {**ATTRS, "domains": ["a", "b"]}
    for d in ("a", "b"):
        write_all(store, key(domain=d), rows, np.zeros(4), attrs=both)
    write_all(store, key("imported:f", domain=imported), rows + 1, np.zeros(4), attrs={**ATTRS, "domains": [imported]})
    assert [e.key["domain"] for e in store.table_entries("ds", "train", "bb")] == [imported]  # the import, whole
    other = "b" if imported == "a" else "a"
    made = "a imported, b extracted" if imported == "a" else "a extracted, b imported"  # which domain came from which
    write_all(store, key(domain=other), rows, np.zeros(4), attrs=both)  # extracted again: current, the newest
    with pytest.raises(StoreError, match=r"ds/train for bb were made by different weights, preprocessing or imported "
                                         rf"files \({made}\): they differ in .*weights: imported:f in {imported}, w1 "
                                         rf"in {other} \(the newest\); re-run `fedcache extract "
                                         r"--store .* --dataset ds --backbones bb --image-size 32`"):
        store.table_entries("ds", "train", "bb")
    write_all(store, key(domain=imported), rows, np.zeros(4), attrs=both)  # the extraction said: every domain again
    found = store.table_entries("ds", "train", "bb")
    assert [(e.key["domain"], e.key["weights_hash"]) for e in found] == [("a", "w1"), ("b", "w1")]


def test_a_mix_of_two_extractions_names_each_domains_entries(store_path):
    """Domains of two extractions (another --image-size for one) are named by their entries, as `store ls` lists them:
    "extracted" twice would not say which is which."""
    store = FeatureStore(store_path)
    rows, both = np.zeros((4, 3), np.float32), {**ATTRS, "domains": ["a", "b"]}
    write_all(store, key(domain="a"), rows, np.zeros(4), attrs=both)
    write_all(store, key(size=64, domain="b"), rows, np.zeros(4), attrs=both)
    with pytest.raises(StoreError) as mixed:
        store.table_entries("ds", "train", "bb")
    a, b = key(domain="a").entry_id, key(size=64, domain="b").entry_id
    # And what the two differ in: a refusal naming only the domains left the user to guess which option it was.
    assert (f"imported files (a extracted ({a}), b extracted ({b})): they differ in size: 32 in a, 64 in b (the "
            "newest); re-run") in str(mixed.value)


def test_new_key_in_same_slot_supersedes_old(store_path):
    store = FeatureStore(store_path)
    write_all(store, key("old"), np.zeros((4, 3), np.float32), np.zeros(4))
    write_all(store, key("new"), np.ones((4, 3), np.float32), np.zeros(4))
    assert store.read("ds", "train", "bb").features.mean() == 1.0
    assert [e.key["weights_hash"] for e in store.stale()] == ["old"]


def test_existing_entry_with_other_shape_is_an_error(store_path):
    store = FeatureStore(store_path)
    write_all(store, key(), np.zeros((4, 3), np.float32), np.zeros(4))
    with pytest.raises(StoreError, match="store rm"):
        with open_writer(store, key(), 5, 3, 1, ATTRS):
            pass


def test_second_writer_of_same_part_fails_clearly(store_path):
    store = FeatureStore(store_path)
    k = key()
    with open_writer(store, k, 4, 3, 2, ATTRS):
        with pytest.raises(EntryLockedError, match="being written by another process"):
            with open_writer(store, k, 4, 3, 2, ATTRS):
                pass


def test_lock_wait_times_out(tmp_path):
    with exclusive_lock(tmp_path / "x.lock", "thing"):
        with pytest.raises(EntryLockedError, match="--wait"):
            with exclusive_lock(tmp_path / "x.lock", "thing", wait=0.3):
                pass


def test_disjoint_parts_complete_the_entry_together(store_path):
    store = FeatureStore(store_path)
    feats = np.arange(20, dtype=np.float32).reshape(10, 2)
    assert not write_all(store, key(), feats, np.zeros(10), chunk_rows=2, part=Part(0, 2))
    assert write_all(store, key(), feats, np.zeros(10), chunk_rows=2, part=Part(1, 2))
    np.testing.assert_array_equal(store.read("ds", "train", "bb").features, feats)


def test_part_parsing():
    assert Part.parse("1/4") == Part(1, 4)
    assert Part(1, 3).chunks(7) == [3, 4]
    for bad in ("4/4", "x", "1/0"):
        with pytest.raises(Exception, match="part"):
            Part.parse(bad)


def test_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="no feature store"):
        FeatureStore(tmp_path / "missing.zarr", create=False)
    (tmp_path / "feats.npz").write_bytes(b"not a folder")
    for create in (False, True):
        with pytest.raises(StoreError, match=r"feats.npz is a file, not a feature store \(a store is a folder\); give"):
            FeatureStore(tmp_path / "feats.npz", create=create)


def test_an_entry_being_written_is_not_removed(store_path):
    # Removed under a running writer, the writer put its files back without any metadata: an entry of unknown
    # slot, damaged, which stopped every read of the store until `store verify --repair`.
    store = FeatureStore(store_path)
    k = key()
    with open_writer(store, k, 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
        with pytest.raises(EntryLockedError, match=f"entry {k.entry_id} .* is being written by another process: pid .*; let it finish"):
            store.remove(k.entry_id)
        assert store.info(k.entry_id).key == k.to_dict()  # untouched
    assert store.remove(k.entry_id).entry_id == k.entry_id  # once the writer is done
    assert store.entry_ids() == []


def test_an_entry_is_not_removed_between_its_writers_two_locks(store_path, monkeypatch):
    # The writer let its create lock go before it took its part lock, and `store rm` looked for part locks before
    # it held the create lock: removed in that moment, the writer stopped with a KeyError (or wrote into the
    # removed entry's folder).
    import contextlib

    import fedcache.store.writer as writer

    store, k, refused = FeatureStore(store_path), key(), []
    real = writer.exclusive_lock

    @contextlib.contextmanager
    def lock(path, what, wait=0.0):
        if ".part" in path.name:  # the moment the writer asks for its part lock: `store rm` runs here
            with pytest.raises(EntryLockedError, match="is being written"):
                FeatureStore(store_path).remove(k.entry_id)
            refused.append(path.name)
        with real(path, what, wait):
            yield

    monkeypatch.setattr(writer, "exclusive_lock", lock)
    with open_writer(store, k, 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
    assert refused and store.info(k.entry_id).key == k.to_dict()


@pytest.mark.parametrize("keywords, again", [(False, "; run the command again"), (True, "; run the same call again")])
def test_an_entry_removed_while_its_writer_queued_says_how_its_caller_runs_again(store_path, monkeypatch, keywords,
                                                                                  again):
    """A Python caller of extract_features(wait=...) was told to run "the command" again."""
    import contextlib

    import fedcache.store.writer as writer
    from fedcache.wording import flag_names, keyword_names

    store, k = FeatureStore(store_path), key()
    real = writer.exclusive_lock

    @contextlib.contextmanager
    def lock(path, what, wait=0.0):
        if ".part" in path.name:  # queued behind another writer of this part; `store rm` runs while it waits
            FeatureStore(store_path).remove(k.entry_id)
        with real(path, what, wait):
            yield

    monkeypatch.setattr(writer, "_entered", lambda held, path, what: False)  # its part lock is another writer's
    monkeypatch.setattr(writer, "exclusive_lock", lock)
    with (keyword_names if keywords else flag_names)(), pytest.raises(StoreError) as err:
        with open_writer(store, k, 8, 3, 2, ATTRS, chunk_rows=4, wait=1.0):
            pass
    assert str(err.value).endswith(f"was removed while this writer waited for the one before it{again}"), err.value


def test_an_entry_being_made_is_partial_never_damaged(store_path, monkeypatch):
    # Its group was made without attributes, so until its arrays were made it was a damaged entry of unknown
    # slot: every read of the store stopped, and `store verify --repair` removed it under its writer.
    import zarr

    store = FeatureStore(store_path)
    write_all(store, EntryKey("ds", "fp", "train", "all", "other-bb", "w1", {"size": 32}), np.ones((4, 3)), np.zeros(4))
    seen = []
    make = zarr.Group.create_array

    def look_first(group, name, **kw):
        if name == "features":
            other = FeatureStore(store_path)
            seen.append((len(other.read("ds", "train", "other-bb")), other.verify(other.info(key().entry_id))[0]))
        return make(group, name, **kw)

    monkeypatch.setattr(zarr.Group, "create_array", look_first)
    write_all(store, key(), np.ones((4, 3)), np.zeros(4))
    assert seen == [(4, "partial")]


def test_a_removal_stopped_midway_leaves_no_entry_that_looks_complete(store_path, monkeypatch):
    """`store rm` removed an entry's files in place, in directory order: stopped midway (Ctrl-C, kill), the entry
    was left without its features while its zarr.json still said complete, and `store ls` listed it as complete."""
    import shutil

    store = FeatureStore(store_path)
    gone, kept = key("w1"), key("w2", domain="other")
    for k in (gone, kept):
        write_all(store, k, np.ones((4, 3), np.float32), np.zeros(4, int), attrs={**ATTRS, "domains": ["all", "other"]})
    real = shutil.rmtree

    def stopped(path, *args, **kw):  # the first of the entry's arrays removed, then Ctrl-C
        real(next(p for p in sorted(store_path.rglob("features")) if gone.entry_id in str(p)))
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", stopped)
    with pytest.raises(KeyboardInterrupt):
        store.remove(gone.entry_id)
    monkeypatch.undo()
    again = FeatureStore(store_path)
    assert [e.entry_id for e in again.entries()] == [kept.entry_id]  # gone, not a complete entry without rows
    assert again.verify(again.info(kept.entry_id))[0] == "ok"
    again.remove(kept.entry_id)  # and the next removal clears what the stopped one left
    assert sorted(p.name for p in store_path.iterdir() if p.name.startswith(".") and p.name != ".locks") in ([], [".removing"])
    assert not any((store_path / ".removing").glob("*"))


def test_two_removals_at_once_both_remove_their_entry(store_path, monkeypatch):
    """A removal made an empty folder under .removing/ to rename its entry into; another removal's sweep between
    the two deleted that folder, and the rename failed with FileNotFoundError, the entry left in place."""
    import os

    store = FeatureStore(store_path)
    first, second = key("w1"), key("w2", domain="other")
    for k in (first, second):
        write_all(store, k, np.ones((4, 3), np.float32), np.zeros(4, int))
    real, interleaved = os.rename, []

    def other_removal_first(src, dst):  # the other command's whole removal runs just before this rename
        if not interleaved:
            interleaved.append(True)
            FeatureStore(store_path).remove(second.entry_id)
        real(src, dst)

    monkeypatch.setattr(os, "rename", other_removal_first)
    store.remove(first.entry_id)
    monkeypatch.undo()
    assert FeatureStore(store_path).entries() == [] and not any((store_path / ".removing").glob("*"))


def test_the_extraction_a_refusal_gives_is_made_as_the_stored_features_were(store_path):
    """A mix of makings refused, and a split the store lacks, said to run `fedcache extract ... --backbones bb` with
    the defaults: pasted, it loaded other weights (or failed for a checkpoint-only backbone) and made features of
    another making again. The newest (or the found) entry's making is carried: --dtype, --weights."""
    store = FeatureStore(store_path)
    ckpt = {**ATTRS, "domains": ["a", "b"], "weights_file": "/ckpts/my model.pt"}
    write_all(store, key("w2", domain="a"), np.ones((4, 3)), np.zeros(4), attrs={**ATTRS, "domains": ["a", "b"]})
    write_all(store, key("w1", domain="b"), np.ones((4, 3)), np.zeros(4), attrs=ckpt)
    write_all(store, EntryKey("ds", "fp", "train", "a", "bb", "w1", {"size": 32}, dtype="float32"), np.ones((4, 3)),
              np.zeros(4), attrs=ckpt)  # the newest: a float32 extraction from a checkpoint, of a only
    with pytest.raises(StoreError, match="made by different weights") as mixed:
        store.read("ds", "train", "bb")
    assert str(mixed.value).split("`")[-2] == ("fedcache extract --store " + str(store_path) + " --dataset ds "
                                               "--backbones bb --dtype float32 --image-size 32 --weights 'bb=/ckpts/my model.pt'")
    with pytest.raises(EntryNotFoundError, match=r"\(only train\)") as lacking:
        store.read("ds", "test", "bb")
    assert str(lacking.value).split("`")[1] == ("fedcache extract --store " + str(store_path) + " --dataset ds "
                                                "--backbones bb --splits test --dtype float32 --image-size 32 "
                                                "--weights 'bb=/ckpts/my model.pt'")



@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/fd"), reason="counts open files through /proc")
@pytest.mark.parametrize("backbones", [["bb"], ["bb", "other"]])
def test_split_rows_closes_the_rows_it_found_when_another_is_refused(store_path, monkeypatch, backbones):
    """The train split's rows of the first backbone found, the next rows refused (a split or a backbone not
    extracted): split_rows left closing their files to whatever freed them last (a finalizer, on CPython as the
    error unwound; anything still holding the rows, such as this test, kept them open)."""
    from tests.conftest import open_files

    store = FeatureStore(store_path)
    write_all(store, key(), np.ones((6, 3), np.float32), np.arange(6) % 2)
    found, rows = [], FeatureStore.rows
    monkeypatch.setattr(FeatureStore, "rows", lambda self, *a, **kw: found.append(rows(self, *a, **kw)) or found[-1])
    before = open_files()
    with pytest.raises(EntryNotFoundError) as raised:
        store.split_rows("ds", ["train", "test"], backbones)
    assert len(found) == 1 and open_files() == before, raised.value


def test_the_last_of_two_parts_writers_to_finish_keeps_what_the_first_wrote(store_path):
    """Each writer opened the entry before the other recorded how it was given to write and completed it: attributes
    read then and written back at the end dropped the other's (its --skip-bad-images) and its completed_at."""
    store = FeatureStore(store_path)
    feats = np.arange(16, dtype=np.float32).reshape(8, 2)

    def fill(w, part):
        for c in w.pending(part):
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, feats[lo:hi], np.zeros(hi - lo), np.arange(lo, hi), np.ones(hi - lo, bool))

    with open_writer(store, key(), 8, 2, 2, ATTRS, Part(0, 2), chunk_rows=2) as first:
        with open_writer(store, key(), 8, 2, 2, {**ATTRS, "skip_bad_images": True}, Part(1, 2), chunk_rows=2) as second:
            fill(first, Part(0, 2))
            fill(second, Part(1, 2))
            assert second.finish()
            completed = dict(store.root["entries"][key().entry_id].attrs)
            assert completed["complete"] and completed["skip_bad_images"]
        assert first.finish()
    assert dict(FeatureStore(store_path).root["entries"][key().entry_id].attrs) == completed
    np.testing.assert_array_equal(store.read("ds", "train", "bb").features, feats)


def test_a_folder_of_other_files_is_not_made_a_store_and_an_empty_one_is_no_store_yet(tmp_path):
    """`extract --store ~/photos` made the photos' folder a store in place; `store ls` of an empty folder passed
    Zarr's "No group found in store" on."""
    from fedcache.federate.partitions.storage import PARTITIONS
    from fedcache.store.feature_store import STORE_NAMES

    assert PARTITIONS in STORE_NAMES
    theirs = tmp_path / "photos"
    theirs.mkdir()
    for name in ("a.png", "b.png", "c.png", "d.png", ".hidden"):
        (theirs / name).write_text("x")
    with pytest.raises(StoreError, match=r"photos is a folder of other files \(a.png, b.png, c.png, ...\), not a "
                                         r"feature store; give a new folder's path \(or a store's\) as --store$"):
        FeatureStore(theirs)
    assert sorted(p.name for p in theirs.iterdir()) == [".hidden", "a.png", "b.png", "c.png", "d.png"]
    with pytest.raises(FileNotFoundError, match=r"^no feature store at .*photos \(a folder of other files: a.png, "
                                                r"b.png, c.png, ...\); give the store's folder as --store$"):
        FeatureStore(theirs, create=False)  # a run reads a store: it is told to give one, not a new folder
    mount = tmp_path / "mount"
    (mount / "lost+found").mkdir(parents=True)  # a file system's root; and Zarr's zarr.json as another makes it
    (mount / "zarr.0123abcd.partial").write_text("{")
    FeatureStore(mount)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"^no feature store at .*empty \(an empty folder\); create one with"):
        FeatureStore(empty, create=False)
    FeatureStore(empty)  # made there, as asked
    assert FeatureStore(empty, create=False).entries() == []


def test_a_group_of_a_store_given_as_the_store_is_refused_and_left_as_it_was(store_path, capsys):
    """`store ls --store feats.zarr/text` (a store's group, empty) listed an "empty store", marked the group a store
    and made groups in it, which the store then listed as two partial text embedding sets."""
    from fedcache.cli import main

    write_all(FeatureStore(store_path), key(), np.ones((4, 3), np.float32), np.zeros(4, np.int64))
    FeatureStore(store_path).root.require_group("partitions").require_group("ds")
    for group in ("text", "entries", "partitions", "partitions/ds"):
        meta = (store_path / group / "zarr.json").read_bytes()
        assert main(["store", "ls", "--store", str(store_path / group)]) != 0, group
        said = " ".join(capsys.readouterr().err.split())
        assert f"is inside the feature store {store_path}; give {store_path} itself" in said, said
        assert (store_path / group / "zarr.json").read_bytes() == meta, group
    assert FeatureStore(store_path).text_entries() == []


def test_a_store_path_that_is_no_store_raises_the_builtin_it_is_a_case_of(tmp_path):
    """Code written against the builtins catches them (docs/python-api.md); a folder that cannot be made is said
    so, not as no fedcache store."""
    with pytest.raises(FileNotFoundError, match="no feature store at .*create one with `fedcache extract"):
        FeatureStore(tmp_path / "typo.zarr", create=False)
    assert not (tmp_path / "typo.zarr").exists()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a feature store"):
        FeatureStore(tmp_path / "a-file", create=False)
    with pytest.raises(StoreError, match=r"cannot make the feature store .*\(Not a directory\); give a --store"):
        FeatureStore(tmp_path / "a-file" / "s.zarr")


def test_a_partial_entry_an_entry_completed_since_superseded_is_stale(store_path, capsys):
    """Begun, then superseded (the images changed, or other options were extracted to the end): `store ls` told to
    finish it with a command that made another entry, `store rm --stale` kept it, and it stayed for good."""
    from fedcache.cli import main

    store = FeatureStore(store_path)
    with open_writer(store, key(size=48), 8, 3, 2, ATTRS, chunk_rows=4) as w:  # begun, then stopped
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
    (partial,) = store.entries()
    assert store.stale() == []  # nothing completed since: to be finished
    write_all(store, key(), np.ones((4, 3)), np.zeros(4))
    assert [e.entry_id for e in store.stale()] == [partial.entry_id]
    assert main(["store", "ls", "--store", str(store_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "stale (partial)" in out and "1 partial entry superseded by an entry completed since (runs read that one): "\
           f"`fedcache store rm --stale --store {store_path}` removes it" in out and "finish it with" not in out, out
    # One an extraction is writing after all (its lock held) is kept, said, and the rest of the clean-up goes on.
    with exclusive_lock(store.create_lock(partial.entry_id), "an extraction"):
        assert main(["store", "rm", "--stale", "--store", str(store_path)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"kept {partial.entry_id}: entry {partial.entry_id} " in said and "is being written" in said, said
    assert main(["store", "rm", "--stale", "--store", str(store_path)]) == 0
    assert [e.entry_id for e in FeatureStore(store_path).entries()] == [key().entry_id]


def test_a_partial_entry_being_written_is_said_so_not_offered_a_command_refused_as_busy(store_path, capsys):
    """`store ls` during an extraction told to finish its entry with a command that was refused (the entry is being
    written by another process); it names the writer now, and offers the command once the writer has let go."""
    import os

    from fedcache.cli import main

    store = FeatureStore(store_path)
    with open_writer(store, key(), 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
        assert main(["store", "ls", "--store", str(store_path)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "being written: 4/8 rows" in out and f"1 partial entry being written by pid {os.getpid()} on " in out, out
        assert out.endswith("ago): let it finish (`fedcache store ls` then lists it complete)"), out
        assert "finish it with" not in out, out
    assert main(["store", "ls", "--store", str(store_path)]) == 0  # stopped: to be finished
    out = " ".join(capsys.readouterr().out.split())
    assert "partial 4/8 rows" in out and "finish it with `fedcache extract" in out and "being written" not in out, out


def test_an_entry_being_written_in_one_part_says_the_command_of_a_part_nothing_writes(store_path, capsys, monkeypatch):
    """An entry whose part 0/2 is being written and whose part 1/2 was interrupted: `store ls` said "let it finish
    (`fedcache store ls` then lists it complete)", which it did not (part 1/2's chunks stay to write), and gave no
    command for the stopped part. It gives that part's, which runs beside the running writer. Each partial entry's
    writers are asked once (a glob of its lock files), not once for its status and again for this line."""
    import os

    from fedcache.cli import main

    store = FeatureStore(store_path)
    with open_writer(store, key(), 16, 3, 2, ATTRS, Part(1, 2), chunk_rows=4) as w:  # stopped after one of its chunks
        assert w.pending(Part(1, 2)) == [2, 3]
        w.write_chunk(2, np.ones((4, 3)), np.zeros(4), np.arange(8, 12), np.ones(4, bool))
    asked, writers = [], FeatureStore.writers
    monkeypatch.setattr(FeatureStore, "writers", lambda self, eid: asked.append(eid) or writers(self, eid))
    with open_writer(store, key(), 16, 3, 2, ATTRS, Part(0, 2), chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
        assert main(["store", "ls", "--store", str(store_path)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert asked == [key().entry_id]
        assert "being written: 8/16 rows" in out and "let it finish" not in out, out
        assert (f"1 partial entry being written by pid {os.getpid()} on " in out and "), but not its part 1/2 "
                "(interrupted, or not started yet): finish it with `fedcache extract --store "
                f"{store_path} --dataset ds --backbones bb --splits train --domains all --image-size 32 --part 1/2`" in out), out
        with open_writer(store, key(), 16, 3, 2, ATTRS, Part(1, 2), chunk_rows=4) as other:  # the part said: not busy
            assert other.pending(Part(1, 2)) == [3]
            with pytest.raises(EntryLockedError):  # while the running part's command is refused as busy
                with open_writer(store, key(), 16, 3, 2, ATTRS, Part(0, 2), chunk_rows=4):
                    pass
            assert main(["store", "ls", "--store", str(store_path)]) == 0  # every part being written
            out = " ".join(capsys.readouterr().out.split())
            assert out.endswith("let it finish (`fedcache store ls` then lists it complete)") and "--part" not in out, out


def test_a_partial_entry_takes_its_written_rows_on_disk(store_path):
    """Its rows file has the finished entry's length, mostly holes: `store ls` said the finished entry's size."""
    store = FeatureStore(store_path)
    rows, dim = 200_000, 64  # 51 MB finished
    with open_writer(store, key(), rows, dim, 1000, ATTRS) as w:
        c = next(iter(w.pending(Part())))
        lo, hi = w.chunk_range(c)
        w.write_chunk(c, np.ones((hi - lo, dim)), np.zeros(hi - lo), np.arange(lo, hi), np.ones(hi - lo, bool))
    (entry,) = store.entries()
    files = [p for p in (store_path / "entries" / entry.entry_id).rglob("*") if p.is_file()]
    if sum(p.stat().st_blocks for p in files) * 512 >= sum(p.stat().st_size for p in files):
        pytest.skip("this filesystem stores no holes")
    disk, memory = store.sizes(entry)
    assert disk < memory / 4, (disk, memory)


def test_the_command_that_finishes_a_partial_entry_is_one_line_in_a_log(tmp_path, capsys):
    """`store ls` into a log or a pipe broke the command at 160 columns: pasted, it ran half of itself."""
    from fedcache.cli import main

    path = tmp_path / ("a-store-with-a-long-name-" * 4) / "store.zarr"
    store = FeatureStore(path)
    with open_writer(store, key(), 8, 3, 2, ATTRS, chunk_rows=4) as w:
        w.write_chunk(0, np.ones((4, 3)), np.zeros(4), np.arange(4), np.ones(4, bool))
    assert main(["store", "ls", "--store", str(path)]) == 0
    (line,) = [s for s in capsys.readouterr().out.splitlines() if "finish it with" in s]
    assert line.endswith("`") and "--store " + str(path) in line and len(line) > 160


def test_missing_text_embeddings_name_the_dataset_of_their_classes(store_path):
    """The hint was `fedcache extract --store S --backbones B` "on the dataset": a command that needs --dataset."""
    store = FeatureStore(store_path)
    write_all(store, key(), np.ones((4, 3)), np.zeros(4))
    with pytest.raises(EntryNotFoundError, match=rf"run `fedcache extract --store {store_path} --dataset ds --backbones "
                                                 r"clip-x` \(only CLIP-style backbones have them\)$"):
        store.read_text("clip-x", ["a", "b"])
    with pytest.raises(EntryNotFoundError, match=r"--dataset DATASET --backbones clip-x` \(only CLIP-style backbones "
                                                 r"have them\), DATASET being a dataset of these classes$"):
        store.read_text("clip-x", ["a", "c"])
