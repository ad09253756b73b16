"""Extraction end to end on a tiny dataset and tiny random backbones: resume, keys, views, errors."""
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from fedcache.errors import ConfigError, DeviceError, EntryLockedError, FedcacheError, StoreError
from fedcache.extract.datasets import DatasetOptions
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.store.feature_store import FeatureStore
from fedcache.store.locks import exclusive_lock

REPO = Path(__file__).resolve().parents[2]


def cfg(store, **kw) -> ExtractConfig:
    base = dict(dataset="test-toy", backbones=["tiny-timm-random"], store=store, batch_size=4, chunk_rows=8, workers=0)
    return ExtractConfig(**{**base, **kw})


def all_arrays(store_path) -> dict:
    g = zarr.open_group(str(store_path), mode="r")
    return {eid: (e["features"][:], e["labels"][:], e["ids"][:]) for eid, e in g["entries"].groups()}


@pytest.mark.parametrize("level", ["info", "warning"])
def test_an_extract_says_each_step_once_whatever_the_log_shows(store_path, capsys, monkeypatch, level):
    """With FEDCACHE_LOG=info the command printed a step the runner logged (a device note, the other domains) a
    second time; a step it did not log ("already complete") was in no log."""
    import logging

    from fedcache.cli import main

    extract(cfg(store_path))
    monkeypatch.setenv("FEDCACHE_LOG", level)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a shell: the command's own stderr handler
    assert main(["extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store_path), "--workers", "0",
                 "--batch-size", "4"]) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    line = "tiny-timm-random: its 4 entries of test-toy already complete, nothing to do for them"
    lines = [text for text in said.splitlines() if "already complete" in text and "done in" not in text]
    assert len(lines) == 1 and lines[0].endswith(line), said  # 2 splits x 2 domains, in one line
    assert all(text.startswith("INFO fedcache.extract.runner: ") == (level == "info") for text in lines), said


def test_entries_found_complete_are_said_in_one_line_a_backbone_with_their_count(store_path):
    """A re-run of a finished extraction said "already complete (entry ...), nothing to do" once per entry: dozens of
    lines for a dataset of many domains. One line a backbone now, after its work, with how many of its entries."""
    extract(cfg(store_path, domains=["light"]))
    notes = []
    extract(cfg(store_path, backbones=["tiny-timm-random", "tiny-clip-random"]),
            progress=lambda e: notes.append(e.message) if e.kind == "info" else None)
    assert [n for n in notes if "already complete" in n] == [  # none of tiny-clip-random's: it extracted all 4
        "tiny-timm-random: 2 of its 4 entries of test-toy already complete, nothing to do for them"], notes
    notes.clear()
    extract(cfg(store_path, backbones=["tiny-timm-random", "tiny-clip-random"], splits=("test",), domains=["dark"]),
            progress=lambda e: notes.append(e.message) if e.kind == "info" else None)
    assert [n for n in notes if "already complete" in n] == [
        "tiny-timm-random: its entry of test-toy already complete, nothing to do for it",
        "tiny-clip-random: its entry of test-toy already complete, nothing to do for it"], notes


def test_extract_then_rerun_is_a_noop(store_path):
    first = extract(cfg(store_path))
    assert {r.status for r in first} == {"extracted"} and len(first) == 4  # 2 splits x 2 domains
    again = extract(cfg(store_path))
    assert {r.status for r in again} == {"already complete"}
    table = FeatureStore(store_path).read("test-toy", "train", "tiny-timm-random")
    assert table.features.shape == (60, 96) and table.random_weights
    assert table.domain_names == ("light", "dark") and sorted(set(table.domains)) == [0, 1]


def test_a_split_the_dataset_lacks_is_refused_before_any_image_is_read(store_path, monkeypatch):
    """`--splits train,tset` extracted every domain's train split (minutes) before it reached tset."""
    import fedcache.extract.runner as runner

    monkeypatch.setattr(runner, "load_backbone", lambda *a, **k: pytest.fail("a backbone loaded before the check"))
    with pytest.raises(ConfigError, match=r"^dataset test-toy has no split 'tset' \(did you mean 'test'\?\); its "
                                          r"splits: test, train \(--splits\)$"):
        extract(cfg(store_path, splits=("train", "tset")))


# Over 20 s on a 2-core machine: in make test-slow (CI runs both), so that make test stays under 10 minutes.
@pytest.mark.slow
def test_extracting_again_with_earlier_options_reads_those_features_again(store_path):
    """float32, then float16 (new entries in the same slots), then float32 again: nothing is extracted the third
    time, and runs read the float32 features again (they kept reading the float16 ones)."""
    read = lambda: FeatureStore(store_path).read("test-toy", "train", "tiny-timm-random").features  # noqa: E731
    extract(cfg(store_path, dtype="float32"))
    first = read().copy()
    extract(cfg(store_path, dtype="float16"))
    assert not np.array_equal(read(), first)
    events = []
    reports = extract(cfg(store_path, dtype="float32"), progress=events.append)
    assert {r.status for r in reports} == {"already complete"}
    np.testing.assert_array_equal(read(), first)
    assert any("runs read it again instead of the newer one" in (e.message or "") for e in events)


def test_same_inputs_give_identical_bytes(tmp_path):
    extract(cfg(tmp_path / "a.zarr"))
    extract(cfg(tmp_path / "b.zarr"))
    a, b = all_arrays(tmp_path / "a.zarr"), all_arrays(tmp_path / "b.zarr")
    assert a.keys() == b.keys()
    for eid in a:
        for x, y in zip(a[eid], b[eid]):
            np.testing.assert_array_equal(x, y)


def test_extraction_leaves_the_callers_torch_rng_alone(tmp_path):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    extract(cfg(tmp_path / "s.zarr"))
    assert torch.equal(torch.get_rng_state(), before)


def test_ctrl_c_then_resume_is_bit_identical(tmp_path):
    extract(cfg(tmp_path / "ref.zarr"))
    seen = {"batches": 0}

    def interrupt(event):
        if event.kind == "advance":
            seen["batches"] += 1
            if seen["batches"] == 11:  # entry 1 has 8 batches: stop mid-way through entry 2
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(cfg(tmp_path / "run.zarr"), progress=interrupt)
    store = FeatureStore(tmp_path / "run.zarr")
    assert any(not e.complete for e in store.entries())  # really interrupted mid-entry
    reports = extract(cfg(tmp_path / "run.zarr"))
    assert "already complete" in {r.status for r in reports}
    ref, run = all_arrays(tmp_path / "ref.zarr"), all_arrays(tmp_path / "run.zarr")
    for eid in ref:
        for x, y in zip(ref[eid], run[eid]):
            np.testing.assert_array_equal(x, y)


def test_a_disk_that_fills_mid_entry_says_what_is_left_to_write_and_the_entry_resumes(tmp_path, fake_disk):
    """The disk filled by another process after the entry's check of its space: the line said the whole entry's need
    (all its rows, though two batches were written and kept). What is left now, beside what is free; the same
    extraction then goes on after the kept rows."""
    from fedcache.disk import human
    from fedcache.errors import DiskFullError
    from fedcache.store.writer import entry_bytes

    disk, batches = fake_disk(tmp_path, 1 << 40), []

    def fill_after_two_batches(event):
        batches.extend([event] if event.kind == "advance" else [])
        if len(batches) == 2:
            disk.free = 0

    one = dict(splits=("train",), domains=["light"])  # 30 rows: 4 chunks of 8, batches of 4
    with pytest.raises(DiskFullError) as full:
        extract(cfg(tmp_path / "s.zarr", **one), progress=fill_after_two_batches)
    left = entry_bytes(30 - 8, 0, 96, 2, 4 - 1)  # chunk 0 done, 22 rows of 3 chunks to write
    assert f": it needs about {human(left)} more, 0 B is free there; " in str(full.value), full.value
    assert str(full.value).endswith("the batches written so far are kept, and it continues after them")
    disk.free, notes = 1 << 40, []
    (report,) = extract(cfg(tmp_path / "s.zarr", **one), progress=lambda e: notes.append(e.message))
    assert report.status == "extracted" and report.rows == 22
    assert any("8 of 30 rows kept from an interrupted extraction" in n for n in notes), notes


def _interrupt_after(batches: int):
    """A progress callback that stops the extraction after ``batches`` batches were embedded."""
    seen = {"batches": 0}

    def interrupt(event):
        if event.kind == "advance":
            seen["batches"] += 1
            if seen["batches"] == batches:
                raise KeyboardInterrupt

    return interrupt


