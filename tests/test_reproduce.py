"""fedcache reproduce: every preset's dry run, and a real run of a tiny preset on the toy store."""
from __future__ import annotations

import json
import re

import pytest

from fedcache import presets as ps
from fedcache import reproduce as rp
from fedcache.cli import main
from fedcache.errors import ConfigError

PAPER_PRESETS = ["fedpcl-table2", "fedpcl-table3", "fedpcl-fairness", "fedpcl-table11", "fedpcl-table15",
                 "fst-cbdg-table1", "fst-cbdg-table2", "flesd-table1", "tpfl-table1", "tpfl-table2", "fst-cbdg", "tpfl"]


def test_every_paper_preset_exists_and_names_real_things():
    from fedcache.extract.backbones import BACKBONES
    from fedcache.extract.datasets import DATASETS
    from fedcache.federate.methods import METHODS
    from fedcache.config import fields_of
    from fedcache.spec import is_option

    assert set(PAPER_PRESETS) <= set(rp.names())
    for name in PAPER_PRESETS:
        p = rp.get(name)
        keys = {e.key for e in p.experiments}
        assert p.paper and all(n.experiment in keys for n in p.paper), name
        for e in p.experiments:
            assert e.dataset in DATASETS and all(b in BACKBONES for b in e.backbones), e
            # Run options, or a method setting that every method of the grid owns (FedRep's E = 1 grid).
            owned = set.intersection(*(set(fields_of(METHODS.get(m).Settings)) for m in e.methods))
            assert all(is_option(k) or k in owned for k in e.sweep), e.sweep
        for n in p.paper:
            exp = next(e for e in p.experiments if e.key == n.experiment)
            assert n.method in exp.methods and 0 < n.value <= 100, n


def test_fedpcl_table2_carries_the_papers_numbers():
    p = rp.get("fedpcl-table2")
    got = {(n.experiment, n.method): n.value for n in p.paper}
    assert got["multi-fedpcl", "fedpcl"] == 55.34 and got["single", "fedproto"] == 51.93 and got["multi", "solo"] == 48.37


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_dry_run_lists_runs_and_what_is_missing(preset, tmp_path, capsys):
    code = main(["reproduce", preset, "--dry-run", "--store", str(tmp_path / "none.zarr")])
    out = capsys.readouterr().out
    assert code == 1 and "missing (the 'how' column says how to get each): a run would stop at the first" in out
    p = rp.get(preset)
    assert p.title.split(" (")[0] in out
    # The paper is named as a reader finds it, not by the file name of the text it was read from
    assert '"' in p.source and not re.search(r"\d{3}_[0-9a-f]{16}\.txt", out)
    assert all(f"{e.key}:" in out for e in p.experiments)
    # Nothing of these papers' data is on a test machine: every dataset is reported missing with a way to get it.
    needs = rp.check(p, tmp_path / "none.zarr")
    missing = [n for n in needs if n.kind == "dataset" and not n.ok]
    assert missing and all(n.how for n in missing)
    assert "missing" in out


@pytest.mark.parametrize("preset", ["fst-cbdg", "fedpcl-table3"])
def test_the_check_asks_the_store_once_for_each_dataset_and_backbone(preset, tmp_path, monkeypatch):
    """Each experiment asked the store of its every backbone, though their needs were listed: 18 asks, not 4."""
    asked = []
    monkeypatch.setattr(rp, "_cached", lambda store, e, b: asked.append((e.store_dataset, b)) or False)
    p = rp.get(preset)
    rp.check(p, tmp_path / "none.zarr")
    assert sorted(asked) == sorted({(e.store_dataset, b) for e in p.experiments for b in e.backbones})
    assert len(asked) < sum(len(e.backbones) for e in p.experiments)  # the presets share them: the test can fail


def test_user_checkpoint_backbones_are_missing_without_weights(tmp_path):
    needs = {(n.kind, n.name): n for n in rp.check(rp.get("fedpcl-table2"), tmp_path / "none.zarr")}
    assert not needs["weights", "resnet18-quickdraw"].ok
    assert needs["weights", "resnet18-quickdraw"].how.count("--weights resnet18-quickdraw=PATH") == 1  # said once
    ckpt = tmp_path / "q.pth"
    ckpt.write_bytes(b"")
    needs = {(n.kind, n.name): n for n in rp.check(rp.get("fedpcl-table2"), tmp_path / "none.zarr", weights={"resnet18-quickdraw": ckpt})}
    assert needs["weights", "resnet18-quickdraw"].ok


