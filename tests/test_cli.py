"""The command line: exit codes, one-line errors, listings, and the store subcommands."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from fedcache.cli import main


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_datasets_and_backbones_list_one_line_each(capsys):
    code, out, _ = run(capsys, "datasets")
    assert code == 0 and "digits5-offline" in out and "cifar10" in out and "test-toy" not in out
    code, out, _ = run(capsys, "backbones")
    assert code == 0 and "efficientnet-lite0" in out and "clip-rn50" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("tiny-clip-random"))
    assert "RANDOM" in line



@pytest.mark.parametrize("columns", [80, 60])
def test_listings_fit_a_narrow_terminal_without_cutting_names_or_numbers(capsys, monkeypatch, store_path, columns):
    """At 80 columns rich squeezed every column: dims read 40… (4096), methods clip-fc-centr…, the datasets'
    source and classes vanished and `store ls` folded each entry over ten lines of two letters. Now the free
    text is cut to the room left, optional columns are dropped (a line says which), and only a table that
    still does not fit is printed wider than the terminal, one line per entry."""
    from fedcache.cli.common import console

    code, _, _ = run(capsys, "extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store_path), "--workers", "0")
    assert code == 0
    monkeypatch.setattr(console, "width", columns)
    monkeypatch.setattr("fedcache.cli.common._piped", lambda: False)  # a terminal of that width
    for args, names in ((["backbones"], ["alexnet-imagenet", "4096", "clip-rn50", "1024", "efficientnet-lite"]),
                        (["methods"], ["clip-fc-centralized", "linear", "projection"]),
                        (["datasets"], ["digits5-offline", "torchvision", "from the data"]),
                        (["store", "ls", "--store", str(store_path)], ["tiny-timm-random RANDOM", "complete", "train"])):
        code, out, _ = run(capsys, *args)
        lines = out.splitlines()
        assert code == 0 and all(n in out for n in names), (args, out)
        assert "…" not in "".join(l.split()[0] for l in lines if l.strip()), out  # first column whole
        rows = [l for l in lines if l.strip() and not l.endswith("COLUMNS=160 shows them)")]
        if args[0] != "store" and columns == 80:  # at 60 a listing may be wider than the terminal, never cut
            assert max(map(len, rows)) <= columns, out
    assert len([l for l in lines if "tiny-timm-random" in l]) == 4  # one line per entry
    assert f"not shown at {columns} columns" in out

def test_unknown_backbone_is_one_red_line_exit_1_or_2(capsys, store_path):
    code, _, err = run(capsys, "extract", "--dataset", "test-toy", "--backbones", "clip-rn5", "--store", str(store_path))
    assert code == 2  # a name it does not know is a bad option value (exit 2), as a bad --partition is
    assert err.strip().startswith("error:") and "Did you mean 'clip-rn50'" in err
    assert "Traceback" not in err


def test_bad_option_value_exits_2(capsys, store_path):
    code, _, err = run(capsys, "extract", "-d", "test-toy", "-b", "tiny-timm-random", "--part", "3/2", "--store", str(store_path))
    assert code == 2 and "--part" in err
    code, _, err = run(capsys, "extract", "-d", "test-toy", "--store", str(store_path))  # missing --backbones
    assert code == 2 and "backbones" in err


def test_extract_takes_the_test_fraction_of_an_unsplit_image_folder(capsys, store_path, tmp_path):
    """The imagefolder help names --test-fraction; the command had no such option."""
    from PIL import Image

    from fedcache.store.feature_store import FeatureStore

    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(10):
            Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / "imgs" / cls / f"{i}.png")
    code, _, err = run(capsys, "extract", "-d", "imagefolder", "--path", str(tmp_path / "imgs"), "-b", "tiny-timm-random",
                       "--store", str(store_path), "--workers", "0", "--test-fraction", "0.5")
    assert code == 0, err
    store = FeatureStore(store_path, create=False)
    assert len(store.read("imagefolder", "test", "tiny-timm-random").labels) == 10
    assert len(store.read("imagefolder", "train", "tiny-timm-random").labels) == 10


def test_debug_env_shows_traceback(monkeypatch, store_path):
    monkeypatch.setenv("FEDCACHE_DEBUG", "1")
    from fedcache.errors import UnknownNameError

    with pytest.raises(UnknownNameError):
        main(["extract", "-d", "nope", "-b", "tiny-timm-random", "--store", str(store_path)])


def test_extract_ls_info_export_import_rm(capsys, store_path, tmp_path):
    code, out, _ = run(capsys, "extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store_path), "--workers", "0")
    assert code == 0 and "4 extracted" in out
    code, out, _ = run(capsys, "extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store_path))
    assert "4 already complete" in out
    code, out, _ = run(capsys, "store", "ls", "--store", str(store_path))
    assert code == 0 and out.count("complete") == 4 and "RANDOM" in out
    eid = re.search(r"\b[0-9a-f]{16}\b", out).group(0)
    code, out, _ = run(capsys, "store", "info", eid[:8], "--store", str(store_path))
    assert code == 0 and '"weights_hash"' in out and '"complete": true' in out
    for suffix in ("h5", "npz"):
        dump = tmp_path / f"dump.{suffix}"
        code, out, _ = run(capsys, "store", "export", "-d", "test-toy", "-b", "tiny-timm-random", "-o", str(dump), "--store", str(store_path))
        assert code == 0 and dump.exists()
        code, out, _ = run(capsys, "store", "import", str(dump), "-d", f"mine-{suffix}", "-b", "my-encoder", "--store", str(store_path))
        assert code == 0 and "imported 4 entries" in out
    code, _, err = run(capsys, "store", "import", str(tmp_path / "mine.h5"), "-d", "x", "-b", "y", "--store", str(store_path))
    assert code == 2 and f"error: no such file: {tmp_path / 'mine.h5'}" in " ".join(err.split())  # refused as given
    from fedcache.store.feature_store import FeatureStore

    fs = FeatureStore(store_path)
    orig, back = fs.read("test-toy", "train", "tiny-timm-random"), fs.read("mine-npz", "train", "my-encoder")
    np.testing.assert_array_equal(orig.features, back.features)
    np.testing.assert_array_equal(orig.labels, back.labels)
    assert back.domain_names == ("light", "dark") and back.random_weights
    code, out, err = run(capsys, "store", "rm", eid, "--store", str(store_path))
    assert code == 0, err
    assert f"removed {eid}" in out


def test_store_rm_finds_every_id_before_it_removes_any_and_takes_no_one_character_prefix(capsys, tmp_path):
    """`store rm 1` removed whichever entry's id began with 1; `store rm A nosuch B` removed A, then stopped."""
    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.store.feature_store import FeatureStore

    store = tmp_path / "s.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=store, workers=0, splits=("test",)))
    ids = sorted(e.entry_id for e in FeatureStore(store).entries())
    code, _, err = run(capsys, "store", "rm", ids[0][:3], "--store", str(store))
    assert code == 2 and f"{ids[0][:3]!r}: give at least 4 characters of an entry id to remove it" in err, err
    code, _, err = run(capsys, "store", "rm", ids[0], "nosuch", "--store", str(store))
    assert code == 2 and "no entry 'nosuch'" in err  # an unknown name
    assert sorted(e.entry_id for e in FeatureStore(store).entries()) == ids
    code, out, _ = run(capsys, "store", "rm", ids[0][:4], ids[0], "--store", str(store))  # one entry, named twice
    assert code == 0 and out.count("removed") == 1 and len(FeatureStore(store).entries()) == len(ids) - 1


def test_store_rm_of_what_runs_read_says_which_earlier_entry_they_read_now(capsys, tmp_path):
    """Removing the current entry made an older one of other options current without a word: runs read it."""
    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.store.feature_store import FeatureStore

    store = tmp_path / "s.zarr"
    base = dict(dataset="test-toy", backbones=["tiny-timm-random"], store=store, workers=0, splits=("test",),
                domains=("light",))
    extract(ExtractConfig(**base, dtype="float32"))
    (old,) = FeatureStore(store).entries()
    extract(ExtractConfig(**base))  # float16: current now
    (new,) = [e for e in FeatureStore(store).entries() if e.entry_id != old.entry_id]
    code, out, _ = run(capsys, "store", "rm", new.entry_id, "--store", str(store))
    said = " ".join(out.split())
    assert code == 0 and (f"runs of test-toy/test/light tiny-timm-random now read {old.entry_id}, an earlier entry of "
                          "that data") in said, said
    code, out, _ = run(capsys, "store", "rm", old.entry_id, "--store", str(store))
    assert code == 0 and "now read" not in out


