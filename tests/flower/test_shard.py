"""`fedcache shard`: each client's store holds exactly its rows and reads back as the engine's data."""
import logging
import re
import shutil

import numpy as np
import pytest
import torch

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.federate.tables import sample_keys
from fedcache.training import prepare
from fedcache.ownership import LOCK
from fedcache.flower.shard import SERVER, client_dir, load_client, load_server, open_shard, write_shards
from fedcache.flower.sim import shard_spec
from fedcache.store.feature_store import FeatureStore

from .conftest import BACKBONE, toy_config

FUSED = [BACKBONE, "tiny-clip-random"]


@pytest.fixture(scope="module")
def sharded(flower_store, tmp_path_factory):
    cfg = toy_config(flower_store, backbones=FUSED)
    out = tmp_path_factory.mktemp("shards") / "shards"
    assert main(["shard", "--store", str(flower_store), "-d", "test-toy", "-b", ",".join(FUSED), "--partition", "dirichlet",
                 "--alpha", "1.0", "--clients", "3", "--seed", "1", "--out", str(out)]) == 0
    return cfg, out


def test_each_client_shard_holds_exactly_its_rows(sharded):
    cfg, out = sharded
    method, _ = prepare(cfg)
    full = method.ctx.data
    for k in range(full.n_clients):
        data, info = load_client(client_dir(out, k))
        assert (info.role, info.client, info.n_clients) == ("client", k, full.n_clients)
        # Only client k has rows, in the engine's order: same features, labels, local test rows.
        assert [len(r) for r in data.client_train] == [len(full.client_train[k]) if c == k else 0 for c in range(3)]
        assert len(data.x_train) == len(full.client_train[k])
        torch.testing.assert_close(data.x_train[data.client_train[k]], full.x_train[full.client_train[k]], rtol=0, atol=0)
        assert torch.equal(data.y_train[data.client_train[k]], full.y_train[full.client_train[k]])
        torch.testing.assert_close(data.x_test[data.client_test[k]], full.x_test[full.client_test[k]], rtol=0, atol=0)
        assert data.dim == full.dim and data.class_names == full.class_names


def test_no_client_shard_has_another_clients_rows(sharded):
    _, out = sharded
    seen = []
    for k in range(3):
        store, _ = open_shard(client_dir(out, k))
        keys = set(sample_keys(store.read("test-toy", "train", BACKBONE)).tolist())
        assert all(not (keys & other) for other in seen)
        seen.append(keys)


def test_server_shard_has_no_training_rows_but_the_test_split_and_text(sharded, flower_store):
    cfg, out = sharded
    data, info = load_server(out / SERVER)
    assert info.role == "server" and len(data.x_train) == 0 and data.n_clients == 3
    full = FeatureStore(flower_store, create=False).read("test-toy", "test", BACKBONE)
    assert len(data.x_test) == len(full)
    # The class-text embeddings travel with the shards.
    store, _ = open_shard(out / SERVER)
    src = FeatureStore(flower_store, create=False)
    np.testing.assert_array_equal(store.read_text("tiny-clip-random", full.class_names),
                                  src.read_text("tiny-clip-random", full.class_names))