def test_an_unregistered_method_is_reported_and_refused(tmp_path):
    preset = ps.Preset("test-missing-method", "t", "-", (ps.Experiment("e", "test-toy", ("tiny-timm-random",), ("no-such-method",)),), ())
    needs = rp.check(preset, tmp_path / "s.zarr")
    assert [n.name for n in needs if not n.ok] == ["no-such-method"]
    with pytest.raises(ConfigError, match="no-such-method.*not registered"):
        rp.reproduce(preset, tmp_path / "s.zarr", tmp_path / "out")


TOY = ps.Preset(
    "test-toy-preset", "A tiny preset for tests (its 'paper' numbers are made up for the test)", "-",
    (ps.Experiment("toy", "test-toy", ("tiny-timm-random",), ("fedavg", "solo"), {"clients": 2, "rounds": 2, "lr": [0.01, 0.1]}, seeds=(0,)),),
    (ps.PaperNumber("toy", "fedavg", 50.0, "FedAvg, lr 0.1", {"lr": 0.1}), ps.PaperNumber("toy", "solo", 40.0, "Solo, lr 0.01", {"lr": 0.01})),
)
TOY_E = TOY.experiments[0]


def test_a_real_run_writes_the_report_with_the_papers_numbers(tmp_path):
    html = rp.reproduce(TOY, tmp_path / "s.zarr", tmp_path / "out")
    paper = json.loads((tmp_path / "out" / "paper.json").read_text())
    assert [r["paper"] for r in paper["rows"]] == [50.0, 40.0]
    assert all(r["fedcache"] is not None and 0 <= r["fedcache"] <= 100 for r in paper["rows"])
    from fedcache.table import Table

    cells = Table.from_csv(tmp_path / "out" / "toy" / "results.csv")
    assert paper["rows"][0]["fedcache"] == cells.where(method="fedavg", lr=0.1).column("mean_accuracy")[0]
    text = html.read_text()
    assert "Paper vs fedcache" in text and "FedAvg, lr 0.1" in text


def test_combined_presets_hold_every_table_and_number():
    for name, parts in (("fst-cbdg", ("fst-cbdg-table1", "fst-cbdg-table2")), ("tpfl", ("tpfl-table1", "tpfl-table2"))):
        whole, tables = rp.get(name), [rp.get(p) for p in parts]
        assert len(whole.experiments) == sum(len(t.experiments) for t in tables)
        assert sorted(n.value for n in whole.paper) == sorted(n.value for t in tables for n in t.paper)
        assert len({e.key for e in whole.experiments}) == len(whole.experiments)  # no folder shared by two tables


def test_tpfl_tables_run_every_method_with_the_papers_adam():
    """TPFL Sec. 4.1 states one optimizer, Adam 1e-3: PromptFL's row must not fall back to its own SGD default."""
    from fedcache.federate.optim_config import OPTIMIZER_PRESETS as OPTIM

    for name in ("tpfl-table1", "tpfl-table2"):
        for e in ps.PRESETS.get(name).experiments:
            assert "promptfl" in e.methods and e.sweep["preset"] == "tpfl", (name, e.key)
    assert (OPTIM["tpfl"].optimizer, OPTIM["tpfl"].lr) == ("adam", 1e-3)


# fedpcl-table3 sweeps `alpha`, which perfedavg also owns (method.alpha): the grid refuses the ambiguous key.
# Its presets belong to the `protocol` branch (partition.alpha fixes it); remove this entry when that is merged.
_CELLS_REFUSED: set = set()


def _experiments():
    for name in ps.PRESETS.names():
        for e in ps.PRESETS.get(name).experiments:
            marks = [pytest.mark.xfail(strict=True, raises=ConfigError, reason="ambiguous alpha, branch protocol")] \
                if (name, e.key) in _CELLS_REFUSED else []
            yield pytest.param(name, e, id=f"{name}/{e.key}", marks=marks)