def test_store_rm_without_targets_and_missing_store(capsys, tmp_path):
    code, _, err = run(capsys, "store", "ls", "--store", str(tmp_path / "none.zarr"))
    assert code == 2 and "no feature store" in err  # the command as given is refused


def test_train_that_cannot_start_says_only_why(capsys, toy_store, tmp_path):
    """No progress line before the error: a run whose store or features are missing never started a round."""
    # No store at --store refuses the command as given (2); features the store lacks stop it (1).
    for store, backbone, exit_code in ((tmp_path / "none.zarr", "tiny-timm-random", 2), (toy_store, "tiny-clip-random", 1)):
        code, _, err = run(capsys, "train", "--store", str(store), "-d", "test-toy", "-b", backbone, "-m", "fedavg",
                           "--rounds", "2", "--out", str(tmp_path / "run"))
        assert code == exit_code and err.strip().startswith("error:") and len(err.strip().splitlines()) == 1, err


def test_train_says_a_slow_data_read_before_its_rounds(capsys, toy_store, tmp_path, monkeypatch):
    """A million rows read and partitioned took seconds before the rounds' first line: said where it took
    ``progress.SLOW_STEP`` seconds or more (0 here)."""
    from fedcache import progress

    monkeypatch.setattr(progress, "SLOW_STEP", 0.0)
    code, _, err = run(capsys, "train", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
                       "--clients", "2", "--rounds", "2")
    lines = err.splitlines()
    assert code == 0 and re.fullmatch(rf"data ready in \d+\.\d s: 84 rows \([\d.]+ kB\) of test-toy on tiny-timm-random "
                                      rf"read from {re.escape(str(toy_store))}, partition [0-9a-f]+", lines[0]), err
    assert lines[1].startswith("fedavg rounds "), err


def test_train_shows_its_rounds_before_the_first_is_done(capsys, toy_store, monkeypatch):
    """The bar is drawn as the rounds start: drawn once the first was done, a long first round (seconds at a million
    rows) was silent. A first round that fails shows it under "rounds 0/2"."""
    from fedcache.errors import FedcacheError
    from fedcache.federate import driver

    def failing(runs, engine, states, rnd):
        raise FedcacheError("the first round failed")

    monkeypatch.setattr(driver, "_round", failing)
    code, _, err = run(capsys, "train", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m",
                       "fedavg", "--clients", "2", "--rounds", "2")
    assert code == 1 and err.splitlines() == ["fedavg rounds 0/2 (0%)", "error: the first round failed"], err


def test_train_bar_on_a_terminal_shows_the_time_its_first_round_takes(capsys, toy_store, monkeypatch):
    """On a terminal the rounds bar stood at 0/2 for the whole first round (10 to 20 s at a million rows), nothing
    moving: it shows the time elapsed, which counts while a round runs."""
    import io
    import time

    from rich.console import Console

    from fedcache.errors import FedcacheError
    from fedcache.federate import driver

    def slow(runs, engine, states, rnd):
        time.sleep(1.2)
        raise FedcacheError("the first round failed")

    screen = io.StringIO()
    monkeypatch.setattr("fedcache.cli.common.err", Console(file=screen, force_terminal=True, width=100))
    monkeypatch.setattr(driver, "_round", slow)
    code, _, _ = run(capsys, "train", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m",
                     "fedavg", "--clients", "2", "--rounds", "2")
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # the bar's last frame, less its colours
    assert code == 1 and re.search(r"fedavg rounds .* 0/2 0:00:0[1-9]", shown), shown


def test_partition_says_a_slow_data_read_before_its_line(capsys, toy_store, tmp_path, monkeypatch):
    """A million rows read and partitioned took seconds without a word: said on stderr where it took
    ``progress.SLOW_STEP`` seconds or more (0 here), the command's own line on stdout; a partition that cannot be
    made is its error alone."""
    from fedcache import progress

    monkeypatch.setattr(progress, "SLOW_STEP", 0.0)
    data = ("--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random")
    code, out, err = run(capsys, "partition", *data, "--partition", "dirichlet", "--clients", "3")
    assert code == 0 and out.startswith("partition ") and re.fullmatch(
        rf"partition ready in \d+\.\d s: the labels of 84 rows of test-toy on tiny-timm-random read from "
        rf"{re.escape(str(toy_store))}, partition [0-9a-f]+", err.strip()), (out, err)
    code, out, err = run(capsys, "partition", "--store", str(tmp_path / "none.zarr"), "-d", "test-toy", "-b",
                         "tiny-timm-random")
    assert code == 2 and not out and err.strip().startswith("error:") and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "shard", "extract", "demo"])
def test_commands_say_loading_torch_before_anything_else(toy_store, tmp_path, command):
    """`loading torch ...` is said where torch is not loaded yet: train and shard loaded it silently in their spec
    (its method), extract in its config (the backbones' names), demo at its first line, so none said it in the
    seconds it takes on a busy machine. Said at once here (``progress.SLOW_STEP`` 0), before anything else."""
    import subprocess

    data = ["--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random"]
    (tmp_path / "a-file").write_text("")
    args = {"train": ["train", *data, "-m", "fedavg", "--rounds", "1", "--clients", "2"],
            "shard": ["shard", *data, "--clients", "2", "--out", str(tmp_path / "shards")],
            "extract": ["extract", "-d", "digits5-offline", "-b", "no-such-backbone", "--store", str(tmp_path / "s")],
            "demo": ["demo", "--store", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "a-file")]}[command]
    code = ("import sys; from fedcache import progress; progress.SLOW_STEP = 0.0\n"
            "from fedcache.cli import main; main(sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert done.stderr.splitlines()[:1] == ["loading torch ..."], done.stderr


def test_partition_loads_no_torch(toy_store):
    """`fedcache partition` spent most of its seconds loading torch for a method it never used (its spec's): it
    reads the labels, domains and ids and makes the partition without torch, so it has no `loading torch ...`."""
    import subprocess

    code = ("import sys; from fedcache import progress; progress.SLOW_STEP = 0.0\n"
            "from fedcache.cli import main; code = main(sys.argv[1:]); print('torch' in sys.modules, code)")
    done = subprocess.run([sys.executable, "-c", code, "partition", "--store", str(toy_store), "-d", "test-toy", "-b",
                           "tiny-timm-random", "--partition", "dirichlet", "--clients", "3"], capture_output=True, text=True)
    out = done.stdout.splitlines()
    assert out[0].startswith("partition ") and out[-1] == "False 0", (done.stdout, done.stderr)
    assert done.stderr.startswith("partition ready in ") and "loading torch" not in done.stderr, done.stderr


FAST_REFUSALS = {  # the command after `fedcache` (and --store S ...), the line it refuses it with
    # checked as the grid's cells were made, after the methods' settings were read (torch) to name the axis
    "grid -m fedavg --rounds 0": "--rounds (schedule.rounds)=0: must be >= 1",
    # checked as the grid ran, after its spec had read the methods' settings and imported training (torch)
    "grid -m fedavg --min-rounds 2": "--min-rounds sets how successive halving cuts; add --prune halving (with "
                                     "--select), or leave it out",
    # a method's name: known once every method's module (torch) was imported
    "grid -m fedavgg": "unknown method 'fedavgg'. Did you mean 'fedavg', 'fedavgm', 'perfedavg'? Known: {methods}.",
    # ... and where a run-option flag made an axis, whose key was routed by the methods' settings (torch) first
    "grid -m fedavg,fedavgg --rounds 5": "unknown method 'fedavgg'. Did you mean 'fedavg', 'fedavgm', 'perfedavg'? "
                                         "Known: {methods}.",
    "grid -m fedavg --rounds 5 --track zz": "--track zz: unknown tracker; known: mlflow, tensorboard",
    "train -m fedavgg": "unknown method 'fedavgg'. Did you mean 'fedavg', 'fedavgm', 'perfedavg'? Known: {methods}.",
    # the store: opened once the spec's method (torch) was imported, a method a sharding never uses
    "shard": "no feature store at {store}; create one with `fedcache extract --store {store} ...`",
}


@pytest.mark.parametrize("command", FAST_REFUSALS)
def test_a_mistyped_command_is_refused_before_torch_loads(tmp_path, command):
    """Each of these loaded torch (seconds: `loading torch ...` on a busy machine) before its one line, for a check
    that needs none of it (see FAST_REFUSALS). The same line now comes with torch not imported."""
    import subprocess

    from fedcache.federate.methods import METHODS

    name, *rest = command.split()
    store = tmp_path / "none.zarr"
    args = [name, *rest, "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random", "--out", str(tmp_path / "o")]
    # SLOW_STEP out of reach: what is checked is torch never imported, not how long a loaded machine took to say so
    code = ("import sys; from fedcache import progress; progress.SLOW_STEP = 1e9; from fedcache.cli import main; "
            "code = main(sys.argv[1:]); print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    said = FAST_REFUSALS[command].format(methods=", ".join(METHODS.names()), store=store)
    assert done.stderr.splitlines() == [f"error: {said}"], done.stderr
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)


def test_a_slow_import_is_said_while_it_runs(capsys, monkeypatch):
    """torch's import, 2.5 to 8 s on a busy machine before a grid's first line: said once it has taken
    ``progress.SLOW_STEP`` seconds, before what follows it; a fast one says nothing."""
    import time

    from fedcache import progress
    from fedcache.cli.common import said_while_slow

    monkeypatch.setattr(progress, "SLOW_STEP", 0.05)
    with said_while_slow("loading torch ..."):
        time.sleep(1)
    print("after", file=sys.stderr)
    with said_while_slow("loading torch ..."):
        pass
    assert capsys.readouterr().err.splitlines() == ["loading torch ...", "after"]


def test_grid_that_cannot_start_says_only_why(capsys, toy_store, tmp_path):
    """No progress line before the error: a grid refused before its plan (here too many clients) trained nothing."""
    code, out, err = run(capsys, "grid", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m",
                         "fedavg", "--set", "rounds=1", "--clients", "100000", "--out", str(tmp_path / "g"))
    assert code == 2 and "grid" not in out and err.strip().startswith("error:") and len(err.strip().splitlines()) == 1, (out, err)


def test_store_ls_shows_incomplete_entries(capsys, store_path):
    from fedcache.extract.runner import ExtractConfig, extract

    def stop(event):
        if event.kind == "advance":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=store_path, workers=0,
                              batch_size=4, chunk_rows=8), progress=stop)
    code, out, _ = run(capsys, "store", "ls", "--store", str(store_path))
    assert code == 0 and "partial 4/30 rows" in out  # the first batch, kept: no chunk of 8 rows done