def test_sharding_shows_its_progress_a_shard_at_a_time(flower_store, tmp_path, capsys):
    """A shard takes about a second: 40 clients were written for over a minute without a line."""
    told = []
    write_shards(shard_spec(toy_config(flower_store, clients=3)), tmp_path / "lib", lambda *a: told.append(a))
    assert told == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]  # before the first shard, then after each
    assert main(["shard", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "--partition", "iid",
                 "--clients", "2", "--out", str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "shards 0/3 (0%)" and err[-1].startswith("shards 3/3 (100%) in "), err


def test_a_partition_that_cannot_be_made_is_refused_before_a_feature_is_read(flower_store, tmp_path, monkeypatch):
    """Sharding made its partition of the labels after reading every backbone's features (seconds at a million
    rows) for a refusal that needs none of them."""
    read, features = [], FeatureStore.features
    monkeypatch.setattr(FeatureStore, "features", lambda self, rows: read.append(rows) or features(self, rows))
    with pytest.raises(ConfigError, match="1000 clients but only 60 training rows"):
        write_shards(shard_spec(toy_config(flower_store, backbones=FUSED, partition="iid", clients=1000)), tmp_path / "s")
    assert read == []


@pytest.mark.parametrize("partition", [["iid", "--clients", "3", "--few-shot", "15"],
                                       ["class-disjoint", "--classes-per-client", "1", "--clients", "2"]])
def test_a_sharding_warns_of_what_a_run_on_its_partition_warns_of(flower_store, tmp_path, caplog, partition):
    """`fedcache shard` said a partition's notes alone: a --few-shot more than every client holds of a class, or classes
    no client is dealt, which `fedcache train` on the same partition warns of, went unsaid to whoever copied the
    shards out to the clients."""
    data = ["--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "--seed", "1", "--partition", *partition]
    said = {}
    for cmd, more in (("train", ["-m", "fedavg", "--rounds", "1"]), ("shard", [])):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fedcache"):
            assert main([cmd, *data, *more, "--out", str(tmp_path / cmd)]) == 0
        said[cmd] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said["train"]) == 1 and said["shard"] == said["train"]


def test_shards_inside_a_store_are_refused_before_anything_is_read_or_made(sharded, flower_store, monkeypatch):
    """`--out STORE/shards` was refused once the partition was made, as `--store STORE/shards/.partial/client-000 is
    inside the feature store ...; give STORE itself`: a flag not given, a folder of the sharding's own, advice for
    another mistake."""
    _, out = sharded
    read, features = [], FeatureStore.features
    monkeypatch.setattr(FeatureStore, "features", lambda self, rows: read.append(rows) or features(self, rows))
    for store in (flower_store, client_dir(out, 0)):
        before = sorted(p.name for p in store.iterdir())
        with pytest.raises(ConfigError, match="^" + re.escape(f"--out {store}/shards is inside the feature store {store}; "
                                                              "choose a directory outside it") + "$"):
            write_shards(shard_spec(toy_config(flower_store)), store / "shards")
        assert sorted(p.name for p in store.iterdir()) == before
    assert read == []


def test_shard_errors_say_what_to_do(sharded, tmp_path):
    cfg, out = sharded
    with pytest.raises(ConfigError, match="not empty"):
        write_shards(shard_spec(cfg), out)
    with pytest.raises(ConfigError, match="server's shard"):
        load_client(out / SERVER)
    with pytest.raises(ConfigError, match="client 0's shard"):
        load_server(client_dir(out, 0))
    with pytest.raises(ConfigError, match="no shard at"):
        load_client(tmp_path / "nowhere")
    # The shards' folder for one shard: it was "no feature store ...; give the store's folder as --store".
    said = f"{out} holds the shards (client-000, client-001, client-002), not one: give each client its own, e.g. "
    with pytest.raises(ConfigError, match="^" + re.escape(said + str(out / "client-000")) + "$"):
        load_client(out)


def test_a_shard_given_as_the_store_is_refused_and_left_as_it_was(flower_store, tmp_path, capsys):
    """`train`, `partition` or `shard` with --store a client's shard saved a second partition record into it;
    that client's Flower node then failed every round ('should hold exactly one partition record, found 2')
    and a deployment with min_clients below N went on without it."""
    out = tmp_path / "shards"
    write_shards(shard_spec(toy_config(flower_store, clients=3)), out)
    mine = str(client_dir(out, 0))
    other = ["-d", "test-toy", "-b", BACKBONE, "--partition", "iid", "--clients", "1"]  # the shard holds few rows
    assert main(["train", "--store", mine, *other, "-m", "fedavg", "--rounds", "1"]) == 1
    assert main(["shard", "--store", mine, *other, "--out", str(tmp_path / "again")]) == 1
    assert "is client 0's shard" in capsys.readouterr().err
    data, info = load_client(mine)  # still the client's shard
    assert info.client == 0 and len(data.client_train[0]) == info.client_train_sizes[0]


def test_an_interrupted_sharding_leaves_nothing_that_passes_for_shards(flower_store, tmp_path, monkeypatch):
    """`fedcache shard` killed part-way left client-000/ complete, client-001/ partial and no server/ in --out, and a
    re-run refused the not-empty --out: the shards appear in --out only once all of them are written."""
    from fedcache.flower import shard

    out = tmp_path / "shards"
    out.mkdir()  # an empty --out is taken

    def killed(*args):
        # a kill here would leave no shards in --out: only .partial, which the next sharding removes
        assert _names(out) == [shard.STAGING] and client_dir(args[-1].parent, 0).exists()
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(shard, "_write_server", killed)
        with pytest.raises(KeyboardInterrupt):
            write_shards(shard_spec(toy_config(flower_store, clients=3)), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"] and _names(out) == []
    paths = write_shards(shard_spec(toy_config(flower_store, clients=3)), out)
    assert paths == [client_dir(out, k) for k in range(3)] + [out / SERVER]
    assert open_shard(out / SERVER)[1].role == "server" and sorted(p.name for p in tmp_path.iterdir()) == ["shards"]


def test_an_interrupted_shard_command_says_nothing_was_kept_and_its_rerun_shards(flower_store, tmp_path, monkeypatch,
                                                                                  capsys):
    """An interrupted `fedcache shard` said "finished work is kept; re-run the same command to resume": it keeps no
    shard, and its re-run shards again from the start."""
    from fedcache.flower import shard

    out = tmp_path / "shards"
    argv = ["shard", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "--partition", "iid", "--clients",
            "2", "--out", str(out)]

    def interrupted(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(shard, "_write_server", interrupted)
        assert main(argv) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == ("interrupted: no shard was written (they appear in --out only once all of them are whole); run the "
                       "same command again, which shards again from the start"), err
    assert not out.exists()
    assert main(argv) == 0 and _names(out) == ["client-000", "client-001", SERVER]


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != LOCK)


def test_an_existing_out_is_kept_and_a_new_one_has_the_usual_mode(flower_store, tmp_path, monkeypatch):
    """An empty --out that exists ('.', a link to a directory, a mount point) has the shards moved into it: renaming a
    staging directory onto it failed with EBUSY or ENOTDIR, after every shard was written. A new --out is made with
    the umask's mode (mkdtemp's 0700 kept a SuperNode's service account out)."""
    import os
    import stat
    from pathlib import Path

    new = tmp_path / "new"
    write_shards(shard_spec(toy_config(flower_store, clients=2)), new)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o777 & ~umask
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    paths = write_shards(shard_spec(toy_config(flower_store, clients=2)), Path("."))
    assert _names(here) == ["client-000", "client-001", SERVER]
    assert paths == [client_dir(Path("."), k) for k in range(2)] + [Path(".") / SERVER]
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    write_shards(shard_spec(toy_config(flower_store, clients=2)), tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (target / SERVER).is_dir()


def test_a_killed_shardings_staging_is_removed_by_the_next_and_a_second_sharding_at_once_is_refused(flower_store, tmp_path):
    """SIGKILL runs no clean-up: the .partial it leaves in --out is removed by the next sharding into it. Meanwhile,
    a sharding into an --out another one holds is refused, naming it, rather than removing its .partial."""
    from fedcache.errors import DirectoryBusyError
    from fedcache.flower import shard
    from fedcache.store.locks import exclusive_lock
    from tests.faults import held_by_another_thread

    out = tmp_path / "shards"
    (out / shard.STAGING / "client-000").mkdir(parents=True)
    with held_by_another_thread(exclusive_lock(out / LOCK, "another sharding"), for_seconds=5):
        with pytest.raises(DirectoryBusyError, match="the shard directory .*shards"):
            write_shards(shard_spec(toy_config(flower_store, clients=2)), out)
    assert (out / shard.STAGING / "client-000").is_dir()
    write_shards(shard_spec(toy_config(flower_store, clients=2)), out)
    assert _names(out) == ["client-000", "client-001", SERVER]


def test_shards_below_a_directory_this_process_holds(flower_store, tmp_path):
    """flower-sim shards into its run directory, which it holds: hold() of a directory below one this process holds
    makes nothing, so write_shards makes --out itself."""
    from fedcache.ownership import hold

    with hold(tmp_path / "run", "the run directory"):
        paths = write_shards(shard_spec(toy_config(flower_store, clients=2)), tmp_path / "run" / "shards.partial")
    assert paths[-1] == tmp_path / "run" / "shards.partial" / SERVER and paths[-1].is_dir()


def test_a_shard_missing_a_file_is_named_as_a_shard_with_a_fix_that_keeps_it_one(sharded, tmp_path):
    """A client shard copied without one of its files: the ClientApp (and a SuperNode's refusal the server logs) said
    the store's advice, to extract the entry again or `fedcache store rm` it, which cannot mend a shard."""
    import shutil

    from fedcache.errors import DamagedEntryError

    _, out = sharded
    for shard, who in ((client_dir(out, 1), "client 1's shard"), (out / SERVER, "the server's shard")):
        copy = tmp_path / shard.name
        shutil.copytree(shard, copy)
        for chunk in copy.glob("entries/*/features/c/0/0"):  # (an entry of no rows is never read)
            chunk.unlink()
        with pytest.raises(DamagedEntryError, match=rf"{who} {copy} is damaged: its features cannot be read .*is missing"
                                                    r"\); copy that directory again from the `fedcache shard` output") as err:
            (load_client if shard.name != SERVER else load_server)(copy)
        assert "store rm" not in str(err.value) and "fedcache extract" not in str(err.value)


def test_another_datasets_text_on_the_backbone_is_neither_checked_nor_copied(flower_store, tmp_path):
    """Every text entry of the backbone was checked and copied whatever its classes: another dataset's, damaged,
    refused the sharding of this one, and intact it went into every shard."""
    import shutil

    from fedcache.store.keys import TextKey

    path = tmp_path / "store.zarr"
    shutil.copytree(flower_store, path)
    store, emb = FeatureStore(path), np.ones((1, 2, 3), np.float32)
    other = [store.put_text(TextKey("tiny-clip-random", "w", classes, ("a photo of {}",), "single"), emb, False)
             for classes in (("x", "y"), ("u", "v"))]
    (path / "text" / other[0] / "embeddings" / "c" / "0" / "0" / "0").unlink()  # damaged: its chunk gone
    out = tmp_path / "shards"
    assert main(["shard", "--store", str(path), "-d", "test-toy", "-b", "tiny-clip-random", "--partition", "dirichlet",
                 "--alpha", "1.0", "--clients", "2", "--seed", "1", "--out", str(out)]) == 0
    shard, _ = open_shard(client_dir(out, 0))
    copied = [a["key"]["classes"] for _, a in shard.text_entries()]
    assert copied and all(classes == list(store.read("test-toy", "train", "tiny-clip-random").class_names)
                          for classes in copied)


def test_shards_of_a_clip_backbone_without_its_text_say_the_extraction_that_stores_it(flower_store, tmp_path):
    """A text method on shards cut from a store whose CLIP text entries were removed said it needs 'a backbone with a
    text tower, e.g. clip-rn50': the shards' backbone has one. They say the extraction that stores its text (into the
    store they were cut from), as a run on the store does, and that command and a sharding again give them the text."""
    import shlex
    import shutil

    from fedcache.federate.text import text_from_info
    from fedcache.store.feature_store import TEXT

    path, clip = tmp_path / "store.zarr", "tiny-clip-random"
    shutil.copytree(flower_store, path)
    store = FeatureStore(path)
    for eid in store.entry_ids(TEXT):
        store.discard(eid, TEXT)

    def shard(out):
        assert main(["shard", "--store", str(path), "-d", "test-toy", "-b", clip, "--partition", "iid", "--clients", "2",
                     "--seed", "1", "--out", str(out)]) == 0
        return load_client(client_dir(out, 0))[0], load_server(out / SERVER)[0]

    command = (f"fedcache extract --store STORE --dataset test-toy --backbones {clip} --splits train --domains dark,light "
               "--random-init")
    for data in shard(tmp_path / "shards"):
        with pytest.raises(ConfigError) as missing:
            text_from_info(data, "clip-zs")
        assert str(missing.value) == (
            f"clip-zs needs class-text embeddings: the shard holds no class-text embeddings of {clip} for the classes of "
            f"test-toy (removed, or never extracted); extract them with `{command}`, which finds the features complete "
            "and stores the text, STORE being the store the shards were cut from; then cut the shards again "
            "(`fedcache shard`)")
    assert main(shlex.split(command.replace("STORE", str(path)))[1:] + ["--workers", "0"]) == 0
    for data in shard(tmp_path / "again"):
        assert text_from_info(data, "clip-zs").shape == (data.n_classes, data.dim)


def _shard_files(out) -> dict:
    """Every file of a sharding's output as bytes, its metadata without the times it was written at."""
    import json

    files = {}
    for p in sorted(q for q in out.rglob("*") if q.is_file() and ".locks" not in q.parts):
        data = p.read_bytes()
        if p.name == "zarr.json":
            meta = json.loads(data)
            for when in ("created_at", "completed_at"):
                meta.get("attributes", {}).pop(when, None)
            data = json.dumps(meta, sort_keys=True).encode()
        files[str(p.relative_to(out))] = data
    return files


@pytest.mark.slow
def test_shards_are_the_same_as_those_cut_from_copied_tables(flower_store, tmp_path, monkeypatch):
    """The first backbone's table (and any other already in its order) is no longer copied to put its rows in their
    own order: every shard, the views and the fused second backbone's included, holds the same bytes."""
    import dataclasses

    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.flower import shard as sharding

    store = tmp_path / "store.zarr"
    shutil.copytree(flower_store, store)
    extract(ExtractConfig(dataset="test-toy", backbones=FUSED, store=store, splits=("train",), views=1, workers=0))

    def shard(out):
        assert main(["shard", "--store", str(store), "-d", "test-toy", "-b", ",".join(FUSED), "--partition", "dirichlet",
                     "--alpha", "1.0", "--clients", "3", "--seed", "1", "--out", str(out)]) == 0
        return _shard_files(out)

    now = shard(tmp_path / "now")
    monkeypatch.setattr(sharding, "_take", lambda t, rows: dataclasses.replace(
        t, features=t.features[rows], labels=t.labels[rows], ids=t.ids[rows], domains=t.domains[rows]))
    copied = shard(tmp_path / "copied")
    assert list(now) == list(copied) and any("features" in f for f in now)
    assert [f for f in now if now[f] != copied[f]] == []


def test_a_sharding_copies_no_table_of_features(tmp_path):
    """A sharding copied the first backbone's table whole to put its rows in the order they were in (at a million
    rows, another table's memory at once; a memory-mapped table's, read into memory), and each client's rows once
    more for its partition record's keys. One float32 table is its file memory-mapped: nothing is copied whole."""
    import tracemalloc

    from fedcache.federate.partitions import PartitionRequest
    from fedcache.flower.shard import ShardSpec
    from fedcache.store.interchange import import_file

    rows, dim, rng = 64000, 256, np.random.default_rng(0)  # 64 MB, 16 chunks: a chunk is read (and checked) at once
    arrays = {f"{s}__{name}": a for s, n in (("train", rows), ("test", rows // 10)) for name, a in (
        ("features", rng.standard_normal((n, dim), dtype=np.float32)), ("labels", rng.integers(0, 4, n)))}
    np.savez(tmp_path / "f.npz", **arrays, classes=np.array('["a", "b", "c", "d"]'))
    import_file(tmp_path / "s.zarr", tmp_path / "f.npz", "big", "enc")
    tracemalloc.start()
    try:
        write_shards(ShardSpec(tmp_path / "s.zarr", "big", ["enc"], PartitionRequest.of("iid", 2, 0)), tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A client's rows' features copied were half of them; the table, all.
    assert peak < arrays["train__features"].nbytes / 4, peak