@pytest.mark.parametrize("name,experiment", list(_experiments()))
def test_every_preset_cell_resolves(name, experiment, tmp_path):
    """Each cell's options and --set keys are ones its method accepts and uses (the check a grid makes
    before any work): a preset cannot ask for a setting the method would refuse or ignore."""
    from fedcache.grids import run as grid_run
    from fedcache.api import grid_spec

    e = experiment
    spec = grid_spec(store=tmp_path / "none.zarr", dataset=e.store_dataset, backbones=list(e.backbones),
                     methods=list(e.methods), sweep=dict(e.sweep), seeds=list(e.seeds), out=tmp_path / e.key)
    grid_run.check_cells(spec, grid_run.cells(spec))


def test_a_full_disk_keeps_the_last_paper_json_whole(tmp_path, fake_disk):
    """paper.json was written in place: a full disk left it torn, and `fedcache report` of the folder then stopped
    on it with a JSONDecodeError traceback. Now the one line, and the last whole paper.json is kept."""
    from fedcache.errors import DiskFullError
    from tests.faults import leftovers

    disk = fake_disk(tmp_path, 1 << 40)
    before = rp.write_paper_json(TOY, {}, tmp_path).read_bytes()
    disk.free = 10
    with pytest.raises(DiskFullError, match="paper.json"):
        rp.write_paper_json(TOY, {}, tmp_path)
    assert (tmp_path / "paper.json").read_bytes() == before and leftovers(tmp_path) == []


def test_what_the_store_holds_is_asked_of_its_entries_and_labels_not_its_features(toy_store, tmp_path, monkeypatch):
    """`reproduce` (and its --dry-run) read every feature of each preset's backbones to say they were in the store:
    at a paper's scale, minutes before anything ran. The same answers, from the entries and their labels."""
    import shutil

    from fedcache.errors import FedcacheError
    from fedcache.store.feature_store import FeatureStore
    from tests.conftest import BACKBONE

    def read_whole(store) -> bool:  # the answer as it was: every table read
        try:
            return all(len(FeatureStore(store, create=False).read("test-toy", s, BACKBONE)) for s in ("train", "test"))
        except FedcacheError:
            return False

    def no_features(*args, **kwargs):
        raise AssertionError("a feature was read")

    store = tmp_path / "s.zarr"
    shutil.copytree(toy_store, store)
    (light,) = [e.entry_id for e in FeatureStore(store).entries() if e.slot[1:3] == ("train", "light")]
    entry = FeatureStore(store).root["entries"][light]
    labels = store / "entries" / light / "labels" / "c" / "0"

    def unfinished():
        entry.attrs["complete"] = False

    def damaged_labels():
        entry.attrs["complete"] = True
        labels.write_bytes(b"\xff" * len(labels.read_bytes()))

    for state, change, held in (("intact", lambda: None, True), ("unfinished", unfinished, False),
                                ("damaged labels", damaged_labels, False)):
        change()
        assert read_whole(store) is held, state
        with monkeypatch.context() as m:
            m.setattr(FeatureStore, "fill", no_features)
            m.setattr(FeatureStore, "features", no_features)
            assert rp._cached(store, TOY_E, BACKBONE) is held, state
            assert not rp._cached(store, TOY_E, "tiny-clip-random") and not rp._cached(tmp_path / "none", TOY_E, BACKBONE)


def test_a_run_loads_only_the_backbones_whose_features_it_extracts(toy_store, tmp_path, monkeypatch):
    """`reproduce` extracted every backbone of a preset, loading each model though its features were stored: slow,
    and offline an error where the weights are absent. Only the backbone the store lacks is loaded now."""
    import shutil

    from fedcache.errors import WeightsNotFoundError
    from fedcache.extract import runner
    from tests.conftest import BACKBONE

    store = tmp_path / "s.zarr"
    shutil.copytree(toy_store, store)  # BACKBONE's features; tiny-clip-random's are extracted by the run
    loaded, load = [], runner.load_backbone

    def offline(name, *args, **kwargs):
        loaded.append(name)
        if name == BACKBONE:  # as a pretrained backbone's weights, absent offline
            raise WeightsNotFoundError(f"{name}: no weights offline")
        return load(name, *args, **kwargs)

    monkeypatch.setattr(runner, "load_backbone", offline)
    fused = ps.Preset("test-fused", "t", "-", (ps.Experiment("e", "test-toy", (BACKBONE, "tiny-clip-random"), ("fedavg",),
                                                            {"clients": 2, "rounds": 1}, seeds=(0,)),), ())
    rp.reproduce(fused, store, tmp_path / "out")
    assert loaded == ["tiny-clip-random"]
    rp.reproduce(fused, store, tmp_path / "again")  # every backbone stored now: none is loaded
    assert loaded == ["tiny-clip-random"]