def _stopped_after(batches: int):
    seen = {"n": 0}

    def stop(event):
        seen["n"] += event.kind == "advance"
        if seen["n"] == batches:
            raise KeyboardInterrupt

    return stop


@pytest.mark.parametrize("changed", [False, True])
def test_store_ls_counts_the_rows_a_resumed_extraction_keeps(capsys, store_path, changed):
    """A domain of one chunk interrupted after 3 batches was `partial 0/1` (chunks done), though its re-run keeps
    those 12 rows. Rows kept whose bytes changed since are computed again: they are not counted."""
    from fedcache.extract.runner import ExtractConfig, extract

    with pytest.raises(KeyboardInterrupt):
        extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=store_path, workers=0,
                              batch_size=4), progress=_stopped_after(3))
    if changed:
        (features,) = store_path.glob("entries/*/features/c/0/0")
        with open(features, "r+b") as fh:  # a byte of row 5
            fh.seek(5 * 96 * 2)
            fh.write(bytes([fh.read(1)[0] ^ 0xFF]))
    code, out, _ = run(capsys, "store", "ls", "--store", str(store_path))
    assert code == 0 and ("partial 0/30 rows" if changed else "partial 12/30 rows") in out, out


@pytest.mark.parametrize("attr", ["batch_size", "chunk_rows", "garbage", "removed"])
def test_store_ls_says_chunks_of_an_entry_whose_rows_cannot_be_counted(capsys, store_path, monkeypatch, attr):
    """A partial entry whose batch size or chunk rows are missing or garbage, or removed by a `store rm` between the
    listing and its status, is said by its chunks done: it was a traceback (KeyError, ValueError from the writer's
    attributes). One without its n_rows is damaged, listed as such before its rows are counted."""
    import json

    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.store import feature_store

    with pytest.raises(KeyboardInterrupt):
        extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=store_path, workers=0,
                              batch_size=4, chunk_rows=8), progress=_stopped_after(3))
    (meta,) = store_path.glob("entries/*/zarr.json")
    if attr == "removed":
        chunks_done = feature_store.FeatureStore.chunks_done

        def removed_after(fs, info):  # as a concurrent `store rm` removes it, once its flags are read
            done = chunks_done(fs, info)
            del fs.root[feature_store.ENTRIES][info.entry_id]
            return done

        monkeypatch.setattr(feature_store.FeatureStore, "chunks_done", removed_after)
    else:
        doc = json.loads(meta.read_text())
        if attr == "garbage":
            doc["attributes"]["batch_size"] = "four"
        else:
            del doc["attributes"][attr]
        meta.write_text(json.dumps(doc))
    code, out, err = run(capsys, "store", "ls", "--store", str(store_path))
    assert code == 0 and "partial 1/4 chunks" in out, (out, err)


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_exits_130_so_a_shell_chain_stops(capsys, store_path, monkeypatch):
    import fedcache.extract.runner as runner

    monkeypatch.setattr(runner, "extract", _interrupt)
    code, _, err = run(capsys, "extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store_path))
    assert code == 130 and "interrupted" in err


def test_an_interrupted_train_says_how_to_go_on(capsys, store_path, monkeypatch):
    """A run's directory is refused without --resume, so "re-run the same command" was advice that failed."""
    import fedcache.cli.train as train_cli

    monkeypatch.setitem(train_cli.ENGINES, "in-process", _interrupt)
    argv = ["train", "--store", str(store_path), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg"]
    out = store_path.parent / "r"
    code, _, err = run(capsys, *argv, "--out", str(out))
    # The run's lock made --out and removed it, empty, as it let go: "{out} holds no checkpoint" was of no folder.
    assert code == 130 and f"no round had finished and {out} does not exist; re-run the same command" in err
    assert not out.exists()
    out.mkdir()
    code, _, err = run(capsys, *argv, "--out", str(out))  # a folder the user made: it stays, checkpoint-less
    assert code == 130 and f"no round had finished, so {out} holds no checkpoint; re-run the same command" in err
    def checkpointed_then_interrupted(spec):  # as a run interrupted after its first round
        if spec.engine.out is not None:
            (Path(spec.engine.out) / "checkpoint.pt").write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setitem(train_cli.ENGINES, "in-process", checkpointed_then_interrupted)
    for given in (["--out", str(out)], [f"--out={out}"], ["-o", str(out)], [f"-o{out}"]):
        (out / "checkpoint.pt").unlink(missing_ok=True)
        code, _, err = run(capsys, *argv, *given)
        assert code == 130 and "re-run the command with --resume to continue" in err, given
    code, _, err = run(capsys, *argv)
    assert code == 130 and "the run had no --out, so nothing of it was kept" in err


def test_an_interrupted_train_whose_folder_holds_an_earlier_run_does_not_send_to_resume_it(capsys, store_path, monkeypatch):
    """--overwrite (or a finished run's folder given again) stopped before its first round: "re-run with --resume"
    continued the other run, or was refused as other options (seed 0 there, 1 here)."""
    import os

    import fedcache.cli.train as train_cli

    monkeypatch.setitem(train_cli.ENGINES, "in-process", _interrupt)
    out = store_path.parent / "r"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")
    os.utime(out / "checkpoint.pt", (1e9, 1e9))  # the earlier run's
    argv = ["train", "--store", str(store_path), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg", "-o", str(out)]
    code, _, err = run(capsys, *argv, "--overwrite")
    assert code == 130 and (f"no round had finished: the checkpoint in {out} is of the run that was there before this "
                            "command; re-run the same command") in " ".join(err.split())
    code, _, err = run(capsys, *argv, "--resume")  # its own checkpoint is the one to go on from
    assert code == 130 and "re-run the command with --resume to continue" in err


def test_train_resume_of_a_folder_that_does_not_exist_says_so(capsys, store_path):
    """--resume --out DIR where DIR does not exist said DIR "has no config.json", of no folder (a mistyped --out)."""
    out = store_path.parent / "no-such-run"
    code, _, err = run(capsys, "train", "--store", str(store_path), "-d", "test-toy", "-b", "tiny-timm-random",
                       "-m", "fedavg", "--resume", "--out", str(out))
    assert code == 2 and f"--resume: {out} does not exist; start the run without --resume" in err, err
    assert not out.exists()


@pytest.mark.parametrize("exc, line", [
    (PermissionError(13, "Permission denied", "/srv/runs/r"), "no permission to write /srv/runs/r; choose a path you can write to"),
    (OSError(5, "Input/output error", "/srv/runs/r"), "Input/output error: /srv/runs/r (FEDCACHE_DEBUG=1 shows where it happened)"),
])
def test_an_os_error_is_one_line_naming_the_path(exc, line, capsys, store_path, monkeypatch):
    import fedcache.cli.train as train_cli

    def failing(*_args, **_kwargs):
        raise exc

    monkeypatch.setitem(train_cli.ENGINES, "in-process", failing)
    code, _, err = run(capsys, "train", "--store", str(store_path), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg")
    assert code == 1 and err.strip() == f"error: {line}"


def test_a_validation_run_says_what_its_accuracy_was_scored_on(capsys, store_path, monkeypatch):
    import fedcache.cli.train as train_cli

    summary = {"method": "fedavg", "mean_accuracy": 50.0, "std_accuracy": 1.0, "global_accuracy": 51.0, "rounds": 1,
               "params_up_per_round": 1, "bytes_up": 4, "bytes_down": 4, "seconds": 0.1}
    monkeypatch.setitem(train_cli.ENGINES, "in-process", lambda spec: (summary, ""))
    argv = ["train", "--store", str(store_path), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg"]
    code, out, _ = run(capsys, *argv, "--validation", "--subsample", "0.8")
    assert code == 0 and "global 51.00%" in out and "(scored on validation: spare training rows)" in out
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "validation" not in out


def test_a_command_exit_code_is_the_process_exit_code(capsys, store_path, monkeypatch):
    import typer

    import fedcache.extract.runner as runner

    def exits(*_a, **_k):
        raise typer.Exit(3)

    monkeypatch.setattr(runner, "extract", exits)
    code, _, _ = run(capsys, "extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store_path))
    assert code == 3


@pytest.mark.slow
def test_sigint_to_a_real_process_exits_130(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    # A real process interrupted while a command runs (the extraction itself is replaced by a wait).
    script = (
        "import signal, sys, time, tests.conftest\n"
        # A runner started in the background (nohup make test &) hands SIGINT down ignored; a terminal does not.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from fedcache import cli\n"
        "import fedcache.extract.runner as r\n"
        "def slow(*a, **k):\n"
        "    print('started', flush=True); time.sleep(60)\n"
        "r.extract = slow\n"
        "sys.exit(cli.main(['extract', '-d', 'test-toy', '-b', 'tiny-timm-random', '--store', sys.argv[1]]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "s.zarr")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("name, code", [pytest.param("SIGINT", 130, marks=pytest.mark.slow), ("SIGTERM", 143)])
def test_the_command_exits_with_the_shells_code_for_the_signal_that_stopped_it(tmp_path, name, code):
    """A scheduler or a script tells a stopped job from a failed one by 128 + the signal's number: SIGTERM (a
    scheduler's, `kill`) exited 130 as Ctrl-C does."""
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import signal, sys, time, tests.conftest\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # as in a terminal
        "from fedcache.cli.root import _console_script\n"
        "import fedcache.extract.runner as r\n"
        "def slow(*a, **k):\n"
        "    print('started', flush=True); time.sleep(60)\n"
        "r.extract = slow\n"
        "sys.argv = ['fedcache', 'extract', '-d', 'test-toy', '-b', 'tiny-timm-random', '--store', sys.argv[1]]\n"
        "_console_script()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "s.zarr")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code and "interrupted" in err and "Traceback" not in err, (proc.returncode, err)


def test_the_command_leaves_what_is_alive_at_its_end_to_the_os_and_a_caller_of_main_does_not():
    """Python's last collections at exit walked every object torch's import made: a second of every command (and
    Ctrl-C to exit on a loaded machine past this file's 30 s). The command freezes them as it returns; main(),
    called from Python, leaves the caller's process as it was."""
    import os
    import subprocess
    import sys

    script = ("import atexit, gc, sys\n"
              "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"  # runs last
              "sys.argv = ['fedcache', 'methods']\n"
              "from fedcache.cli.root import {call}\n"
              "{call}{args}\n")
    ran = {call: subprocess.run([sys.executable, "-c", script.format(call=call, args=args)], capture_output=True,
                                text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()), timeout=120)
           for call, args in (("_console_script", "()"), ("main", "(['methods'])"))}
    assert all(r.returncode == 0 for r in ran.values()), {c: r.stderr for c, r in ran.items()}
    assert ran["_console_script"].stdout.splitlines()[-1] == "frozen True"
    assert ran["main"].stdout.splitlines()[-1] == "frozen False"


@pytest.mark.slow
def test_signals_while_the_first_is_handled_change_nothing(toy_store, tmp_path):
    """A second SIGTERM or Ctrl-C reaching `fedcache train` while it stopped for the first raised KeyboardInterrupt
    again wherever it landed (rich printing the "interrupted" line, torch's exit hooks): a traceback, exit -2 or
    -15. A burst of both, every 5 ms after the first until the process is gone, reaches every stage of its handling
    (each try failed so before); the run ends as after one signal."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fedcache.cli", "train", "--store", str(toy_store), "-d", "test-toy",
                             "-b", "tiny-timm-random", "-m", "fedavg", "--partition", "iid", "--clients", "2", "--rounds",
                             "100000", "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    try:
        deadline = time.monotonic() + 60
        while not (out / "checkpoint.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1] if proc.poll() else "timeout"
            time.sleep(0.05)
        for sig in [signal.SIGTERM, signal.SIGINT] * 400:
            if proc.poll() is not None:
                break
            proc.send_signal(sig)
            time.sleep(0.005)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failed test must not leave a run training
            proc.kill()
    assert proc.returncode == 143 and "Traceback" not in err and "Signal" not in err, (proc.returncode, err)
    assert err.count("interrupted") == 1 and "its last checkpoint is kept" in err, err
    assert (out / "checkpoint.pt").exists()


def _all_commands():
    import typer.main

    from fedcache.cli import app

    root = typer.main.get_command(app)

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, prefix + (name,))
            else:
                yield " ".join(prefix + (name,)), cmd

    from fedcache.federate.methods import METHODS

    ctx = root.make_context("fedcache", ["--help"], resilient_parsing=True)
    methods = [(c.name, root.get_command(ctx, c.name)) for _, cls in METHODS.items() for c in cls.commands]
    return list(walk(root, ())) + methods  # commands that methods declare too (fedpcl's backbone-heatmap)


def test_every_option_has_help_and_a_short_flag_means_one_thing():
    missing, meaning = [], {}
    for name, cmd in _all_commands():
        for param in cmd.params:
            if not param.opts or not param.opts[0].startswith("-") or "--help" in param.opts:
                continue
            if not (getattr(param, "help", None) or "").strip():
                missing.append(f"{name} {param.opts[0]}")
            for short in (o for o in param.opts if len(o) == 2):
                meaning.setdefault(short, set()).add(frozenset(param.opts))
    assert not missing, f"options without help: {missing}"
    assert {k: v for k, v in meaning.items() if len(v) > 1} == {}


def test_h_version_and_help(capsys):
    assert main(["--version"]) == 0 and "fedcache 0.1" in capsys.readouterr().out
    assert main(["train", "-h"]) == 0 and "--method" in capsys.readouterr().out


def test_every_help_at_80_columns_shows_every_name_default_and_word_whole(capsys, monkeypatch):
    """At 80 columns, rich cut what did not fit with an ellipsis: `--backbones,--backbo…` (train; `--backb…` in grid),
    the columns of switches' --no- forms and of long choice lists having taken the room (`--clients-per-…` before),
    and long words of the help (`'fedcache[tensorboard…`, demo's default `efficientnet-lite0,efficientnet-l…`).
    Every command's help, the groups' and the methods' own commands too, is read whole."""
    monkeypatch.setenv("COLUMNS", "80")
    cut = {}
    for name, cmd in [("", None), ("store", None)] + _all_commands():
        assert main([*name.split(), "--help"]) == 0, name
        shown = capsys.readouterr().out
        names = [n for p in (cmd.params if cmd else []) if not getattr(p, "hidden", False)
                 for n in (*p.opts, *getattr(p, "secondary_opts", ())) if n.startswith("-")]
        lost = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", shown)]
        if "…" in shown or lost or max(map(len, shown.splitlines())) > 80:
            cut[name or "fedcache"] = [line for line in shown.splitlines() if "…" in line or len(line) > 80] + lost
    assert cut == {}, cut


def test_python_m_fedcache_is_the_command():
    """Where the console script is not on PATH (a venv not activated), `python -m fedcache` said "'fedcache' is a
    package and cannot be directly executed"."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fedcache", "store", "-h"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()), timeout=120)
    assert done.returncode == 0 and "Usage: fedcache store" in done.stdout, done.stderr


def test_a_bug_s_traceback_shows_no_locals():
    """A summary.json whose figure was text failed inside numpy: typer's traceback printed every frame's locals,
    the run's config and summary whole, a thousand lines around the one that said what failed."""
    import os
    import subprocess
    import sys

    script = ("import fedcache.reports\n"
              "def boom(*args, **kwargs):\n"
              "    local = 'LOCAL' + '-VALUE'\n"
              "    raise RuntimeError('a bug')\n"
              "fedcache.reports.write_report = boom\n"
              "import sys; sys.argv = ['fedcache', 'report', 'somewhere']\n"
              "from fedcache._console import main; main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.getcwd(), COLUMNS="80"))
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "RuntimeError: a bug" in said and "LOCAL-VALUE" not in said, said


@pytest.mark.parametrize("argv, suggestion", [(["trian"], "'train'"), (["store", "lss"], "'ls'")])
def test_a_misspelled_command_is_suggested_once(argv, suggestion, capsys):
    """click 8.4+ suggests a close command name itself; typer's suggestion repeated it."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("Did you mean") == 1 and suggestion in err


@pytest.mark.parametrize("argv, said", [
    (["train", "--seet", "lr=1"], "error: No such option '--seet'. (Did you mean one of: '--preset', '--seed', "
                                  "'--set'?) See `fedcache train --help`."),
    (["trian"], "error: No such command 'trian'. Did you mean 'train'? See `fedcache --help`."),
    (["report", "a", "b"], "error: Got unexpected extra argument (b). See `fedcache report --help`."),
    (["train", "--clients-per-round", "10"], "error: No such option '--clients-per-round'. (Did you mean one of: "
     "'--clients', '--clients-per-domain'?) A round samples --fraction of the clients (10 of 5,000 a round: "
     "--fraction 0.002). See `fedcache train --help`."),
])
def test_a_misspelled_option_or_command_is_one_line(argv, said, capsys):
    """click printed its usage, a 'Try --help' line and the error in three lines; every other mistake is one."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == said and not captured.out, captured


@pytest.mark.parametrize("argv", [[], ["store"]])
def test_a_group_given_nothing_shows_its_help_alone(argv, capsys):
    """The one-line handler of usage errors printed `error: . See ...` under the help of `fedcache store`."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert "Usage: fedcache" in shown and "error:" not in shown and "Commands" in shown, shown


def test_every_command_and_argument_has_its_help_under_h(capsys, monkeypatch):
    """-h on every command and group; each argument's help is shown (click 8.5 dropped typer's argument help:
    `fedcache report -h` listed RUN_DIR with none)."""
    monkeypatch.setenv("COLUMNS", "300")  # one line per parameter
    arguments = 0
    for name, cmd in [*_all_commands(), ("store", None)]:
        assert main([*name.split(), "-h"]) == 0, name
        shown = capsys.readouterr().out
        assert f"fedcache {name}" in shown, name
        for param in [p for p in (cmd.params if cmd else []) if p.param_type_name == "argument"]:
            assert param.help and param.help in shown, (name, param.name)
            arguments += 1
    assert arguments >= 6  # report, reproduce, flower-app, store info, store rm, store import


EXTRACT_BAD = [  # issue 18: each was a traceback after loading the model (or, for 0, silently the default)
    ("--image-size", "-5", "--image-size=-5: must be >= 1"),
    ("--image-size", "0", "--image-size=0: must be >= 1"),
    ("--workers", "-1", "--workers=-1: must be >= 0"),
    ("--batch-size", "0", "--batch-size=0: must be >= 1"),
    ("--batch-size", "-4", "--batch-size=-4: must be >= 1"),
    ("--views", "-1", "--views=-1: must be >= 0"),
    ("--seed", "-1", "--seed=-1: must be >= 0"),
    ("--wait", "nan", "--wait=nan: must be a finite number"),
    ("--image-noise", "gaussian,-1,0.5", "--image-noise"),
]


@pytest.mark.parametrize("flag,value,message", EXTRACT_BAD)
def test_extract_numbers_are_checked_before_any_work(flag, value, message, capsys, store_path):
    # "nope" is no dataset: an unchecked value would fail there instead (exit 1, unknown dataset).
    code, _, err = run(capsys, "extract", "-d", "nope", "-b", "tiny-timm-random", "--store", str(store_path), flag, value)
    assert code == 2 and message in err and "Traceback" not in err, err


def test_grid_seeds_must_be_whole_numbers(capsys, tmp_path):
    code, _, err = run(capsys, "grid", "--store", str(tmp_path / "missing.zarr"), "-d", "x", "-b", "y", "-m", "fedavg",
                       "--seeds", "0,a", "-o", str(tmp_path / "g"))
    assert code == 2 and "'a': expected an integer" in err and "Traceback" not in err, err


def test_every_command_shows_an_example_that_parses(capsys):
    import shlex

    for name, cmd in _all_commands():
        assert (cmd.epilog or "").startswith(f"Example: fedcache {name}"), f"{name} has no example in its help"
        words = shlex.split(cmd.epilog.removeprefix("Example: "))[1 + len(name.split()):]
        cmd.make_context(name, words)  # raises on an unknown option or a missing required one
    assert main(["store", "rm", "-h"]) == 0 and "Example: fedcache store rm" in capsys.readouterr().out


def test_grid_shows_train_s_defaults_as_train_does():
    """A grid option is unset unless given (so it is no axis), but its help shows the default train uses."""
    from fedcache.cli import GRID_OWN
    from fedcache.spec import grid_options

    commands = dict(_all_commands())
    # grid's own options (e.g. --engine batched|processes) are not train's and show grid's default
    own = set(GRID_OWN) | {o.name for o in grid_options()}
    grid = {p.name: p for p in commands["grid"].params if p.name not in own}
    checked = 0
    for p in commands["train"].params:
        if p.name in grid and not p.is_flag and p.default not in (None, [], (), ""):
            assert f"\\[default: {p.default}]" in grid[p.name].help, (p.name, grid[p.name].help)
            checked += 1
    assert checked >= 10
    for o in grid_options():  # grid's own defaults are shown the same way ("Default processes." was not)
        if o.default is not None:
            assert f"\\[default: {o.default}]" in commands["grid"].params[[p.name for p in commands["grid"].params].index(o.name)].help


def test_help_text_with_brackets_is_shown_as_written(capsys, monkeypatch):
    """Help is rich markup: 'fedcache[tensorboard]' lost its extra ([tensorboard] read as a style)."""
    monkeypatch.setenv("COLUMNS", "300")  # one line per option
    for command in ("train", "grid"):
        assert main([command, "-h"]) == 0
        assert "pip install 'fedcache[tensorboard]' / 'fedcache[mlflow]'" in capsys.readouterr().out


def test_methods_name_shows_every_setting_with_its_default_and_range(capsys):
    """`fedcache methods NAME`: each of the method's --set settings, its default and what it accepts, read from
    its Params (so a new setting shows without a CLI change); an unknown name is one line naming the known ones."""
    import dataclasses

    from fedcache.cli import main
    from fedcache.federate.methods import METHODS

    assert main(["methods", "fedproto"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(METHODS.get("fedproto").Settings):
        assert f.name in out
    assert "one of weighted, uniform" in out and "a finite number >= 0" in out and "docs/methods/fedproto.md" in out
    assert main(["methods", "fedprox"]) == 0
    assert "mu" in capsys.readouterr().out
    # --preset's help sends the reader to `fedcache methods` for the method's preset: it is there.
    assert main(["methods", "fst-cbdg"]) == 0
    out = capsys.readouterr().out
    assert "Optimizer: preset fst-cbdg (SGD 0.01, momentum 0.9, wd 1e-05)" in out
    assert "--set lr=VALUE --set weight_decay=VALUE" in out  # as train takes them (a comma splits no --set)
    assert main(["methods", "linear-probe"]) == 0
    assert "Optimizer: none" in capsys.readouterr().out
    assert main(["methods", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_backbones_name_says_what_it_takes_and_how_it_gets_its_weights(capsys):
    """`fedcache backbones NAME` was refused ("unexpected extra argument") where `datasets NAME` and `methods NAME`
    answer, though a backbone's checkpoint instructions (FedPCL's ResNet18s) were in no listing's column whole."""
    from fedcache.cli import main
    from fedcache.extract.backbones import BACKBONES

    assert main(["backbones", "resnet18-quickdraw"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("resnet18-quickdraw: ResNet18 trained on Meta-Dataset QuickDraw")
    assert "embedding 512-d; images 64x64 unless" in out and "text tower: none" in out
    assert "weights: " + " ".join(BACKBONES.get("resnet18-quickdraw").weights_help.split()) in out
    assert main(["backbones", "tiny-clip-random"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "32x32 only" in out and "text tower: yes" in out and "weights: RANDOM, " in out
    assert main(["backbones", "clip-rn5"]) == 2
    assert "unknown backbone 'clip-rn5'" in capsys.readouterr().err


def test_datasets_name_says_how_to_get_it(capsys):
    """`fedcache datasets` had no word of how to get a dataset, though digit5's instructions (and the docs) sent
    their reader there for each of its domains."""
    from fedcache.cli import main
    from fedcache.extract.datasets import DATASETS

    assert main(["datasets", "cifar10"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("cifar10: CIFAR-10") and "classes 10: airplane," in out
    assert "how to get it: " + " ".join(DATASETS.get("cifar10").how_to_get.split()) in out
    assert main(["datasets", "digit5"]) == 0
    assert "domains mnist, mnist-m, svhn, synthdigits, usps" in capsys.readouterr().out
    assert main(["datasets", "cifar"]) == 2
    assert "unknown dataset 'cifar'" in capsys.readouterr().err


def test_an_interrupt_while_torch_imports_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM in a train's first seconds (torch still importing) reached the word after the interrupt,
    which imported torch again: half imported, it raised a RuntimeError traceback and exit 1 instead of 130."""
    import sys

    from fedcache.cli.root import _how_to_go_on

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as a half-imported torch does
    monkeypatch.delitem(sys.modules, "fedcache.federate.rundir", raising=False)
    assert _how_to_go_on(["train", "--out", str(tmp_path / "run")]).startswith("no round had finished")


def _as_help_shows(o):
    """A default as `--help` writes it ("" where it shows none)."""
    d = o.default
    if d is None or d == {} or o.required:
        return ""
    if isinstance(d, bool):  # a switch off by default is its flag alone, and shows no default
        return o.flags[0].split("/")[0].lstrip("-") if d else ""
    return ",".join(d) if isinstance(d, tuple) else str(d)


def test_extract_help_lists_every_setting_with_its_help_and_default(capsys, monkeypatch):
    """`fedcache extract`'s options are generated from ExtractConfig and DatasetOptions (fedcache/extract/config.py):
    every field is an option (dataset_options by its own fields), shown with the field's help and default, and
    the defaults the command passes are the fields' own. The options were a second, hand-written table."""
    import dataclasses
    import inspect

    from fedcache.cli.extract import extract
    from fedcache.extract.config import DatasetOptions, ExtractConfig, extract_config, options

    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    assert main(["extract", "-h"]) == 0
    lines = capsys.readouterr().out.splitlines()
    declared = {o.field: o for o in options()}
    fields = {f.name for cls in (ExtractConfig, DatasetOptions) for f in dataclasses.fields(cls)} - {"dataset_options"}
    assert set(declared) == fields
    for o in declared.values():
        line = next((l for l in lines if re.search(rf"\s{o.flag}[\s,]", l)), "")
        assert o.help in line, (o.name, line)
        shown = _as_help_shows(o)
        assert (f"[default: {shown}]" in line) if shown else "[default:" not in line, (o.name, line)
    given = {n: p.default.default for n, p in inspect.signature(extract).parameters.items() if p.default.default is not ...}
    assert extract_config(dataset="d", backbones="b", **given) == ExtractConfig(dataset="d", backbones=("b",))


@pytest.mark.parametrize("args, said", [
    (["train", "--rounds", "abc"], "error: Invalid value for '--rounds': 'abc' is not a valid integer."),
    (["train", "-d", "x", "--fraction", "half"], "error: Invalid value for '--fraction': 'half' is not a valid float."),
    (["grid", "--jobs", "two"], "error: Invalid value for '--jobs' / '-j': 'two' is not a valid integer."),
])
def test_a_value_of_the_wrong_type_is_one_line_as_every_other_bad_value(capsys, args, said):
    """click's own type check (an integer option given text) printed its usage and a 'Try --help' line around the
    error, where fedcache's checks of every other bad value (--rounds 0) print one line; exit 2 either way."""
    code, out, err = run(capsys, *args)
    assert code == 2 and err.strip() == said and not out, (out, err)


GRID_HINT = "`fedcache train` runs one value: `fedcache grid` takes the same options, a comma list making an axis"


@pytest.mark.parametrize("args, said", [
    (["--alpha", "0.1,1"], "Invalid value for '--alpha': '0.1,1' is not a valid float; " + GRID_HINT + " (--alpha 0.1,1)"),
    (["--rounds=2,3"], "Invalid value for '--rounds': '2,3' is not a valid integer; " + GRID_HINT + " (--rounds 2,3)"),
    (["--set", "lr=0.1,0.2"], "--set lr='0.1,0.2': expected a finite number; " + GRID_HINT + " (--set lr=0.1,0.2)"),
    (["--set", "lr=abc"], "--set lr='abc': expected a finite number"),
    (["--set", "lr=0.1,weight_decay=0"], "--set lr='0.1,weight_decay=0' holds 2 pairs; give each its own: --set lr=0.1 "
                                         "--set weight_decay=0"),
    # "lr=0.1 momentum=0.5" (docs/python-api.md said --set's value is space-separated pairs) was a bad lr
    (["--set", "lr=0.1 weight_decay=0 optimizer=sgd"], "--set lr='0.1 weight_decay=0 optimizer=sgd' holds 3 pairs; give "
                                                       "each its own: --set lr=0.1 --set weight_decay=0 --set optimizer=sgd"),
    (["--partition", "iid,dirichlet"], "--partition (partition.scheme)='iid,dirichlet': must be one of class-disjoint, "
                                       "dirichlet, domain, domain-dirichlet, iid, shards (did you mean 'dirichlet'?); "
                                       + GRID_HINT + " (--partition iid,dirichlet)"),
    (["--alpha", "half"], "Invalid value for '--alpha': 'half' is not a valid float."),
])
def test_train_given_a_comma_list_says_a_grid_makes_it_an_axis(capsys, args, said):
    """A user who gives train a list of values (as to a grid) most likely meant a sweep: the error says which
    command makes one, and nothing where the value was no list."""
    code, out, err = run(capsys, "train", "-d", "x", "-b", "y", "-m", "fedavg", *args)
    assert code == 2 and " ".join(err.split()) == "error: " + said, (out, err)


def test_train_given_a_comma_list_of_methods_says_a_grid_makes_it_an_axis(capsys):
    code, out, err = run(capsys, "train", "-d", "x", "-b", "y,z", "-m", "fedavg,fedprox")
    said = " ".join(err.split())
    assert code == 2 and said.startswith("error: unknown method 'fedavg,fedprox'. Did you mean"), said
    assert said.endswith(", tpfl; " + GRID_HINT + " (--method fedavg,fedprox)"), said  # not of -b: fused backbones


def test_a_missing_argument_still_shows_the_usage(capsys):
    """A missing argument is a BadParameter too, but the one-line form of a wrong value would drop the usage line
    that says what the command takes."""
    code, out, err = run(capsys, "store", "info")
    assert code == 2 and "Usage: fedcache store info" in err and "Missing argument 'ENTRY'" in err, (out, err)


@pytest.mark.parametrize("args, said", [
    (["train", "--out", ""], "an empty argument after --out"),
    (["grid", "--out=", "-m", "fedavg"], "--out= with nothing after the ="),
    (["report", ""], "an empty argument after report"),
])
def test_an_empty_argument_is_refused_before_anything_runs(capsys, tmp_path, monkeypatch, args, said):
    """``--out "$RUN"`` with RUN unset: an empty path is the current directory, where the run would have
    written its files."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *args)
    assert code == 2 and said in err and "an unset shell variable" in err, err
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_report_says_the_last_report_is_kept_not_resume():
    from fedcache.cli.root import _how_to_go_on

    said = _how_to_go_on(["report", "runs/cmp"])  # a Ctrl-C as the new report is put in place waits until it is
    assert "resume" not in said and "the last one (if any) as it was, or the new one where it was being put" in said


@pytest.mark.parametrize("argv, said", [(["store", "ls", "--store", "s.zarr"], "it only reads the store: nothing was changed"),
                                        (["store", "rm", "abc"], "the entries it said it removed are gone"),
                                        (["store", "export", "-o", "f.h5"], "no part of the export was written"),
                                        (["store", "import", "f.npz"], "none while it was checking the file")])
def test_an_interrupted_store_command_says_what_it_left_not_resume(argv, said):
    """Every command but train and report was told "finished work is kept; re-run the same command to resume"."""
    from fedcache.cli.root import _how_to_go_on

    assert said in _how_to_go_on(argv) and "resume" not in _how_to_go_on(argv)


def _extract_interrupted(capsys, monkeypatch, store, at) -> str:
    """The "interrupted" line of `fedcache extract` on the tests' dataset, Ctrl-C'd at the progress event ``at(e)``
    says is the one (batches of 4 in chunks of 8: a train entry has 8)."""
    import fedcache.cli.common as common

    shown = getattr(common.ExtractProgress.__call__, "shown", common.ExtractProgress.__call__)  # not an earlier call's

    def interrupt(self, e):
        shown(self, e)
        if at(e):
            raise KeyboardInterrupt

    interrupt.shown = shown
    monkeypatch.setattr(common.ExtractProgress, "__call__", interrupt)
    code, _, err = run(capsys, "extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store),
                       "--workers", "0", "--batch-size", "4", "--chunk-rows", "8")
    assert code == 130, err
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    return line


def test_an_interrupted_extract_says_what_it_finished_and_wrote(capsys, monkeypatch, tmp_path):
    """"interrupted: finished work is kept" was said of an extraction stopped before it had written anything, even
    before it had made its store. What it finished, what of the entry it was writing it wrote, or that it wrote
    nothing, as it was."""
    import fedcache.extract.runner as runner

    store, advances = tmp_path / "s.zarr", []
    real = runner.load_backbone
    monkeypatch.setattr(runner, "load_backbone", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert _extract_interrupted(capsys, monkeypatch, store, lambda e: False) == (
        f"interrupted: nothing was written (no store was made at {store}); re-run the same command")
    assert not store.exists()
    monkeypatch.setattr(runner, "load_backbone", real)
    assert _extract_interrupted(capsys, monkeypatch, store, lambda e: e.kind == "start") == (
        "interrupted: nothing was finished: no entry completed and no batch of features kept; re-run the same command")
    line = _extract_interrupted(capsys, monkeypatch, store, lambda e: e.kind == "advance" and (advances.append(e) or len(advances) == 10))
    assert line == ("interrupted: the 1 entry it finished is kept, and the 8 rows of test-toy/train/dark "
                    "tiny-timm-random it wrote; re-run the same command to go on after them"), line
    line = _extract_interrupted(capsys, monkeypatch, store, lambda e: e.kind == "advance")  # resumes at row 8 of dark
    assert line == ("interrupted: the 4 rows of test-toy/train/dark tiny-timm-random it wrote are kept; re-run the same "
                    "command to go on after them"), line


def test_extract_says_in_one_line_a_dataset_option_its_dataset_does_not_read(capsys, monkeypatch, tmp_path):
    """`--data-root DIR` given to a dataset that reads no data folder (the embedded digits5-offline) was taken without
    a word: the user believed their folder read. Said in one line where typed; the extraction goes on. A Python call
    says nothing (`fedcache reproduce` gives its --data-root to every dataset), and the entries record no folder: the
    commands they are finished or completed by named it too."""
    import logging
    from dataclasses import replace

    import fedcache
    from fedcache.extract.datasets import DATASETS
    from fedcache.store.feature_store import FeatureStore

    monkeypatch.setitem(DATASETS._items, "test-toy", replace(DATASETS.get("test-toy"), reads=frozenset({"seed"})))
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a shell: the command's own stderr handler
    store = tmp_path / "s.zarr"
    given = ["-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store), "--workers", "0", "--splits", "test"]
    code, _, err = run(capsys, "extract", *given, "--domains", "light", "--data-root", str(tmp_path), "--seed", "1")
    assert code == 0, err
    assert [line for line in err.splitlines() if "read" in line and "--data-root" in line] == [
        "WARNING fedcache.cli: dataset test-toy does not read --data-root: it is ignored"], err
    (entry,) = FeatureStore(store).entries()
    assert entry.attrs["dataset_options"] == {"seed": 1}  # --seed is read, and recorded
    (completes,) = [line for line in err.splitlines() if line.startswith("a run on test-toy")]  # its other domain's
    assert "--dataset test-toy --seed 1 --backbones" in completes and "--data-root" not in completes, completes
    code, _, err = run(capsys, "extract", *given, "--download")
    assert code == 0 and "WARNING fedcache.cli: dataset test-toy does not read --download: it is ignored" in err, err
    code, _, err = run(capsys, "extract", *given, "--seed", "1")
    assert code == 0 and "does not read" not in err, err
    fedcache.extract_features("test-toy", ["tiny-timm-random"], store=store, data_root=tmp_path, workers=0, seed=1,
                              splits="test")
    assert "does not read" not in capsys.readouterr().err  # logging's last resort prints a warning of no handler


def test_an_interrupted_extract_of_an_entry_begun_in_store_format_1_says_the_rows_it_keeps(capsys, monkeypatch, tmp_path):
    """An entry an older fedcache began (store format 1) keeps no rows of an unfinished chunk: "the 4 rows it wrote
    are kept" was said of a batch that a re-run writes again (`store ls` then said 0/30 rows kept)."""
    import functools

    import fedcache.extract.runner as runner
    from fedcache.store.writer import open_writer

    store, advances = tmp_path / "s.zarr", []
    monkeypatch.setattr(runner, "open_writer", functools.partial(open_writer, entry_format=1))
    assert _extract_interrupted(capsys, monkeypatch, store, lambda e: e.kind == "advance") == (
        "interrupted: nothing was finished: no entry completed and no batch of features kept; re-run the same command")
    line = _extract_interrupted(capsys, monkeypatch, store, lambda e: e.kind == "advance" and (advances.append(e) or len(advances) == 3))
    assert line == ("interrupted: the 8 rows of test-toy/train/light tiny-timm-random it wrote are kept; re-run the "
                    "same command to go on after them"), line  # of 12 written: a chunk of 8, and a batch of the next
    assert main(["store", "ls", "--store", str(store)]) == 0
    assert "partial 8/30 rows" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("args", [["datasets"], ["extract", "-d", "nope", "-b", "tiny-timm-random"], ["--nope"]])
def test_main_called_from_python_gives_the_process_back(args, monkeypatch, capsys):
    """main() from a script or a notebook left its stderr handler on the root logger (every later log line of the
    caller's printed twice, or at FEDCACHE_LOG's level), the root logger at that level, and typer's sys.excepthook."""
    import logging
    import sys

    monkeypatch.setenv("FEDCACHE_LOG", "info")
    root = logging.getLogger()
    # As in a script: no handler yet (pytest's own would make logging.basicConfig add none), Python's hook.
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    before = (list(root.handlers), root.level, sys.excepthook)
    main(args)
    assert (list(root.handlers), root.level, sys.excepthook) == before


def test_the_train_line_says_which_std_and_that_bytes_are_totals():
    """`fedavg: 61.58 (15.93)% over clients, ..., 12,810,000 B up` left the reader to guess what the bracket and
    the bytes were: a std over clients, and totals over every round."""
    from fedcache.cli import _result_line

    line = _result_line({"method": "fedavg", "mean_accuracy": 61.58, "std_accuracy": 15.93, "global_accuracy": 61.0,
                         "params_up_per_client": 12810, "params_up_per_round": 64050, "bytes_up": 12810000,
                         "bytes_down": 12810000, "rounds": 50, "seconds": 7.4})
    assert "61.58% mean over clients (std 15.93), global 61.00%" in line
    assert "12,810,000 B up and 12,810,000 B down in all; 50 rounds" in line


def test_train_refuses_a_partition_option_its_scheme_ignores_every_time(capsys, toy_store, tmp_path):
    """`--alpha 0.3` with the default iid scheme warned only when the partition was first made: a re-run found it
    stored, printed nothing, and trained IID. It is refused every time, naming what to do; left at its default, or
    with a scheme that reads it, it is fine."""
    import fedcache
    from fedcache.errors import ConfigError

    data = ["--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "--clients", "2"]
    args = [*data, "-m", "fedavg", "--rounds", "1"]
    for _ in range(2):
        code, _, err = run(capsys, "train", *args, "--alpha", "0.3")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert ("--alpha 0.3: the partition scheme iid ignores alpha, so the run would be the same without it; drop "
                "--alpha, or use a scheme that reads it (--partition dirichlet or domain-dirichlet)") in err
    code, _, err = run(capsys, "partition", *data, "--alpha", "0.5")  # given at its default value: still given
    assert code == 2 and "ignores alpha" in err
    code, _, err = run(capsys, "shard", *data, "--alpha", "0.3", "--out", str(tmp_path / "shards"))
    assert code == 2 and "ignores alpha" in err and not (tmp_path / "shards").exists()
    # From Python, named by the keywords given
    with pytest.raises(ConfigError, match=r"^shards=3: the partition scheme dirichlet ignores shards.*; drop shards, "
                                          r"or use a scheme that reads it \(partition='shards'\)$"):
        fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", partition="dirichlet", shards=3, rounds=1)
    # From Python a default passed is no choice: a wrapper passing every option (**vars(args)) still runs
    fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", clients=2, alpha=0.5, shards=2, rounds=1)
    for extra in ([], ["--partition", "dirichlet", "--alpha", "0.3"]):
        code, _, err = run(capsys, "train", *args, *extra)
        assert code == 0, err


def test_a_run_recorded_with_an_option_its_scheme_ignores_resumes(capsys, toy_store, tmp_path):
    """A run started before the refusal (`--alpha 0.3` with iid, in its config.json) could not be resumed: with
    --alpha it was refused, and without it --resume found the options differ (alpha 0.3 there, 0.5 here)."""
    from fedcache.spec import RunSpec
    from fedcache.training import train

    args = ["--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "--clients", "2", "-m", "fedavg",
            "--rounds", "1", "--alpha", "0.3", "--out", str(tmp_path / "run")]
    train(RunSpec.of(store=toy_store, dataset="test-toy", backbones=["tiny-timm-random"], method="fedavg", clients=2,
                     rounds=1, alpha=0.3, out=tmp_path / "run"))
    code, _, err = run(capsys, "train", *args, "--resume")
    assert code == 0, err


def test_validation_without_spare_rows_advises_for_what_was_given(capsys, toy_store):
    """`--few-shot N` that keeps every row its clients hold was told to add `--subsample 0.8 ... or --few-shot N`,
    as if it had not been given."""
    args = ["train", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
            "--partition", "domain", "--rounds", "1", "--validation"]
    code, _, err = run(capsys, *args, "--few-shot", "10")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--few-shot 10 left every row to its clients; use a smaller --few-shot, or add --subsample 0.8" in err
    assert "or --few-shot N" not in err
    code, _, err = run(capsys, *args)
    assert code == 2 and "add --subsample 0.8 (each client trains on 80% of its rows; the rest are spare) or --few-shot N" in err


def test_a_piped_table_is_whole(toy_store):
    """Piped or redirected, a listing was cut at 160 columns (or COLUMNS) with an ellipsis: `synt…`, `(handwr…`,
    `fedavg ... average of locally trained heads, weighted by s…`. A pipe has no width to fit: every column whole."""
    import os
    import subprocess
    import sys

    from fedcache.extract.datasets import DATASETS
    from fedcache.federate.methods import METHODS

    env = {**os.environ, "COLUMNS": "80"}
    def piped(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "fedcache.cli", *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, check=True)
        assert "…" not in done.stdout, done.stdout
        return done.stdout

    out = piped("datasets")
    spec = DATASETS.get("digits5-offline")
    assert ",".join(spec.domains) in out and spec.description in out
    assert METHODS.get("fedavg").description in piped("methods")
    assert "tiny-timm-random RANDOM" in piped("store", "ls", "--store", str(toy_store))


def test_train_and_grid_help_name_only_their_own_flags():
    """`grid -h` said --keep-checkpoints keeps `what --resume needs` and --track writes `under --track-dir`, options
    grid has not; `train -h` did not say that a run without --out writes nothing."""
    import re as re_

    commands = dict(_all_commands())
    for name in ("train", "grid"):
        cmd = commands[name]
        flags = {f for p in cmd.params for f in (*p.opts, *p.secondary_opts)}
        for p in cmd.params:
            named = set(re_.findall(r"(?<![\w-])--[a-z][a-z-]*", getattr(p, "help", None) or ""))
            assert named <= flags, (name, p.name, named - flags)
    out = next(p for p in commands["train"].params if p.name == "out")
    assert "Left out, the run writes nothing" in out.help


@pytest.mark.parametrize("command", ["train", "shard"])
def test_features_missing_from_the_store_are_advised_to_be_extracted_only_where_they_can_be(capsys, toy_store, tmp_path,
                                                                                           command):
    """`train -d digits5` (no such dataset) ended `or extract them: fedcache extract ... --dataset digits5`; so did a
    backbone that no registry knows, and `shard` still did after train no longer did. Such a name is said to be
    unknown, with the name fedcache knows that is close."""
    base = [command, "--store", str(toy_store), "--out", str(tmp_path / "out"),
            *({"train": ["-m", "fedavg", "--rounds", "1"], "shard": ["--clients", "2"]}[command])]
    for data, unknown, near in ((["-d", "digits5", "-b", "tiny-timm-random"], "dataset 'digits5'", "digit5"),
                                (["-d", "test-toy", "-b", "efficientnet-lite"], "backbone 'efficientnet-lite'",
                                 "efficientnet-lite0"),
                                (["-d", "test-toy", "-b", "tiny-timm-random,efficientnet-lite"],
                                 "backbone 'efficientnet-lite'", "efficientnet-lite0")):
        code, _, err = run(capsys, *base, *data)
        assert code == 2 and len(err.strip().splitlines()) == 1, err  # an unknown name, as an unknown method is
        assert f"it knows no {unknown} (did you mean " in err and f"'{near}'" in err and "`fedcache extract" not in err, err
    for data in (["-d", "digits5-offline", "-b", "tiny-timm-random"], ["-d", "test-toy", "-b", "tiny-clip-random"]):
        code, _, err = run(capsys, *base, *data)
        assert code == 1 and "or extract them: `fedcache extract" in err, err
    assert not (tmp_path / "out").exists()


def test_train_advice_on_divergence_names_the_lr_as_typed(capsys, toy_store, tmp_path):
    """``--set optim.lr=1e300`` diverged with the advice ``--set lr=...``: named as typed, it is the one to lower."""
    code, _, err = run(capsys, "train", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m",
                       "fedavg", "--clients", "2", "--rounds", "2", "--set", "optim.lr=1e300", "--out", str(tmp_path / "r"))
    assert code == 1 and "lower the learning rate (--set optim.lr=...)" in err, err


def test_store_exports_help_names_its_options_whole_at_80_columns():
    """`--overwrite/--no-overwrite`'s column cut `--backbone,--backbon…` there; the switch has no --no- form."""
    import os
    import subprocess

    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run([sys.executable, "-m", "fedcache", "store", "export", "--help"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0 and "--backbone,--backbones" in done.stdout and "…" not in done.stdout, done.stdout