def _count_embedded(monkeypatch) -> dict:
    """Rows run through the backbone, per call of _forward."""
    from fedcache.extract import runner

    counted, forward = {"rows": 0}, runner._forward

    def counting(bb, plan, pre, x, ids, domain_index):
        counted["rows"] += len(x)
        return forward(bb, plan, pre, x, ids, domain_index)

    monkeypatch.setattr(runner, "_forward", counting)
    return counted


def test_an_extraction_interrupted_mid_chunk_resumes_after_the_rows_it_wrote(tmp_path, monkeypatch):
    """A domain smaller than a chunk (every entry of digits5-offline) is one chunk: an extraction interrupted in it
    kept nothing, and its re-run embedded the whole domain again. It now resumes after the last batch written, and
    the result is bit-identical to an uninterrupted extraction."""
    extract(cfg(tmp_path / "ref.zarr", chunk_rows=None))
    store = tmp_path / "run.zarr"
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store, chunk_rows=None), progress=_interrupt_after(3))  # 12 of the first entry's 30 rows
    assert [e.n_rows // e.attrs["chunk_rows"] for e in FeatureStore(store).entries()] == [0]  # one chunk, not done
    counted, total = _count_embedded(monkeypatch), sum(e.n_rows for e in FeatureStore(tmp_path / "ref.zarr").entries())
    events = []
    reports = extract(cfg(store, chunk_rows=None), progress=events.append)
    assert counted["rows"] == total - 12 and reports[0].rows == 30 - 12
    said = [e.message for e in events if e.kind == "info" and "resuming" in (e.message or "")]
    assert len(said) == 1 and said[0].endswith(", 12 of 30 rows kept from an interrupted extraction"), said
    ref, run = all_arrays(tmp_path / "ref.zarr"), all_arrays(store)
    assert ref.keys() == run.keys()
    for eid in ref:
        for x, y in zip(ref[eid], run[eid]):
            np.testing.assert_array_equal(x, y)
    assert not list(store.glob("entries/*/done/.rows_kept.*"))  # a finished chunk leaves no record of kept rows


def test_rows_kept_of_a_chunk_whose_bytes_changed_are_written_again(tmp_path, monkeypatch):
    """Nothing stale is reused: rows an interrupted writer recorded, whose bytes no longer match their checksums,
    are computed again from the chunk's start (a resume after them would complete a damaged entry)."""
    extract(cfg(tmp_path / "ref.zarr", chunk_rows=None))
    store = tmp_path / "run.zarr"
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store, chunk_rows=None), progress=_interrupt_after(3))
    (features,) = store.glob("entries/*/features/c/0/0")
    with open(features, "r+b") as fh:  # a byte of row 5
        fh.seek(5 * 96 * 2)
        fh.write(bytes([fh.read(1)[0] ^ 0xFF]))
    counted, total = _count_embedded(monkeypatch), sum(e.n_rows for e in FeatureStore(tmp_path / "ref.zarr").entries())
    extract(cfg(store, chunk_rows=None))
    assert counted["rows"] == total
    ref, run = all_arrays(tmp_path / "ref.zarr"), all_arrays(store)
    for eid in ref:
        for x, y in zip(ref[eid], run[eid]):
            np.testing.assert_array_equal(x, y)


def test_an_extraction_killed_between_a_batchs_rows_and_its_record_redoes_that_batch(tmp_path, monkeypatch):
    """Rows are written before the record that counts them: a writer stopped in between leaves rows past the
    record, which a re-run writes again (it resumes after the rows recorded), bit for bit."""
    from fedcache.store import writer

    extract(cfg(tmp_path / "ref.zarr", chunk_rows=None))
    store, keep, calls = tmp_path / "run.zarr", writer._Files.keep, {"n": 0}

    def killed_at_the_third(self, c, n, crcs):
        calls["n"] += 1
        if calls["n"] == 3:  # the third batch's rows are written, its record not
            raise KeyboardInterrupt
        keep(self, c, n, crcs)

    monkeypatch.setattr(writer._Files, "keep", killed_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store, chunk_rows=None))
    monkeypatch.setattr(writer._Files, "keep", keep)
    (record,) = store.glob("entries/*/done/.rows_kept.0")
    assert np.frombuffer(record.read_bytes(), "<i8")[0] == 8
    counted, total = _count_embedded(monkeypatch), sum(e.n_rows for e in FeatureStore(tmp_path / "ref.zarr").entries())
    extract(cfg(store, chunk_rows=None))
    assert counted["rows"] == total - 8
    ref, run = all_arrays(tmp_path / "ref.zarr"), all_arrays(store)
    assert ref.keys() == run.keys()
    for eid in ref:
        for x, y in zip(ref[eid], run[eid]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("stop_in", ["light", "dark"])  # no entry of view 1 complete; light's complete, dark's not
def test_an_unfinished_views_extraction_is_said_as_one_with_the_command_that_finishes_it(store_path, stop_in, capsys):
    """An `extract --views 2` interrupted in view 1 was 'the train features of test-toy for ... are not complete yet',
    finished with `extract --splits train --domains light (and any other option it was started with)`: that command
    found the plain features complete and left the view unfinished, the train that needs the views refused again.
    `store ls` said 'partial' and no command."""
    from fedcache.cli import main
    from fedcache.errors import IncompleteEntryError
    from fedcache.federate.tables import load_views

    extract(cfg(store_path))
    label = {"now": ""}

    def interrupt(event):
        label["now"] = event.label if event.kind == "start" else label["now"]
        if event.kind == "advance" and label["now"] == f"test-toy/train/{stop_in} tiny-timm-random view 1":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, splits=("train",), views=2), progress=interrupt)
    store = FeatureStore(store_path)
    train = store.read("test-toy", "train", "tiny-timm-random")
    with pytest.raises(IncompleteEntryError) as unfinished:
        load_views(store, "test-toy", ["tiny-timm-random"], train)  # what a train on the views reads
    finish = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-timm-random --splits train "
              "--views 2 --random-init")
    assert str(unfinished.value) == (
        f"augmented view 1 of the train features of test-toy{'' if stop_in == 'light' else '/dark'} for "
        f"tiny-timm-random is not complete yet (an `extract --views` interrupted or still running); finish the views "
        f"with `{finish}`")
    capsys.readouterr()
    assert main(["store", "ls", "--store", str(store_path)]) == 0
    assert f"1 partial entry (an extraction or import interrupted, or still running): finish it with `{finish}`" in " ".join(
        capsys.readouterr().out.split())
    extract(cfg(store_path, splits=("train",), views=2))  # the command said (chunk sizes are the entries' own)
    assert load_views(store, "test-toy", ["tiny-timm-random"], train).shape == (60, 2, 96)


def test_a_plain_extraction_names_an_unfinished_views_extraction_and_the_command_that_finishes_it(store_path):
    """A plain `extract` (no --views) over an `extract --views 2` interrupted found its own entries complete and said
    nothing of the views it left unfinished, which a train on them then refused. It says them, with their command."""
    notes = []

    def interrupt(event):
        if event.kind == "start" and event.label == "test-toy/train/dark tiny-timm-random view 1":
            raise KeyboardInterrupt

    def said(event):
        notes.extend([event.message] if event.kind == "info" else [])

    extract(cfg(store_path), progress=said)
    assert not [n for n in notes if "not complete" in n]  # no views begun: nothing said of them
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, splits=("train",), views=2), progress=interrupt)
    notes.clear()
    extract(cfg(store_path), progress=said)
    finish = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-timm-random --splits train "
              "--views 2 --random-init")
    assert notes[-1] == ("augmented view 1 of the train features of test-toy/dark for tiny-timm-random is not complete "
                         "yet (an `extract --views` interrupted or still running); finish the views with "
                         f"`{finish}`")
    extract(cfg(store_path, splits=("train",), views=2))  # the command said
    notes.clear()
    extract(cfg(store_path), progress=said)
    assert not [n for n in notes if "not complete" in n]