@pytest.mark.slow
def test_features_stored_otherwise_than_the_preset_makes_them_are_extracted_again(toy_store, tmp_path):
    """A slot's entry is current whatever made it: with the store's newest features of a preset backbone from
    another --dtype, --image-size or a --weights checkpoint, `reproduce` skipped their extraction (they had rows)
    and trained the paper's grid on them without a word. They are extracted as the preset makes them."""
    import shutil

    from fedcache.api import extract_features
    from fedcache.store.feature_store import FeatureStore
    from tests.conftest import BACKBONE

    def newest_keys(store):
        return [e.key for s, e in FeatureStore(store).current().items() if s[1] in ("train", "test")]

    for made, options in (("dtype", {"dtype": "float32"}), ("image size", {"image_size": 48}), ("checkpoint", None)):
        store = tmp_path / made / "s.zarr"
        shutil.copytree(toy_store, store)
        if options:
            extract_features("test-toy", [BACKBONE], store=store, workers=0, **options)
        else:  # as an extraction from `--weights` records it (its entries' key, another weights hash, is kept)
            for e in FeatureStore(store).entries():
                FeatureStore(store).root["entries"][e.entry_id].attrs["weights_file"] = "/elsewhere/model.pt"
        assert rp._to_extract(TOY_E, store, {}) == [BACKBONE], made
        if not options:  # hand-made: the key is the preset's own, which an extraction finds complete and keeps
            continue
        rp.reproduce(ps.Preset("t", "t", "-", (TOY_E,), ()), store, tmp_path / made / "out")
        assert all(k["dtype"] == "float16" and k["preprocess"]["size"] == 32 for k in newest_keys(store)), made
        assert rp._to_extract(TOY_E, store, {}) == [], made  # as the preset makes them now: not again


def test_a_checkpoint_only_backbone_stored_from_its_checkpoint_is_not_extracted_again():
    """A checkpoint-only backbone (resnet18-quickdraw) is made from a checkpoint whatever makes it: its stored
    features stand; made with --random-init, they are not the preset's (and it asks for --weights)."""
    from fedcache.store.entries import EntryInfo

    e = ps.Experiment("e", "test-toy", ("resnet18-quickdraw",), ("fedavg",), {})
    key = {"backbone": "resnet18-quickdraw", "dtype": "float16", "preprocess": {"size": 64}}

    def entry(**attrs):
        return EntryInfo("x", key, 1, 1, True, None, attrs)

    assert rp._made_by_preset(e, "resnet18-quickdraw", entry(weights_file="/w/quickdraw.pt"))
    assert not rp._made_by_preset(e, "resnet18-quickdraw", entry(random_weights=True))
    digits = ps.Experiment("e", "digits5-offline", ("tiny-timm-random",), ("fedavg",), {})  # resized to 64 by default
    made = {"backbone": "tiny-timm-random", "dtype": "float16"}
    assert rp._made_by_preset(digits, "tiny-timm-random", EntryInfo("x", {**made, "preprocess": {"size": 64}}, 1, 1, True,
                                                                    None, {"random_weights": True}))
    assert not rp._made_by_preset(digits, "tiny-timm-random", EntryInfo("x", {**made, "preprocess": {"size": 32}}, 1, 1,
                                                                        True, None, {"random_weights": True}))


def test_a_dry_run_says_which_backbones_features_the_run_extracts(toy_store, tmp_path):
    """The store's check was asked per need and split, and its answer unsaid: a store lacking the test features of a
    domain listed the dataset as "generated offline", all ok, as an empty store did. The dataset's line says whose
    features the run extracts; a store holding them says they are there."""
    import shutil

    from fedcache.store.feature_store import FeatureStore
    from tests.conftest import BACKBONE

    store = tmp_path / "s.zarr"
    shutil.copytree(toy_store, store)
    assert [n.how for n in rp.check(TOY, store) if n.kind == "dataset"] == ["features already in the store"]
    (dark,) = [e.entry_id for e in FeatureStore(store).entries() if e.slot[1:3] == ("test", "dark")]
    FeatureStore(store).discard(dark, "entries")
    (dataset,) = [n for n in rp.check(TOY, store) if n.kind == "dataset"]
    assert dataset.ok and dataset.how.startswith("generated offline (the run extracts its features of "
                                                 f"{BACKBONE}: the store lacks them"), dataset.how


