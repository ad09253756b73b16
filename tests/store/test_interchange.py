"""Bring your own embeddings: flat files, bad files."""
import h5py
import numpy as np
import pytest

from fedcache.errors import ConfigError, DataNotFoundError
from fedcache.store.feature_store import FeatureStore
from fedcache.store.interchange import import_file
from tests.faults import held_by_another_thread


def test_flat_h5_with_domains_becomes_entries(store_path, tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "emb.h5"
    with h5py.File(path, "w") as f:
        f["features"] = rng.normal(size=(30, 8)).astype(np.float32)
        f["labels"] = rng.integers(0, 3, 30)
        f["domains"] = np.repeat([0, 1, 2], 10)
    store = FeatureStore(store_path)
    with pytest.raises(ConfigError, match="--split"):
        import_file(store, path, "mine", "enc")
    ids = import_file(store, path, "mine", "enc", split="train").ids
    assert len(ids) == 3
    table = store.read("mine", "train", "enc")
    assert table.domain_names == ("domain0", "domain1", "domain2") and len(table) == 30
    assert not table.random_weights


def test_npz_without_labels_is_refused(store_path, tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, features=np.zeros((3, 2)))
    with pytest.raises(ConfigError, match="needs 'features'.*'labels'"):
        import_file(FeatureStore(store_path), path, "x", "y", split="train")
    with pytest.raises(DataNotFoundError):
        import_file(FeatureStore(store_path), tmp_path / "missing.npz", "x", "y")


def _npz(path, seed):
    rng = np.random.default_rng(seed)
    np.savez(path, train__features=rng.normal(size=(20, 4)).astype(np.float32), train__labels=rng.integers(0, 3, 20))
    return path


def test_importing_a_file_again_makes_its_features_the_ones_runs_read(store_path, tmp_path):
    """A, then B, then A again under the same names: runs read A (they read B, the last write, before)."""
    a, b = _npz(tmp_path / "a.npz", 0), _npz(tmp_path / "b.npz", 1)
    store = FeatureStore(store_path)
    for path in (a, b, a):
        import_file(store, path, "mine", "enc")
    np.testing.assert_array_equal(store.read("mine", "train", "enc").features, np.load(a)["train__features"])
    assert len(store.stale()) == 1
    import_file(store, b, "mine", "enc")
    np.testing.assert_array_equal(store.read("mine", "train", "enc").features, np.load(b)["train__features"])


def test_a_split_an_import_lacks_is_imported_not_extracted(store_path, tmp_path):
    """Imported embeddings have no backbone here: the missing test split was told to be extracted first."""
    from fedcache.errors import EntryNotFoundError

    store = FeatureStore(store_path)
    import_file(store, _npz(tmp_path / "a.npz", 0), "mine", "enc")
    with pytest.raises(EntryNotFoundError) as caught:
        store.read("mine", "test", "enc")
    said = str(caught.value)
    assert said.endswith("(only train, imported): import that split too (`fedcache store import FILE --store "
                         f"{store_path} --dataset mine --backbone enc --split test`)") and "extract" not in said


def test_the_import_command_says_what_it_did(store_path, tmp_path, capsys):
    from fedcache.cli import main

    a, b = _npz(tmp_path / "a.npz", 0), _npz(tmp_path / "b.npz", 1)
    said = []
    for path in (a, a, b, a):
        assert main(["store", "import", str(path), "--store", str(store_path), "-d", "mine", "-b", "enc"]) == 0
        said.append(" ".join(capsys.readouterr().out.split()))
    assert said[0] == "imported 1 entry as dataset 'mine', backbone 'enc'"
    assert said[1].startswith("nothing to import: the store already holds") and "a.npz's 1 entry" in said[1]
    assert said[2].startswith("imported 1 entry") and "1 other entry as dataset 'mine', backbone 'enc' is now stale" in said[2]
    assert "fedcache store rm --stale" in said[2]
    assert "runs read them again instead of the ones imported after them" in said[3] and "now stale" in said[3]


def test_store_rm_stale_removes_the_stale_entries_then_says_none_are_left(store_path, tmp_path, capsys):
    """The advice the import gives, followed twice: the second finds nothing stale, which is no error (it said
    "name entry ids to remove, or pass --stale", exit 2, to a command that had passed --stale)."""
    from fedcache.cli import main

    for path in (_npz(tmp_path / "a.npz", 0), _npz(tmp_path / "b.npz", 1)):
        import_file(FeatureStore(store_path), path, "mine", "enc")
    capsys.readouterr()
    assert main(["store", "rm", "--stale", "--store", str(store_path)]) == 0
    assert capsys.readouterr().out.startswith("removed ")
    assert main(["store", "rm", "--stale", "--store", str(store_path)]) == 0
    said = capsys.readouterr()
    assert " ".join(said.out.split()) == f"no stale entries in {store_path}: nothing removed" and not said.err
    assert FeatureStore(store_path).read("mine", "train", "enc").features.shape == (20, 4)
    assert main(["store", "rm", "--store", str(store_path)]) == 2
    assert "name entry ids to remove, or pass --stale" in capsys.readouterr().err


def test_a_file_of_other_domains_supersedes_the_domains_it_lacks(store_path, tmp_path):
    """A file without domains ('all'), then one of photo and sketch, under the same names: runs read the photos and
    sketches only (the old 'all' entries stayed current beside them, and the first slot in sort order decided the
    table's domains); importing the first file again brings 'all' back alone."""
    rng = np.random.default_rng(0)
    plain = tmp_path / "plain.npz"
    np.savez(plain, train__features=rng.normal(size=(20, 4)).astype(np.float32), train__labels=rng.integers(0, 3, 20))
    split = tmp_path / "split.npz"
    np.savez(split, train__features=rng.normal(size=(30, 4)).astype(np.float32), train__labels=rng.integers(0, 3, 30),
             train__domains=np.arange(30) % 2, domains=np.array('["photo", "sketch"]'))
    store = FeatureStore(store_path)
    import_file(store, plain, "mine", "enc")
    import_file(store, split, "mine", "enc")
    table = store.read("mine", "train", "enc")
    assert table.domain_names == ("photo", "sketch") and len(table) == 30
    assert [e.key["domain"] for e in store.stale()] == ["all"]
    import_file(store, plain, "mine", "enc")
    table = store.read("mine", "train", "enc")
    assert table.domain_names == ("all",) and len(table) == 20
    assert sorted(e.key["domain"] for e in store.stale()) == ["photo", "sketch"]


def test_npz_names_may_be_an_array_of_strings(store_path, tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "named.npz"
    np.savez(path, train__features=rng.normal(size=(6, 2)).astype(np.float32), train__labels=np.arange(6) % 2,
             train__domains=np.arange(6) % 3, domains=np.array(["a", "b", "c"]), classes=np.array(["cat", "dog"]))
    store = FeatureStore(store_path)
    import_file(store, path, "mine", "enc")
    table = store.read("mine", "train", "enc")
    assert table.domain_names == ("a", "b", "c") and table.class_names == ("cat", "dog")


@pytest.mark.parametrize("how", ["attribute", "dataset"])
def test_h5_names_may_be_a_list_of_strings(store_path, tmp_path, how):
    """As h5py writes a list of names: f.attrs["classes"] = [...] (read back as an array), or a dataset of strings."""
    rng = np.random.default_rng(0)
    path = tmp_path / "named.h5"
    with h5py.File(path, "w") as f:
        f["train/features"] = rng.normal(size=(6, 2)).astype(np.float32)
        f["train/labels"], f["train/domains"] = np.arange(6) % 2, np.arange(6) % 3
        if how == "attribute":
            f.attrs["classes"], f.attrs["domains"] = ["cat", "dog"], ["a", "b", "c"]
        else:
            f["classes"] = np.array(["cat", "dog"], dtype=h5py.string_dtype())
            f["domains"] = np.array([b"a", b"b", b"c"])  # fixed-length bytes
    store = FeatureStore(store_path)
    import_file(store, path, "mine", "enc")
    table = store.read("mine", "train", "enc")
    assert table.domain_names == ("a", "b", "c") and table.class_names == ("cat", "dog")


def test_h5_names_given_twice_are_refused(store_path, tmp_path):
    path = tmp_path / "twice.h5"
    with h5py.File(path, "w") as f:
        f["train/features"], f["train/labels"] = np.zeros((2, 2), np.float32), np.arange(2)
        f.attrs["classes"] = '["cat", "dog"]'
        f["classes"] = np.array(["cat", "dog"], dtype=h5py.string_dtype())
    with pytest.raises(ConfigError, match="'classes' is both an attribute and a dataset"):
        import_file(FeatureStore(store_path), path, "mine", "enc")


def test_a_second_import_under_the_same_names_at_once_is_refused_and_writes_nothing(store_path, tmp_path, monkeypatch):
    # Two imports of one (dataset, backbone) at once interleaved their entries: each slot went to whichever
    # finished it last, both said they had imported, and every run refused the mix of the two files.
    from fedcache.errors import EntryLockedError
    from fedcache.store.interchange import import_lock
    from fedcache.store.locks import exclusive_lock

    monkeypatch.setattr("fedcache.store.interchange.READERS_WAIT", 0.0)  # the wait for readers is tested below
    path = tmp_path / "mine.npz"
    np.savez(path, train__features=np.ones((4, 3), np.float32), train__labels=np.arange(4) % 2)
    store = FeatureStore(store_path)
    with exclusive_lock(store.locks_dir / f"{import_lock('mine', 'enc')}.lock", "an import"):
        with pytest.raises(EntryLockedError, match="dataset 'mine', backbone 'enc' of .* is being written by another process: pid .*; another import writes it"):
            import_file(store, path, "mine", "enc")
        assert store.entry_ids() == []
        assert import_file(store, path, "mine", "other-enc").written  # other names are not held up
    assert import_file(store, path, "mine", "enc").written


def test_an_import_queued_behind_the_same_import_says_it_wrote_nothing(store_path, tmp_path, monkeypatch):
    """What an import wrote is judged under its lock: a second import of the same file, queued while the first
    wrote, said "imported 2 entries" though the first had written them."""
    import threading

    from fedcache.store import interchange

    path = _both_splits(tmp_path / "f.npz", 0)
    writing, go_on, calls = threading.Event(), threading.Event(), []
    write_domain = interchange._import_domain

    def slow_first_domain(*args):
        calls.append(1)
        if len(calls) == 1:  # the first import, mid-write, holding the lock
            writing.set()
            go_on.wait(10)
        return write_domain(*args)

    monkeypatch.setattr(interchange, "_import_domain", slow_first_domain)
    first = []
    thread = threading.Thread(target=lambda: first.append(import_file(FeatureStore(store_path), path, "mine", "enc")))
    thread.start()
    writing.wait(10)
    threading.Timer(0.5, go_on.set).start()
    second = import_file(FeatureStore(store_path), path, "mine", "enc")  # waits for the first's lock
    thread.join()
    assert first[0].written == first[0].ids and len(first[0].ids) == 2
    assert second.ids == first[0].ids and second.written == [] and second.were_current and second.superseded == []
    again = import_file(FeatureStore(store_path), _both_splits(tmp_path / "g.npz", 1), "mine", "enc")
    assert again.written == again.ids and sorted(again.superseded) == sorted(first[0].ids)


def test_import_locks_of_dotted_or_long_names_are_apart_and_short():
    from fedcache.store.interchange import import_lock

    assert import_lock("a.b", "c") != import_lock("a", "b.c")
    assert len(import_lock("d" * 200, "b" * 200) + ".lock") < 255


def _both_splits(path, seed):
    rng = np.random.default_rng(seed)
    np.savez(path, **{f"{s}__{k}": v for s in ("train", "test") for k, v in
                      (("features", rng.normal(size=(12, 4)).astype(np.float32)), ("labels", np.arange(12) % 3))})
    return path


def test_a_run_never_reads_one_import_s_training_split_with_another_s_test_split(store_path, tmp_path, monkeypatch):
    """An import writes its splits one after another: a run that found its entries in between read the new
    training split with the old test split. It is refused in one line naming the import, and reads both new
    splits once the import is done."""
    from fedcache.errors import EntryLockedError
    from fedcache.federate.tables import load_splits
    from fedcache.store import interchange

    store = FeatureStore(store_path)
    old = import_file(store, _both_splits(tmp_path / "old.npz", 0), "mine", "enc").ids
    seen = []
    write_domain = interchange._import_domain

    def reading_between_splits(store_, key, *args):
        eid = write_domain(store_, key, *args)
        if key.split == "train":  # the new training split is written, the test split is not yet
            with pytest.raises(EntryLockedError, match="dataset 'mine', backbone 'enc' of .* is being written by another "
                                                       "process: pid .*; an import writes it"):
                load_splits(FeatureStore(store_path, create=False), "mine", ["enc"])
            seen.append(key.split)
        return eid

    monkeypatch.setattr(interchange, "_import_domain", reading_between_splits)
    new = import_file(store, _both_splits(tmp_path / "new.npz", 1), "mine", "enc").ids
    assert seen == ["train"] and set(new).isdisjoint(old)
    train, test = load_splits(FeatureStore(store_path, create=False), "mine", ["enc"])
    assert set(train.entry_ids + test.entry_ids) == set(new)


def test_an_import_waits_for_a_run_finding_its_entries(store_path, tmp_path):
    """A run holds the pair while it finds its entries (a moment): an import started then waits for it instead of
    being refused as if another import wrote."""
    import time

    from fedcache.store.feature_store import import_lock
    from fedcache.store.locks import shared_lock

    store = FeatureStore(store_path)
    import_file(store, _both_splits(tmp_path / "old.npz", 0), "mine", "enc")
    with held_by_another_thread(shared_lock(store.locks_dir / f"{import_lock('mine', 'enc')}.lock", "a run")):
        t0 = time.monotonic()
        assert import_file(store, _both_splits(tmp_path / "new.npz", 1), "mine", "enc").written
        assert time.monotonic() - t0 >= 0.4


def _samples(tmp_path, name, order):
    """One dataset's samples (2 domains x 60 rows, ids 0..59 within each), written to an .npz in ``order``."""
    rng = np.random.default_rng(0)
    n = 120
    x = rng.normal(size=(n, 6)).astype(np.float32)
    labels, domains, ids = rng.integers(0, 3, n), np.repeat([0, 1], 60), np.tile(np.arange(60), 2)
    x[np.arange(n), labels] += 2.0  # learnable
    split = {"features": x, "labels": labels, "domains": domains, "ids": ids}
    path = tmp_path / f"{name}.npz"
    np.savez(path, domains='["a", "b"]', **{f"{s}__{k}": v[order] for s in ("train", "test") for k, v in split.items()})
    return path


@pytest.mark.parametrize("validation", [False, True])
def test_the_same_samples_imported_in_another_row_order_train_to_the_same_numbers(tmp_path, validation):
    """A table's row order decided its partitions under a partition id that does not: the same samples in another
    order gave the same id, other clients' rows and other numbers. Import stores each domain's rows in id order."""
    from fedcache.api import train

    runs = {}
    for name, order in (("sorted", np.arange(120)), ("shuffled", np.random.default_rng(1).permutation(120))):
        store = tmp_path / f"{name}.zarr"
        import_file(store, _samples(tmp_path, name, order), "mine", "enc")
        r = train(store=store, dataset="mine", backbones="enc", method="fedavg", partition="dirichlet", alpha=0.3,
                  clients=4, subsample=0.8, rounds=10, validation=validation, settings={"lr": 0.1})
        runs[name] = ({k: v for k, v in r.summary.items() if k != "seconds"}, [h.get("mean_accuracy") for h in r.history])
    assert runs["sorted"] == runs["shuffled"]
    assert runs["sorted"][0]["mean_accuracy"] > 50  # it learnt: equal numbers of a run that learnt nothing would say little


def test_rows_of_one_block_in_another_id_order_are_stored_in_id_order(store_path, tmp_path):
    """A domain's rows spanning one block of the file (its first row first, its last last) were copied as that
    block, in the file's order."""
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    ids, labels = np.array([0, 2, 1, 3, 4, 5]), np.array([0, 1, 1, 0, 1, 0])
    path = tmp_path / "swapped.npz"
    np.savez(path, train__features=x, train__labels=labels, train__ids=ids)
    import_file(FeatureStore(store_path), path, "mine", "enc")
    t = FeatureStore(store_path, create=False).read("mine", "train", "enc")
    order = np.argsort(ids)
    assert t.ids.tolist() == list(range(6)) and t.labels.tolist() == labels[order].tolist()
    np.testing.assert_array_equal(t.features, x[order])


def test_a_read_where_no_lock_file_can_be_made_runs_without_one(tmp_path):
    from fedcache.store.locks import shared_lock

    (tmp_path / "not-a-dir").write_text("")
    with shared_lock(tmp_path / "not-a-dir" / "x.lock", "a store"):
        pass


def _split_file(path, order_train, order_test, test_domains=(0, 1)):
    """Train and test splits of 2 domains (20 rows each, ids 0..19 within a domain), each written in its order;
    the test split holds only the rows of ``test_domains``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    labels, domains, ids = np.arange(40) % 2, np.repeat([0, 1], 20), np.tile(np.arange(20), 2)
    keep = np.isin(domains, test_domains)
    arrays = {}
    for split, order, rows in (("train", order_train, np.arange(40)), ("test", order_test, np.flatnonzero(keep))):
        pick = rows[order(len(rows))]
        arrays.update({f"{split}__features": x[pick], f"{split}__labels": labels[pick], f"{split}__domains": domains[pick],
                       f"{split}__ids": ids[pick]})
    np.savez(path, domains='["a", "b"]', **arrays)
    return path


SORTED = np.arange
SHUFFLED = lambda n: np.random.default_rng(n).permutation(n)  # noqa: E731
FIRST_DOMAIN_SHUFFLED = lambda n: np.concatenate([np.random.default_rng(1).permutation(n // 2), np.arange(n // 2, n)])  # noqa: E731


@pytest.mark.parametrize("orders", [(SHUFFLED, SORTED, (0, 1)), (FIRST_DOMAIN_SHUFFLED, FIRST_DOMAIN_SHUFFLED, (0, 1)),
                                    (SHUFFLED, SHUFFLED, (0,))],
                         ids=["train-shuffled-test-sorted", "one-domain-shuffled", "an-empty-domain"])
def test_a_file_only_partly_out_of_id_order_is_one_import(store_path, tmp_path, orders):
    """Whether rows were put in id order is in every entry's key: marked per entry, a file with a sorted split, a
    sorted domain or an empty one made entries of two keys, which runs refused as two encoders' features."""
    from fedcache.api import train
    from fedcache.federate.tables import load_splits

    import_file(FeatureStore(store_path), _split_file(tmp_path / "f.npz", *orders), "mine", "enc")
    tr, te = load_splits(FeatureStore(store_path, create=False), "mine", ["enc"])
    assert tr.ids.tolist() == [*range(20), *range(20)] and len(te) == 20 * len(orders[2])
    assert train(store=store_path, dataset="mine", backbones="enc", method="fedavg", partition="iid", clients=2,
                 rounds=1).summary["rounds"] == 1


def test_an_export_is_refused_while_an_import_writes_its_splits(store_path, tmp_path, capsys):
    """Export finds its splits as a run does (``FeatureStore.read_splits``, also what shards read): between an
    import's two splits it wrote one file's training rows beside another's test rows."""
    from fedcache.cli import main
    from fedcache.store.feature_store import import_lock
    from fedcache.store.locks import exclusive_lock

    store = FeatureStore(store_path)
    import_file(store, _both_splits(tmp_path / "old.npz", 0), "mine", "enc")
    export = ["store", "export", "-d", "mine", "-b", "enc", "-o", str(tmp_path / "out.npz"), "--store", str(store_path)]
    with exclusive_lock(store.locks_dir / f"{import_lock('mine', 'enc')}.lock", "an import"):
        assert main(export) == 1
    assert "is being written by another process: pid" in capsys.readouterr().err
    assert not (tmp_path / "out.npz").exists()
    assert main(export) == 0 and (tmp_path / "out.npz").exists()


def test_an_import_says_its_rows_as_it_writes_them(store_path, tmp_path):
    """A million rows took seconds to write without a word: ``on_rows(done, total)`` as the writing starts and after
    each chunk, across the file's entries."""
    rng = np.random.default_rng(0)
    path = tmp_path / "three.npz"
    np.savez(path, train__features=rng.normal(size=(30, 4)).astype(np.float32), train__labels=rng.integers(0, 3, 30),
             train__domains=np.arange(30) // 10, domains=np.array('["a", "b", "c"]'))
    calls = []
    import_file(FeatureStore(store_path), path, "mine", "enc", on_rows=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 30), (10, 30), (20, 30), (30, 30)]


def test_a_resumed_import_says_the_rows_it_kept_first(store_path, tmp_path):
    """Its first line said 0 rows in the store, then jumped to those an interrupted import had written."""
    rng = np.random.default_rng(0)
    path = tmp_path / "three.npz"
    np.savez(path, train__features=rng.normal(size=(30, 4)).astype(np.float32), train__labels=rng.integers(0, 3, 30),
             train__domains=np.arange(30) // 10, domains=np.array('["a", "b", "c"]'))

    def stop_after_ten(done, total):
        if done >= 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_file(FeatureStore(store_path), path, "mine", "enc", on_rows=stop_after_ten)
    calls = []
    import_file(FeatureStore(store_path), path, "mine", "enc", on_rows=lambda done, total: calls.append((done, total)))
    assert calls == [(10, 30), (20, 30), (30, 30)]


def test_the_import_command_says_a_slow_check_and_its_rows(store_path, tmp_path, capsys, monkeypatch):
    """The check said where it took ``progress.SLOW_STEP`` seconds or more (0 here), then the rows written; a file
    refused is its error alone."""
    import re

    from fedcache import progress
    from fedcache.cli import main

    monkeypatch.setattr(progress, "SLOW_STEP", 0.0)
    path = _npz(tmp_path / "a.npz", 0)
    assert main(["store", "import", str(path), "--store", str(store_path), "-d", "mine", "-b", "enc"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"{re.escape(str(path))} checked in \d+\.\d s: 20 rows of 4 features in 1 split \(train\)", lines[0])
    assert lines[1] == "rows in the store 0/20 (0%)" and re.fullmatch(r"rows in the store 20/20 \(100%\) in \d+s", lines[2]), lines
    assert len(lines) == 3, lines  # the time is the machine's (1s under load), the words are ours
    bad = tmp_path / "bad.npz"
    np.savez(bad, features=np.zeros((3, 2)))
    assert main(["store", "import", str(bad), "--store", str(store_path), "-d", "mine", "-b", "enc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