def test_views_left_unfinished_for_several_backbones_are_said_once_with_one_command(store_path):
    """A plain extraction of two backbones whose `extract --views` were both interrupted said the same line twice, a
    command each; one command (`--backbones a,b`) finishes both, said once, after the backbones' work."""
    from fedcache.federate.tables import load_views

    both, train = ["tiny-timm-random", "tiny-clip-random"], ("train",)
    extract(cfg(store_path, backbones=both, splits=train))
    for backbone in both:
        def interrupt(event, backbone=backbone):
            if event.kind == "start" and event.label == f"test-toy/train/dark {backbone} view 1":
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            extract(cfg(store_path, backbones=[backbone], splits=train, views=2), progress=interrupt)
    notes = []
    extract(cfg(store_path, backbones=both, splits=train),
            progress=lambda e: notes.extend([e.message] if e.kind == "info" else []))
    finish = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-timm-random,tiny-clip-random "
              "--splits train --views 2 --random-init")
    assert [n for n in notes if "not complete" in n] == [
        "augmented view 1 of the train features of test-toy/dark for tiny-timm-random,tiny-clip-random is not complete "
        f"yet (an `extract --views` interrupted or still running); finish the views with `{finish}`"], notes
    assert notes[-1].endswith(f"`{finish}`")  # after both backbones' own lines
    extract(cfg(store_path, backbones=both, splits=train, views=2))  # the command said
    store = FeatureStore(store_path)
    table = store.read("test-toy", "train", "tiny-timm-random")
    assert load_views(store, "test-toy", both, table).shape[:2] == (60, 2)


def test_a_view_of_some_domains_only_is_said_with_the_domains_that_lack_it(store_path):
    """Views extracted for one domain (`extract --views 1 --domains light`) were left out without a word: a method
    training on views then said it found 0. The domains that lack the view are named, with the command that
    completes it."""
    from fedcache.errors import EntryNotFoundError
    from fedcache.federate.tables import load_views

    extract(cfg(store_path))
    extract(cfg(store_path, splits=("train",), views=1, domains=("light",)))
    store = FeatureStore(store_path)
    train = store.read("test-toy", "train", "tiny-timm-random")
    with pytest.raises(EntryNotFoundError) as partial:
        load_views(store, "test-toy", ["tiny-timm-random"], train)
    complete = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-timm-random --splits train "
                "--views 1 --random-init")
    assert str(partial.value) == ("augmented view 1 of the train features of test-toy for tiny-timm-random is of "
                                  f"light only (dark lack it); complete it with `{complete}`")
    extract(cfg(store_path, splits=("train",), views=1))  # the command said
    assert load_views(store, "test-toy", ["tiny-timm-random"], train).shape == (60, 1, 96)


def test_a_view_extracted_for_one_fused_backbone_only_is_said_with_the_backbone_that_lacks_it(store_path):
    """`extract --views 2` run for one of two fused backbones: the views' loop stopped at the other's missing view 1
    and checked only the backbones that held it, so a method training on views found none, without a word. The
    backbone that lacks the view is named, with the extraction that makes it for it (its own --image-size)."""
    from fedcache.errors import EntryNotFoundError
    from fedcache.federate.tables import load_fused, load_views

    both = ["tiny-timm-random", "tiny-clip-random"]
    extract(cfg(store_path, backbones=both, splits=("train",)))
    extract(cfg(store_path, splits=("train",), views=2))  # tiny-timm-random's alone
    store = FeatureStore(store_path)
    make = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-clip-random --splits train "
            "--views 2 --random-init")
    for fused in (both, both[::-1]):  # whichever comes first
        train = load_fused(store, "test-toy", fused, "train")
        with pytest.raises(EntryNotFoundError) as lacking:
            load_views(store, "test-toy", fused, train)
        assert str(lacking.value) == ("augmented view 1 of the train features of test-toy is extracted for "
                                      "tiny-timm-random but not for tiny-clip-random (fused backbones train on the "
                                      f"views of each); extract it with `{make}`")
    extract(cfg(store_path, backbones=["tiny-clip-random"], splits=("train",), views=2))  # the command said
    train = load_fused(store, "test-toy", both, "train")
    assert load_views(store, "test-toy", both, train).shape == (60, 2, train.features.shape[1])


# Over 20 s on a 2-core machine: in make test-slow (CI runs both), so that make test stays under 10 minutes.
@pytest.mark.slow
def test_a_view_made_with_another_seed_for_one_fused_backbone_is_refused_with_the_command_that_remakes_it(store_path):
    """`extract --views 2` of two fused backbones, then of one of them again with another --view-seed: view k of
    one and view k of the other were fused unchecked, each row joining two different augmentations of its image.
    Refused, naming the backbones, the view and what differs, with the extraction that makes it alike; once run,
    the views are read (the shards' too: `fedcache shard` of a views method refuses them as a run does)."""
    from fedcache.federate.tables import load_fused, load_views
    from fedcache.federate.partitions import PartitionRequest
    from fedcache.flower.shard import ShardSpec, write_shards

    both = ["tiny-timm-random", "tiny-clip-random"]
    extract(cfg(store_path, backbones=both, views=2))  # the test split too: a sharding reads it
    extract(cfg(store_path, backbones=["tiny-clip-random"], splits=("train",), views=2, view_seed=3))
    store = FeatureStore(store_path)
    train = load_fused(store, "test-toy", both, "train")
    make = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-clip-random --splits train "
            "--views 2 --random-init")
    with pytest.raises(StoreError) as differ:
        load_views(store, "test-toy", both, train)
    assert str(differ.value) == (
        "augmented view 1 of the train features of test-toy/light was made with --view-seed 0 for tiny-timm-random but "
        "--view-seed 3 for tiny-clip-random (fused backbones join each image's view 1: these would be different "
        f"augmentations of it); re-extract it for tiny-clip-random as for tiny-timm-random with `{make}`")
    spec = ShardSpec(store_path, "test-toy", both, PartitionRequest.of("iid", 2, 0), views=True)
    with pytest.raises(StoreError, match=re.escape(str(differ.value))):
        write_shards(spec, store_path.parent / "shards")
    extract(cfg(store_path, backbones=["tiny-clip-random"], splits=("train",), views=2))  # the command said
    assert load_views(store, "test-toy", both, train).shape == (60, 2, train.features.shape[1])


# Over 20 s on a 2-core machine: in make test-slow (CI runs both), so that make test stays under 10 minutes.
@pytest.mark.slow
def test_a_view_made_with_another_seed_for_some_domains_of_one_backbone_is_refused_with_the_command(store_path):
    """`extract --views 2`, then `extract --views 2 --domains dark --view-seed 1`: the table of view 1 took light's
    crops of seed 0 beside dark's of seed 1 unchecked (only fused backbones were compared). Refused in one line,
    naming the view, the domains and what differs, with the extraction that makes every domain alike; once run, the
    views are read."""
    from fedcache.federate.tables import load_views

    extract(cfg(store_path))
    extract(cfg(store_path, splits=("train",), views=2))
    extract(cfg(store_path, splits=("train",), views=2, domains=("dark",), view_seed=1))
    store = FeatureStore(store_path)
    train = store.read("test-toy", "train", "tiny-timm-random")
    make = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-timm-random --splits train "
            "--views 2 --view-seed 1 --random-init")
    with pytest.raises(StoreError) as mixed:
        load_views(store, "test-toy", ["tiny-timm-random"], train)
    assert str(mixed.value) == (
        "augmented view 1 of the train features of test-toy for tiny-timm-random was made with --view-seed 0 for "
        "light but --view-seed 1 for dark (one view of its domains: these would be different augmentations); "
        f"re-extract every domain as dark was with `{make}`")
    extract(cfg(store_path, splits=("train",), views=2, view_seed=1))  # the command said
    assert load_views(store, "test-toy", ["tiny-timm-random"], train).shape == (60, 2, 96)


def test_an_unfinished_view_after_complete_ones_refuses_a_views_run_in_one_line(store_path, capsys):
    """`extract --views 2` interrupted in view 2, view 1 complete: a run on view 1 alone would train on fewer views
    than were asked for, without a word. `train` with a method that trains on views refuses in one line naming
    view 2 and the command that finishes it, no traceback; once finished, it trains on both."""
    from fedcache.cli import main
    from fedcache.errors import IncompleteEntryError
    from fedcache.federate.tables import load_views

    def interrupt(event):
        if event.kind == "start" and event.label == "test-toy/train/dark tiny-timm-random view 2":
            raise KeyboardInterrupt

    extract(cfg(store_path))
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, splits=("train",), views=2), progress=interrupt)
    store = FeatureStore(store_path)
    train = store.read("test-toy", "train", "tiny-timm-random")
    finish = (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-timm-random --splits train "
              "--views 2 --random-init")
    said = ("augmented view 2 of the train features of test-toy/dark for tiny-timm-random is not complete yet (an "
            f"`extract --views` interrupted or still running); finish the views with `{finish}`")
    with pytest.raises(IncompleteEntryError, match=re.escape(said)):
        load_views(store, "test-toy", ["tiny-timm-random"], train)
    argv = ["train", "--store", str(store_path), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg-ssl",
            "--rounds", "1", "--out", str(store_path.parent / "run")]
    capsys.readouterr()
    code, err = main(argv), capsys.readouterr().err
    assert code == 1 and " ".join(err.split()) == f"error: {said}", err  # one line, wrapped at most
    extract(cfg(store_path, splits=("train",), views=2))  # the command said
    assert load_views(store, "test-toy", ["tiny-timm-random"], train).shape == (60, 2, 96)