@pytest.fixture
def toy_preset(monkeypatch):
    """TOY registered, for the command line: `fedcache reproduce test-toy-preset`."""
    monkeypatch.setitem(ps.PRESETS._items, TOY.name, TOY)
    return TOY


def test_a_dry_run_refuses_a_store_the_run_would_refuse(tmp_path):
    """A regular file, or a run's folder, given as --store was listed as a store lacking every feature, all ok (exit
    0), and the run then refused it."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    for store, said in (("a-file", "is a file, not a feature store"), ("run", "a folder of other files: config.json")):
        missing = [n for n in rp.check(TOY, tmp_path / store) if not n.ok]
        assert [n.kind for n in missing] == ["store"] and said in missing[0].how, store
    (new,) = [n for n in rp.check(TOY, tmp_path / "new.zarr") if n.kind == "store"]
    assert new.ok and new.how == "made by the run"


def test_weights_are_checked_as_the_run_uses_them(toy_store, tmp_path):
    """--weights to no file was "ok" (the run stopped at its extraction); given for a backbone whose features are
    stored, the dry run said they were in the store, though the run extracts them from the checkpoint; and one for
    a backbone the preset does not use was dropped without a word."""
    from tests.conftest import BACKBONE

    needs = {n.name: n for n in rp.check(TOY, toy_store, weights={BACKBONE: tmp_path / "none.pth"})}
    assert not needs[BACKBONE].ok and needs[BACKBONE].how.endswith("none.pth: no such file")
    (tmp_path / "w.pth").write_bytes(b"")
    needs = {n.name: n for n in rp.check(TOY, toy_store, weights={BACKBONE: tmp_path / "w.pth"})}
    assert needs[BACKBONE].ok and needs[BACKBONE].how == f"extracted from {tmp_path / 'w.pth'}"
    assert needs["test-toy"].how.startswith(f"generated offline (the run extracts its features of {BACKBONE}")
    with pytest.raises(ConfigError, match="test-toy-preset uses no backbone 'tiny-clip-random'.*; its backbones: tiny-timm-random"):
        rp.check(TOY, toy_store, weights={"tiny-clip-random": tmp_path / "w.pth"})


def test_out_is_checked_before_anything_is_extracted(tmp_path, monkeypatch, toy_preset, capsys):
    """An --out inside the feature store was refused by the run's first grid, after the extraction (minutes to hours
    in), and a dry run said nothing of it; nor of --jobs 0."""
    from fedcache import api

    def no_extraction(*args, **kwargs):
        raise AssertionError("extracted before --out was checked")

    monkeypatch.setattr(api, "extract_features", no_extraction)
    store = tmp_path / "s.zarr"
    with pytest.raises(ConfigError, match="is inside the feature store"):
        rp.reproduce(TOY, store, store / "runs")
    store.mkdir()  # as an extraction leaves it
    (store / "zarr.json").write_text('{"attributes": {"fedcache_store": 2}, "zarr_format": 3, "node_type": "group"}')
    for args, said in ((["--out", str(store / "runs")], "is inside the feature store"), (["--jobs", "0"], "--jobs")):
        code = main(["reproduce", TOY.name, "--dry-run", "--store", str(store), *args])
        assert code == 2 and said in capsys.readouterr().err, args


def test_a_run_shows_its_grids_and_ends_with_the_papers_numbers_beside_its_own(toy_store, tmp_path, toy_preset, capsys):
    """A reproduction said nothing while its grids ran (hours, for a paper's table) and ended with the report's path
    alone; its numbers were in the HTML. Each grid has its bar, and the comparison is printed."""
    import shutil

    store = tmp_path / "s.zarr"
    shutil.copytree(toy_store, store)
    code = main(["reproduce", TOY.name, "--store", str(store), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0 and "grid toy 4/4 (100%)" in err
    paper = json.loads((tmp_path / "out" / "paper.json").read_text())["rows"]
    line = next(x for x in out.splitlines() if "FedAvg, lr 0.1" in x).split()
    assert line[3:5] == ["50.00", f"{paper[0]['fedcache']:.2f}"] and paper[0]["note"] == "fedavg, mean of 1 run"