KILL_SCRIPT = """
import sys, time
sys.path.insert(0, {repo!r})
import torch
import tests.conftest  # registers test-toy
from fedcache.extract.runner import ExtractConfig, extract
torch.set_num_threads({threads})  # the parent's count: a conv's float32 sums depend on the thread split
def slow(event):
    if event.kind == "advance":
        time.sleep(0.15)
extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store={store!r},
                      batch_size=4, chunk_rows=8, workers=0), progress=slow)
"""


@pytest.mark.slow
def test_kill_9_then_resume_is_bit_identical(tmp_path):
    extract(cfg(tmp_path / "ref.zarr"))
    store = tmp_path / "run.zarr"
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT.format(repo=str(REPO), store=str(store), threads=torch.get_num_threads())))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO)
    try:
        _wait_for_some_chunks(store, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    fs = FeatureStore(store)
    assert any(not e.complete for e in fs.entries())
    extract(cfg(store))
    ref, run = all_arrays(tmp_path / "ref.zarr"), all_arrays(store)
    assert ref.keys() == run.keys()
    for eid in ref:
        for x, y in zip(ref[eid], run[eid]):
            np.testing.assert_array_equal(x, y)


def _wait_for_some_chunks(store: Path, proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the extraction finished before it could be killed"
        done = list(store.glob("entries/*/done/c/*"))
        if len(done) >= 3:  # first entry (4 chunks) part-way or done, second not
            return
        time.sleep(0.05)
    raise AssertionError("no chunk was written in time")


def test_changed_weights_or_preprocessing_make_new_entries(store_path, tmp_path):
    extract(cfg(store_path, splits=("test",), domains=["light"]))
    extract(cfg(store_path, splits=("test",), domains=["light"], image_size=24))
    ckpt = _changed_checkpoint(tmp_path / "changed.pth")
    extract(cfg(store_path, splits=("test",), domains=["light"], weights={"tiny-timm-random": ckpt}))
    store = FeatureStore(store_path)
    entries = store.entries()
    assert len(entries) == 3 and len({e.key["weights_hash"] for e in entries}) == 2
    assert len(store.stale()) == 2  # only the newest one is read
    newest = store.read("test-toy", "test", "tiny-timm-random", domains=["light"])
    assert newest.entry_ids[0] == max(entries, key=lambda e: e.completed_at).entry_id
    assert not newest.random_weights  # the user's checkpoint replaced the random init


def test_reader_refuses_to_mix_domains_made_by_different_weights(store_path):
    extract(cfg(store_path, splits=("test",)))
    extract(cfg(store_path, splits=("test",), domains=["light"], image_size=24))
    with pytest.raises(StoreError, match=r"different weights, preprocessing or imported files \(light extracted \(\w+\), "
                                         r"dark extracted \(\w+\)\): they differ in size: \d+ in dark, 24 in light "
                                         r"\(the newest\); re-run `fedcache extract"):
        FeatureStore(store_path).read("test-toy", "test", "tiny-timm-random")


def test_views_are_seeded_and_differ_from_plain(store_path):
    extract(cfg(store_path, views=2, domains=["light"], splits=("train",)))
    store = FeatureStore(store_path)
    plain = store.read("test-toy", "train", "tiny-timm-random", domains=["light"]).features
    v1 = store.read("test-toy", "train", "tiny-timm-random", view=1, domains=["light"]).features
    v2 = store.read("test-toy", "train", "tiny-timm-random", view=2, domains=["light"]).features
    assert not np.allclose(plain, v1) and not np.allclose(v1, v2)
    e = [x for x in store.entries() if x.key["view"] == 1][0]
    assert e.key["augmentation"] == {"recipe": "simclr", "seed": 0}
    # Same seed again (in another store, with workers): the same views.
    other = store_path.parent / "other.zarr"
    extract(cfg(other, views=2, domains=["light"], splits=("train",), workers=2))
    np.testing.assert_array_equal(v1, FeatureStore(other).read("test-toy", "train", "tiny-timm-random", view=1, domains=["light"]).features)


def test_clip_text_embeddings_are_stored(store_path):
    extract(cfg(store_path, backbones=["tiny-clip-random"], splits=("test",)))
    store = FeatureStore(store_path)
    single = store.read_text("tiny-clip-random", ["red", "green", "blue"], "single")
    ens = store.read_text("tiny-clip-random", ["red", "green", "blue"], "ensemble")
    assert single.shape == (1, 3, 32) and ens.shape[0] > 1 and ens.shape[1:] == (3, 32)
    np.testing.assert_allclose(single[0], ens[0], rtol=1e-5)  # the single template leads the ensemble


def test_cuda_without_gpu_is_a_clear_error(store_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        extract(cfg(store_path, device="cuda"))


def test_bad_config_errors(store_path):
    with pytest.raises(ConfigError, match="no domain"):
        extract(cfg(store_path, domains=["nope"]))
    with pytest.raises(ConfigError, match="dtype"):
        extract(cfg(store_path, dtype="int8"))


def test_concurrent_writer_of_same_entry_is_refused(store_path):
    from fedcache.extract.loading import load_backbone
    from fedcache.extract.runner import entry_key
    from fedcache.extract.loading import load_dataset
    from fedcache.extract.transforms import ViewSpec

    c = cfg(store_path, splits=("test",), domains=["light"])
    ds = load_dataset("test-toy", DatasetOptions())
    k = entry_key(c, ds, ds.samples("test", "light"), load_backbone("tiny-timm-random"), "test", "light", ViewSpec())
    lock = store_path / ".locks" / f"{k.entry_id}.part0of1.lock"
    FeatureStore(store_path)
    with exclusive_lock(lock, "held by the test"):
        with pytest.raises(EntryLockedError, match="another process"):
            extract(c)
    assert {r.status for r in extract(c)} == {"extracted"}


def test_image_noise_is_seeded_recorded_in_the_key_and_on_the_training_split_only(tmp_path):
    noisy = cfg(tmp_path / "n.zarr", splits=("train", "test"), domains=["light"], image_noise=("laplace", 0.2, 0.1))
    extract(noisy)
    extract(replace(noisy, store=tmp_path / "n2.zarr", batch_size=2, chunk_rows=4))  # other batching: same noise
    extract(cfg(tmp_path / "n.zarr", splits=("train", "test"), domains=["light"]))
    store = FeatureStore(tmp_path / "n.zarr")
    assert {e.key["dataset"] for e in store.entries()} == {"test-toy", "test-toy-noise-laplace-0.2-0.1"}
    keys = {(e.key["dataset"], e.key["split"]): (e.entry_id, e.key["preprocess"].get("noise")) for e in store.entries()}
    assert keys["test-toy-noise-laplace-0.2-0.1", "train"][1] == {"kind": "laplace", "scale": 0.2, "perturb": 0.1, "seed": 0}
    assert [n for (ds, split), (_, n) in keys.items() if (ds, split) != ("test-toy-noise-laplace-0.2-0.1", "train")] == [None] * 3
    noisy_id = keys["test-toy-noise-laplace-0.2-0.1", "train"][0]
    a = zarr.open_group(str(tmp_path / "n.zarr"))["entries"][noisy_id]["features"][:]
    b = zarr.open_group(str(tmp_path / "n2.zarr"))["entries"][noisy_id]["features"][:]
    np.testing.assert_allclose(a, b, atol=2e-3)  # float16 storage; batch size changes only rounding
    plain = store.read("test-toy", "train", "tiny-timm-random", domains=["light"]).features
    assert not np.allclose(a.astype(np.float32), plain, atol=1e-2)
    # The test images of the noisy dataset are the clean ones (FedPCL Table 15 evaluates on clean images).
    clean_test = store.read("test-toy", "test", "tiny-timm-random", domains=["light"]).features
    np.testing.assert_allclose(store.read("test-toy-noise-laplace-0.2-0.1", "test", "tiny-timm-random", domains=["light"]).features,
                               clean_test, atol=2e-3)


def test_the_command_that_completes_a_noisy_dataset_names_the_dataset_fedcache_knows(tmp_path):
    """A noisy dataset's entries are stored as `test-toy-noise-laplace-0.2-0.1`: the extraction hinted for its missing
    domains said `--dataset test-toy-noise-laplace-0.2-0.1`, which no registry knows. The hint is a command that works."""
    import shlex

    from fedcache.cli import main
    from fedcache.errors import EntryNotFoundError

    store_path = tmp_path / "n.zarr"
    extract(cfg(store_path, domains=["light"], image_noise=("laplace", 0.2, 0.1)))
    with pytest.raises(EntryNotFoundError) as missing:
        FeatureStore(store_path).read("test-toy-noise-laplace-0.2-0.1", "train", "tiny-timm-random")
    hint = str(missing.value).split("`")[1]
    assert " --dataset test-toy --name test-toy-noise-laplace-0.2-0.1 --image-noise laplace,0.2,0.1 " in hint
    assert main(shlex.split(hint)[1:] + ["--workers", "0"]) == 0
    assert FeatureStore(store_path).read("test-toy-noise-laplace-0.2-0.1", "train", "tiny-timm-random").domain_names == ("light", "dark")


def test_a_dataset_stored_under_a_name_of_some_domains_is_read_and_made_again_as_those(tmp_path):
    """`--domains light --name toy-light` stores a dataset of light alone: its entries named every domain of test-toy,
    so reading it wanted dark, and every hint (a split it lacks, a backbone it lacks) extracted all domains, or
    named toy-light as the dataset. Each hint, pasted, makes light alone, under that name, and the table reads."""
    from fedcache.cli import main
    from fedcache.errors import EntryNotFoundError

    store_path = tmp_path / "s.zarr"
    extract(cfg(store_path, splits=("train",), domains=["light"], name="toy-light"))
    assert FeatureStore(store_path).read("toy-light", "train", "tiny-timm-random").domain_names == ("light",)
    for backbone in ("tiny-timm-random", "tiny-clip-random"):  # its test split; another backbone
        with pytest.raises(EntryNotFoundError) as missing:
            FeatureStore(store_path).read("toy-light", "test", backbone)
        hint = shlex.split(str(missing.value).split("`")[1])
        said = dict(zip(hint[2::2], hint[3::2]))
        assert (said["--dataset"], said["--name"], said["--domains"]) == ("test-toy", "toy-light", "light"), hint
        assert main(hint[1:] + ["--workers", "0"]) == 0
        assert FeatureStore(store_path).read("toy-light", "test", backbone).domain_names == ("light",)


FOUR = ("light", "dark", "pale", "deep")


@pytest.fixture
def toy4(monkeypatch) -> str:
    """test-toy with four domains (pale and deep repeat light's and dark's images), registered for this test only."""
    from fedcache.extract.datasets import DATASETS, Dataset, DatasetSpec

    toy = DATASETS.get("test-toy")

    def load(options):
        two = toy.load(options)
        splits = {(s, d): two.splits[(s, two.domains[i % 2])] for s in ("train", "test") for i, d in enumerate(FOUR)}
        return Dataset("test-toy4", two.classes, FOUR, splits, default_image_size=two.default_image_size)

    monkeypatch.setitem(DATASETS._items, "test-toy4", DatasetSpec("test-toy4", "four domains", "embedded", load,
                                                                   toy.classes, FOUR, default_image_size=32))
    return "test-toy4"


def test_a_runs_missing_domains_are_made_by_one_command_of_every_split_it_lacks(tmp_path, toy4):
    """A store of two domains of four, both splits: a run's read (train, then test) said `--splits train --domains
    ...`, and once that ran, the same of the test split: two extractions (torch and the dataset loaded twice). The
    command said makes both splits; pasted once, the run reads. The other way on, a --name of the domains held,
    works too."""
    from fedcache.cli import main
    from fedcache.errors import EntryNotFoundError
    from fedcache.federate.tables import load_splits

    store_path = tmp_path / "s.zarr"
    extract(cfg(store_path, dataset=toy4, domains=["light", "dark"]))
    with pytest.raises(EntryNotFoundError) as missing:
        load_splits(FeatureStore(store_path), toy4, ["tiny-timm-random"])
    said = str(missing.value)
    assert said.startswith("the store has no train features of test-toy4/pale,deep for tiny-timm-random; run "), said
    commands = [shlex.split(c) for c in said.split("`")[1::2]]
    assert commands[0][1:] == ["extract", "--store", str(store_path), "--dataset", toy4, "--backbones", "tiny-timm-random",
                        "--splits", "train,test", "--domains", "deep,pale", "--random-init"]
    make, named = commands
    assert named[named.index("--name") + 1] == "test-toy4-light-dark" and said.endswith("and run on test-toy4-light-dark")
    assert main(named[1:] + ["--workers", "0"]) == 0
    train, test = load_splits(FeatureStore(store_path), "test-toy4-light-dark", ["tiny-timm-random"])
    assert train.domain_names == test.domain_names == ("light", "dark")
    assert main(make[1:] + ["--workers", "0"]) == 0
    train, test = load_splits(FeatureStore(store_path), toy4, ["tiny-timm-random"])
    assert train.domain_names == test.domain_names == FOUR


def test_a_store_lacking_a_whole_split_beside_missing_domains_is_made_by_one_command(tmp_path, toy4):
    """Two domains of the train split only: the command makes the test split of every domain too (an extraction
    finds the train entries it holds complete)."""
    from fedcache.cli import main
    from fedcache.errors import EntryNotFoundError
    from fedcache.federate.tables import load_splits

    store_path = tmp_path / "s.zarr"
    extract(cfg(store_path, dataset=toy4, domains=["light", "dark"], splits=("train",)))
    with pytest.raises(EntryNotFoundError) as missing:
        load_splits(FeatureStore(store_path), toy4, ["tiny-timm-random"])
    make = shlex.split(str(missing.value).split("`")[1])
    assert make[make.index("--splits") + 1:make.index("--domains") + 2] == ["train,test", "--domains", "dark,deep,light,pale"]
    assert main(make[1:] + ["--workers", "0"]) == 0
    train, test = load_splits(FeatureStore(store_path), toy4, ["tiny-timm-random"])
    assert train.domain_names == test.domain_names == FOUR


def test_extracting_some_domains_says_a_run_reads_every_domain_and_the_ways_on(tmp_path, toy4):
    """`extract --domains` of some domains, no --name, succeeded in silence; every run on the dataset was then refused
    for the others. It says so at once, with the run's own words and both ways on; not where the store holds the
    others, nor for a --name (a dataset of those domains)."""
    store_path = tmp_path / "s.zarr"
    notes = []
    said = lambda e: notes.append(e.message) if e.kind == "info" else None  # noqa: E731
    extract(cfg(store_path, dataset=toy4, domains=["light", "dark"]), progress=said)
    told = [n for n in notes if "every domain" in n]
    assert told == [f"a run on test-toy4 reads every domain of it: the store has no train features of "
                    f"test-toy4/pale,deep for tiny-timm-random; run `fedcache extract --store {store_path} --dataset "
                    "test-toy4 --backbones tiny-timm-random --splits train,test --domains deep,pale --random-init`, or "
                    f"store light,dark as a dataset of its own with `fedcache extract --store {store_path} --dataset "
                    "test-toy4 --name test-toy4-light-dark --domains light,dark --backbones tiny-timm-random --splits "
                    "train,test --random-init` and run on test-toy4-light-dark"]
    for quiet in (dict(domains=["pale", "deep"]), dict(domains=["light"], name="toy4-light")):
        notes.clear()
        extract(cfg(store_path, dataset=toy4, **quiet), progress=said)
        assert not [n for n in notes if "every domain" in n], notes


def test_some_domains_of_several_backbones_say_a_run_reads_every_domain_once(tmp_path):
    """`-b a,b --domains light` said "a run reads every domain" once per backbone, the same line with each name: once
    now, whose command (`--backbones a,b`) makes what both lack. A path that holds a backbone's name stays as it is."""
    store_path = tmp_path / "tiny-timm-random" / "s.zarr"
    notes = []
    extract(cfg(store_path, backbones=["tiny-timm-random", "tiny-clip-random"], domains=["light"]),
            progress=lambda e: notes.append(e.message) if e.kind == "info" else None)
    (told,) = [n for n in notes if "every domain" in n]
    assert "test-toy/dark for tiny-timm-random,tiny-clip-random; run `" in told, told
    commands = [shlex.split(c) for c in told.split("`")[1::2]]
    assert [c[c.index("--backbones") + 1] for c in commands] == ["tiny-timm-random,tiny-clip-random"] * 2, told
    assert all(c[c.index("--store") + 1] == str(store_path) for c in commands), told


def test_the_name_that_stores_some_domains_reads_them_as_they_were_read(tmp_path, toy4):
    """The other way on, the domains as a dataset of their own (--name), left out the options the images were read
    with (--seed, --data-root, --path), which the extraction of the others beside it said: another seeded split of
    them, or no images at all."""
    notes = []
    said = lambda e: notes.append(e.message) if e.kind == "info" else None  # noqa: E731
    extract(cfg(tmp_path / "s.zarr", dataset=toy4, domains=["light", "dark"], dataset_options=DatasetOptions(seed=3)),
            progress=said)
    (told,) = [n for n in notes if "every domain" in n]
    others, named = [shlex.split(c) for c in told.split("`")[1::2]]
    assert named[named.index("--name") + 1] == "test-toy4-light-dark", told
    assert others[others.index("--seed") + 1] == named[named.index("--seed") + 1] == "3", told


def test_extracting_some_domains_of_one_split_says_the_extraction_a_run_needs(tmp_path, toy4):
    """`extract --domains light,dark --splits train`: its line named `--splits train`, and a run, which reads the train
    and test splits, was then refused for the test split. It names both, and pasted, a run reads every domain."""
    from fedcache.cli import main
    from fedcache.federate.tables import load_splits

    store_path = tmp_path / "s.zarr"
    notes = []
    extract(cfg(store_path, dataset=toy4, domains=["light", "dark"], splits=("train",)),
            progress=lambda e: notes.append(e.message) if e.kind == "info" else None)
    (told,) = [n for n in notes if "every domain" in n]
    command, named = (shlex.split(c) for c in told.split("`")[1::2])
    assert dict(zip(command[2::2], command[3::2]))["--splits"] == "train,test", told
    assert dict(zip(named[2::2], named[3::2]))["--splits"] == "train,test", told
    assert main(command[1:] + ["--workers", "0"]) == 0
    train, test = load_splits(FeatureStore(store_path), "test-toy4", ["tiny-timm-random"])
    assert train.domain_names == test.domain_names == FOUR


@pytest.mark.parametrize("first,then", [(["light"], ["light", "dark"]), (["light", "dark"], ["light"]),
                                         (["light"], None)])
def test_a_name_extracted_again_with_other_domains_is_refused_before_any_work(tmp_path, first, then):
    """A --name grown by a later --domains made entries recording other domains than its first ones, and every read
    of it raised a bare ValueError; one shrunk found the others complete and went on reading them. Refused in one
    line naming both, with the `store rm` that frees the name; pasted, the same extraction makes the name anew."""
    from fedcache.cli import main

    store_path = tmp_path / "s.zarr"
    extract(cfg(store_path, domains=first, name="Y"))
    ids = {e.entry_id for e in FeatureStore(store_path).entries()}
    with pytest.raises(ConfigError) as refused:
        extract(cfg(store_path, domains=then, name="Y"))
    asked = f"--domains {','.join(then)}" if then else "without --domains"
    said = str(refused.value)
    assert said.startswith(f"--name Y {asked} makes a dataset of {','.join(then or ['light', 'dark'])}, but the store's "
                           f"entries of Y are of {','.join(first)} ") and "\n" not in said, said
    assert {e.entry_id for e in FeatureStore(store_path).entries()} == ids  # nothing made
    rm = shlex.split(said.split("`")[1])
    assert set(rm[5:]) == ids and main(rm[1:]) == 0
    extract(cfg(store_path, domains=then, name="Y"))
    for split in ("train", "test"):
        assert FeatureStore(store_path).read("Y", split, "tiny-timm-random").domain_names == tuple(then or ["light", "dark"])


def test_a_table_names_its_domains_as_its_newest_entry_does(store_path):
    """Entries of one table recording other domains (a --name grown before that was refused): the domains a read wants
    were its newest entry's, the names it gave rows its first entry's, and the read raised a bare ValueError."""
    extract(cfg(store_path, domains=["light", "dark"], name="Y", splits=("train",)))
    light = next(e for e in FeatureStore(store_path).entries() if e.key["domain"] == "light")
    zarr.open_group(str(store_path / "entries" / light.entry_id), mode="r+").attrs["domains"] = ["light"]
    table = FeatureStore(store_path).read("Y", "train", "tiny-timm-random")
    assert table.domain_names == ("light", "dark") and set(np.unique(table.domains)) == {0, 1}


@pytest.mark.parametrize("noise", [None, ("gaussian", 0.1, 0.5)])
def test_a_name_extracted_before_its_domains_were_recorded_is_made_again_as_its_entries_hold(tmp_path, noise):
    """Entries of `--name X --domains light` made before made_from recorded the domains name every domain: the hint
    extracted `--name X --domains dark`, which made X of dark alone and dropped light. It says to remove them and
    extract again with the domains X holds; both pasted, X reads light as before. A --name given with --image-noise
    was taken for the noisy dataset's own name, and hinted the extraction of X of dark alone (which is refused)."""
    from fedcache.cli import main
    from fedcache.errors import EntryNotFoundError
    from fedcache.federate.tables import load_splits

    store_path = tmp_path / "s.zarr"
    extract(cfg(store_path, domains=["light"], name="X", image_noise=noise))
    for eid, e in zarr.open_group(str(store_path), mode="r+")["entries"].groups():  # as an older fedcache made them
        made = dict(e.attrs["made_from"])
        del made["domains"]
        e.attrs.update({"made_from": made, "domains": ["light", "dark"]})
    with pytest.raises(EntryNotFoundError) as missing:
        load_splits(FeatureStore(store_path), "X", ["tiny-timm-random"])
    said = str(missing.value)
    assert "X was extracted under --name before fedcache recorded its --domains" in said and "\n" not in said, said
    rm, again = (shlex.split(c) for c in said.split("`")[1::2])
    assert main(rm[1:]) == 0 and main(again[1:] + ["--workers", "0"]) == 0
    options = dict(zip(again[2::2], again[3::2]))
    assert options["--domains"] == "light" and options.get("--image-noise") == (noise and "gaussian,0.1,0.5"), again
    train, test = load_splits(FeatureStore(store_path), "X", ["tiny-timm-random"])
    assert train.domain_names == test.domain_names == ("light",)


def test_an_unfinished_name_extracted_before_its_domains_were_recorded_is_finished_by_a_command_that_runs(store_path):
    """An unfinished entry of `--name X --domains light` made before made_from recorded the domains (its entries name
    every domain): the hint said `--name X ... --domains light`, which the extraction refuses (the entries record
    light,dark). The command it says now runs, and X reads the domains its entries record."""
    from fedcache.cli import main
    from fedcache.errors import IncompleteEntryError

    def stop(event):
        if event.kind == "advance":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, domains=["light"], name="X", splits=("train",)), progress=stop)
    for eid, e in zarr.open_group(str(store_path), mode="r+")["entries"].groups():  # as an older fedcache made them
        made = dict(e.attrs["made_from"])
        del made["domains"]
        e.attrs.update({"made_from": made, "domains": ["light", "dark"]})
    with pytest.raises(IncompleteEntryError) as unfinished:
        FeatureStore(store_path).read("X", "train", "tiny-timm-random")
    said = str(unfinished.value)
    (finish,) = (shlex.split(c) for c in said.split("`")[1::2])
    assert main(finish[1:] + ["--workers", "0"]) == 0, said
    assert FeatureStore(store_path).read("X", "train", "tiny-timm-random").domain_names == ("light", "dark")


def test_a_hint_says_the_image_size_only_where_it_is_not_the_default(tmp_path):
    """Every hint said --image-size: an entry of the dataset's (else the backbone's) default size is made again
    without it; one of another size keeps it, which the default would not make."""
    from fedcache.errors import EntryNotFoundError

    for size, said in ((None, ""), (32, ""), (16, " --image-size 16")):
        store_path = tmp_path / f"{size}.zarr"
        extract(cfg(store_path, splits=("train",), domains=["light"], image_size=size))
        with pytest.raises(EntryNotFoundError) as missing:
            FeatureStore(store_path).read("test-toy", "test", "tiny-timm-random")
        hint = str(missing.value).split("`")[1]
        assert hint.endswith(f"--backbones tiny-timm-random --splits test{said} --random-init"), hint


def test_a_fixed_size_backbone_ignores_the_datasets_default_image_size(store_path, monkeypatch):
    """A CLIP's positional embeddings fix its input size: digits5-offline's default of 64 (meant for CNNs)
    crashed tiny-clip-random's 32-pixel ViT with a size mismatch deep inside open_clip."""
    import fedcache.extract.runner as runner

    load = runner.load_dataset
    monkeypatch.setattr(runner, "load_dataset", lambda *a, **k: replace(load(*a, **k), default_image_size=64))
    extract(cfg(store_path, backbones=["tiny-clip-random"], splits=("test",), domains=["light"]))
    (entry,) = FeatureStore(store_path).entries()
    assert entry.key["preprocess"]["size"] == 32


def test_another_image_size_for_a_fixed_size_backbone_is_refused_before_any_work(store_path):
    with pytest.raises(ConfigError, match=r"own input size only \(tiny-clip-random 32x32.* drop --image-size"):
        extract(cfg(store_path, backbones=["tiny-clip-random"], image_size=64))
    assert not FeatureStore(store_path).entries()


def test_an_image_size_beside_a_fixed_size_backbone_applies_to_the_others(store_path, caplog):
    # Refused for the whole command, it could not be followed: dropping it changed the CNN's size, and its key.
    import logging

    with caplog.at_level(logging.WARNING):
        extract(cfg(store_path, backbones=["tiny-timm-random", "tiny-clip-random"], image_size=16, splits=("test",),
                    domains=["light"]))
    sizes = {e.key["backbone"]: e.key["preprocess"]["size"] for e in FeatureStore(store_path).entries()}
    assert sizes == {"tiny-timm-random": 16, "tiny-clip-random": 32}
    assert "tiny-clip-random takes 32x32 images only: --image-size 16 applies to the other backbones" in caplog.text


def test_reduced_precision_features_have_their_own_entry(store_path):
    # The precision was not in the key: features extracted in bf16 (the default on a GPU) were what a later
    # `--precision fp32` extraction found "already complete", and an interrupted GPU run resumed on a CPU mixed
    # bf16 and float32 chunks in one entry.
    one = dict(splits=("test",), domains=["light"], device="cpu")
    extract(cfg(store_path, precision="bf16", **one))
    assert {r.status for r in extract(cfg(store_path, precision="fp32", **one))} == {"extracted"}
    store = FeatureStore(store_path)
    assert sorted(e.key["preprocess"].get("forward", "float32") for e in store.entries()) == ["bfloat16", "float32"]
    assert {r.status for r in extract(cfg(store_path, **one))} == {"already complete"}  # fp32 on the CPU: as before


@pytest.mark.slow
def test_decoding_workers_leave_the_start_method_and_sigchld_to_the_caller(store_path):
    """torch's DataLoader fixed the process's start method (its workers' queue) and left its SIGCHLD handler installed
    once it had started workers. In a process of its own: torch does both once per process."""
    code = f"""
import multiprocessing, signal
import tests.conftest  # the tiny dataset
from fedcache.extract.runner import ExtractConfig, extract
def mine(signum, frame): pass
signal.signal(signal.SIGCHLD, mine)
reports = extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store={str(store_path)!r},
                                workers=1, batch_size=4))
assert all(r.status == "extracted" for r in reports), [r.status for r in reports]
print(signal.getsignal(signal.SIGCHLD) is mine, multiprocessing.get_start_method(allow_none=True))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.split() == ["True", "None"], out.stderr


# The third batch's forward pass has another process end the decoding worker with ``signal``, then does ``then``;
# torch's SIGCHLD handler runs as that ends, as the signal's would once the worker is gone (set aside meanwhile: a
# thread that does not block the signal would run it at once). In a process of its own: torch installs that handler
# once per process, and this process's handler_kept has put the one before it back.
DECODER_GONE = """
import multiprocessing, os, signal, subprocess
import tests.conftest  # the tiny dataset
import fedcache.extract.runner as runner
from fedcache.extract.runner import ExtractConfig, extract
real, calls = runner._forward, []
def forward(*args):
    calls.append(1)
    if len(calls) < 3:
        return real(*args)
    torchs = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        for worker in multiprocessing.active_children():
            # From another process: a worker ends quietly on its parent's SIGTERM.
            subprocess.run(["kill", "-s", "{signal}", str(worker.pid)], check=True)
            os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)
        {then}
    finally:
        signal.signal(signal.SIGCHLD, torchs)
        torchs(signal.SIGCHLD, None)
runner._forward = forward
try:
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store={store!r}, workers=1, batch_size=1,
                          chunk_rows=8, splits=("train",), domains=["light"]))
except BaseException as exc:
    print(type(exc).__name__, exc)
"""


def _decoder_gone(store: Path, signal: str, then: str) -> str:
    code = DECODER_GONE.format(signal=signal, then=then, store=str(store))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_an_interrupt_that_also_ended_the_decoding_workers_is_an_interrupt(store_path):
    """SIGTERM to the command's process group (`timeout`, a scheduler's stop) ends its decoding workers too: torch's
    SIGCHLD handler raised "DataLoader worker ... is killed by signal" over the interrupt, and the command printed a
    page of traceback instead of its one line that the work is kept."""
    # The command's own SIGTERM is handled first: Python runs pending handlers in the order of the signals' numbers.
    said = _decoder_gone(store_path, "TERM", "raise KeyboardInterrupt")
    assert said == "KeyboardInterrupt", said


@pytest.mark.slow
def test_a_decoding_worker_killed_is_one_line_and_the_same_extraction_continues(store_path):
    """A worker the kernel killed (out of memory; a bus error, out of shared memory) was torch's RuntimeError: a
    traceback of thousands of lines on the command line."""
    said = _decoder_gone(store_path, "KILL", "return real(*args)")
    assert said.startswith("DecoderDiedError a process decoding the images ended: DataLoader worker (pid "), said
    assert said.endswith("is killed by signal: Killed (out of memory? `dmesg` says); the batches written are kept: run "
                         "the same command again to continue after them (--workers 0 decodes in this process)"), said
    again = extract(cfg(store_path, batch_size=1, splits=("train",), domains=["light"]))
    assert [r.status for r in again] == ["extracted"] and again[0].rows == 28  # the two batches before were kept


def test_a_command_refused_before_its_first_backbone_loads_leaves_no_store(store_path, tmp_path):
    """The store was made before the backbone was loaded, and the dataset's domains and the device checked: a command
    refused for its weights (not on this machine, a file that is no checkpoint), a domain or a device left an empty
    store behind, or an empty folder made one."""
    no_checkpoint = tmp_path / "notes.pth"
    no_checkpoint.write_text("not a checkpoint")
    refused = [dict(backbones=["resnet18-quickdraw"]), dict(weights={"tiny-timm-random": no_checkpoint}),
               dict(domains=["nope"])] + ([] if torch.cuda.is_available() else [dict(device="cuda")])
    empty = tmp_path / "empty"
    empty.mkdir()
    for given in refused:
        for store in (store_path, empty):
            with pytest.raises(FedcacheError):
                extract(cfg(store, **given))
            assert not store_path.exists() and list(empty.iterdir()) == [], given


def test_a_store_that_cannot_be_made_is_said_before_the_backbone_loads(store_path, monkeypatch):
    """Made once the first backbone is loaded, a store in a folder this user cannot write in was still to be said
    before that (a backbone's weights may be a download of minutes)."""
    import fedcache.extract.runner as runner

    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != store_path.parent and real(path, mode, **kw))
    monkeypatch.setattr(runner, "load_backbone", lambda *a: pytest.fail("the backbone was loaded"))
    with pytest.raises(StoreError) as refused:
        extract(cfg(store_path))
    assert str(refused.value) == (f"cannot make the feature store {store_path} (no permission to write in "
                                  f"{store_path.parent}); give a --store (or FEDCACHE_STORE) in a folder you can write to")
    assert not store_path.exists()


def test_a_store_given_inside_another_store_is_refused_and_the_store_still_reads(store_path):
    """Made in the store's entries/, a store was an entry with damaged metadata to the store around it: every run on
    that store stopped at it."""
    extract(cfg(store_path, splits=("test",), domains=["light"]))
    for inner in (store_path / "entries" / "mine", store_path / "entries", store_path / "new" / "s.zarr"):
        with pytest.raises(ConfigError, match=f"--store {inner} is inside the feature store {store_path}; give "
                                              f"{store_path} itself"):
            extract(cfg(inner, splits=("test",), domains=["light"]))
    assert FeatureStore(store_path).read("test-toy", "test", "tiny-timm-random", domains=["light"]).features.shape[0] == 12
    assert not (store_path / "entries" / "mine").exists() and not (store_path / "new").exists()


def test_the_command_that_finishes_a_random_init_extraction_extracts_random_weights(store_path):
    """An `extract --random-init` of a pretrained backbone, interrupted, was to be finished by an extraction without
    --random-init: that loads the pretrained weights (a download; other entries) and leaves these unfinished."""
    from fedcache.cli import main
    from fedcache.errors import IncompleteEntryError

    backbone = "timm:test_resnet"  # pretrained weights on the Hub (none offline); its architecture is tiny

    def interrupt(event):
        if event.kind == "start" and event.label == f"test-toy/train/dark {backbone}":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, backbones=[backbone], random_init=True, image_size=32), progress=interrupt)
    with pytest.raises(IncompleteEntryError) as unfinished:
        FeatureStore(store_path).read("test-toy", "train", backbone)
    command = str(unfinished.value).split("`")[1]
    assert command == (f"fedcache extract --store {store_path} --dataset test-toy --backbones {backbone} --splits train "
                       "--domains dark --random-init")
    assert main(shlex.split(command)[1:] + ["--workers", "0", "--batch-size", "4", "--chunk-rows", "8"]) == 0
    assert FeatureStore(store_path).read("test-toy", "train", backbone).random_weights


def _changed_checkpoint(path: Path) -> Path:
    """tiny-timm-random's weights, one tensor moved: a checkpoint whose features differ from the backbone's own."""
    from fedcache.extract.loading import load_backbone

    sd = load_backbone("tiny-timm-random").image_encoder.state_dict()
    first = next(k for k, v in sd.items() if v.is_floating_point())
    sd[first] = sd[first] + 0.5
    torch.save(sd, path)
    return path


def test_the_command_that_finishes_a_checkpoints_extraction_loads_that_checkpoint(store_path, tmp_path, monkeypatch):
    """An `extract --weights NAME=PATH`, interrupted, was to be finished by an extraction without --weights: that
    loads the backbone's own weights (other entries) and leaves these unfinished. The checkpoint's path, recorded
    absolute, is in the command, which works from another directory."""
    from fedcache.cli import main
    from fedcache.errors import IncompleteEntryError

    (tmp_path / "my ckpts").mkdir()
    monkeypatch.chdir(tmp_path / "my ckpts")
    ckpt = _changed_checkpoint(tmp_path / "my ckpts" / "changed.pth")

    def interrupt(event):
        if event.kind == "start" and event.label == "test-toy/train/dark tiny-timm-random":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, weights={"tiny-timm-random": Path("changed.pth")}, image_size=32), progress=interrupt)
    with pytest.raises(IncompleteEntryError) as unfinished:
        FeatureStore(store_path).read("test-toy", "train", "tiny-timm-random")
    command = str(unfinished.value).split("`")[1]
    assert command == (f"fedcache extract --store {store_path} --dataset test-toy --backbones tiny-timm-random --splits "
                       f"train --domains dark --weights 'tiny-timm-random={ckpt}'")
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command)[1:] + ["--workers", "0", "--batch-size", "4", "--chunk-rows", "8"]) == 0
    table = FeatureStore(store_path).read("test-toy", "train", "tiny-timm-random")
    assert not table.random_weights and len(table.domain_names) == 2


@pytest.mark.parametrize("linked", [False, True])
def test_the_command_that_finishes_an_image_folders_extraction_reads_the_same_images(store_path, tmp_path, monkeypatch,
                                                                                      linked):
    """An interrupted `extract -d imagefolder --path ROOT` was to be finished by a command without --path (refused:
    imagefolder needs it), and without its --test-fraction and --seed (another split of an unsplit folder: other
    entries, these left unfinished). The folder, recorded absolute, and the split's options are in the command, which
    finishes these entries from another directory. A folder given through a link is recorded through it, as its key
    names it: resolved, the command made other entries and left these unfinished."""
    from PIL import Image

    from fedcache.cli import main
    from fedcache.errors import IncompleteEntryError

    real = tmp_path / ("real imgs" if linked else "my imgs")
    for cls in ("cat", "dog"):
        (real / cls).mkdir(parents=True)
        for i in range(6):
            image = Image.new("RGB", (8, 8), (40 * i, 0 if cls == "cat" else 200, 0))
            image.save(real / cls / f"{i}.png")
    if linked:
        (tmp_path / "my imgs").symlink_to(real, target_is_directory=True)
    monkeypatch.chdir(tmp_path)

    def interrupt(event):
        if event.kind == "start" and event.label == "pets/train/all tiny-timm-random":
            raise KeyboardInterrupt

    options = DatasetOptions(path=Path("my imgs"), test_fraction=0.5, seed=3)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, dataset="imagefolder", name="pets", dataset_options=options), progress=interrupt)
    with pytest.raises(IncompleteEntryError) as unfinished:
        FeatureStore(store_path).read("pets", "train", "tiny-timm-random")
    command = shlex.split(str(unfinished.value).split("`")[1])
    given = dict(zip(command[2::2], command[3::2]))
    said = (given["--path"], given["--test-fraction"], given["--seed"])
    assert said == (str(tmp_path / "my imgs"), "0.5", "3"), command
    monkeypatch.chdir(store_path.parent.parent)
    assert main(command[1:] + ["--workers", "0", "--batch-size", "4", "--chunk-rows", "8"]) == 0
    store = FeatureStore(store_path)
    assert [e.complete for e in store.entries() if e.key["split"] == "train"] == [True]
    assert len(store.read("pets", "train", "tiny-timm-random")) == 6


def test_a_checkpoint_backbones_entry_without_its_file_says_the_file_is_not_known():
    """Entries of a backbone that loads only a checkpoint (resnet18-quickdraw), made before the file was recorded:
    the command names a placeholder and says the store does not record the file, not a command that cannot load."""
    from fedcache.store import lookup
    from fedcache.store.entries import EntryInfo

    key = {"dataset": "digit5", "split": "train", "domain": "mnist", "backbone": "resnet18-quickdraw", "view": 0,
           "dtype": "float16", "preprocess": {"size": 64}}
    old = EntryInfo("e1", key, 4, 512, False, None, {"backbone_source": "checkpoint", "random_weights": False})
    said = lookup.extract_said(Path("s.zarr"), [old])
    # Pasted from its backticks, the command runs (a "(" in them stopped the shell); what it stands for follows them.
    assert said.endswith("--image-size 64 --weights resnet18-quickdraw=CHECKPOINT` (CHECKPOINT: the file these were "
                         "extracted from, which the store does not record)")
    assert shlex.split(said.split("`")[1])[-2:] == ["--weights", "resnet18-quickdraw=CHECKPOINT"]
    viewed = EntryInfo("e2", {**key, "view": 1, "augmentation": {"recipe": "simclr"}}, 4, 512, False, None, old.attrs)
    said = lookup.extract_said(Path("s.zarr"), [viewed])
    assert said.endswith("=CHECKPOINT` (CHECKPOINT: the file these were extracted from, which the store does not "
                         "record; and any other option it was started with)")
    assert lookup.views_said(Path("s.zarr"), [viewed], viewed).endswith(
        "=CHECKPOINT` (CHECKPOINT: the file these were extracted from, which the store does not record)")


def test_extracting_the_last_domains_of_one_split_says_what_the_other_split_lacks(tmp_path, toy4):
    """`extract --domains light,dark`, then `--domains pale,deep --splits train`: the train split held every domain,
    so the line (asked of the splits extracted) said nothing, and a run was refused for the test split's. It says
    the extraction that the run needs, which, pasted, makes a run read every domain."""
    from fedcache.cli import main
    from fedcache.federate.tables import load_splits

    store_path = tmp_path / "s.zarr"
    extract(cfg(store_path, dataset=toy4, domains=["light", "dark"]))
    notes = []
    extract(cfg(store_path, dataset=toy4, domains=["pale", "deep"], splits=("train",)),
            progress=lambda e: notes.append(e.message) if e.kind == "info" else None)
    (told,) = [n for n in notes if "every domain" in n]
    assert "the store has no test features of test-toy4/pale,deep" in told, told
    command = shlex.split(told.split("`")[1])
    assert dict(zip(command[2::2], command[3::2]))["--splits"] == "test", told
    assert main(command[1:] + ["--workers", "0"]) == 0
    train, test = load_splits(FeatureStore(store_path), "test-toy4", ["tiny-timm-random"])
    assert train.domain_names == test.domain_names == FOUR
