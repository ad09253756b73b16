"""Run orchestration (fedcache/training.py), `fedcache train` end to end on a real store: files written, --set,
fusion, partitions reused, validation rows, the output policy, errors."""
import json
import os

import numpy as np

import pytest

from fedcache.cli import main
from fedcache.errors import ConfigError, EntryNotFoundError, StoreError
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.trackers.base import TRACKERS, Tracker
from fedcache.training import TrainConfig, train
from tests.conftest import BACKBONE

SUMMARY_KEYS = {"method", "mean_accuracy", "std_accuracy", "global_accuracy", "per_client_accuracy", "worst10",
                "worst20", "worst40", "best10", "variance", "bytes_up", "bytes_down", "params_up_per_round",
                "rounds", "seconds", "random_weights"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("train") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random", "tiny-clip-random"], store=path, workers=0))
    return path


def cfg(store, **kw) -> TrainConfig:
    base = dict(store=store, dataset="test-toy", backbones=["tiny-timm-random"], method="fedavg", partition="domain",
                clients=2, rounds=3)
    return TrainConfig(**{**base, **kw})


def test_cli_train_writes_config_metrics_summary(store, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
                 "--partition", "domain", "--clients", "2", "--rounds", "3", "--set", "lr=0.01", "--out", str(out)])
    captured = capsys.readouterr()
    printed = captured.out
    assert code == 0 and "fedavg:" in printed and "RANDOM WEIGHTS" in printed
    # Not a terminal: plain progress lines instead of a bar that draws nothing.
    assert "fedavg rounds 0/3 (0%)" in captured.err and "fedavg rounds 3/3 (100%) in" in captured.err
    config = json.loads((out / "config.json").read_text())
    assert config["spec"]["optim"]["lr"] == 0.01 and config["spec"]["optim"]["optimizer"] == "adam"
    assert config["partition"]["request"]["scheme"] == "domain" and config["data"]["client_train_sizes"] == [30, 30]
    assert config["partition"]["effective"]["clients_per_domain"] == 1  # what ran, where the request says null
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [l["round"] for l in lines] == [1, 2, 3] and len(lines[0]["per_client"]) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys() and summary["random_weights"] is True
    # Running into the same directory again needs --resume; with it, the finished run is kept.
    assert main(["train", "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
                 "--partition", "domain", "--clients", "2", "--rounds", "3", "--set", "lr=0.01", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "rounds" not in err  # refused before a progress bar is drawn
    # A bad --set value is refused the same way, before any data is read.
    assert main(["train", "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedproto",
                 "--set", "local_protos=first", "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "local_protos=first: must be one of after, last-epoch" in err and "rounds" not in err


def test_a_fresh_run_evaluated_every_other_round_is_not_called_resumed(store, tmp_path, capsys):
    """A round without evaluation reports no metrics line, as the first report of a resumed run does."""
    argv = ["train", "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg", "--partition",
            "domain", "--clients", "2", "--rounds", "3", "--eval-every", "2", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "fedavg rounds 0/3 (0%)" in err and "resumed" not in err, err


def test_resume_with_other_options_is_refused(store, tmp_path):
    train(cfg(store, out=tmp_path / "r"))
    with pytest.raises(ConfigError, match=r"options differ from the run in .* \(lr \(0.001 there, 0.5 here\)\)"):
        train(cfg(store, out=tmp_path / "r", resume=True, settings=["lr=0.5"]))
    with pytest.raises(ConfigError, match=r"\(seed \(0 there, 3 here\)\); use the same"):  # not what it draws
        train(cfg(store, out=tmp_path / "r", resume=True, seed=3))


def test_a_run_started_before_a_config_key_was_added_resumes_and_a_changed_value_is_refused(store, tmp_path):
    """config.json gained `partition.effective`; a grid interrupted before that refused to resume
    ("the options differ") though nothing it computes had changed."""
    out = tmp_path / "r"
    train(cfg(store, out=out, rounds=2))
    config = json.loads((out / "config.json").read_text())
    del config["partition"]["effective"]  # as an earlier fedcache wrote it
    (out / "config.json").write_text(json.dumps(config))
    assert train(cfg(store, out=out, rounds=2, resume=True)).summary["rounds"] == 2
    config["spec"]["method"]["params"] = {**config["spec"]["method"]["params"], "init": "text"}
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="options differ"):
        train(cfg(store, out=out, rounds=2, resume=True))


def test_a_run_resumed_from_another_directory_is_the_same_run(store, tmp_path, monkeypatch):
    """config.json records where the run started (for a report made elsewhere), which is no option of the run."""
    out = tmp_path / "r"
    train(cfg(store, out=out, rounds=2))
    monkeypatch.chdir(tmp_path)
    assert json.loads((out / "config.json").read_text())["cwd"] != str(tmp_path)
    assert train(cfg(store, out=out, rounds=2, resume=True)).summary["rounds"] == 2


class FileTracker(Tracker):
    """A tracker that, as TensorBoard's and MLflow's do, writes into its directory as it is opened."""

    def __init__(self, directory, run_name, params) -> None:
        super().__init__(directory, run_name, params)
        (directory / f"tracked-{len(list(directory.glob('tracked-*')))}").write_text(run_name)

    def log(self, step, metrics) -> None:
        pass

    def close(self, summary) -> None:
        pass


def test_a_finished_run_resumed_trains_nothing_and_leaves_every_file_as_it_was(store, tmp_path, monkeypatch):
    """--resume of a finished run rewrote its summary.json (scored again: an older fedcache's in today's layout) and
    metrics.jsonl, renamed its partition in config.json and opened another tracker run in it. As the Flower engine's,
    it shows the run's stored result and state and writes nothing: every file keeps its bytes and its mtime."""
    monkeypatch.setitem(TRACKERS._items, "files", FileTracker)
    out = tmp_path / "r"
    first = train(cfg(store, out=out, track=("files",)))
    config = json.loads((out / "config.json").read_text())
    config["partition"]["partition_id"] = "older"  # as a run recorded before the partition's id took in the labels
    (out / "config.json").write_text(json.dumps(config))
    summary = json.loads((out / "summary.json").read_text())
    del summary["definitions"]  # as an older fedcache wrote it
    (out / "summary.json").write_text(json.dumps(summary))
    for p in out.rglob("*"):
        os.utime(p, ns=(10**18, 10**18))  # long before now: a file written again has another mtime
    files = lambda: {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    before = files()
    resumed = train(cfg(store, out=out, track=("files",), resume=True))
    assert files() == before and len(before) == 5  # config, metrics, checkpoint, summary, the tracker's
    assert resumed.summary == summary and [l["round"] for l in resumed.history] == [1, 2, 3]
    assert first.server.keys() == resumed.server.keys() and all(torch_equal(first.server[k], resumed.server[k])
                                                                for k in first.server)


def test_fused_backbones_concatenate_features(store):
    from fedcache.training import prepare

    method, resolved = prepare(cfg(store, backbones=["tiny-timm-random", "tiny-clip-random"]))
    assert resolved["data"]["dim"] == 96 + 32
    assert method.ctx.data.x_train.shape == (60, 128)


def test_partition_is_stored_and_reused(store):
    a = train(cfg(store, partition="iid", clients=3))
    b = train(cfg(store, partition="iid", clients=3, backbones=["tiny-clip-random"]))
    assert a.summary["partition_id"] == b.summary["partition_id"]


def test_deterministic_runs(store):
    """The same seed: the same summary and the same weights, to the bit (a dozen test rows a client make accuracy
    move in steps of 8 points: equal accuracies alone would pass unseeded batches); another seed: other numbers."""
    def run(method: str, seed: int):
        return train(cfg(store, method=method, partition="dirichlet", alpha=0.5, seed=seed, rounds=2))

    drop = lambda summary: {k: v for k, v in summary.items() if k != "seconds"}
    for method in ("solo", "fedavg"):
        a, b, c = run(method, 0), run(method, 0), run(method, 1)
        assert drop(a.summary) == drop(b.summary) and drop(a.summary) != drop(c.summary)
        states = [(a.server, b.server, c.server), (a.clients, b.clients, c.clients)]
        assert any(x for x, _, _ in states)  # one of them holds the trained weights
        for x, y, z in states:
            assert x.keys() == y.keys() and all(torch_equal(x[k], y[k]) for k in x)
        assert any(not torch_equal(x[k], z[k]) for x, _, z in states for k in x)


def test_missing_features_name_the_extract_command(store):
    with pytest.raises(EntryNotFoundError, match="fedcache extract --store .* --dataset test-toy --backbones resnet18-birds"):
        train(cfg(store, backbones=["resnet18-birds"]))


def test_impossible_partition_is_a_clear_error(store):
    with pytest.raises(ConfigError):
        train(cfg(store, partition="iid", clients=1000))


def test_validation_scores_on_spare_training_rows_only(store):
    from fedcache.training import prepare

    method, resolved = prepare(cfg(store, few_shot=4, validation=True))
    d = method.ctx.data
    assert torch_equal(d.x_test, d.x_train) and resolved["partition"]["scored_on"].startswith("validation")
    used = set(np.concatenate(d.client_train).tolist())
    for k in range(d.n_clients):
        val = d.client_test[k]
        assert len(val) and not used & set(val.tolist())  # never a row some client trains on
        assert set(d.train_domains[val]) == set(d.train_domains[d.client_train[k]])  # the client's own domain
    with pytest.raises(ConfigError, match="no client trains on"):
        prepare(cfg(store, validation=True))  # every training row is used: nothing to validate on


def test_the_global_accuracy_of_a_validation_run_is_held_out_too(tmp_path):
    """It was scored on the whole training table, the clients' own training rows included (on which the model
    scores otherwise than on rows it never saw: checked below, so the test can tell the two apart)."""
    import torch

    from fedcache.store.interchange import import_file
    from fedcache.training import prepare

    rng = np.random.default_rng(0)
    centres, y = rng.normal(size=(4, 16)), rng.integers(0, 4, 500)
    x = (centres[y] + 2.5 * rng.normal(size=(500, 16))).astype(np.float32)
    np.savez(tmp_path / "f.npz", train__features=x[:400], train__labels=y[:400], test__features=x[400:],
             test__labels=y[400:])
    import_file(tmp_path / "s.zarr", tmp_path / "f.npz", "ds", "enc")
    run = cfg(tmp_path / "s.zarr", dataset="ds", backbones=["enc"], validation=True, subsample=0.5, partition="iid",
              clients=2, rounds=5, head="mlp")
    result = train(run)
    method, _ = prepare(run)
    d = method.ctx.data
    spare = np.setdiff1d(np.arange(len(d.y_train)), np.concatenate(d.client_train))
    assert d.global_rows.tolist() == spare.tolist()
    with torch.no_grad():
        hit = (method.global_logits(result.server, d.x_test).argmax(1) == d.y_test).numpy()
    assert hit[spare].mean() != pytest.approx(hit.mean())
    assert result.summary["global_accuracy"] == pytest.approx(100.0 * hit[spare].mean())
    # Only the spare rows are scored (scoring all cost several times the rounds at scale), once copied; the
    # clients' validation rows are among them, so each client's accuracy is its rows' of the whole table's.
    assert d.scored_test() is d.scored_test() and torch.equal(d.scored_test(), d.x_test[torch.from_numpy(spare)])
    x, y, mask = d.rows_of("test", [0, 1])  # a personalized method's evaluation reads them from that copy
    idx = [torch.from_numpy(d.client_test[k].astype(np.int64)) for k in (0, 1)]
    assert torch.equal(x[mask], torch.cat([d.x_test[i] for i in idx])) and torch.equal(y[mask], torch.cat([d.y_test[i] for i in idx]))
    by_hand = [100.0 * hit[rows].mean() for rows in d.client_test]
    np.testing.assert_allclose(result.summary["per_client_accuracy"], by_hand, atol=1e-3)


def torch_equal(a, b):
    import torch

    return torch.equal(a, b)


def test_backbone_heatmap_command(store, tmp_path, capsys):
    out = tmp_path / "heat.png"
    code = main(["backbone-heatmap", "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random,tiny-clip-random",
                 "--clients", "2", "--few-shot", "5", "--rounds", "3", "-o", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and out.stat().st_size > 5000 and "0: light" in printed
    from fedcache.reports.contribution import backbone_contribution

    c = backbone_contribution(cfg(store, backbones=["tiny-timm-random", "tiny-clip-random"], few_shot=5))
    assert c.scores.shape == (2, 2) and np.allclose(c.scores.sum(1), 1.0) and (c.scores > 0).all()


def test_class_disjoint_from_the_cli(store, tmp_path, capsys):
    out = tmp_path / "cd"
    code = main(["train", "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "solo",
                 "--partition", "class-disjoint", "--clients", "3", "--classes-per-client", "1", "--rounds", "1",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["partition"]["request"]["classes_per_client"] == 1
    from fedcache.training import load_data

    data, _ = load_data(cfg(store, partition="class-disjoint", clients=3, classes_per_client=1))
    held = [set(data.y_train[r].tolist()) for r in data.client_train]
    assert all(len(h) == 1 for h in held) and len(set.union(*held)) == 3


def test_a_diverged_run_directory_offers_overwrite(store, tmp_path, capsys):
    # issue 18: --resume replays the same rounds into the same NaN and a new run in the directory is refused;
    # each message names the way out (--overwrite), and it works.
    args = ["train", "--store", str(store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
            "--rounds", "3", "--out", str(tmp_path / "run")]
    assert main([*args, "--set", "lr=1e30"]) == 1
    err = capsys.readouterr().err
    assert "NaN/inf" in err and "--overwrite" in err and "Traceback" not in err
    assert main(args) == 2 and "--overwrite" in capsys.readouterr().err  # a new run in the directory
    assert main([*args, "--resume"]) == 2 and "--overwrite" in capsys.readouterr().err  # with the change
    assert main([*args, "--overwrite"]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds"] == 3


def test_run_options_a_method_without_an_optimizer_never_reads_are_said(store, caplog):
    """linear-probe fits scikit-learn's probe: --local-epochs, --batch-size and --preset change nothing, and
    a run that got them says so (a warning: grids apply them to every method)."""
    import logging

    from fedcache.training import prepare

    with caplog.at_level(logging.WARNING, logger="fedcache.training"):
        prepare(cfg(store, method="linear-probe", local_epochs=7, batch_size=8, preset="fst-cbdg"))
    assert "linear-probe trains nothing with an optimizer: --local-epochs 7, --batch-size 8, --preset fst-cbdg not used" \
        in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedcache.training"):
        prepare(cfg(store, method="linear-probe"))
        prepare(cfg(store, method="fedavg", local_epochs=7, preset="fst-cbdg"))
    assert "not used" not in caplog.text


def train_args(toy_store, out, *extra):
    return ["train", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
            "--clients", "2", "--rounds", "3", "--out", str(out), *extra]


def test_keep_checkpoints_and_overwrite(toy_store, tmp_path, capsys):
    assert main(train_args(toy_store, tmp_path / "all", "--keep-checkpoints", "all")) == 0
    # The result is one line in a log (not a terminal), not wrapped at the console's width.
    result = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedavg: ")]
    assert len(result) == 1 and len(result[0]) > 160 and result[0].endswith(str(tmp_path / "all")), result
    assert sorted(p.name for p in (tmp_path / "all").glob("checkpoint*.pt")) == [
        "checkpoint-round0001.pt", "checkpoint-round0002.pt", "checkpoint-round0003.pt", "checkpoint.pt"]
    assert main(train_args(toy_store, tmp_path / "none", "--keep-checkpoints", "none")) == 0
    assert not list((tmp_path / "none").glob("checkpoint*.pt")) and (tmp_path / "none" / "summary.json").exists()
    # A directory holding a run is refused, and replaced with --overwrite (other files are left alone).
    (tmp_path / "none" / "notes.txt").write_text("mine")
    capsys.readouterr()
    # Finished without a checkpoint: neither way sends the user to --resume, which has nothing to go on from.
    for extra in ([], ["--resume"]):
        assert main(train_args(toy_store, tmp_path / "none", *extra)) == 2
        err = capsys.readouterr().err
        assert "finished (its summary.json is there) and kept no checkpoint; nothing is left to run: --overwrite" in err
        assert "pass --resume" not in err and "without --resume" not in err and len(err.strip().splitlines()) == 1, err
    assert main(train_args(toy_store, tmp_path / "none", "--overwrite", "--rounds", "2")) == 0
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["rounds"] == 2
    assert (tmp_path / "none" / "notes.txt").read_text() == "mine"
    assert main(train_args(toy_store, tmp_path / "none", "--overwrite", "--resume")) == 2


def test_out_that_is_a_file_is_refused_before_work(toy_store, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(train_args(toy_store, tmp_path / "f")) == 2
    assert "is a file; give a directory" in capsys.readouterr().err


def test_an_unknown_tracker_is_refused_before_work(toy_store, tmp_path, capsys):
    assert main(train_args(toy_store, tmp_path / "r", "--track", "tensorbord")) == 2
    err = capsys.readouterr().err
    assert "unknown tracker" in err and "tensorboard" in err and not (tmp_path / "r").exists()


def test_train_and_test_features_of_different_preprocessing_are_refused(tmp_path):
    # The test split extracted again at another size: each split is consistent on its own, but a model trained
    # on one encoder's features and scored on the other's gave a silently wrong accuracy.
    path = tmp_path / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0))
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0, splits=("test",),
                          image_size=16))
    with pytest.raises(StoreError, match="different weights or preprocessing.*--splits train,test"):
        train(cfg(path))
    import fedcache  # a Python caller is told the keywords

    with pytest.raises(StoreError, match=r"same weights, image_size and precision \(fedcache.extract_features"):
        fedcache.train(store=path, dataset="test-toy", backbones="tiny-timm-random", method="fedavg",
                       partition="domain", clients=2, rounds=1)
    # Extracting the training split the same way makes the two agree again.
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0, splits=("train",),
                          image_size=16))
    assert train(cfg(path)).summary["rounds"] == 3


def test_noisy_training_features_with_clean_test_features_train(tmp_path):
    # Image noise is train-only by design (FedPCL Table 15): not a difference in preprocessing.
    path = tmp_path / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0,
                          image_noise=("gaussian", 0.1, 0.5)))
    assert train(cfg(path, dataset="test-toy-noise-gaussian-0.1-0.5")).summary["rounds"] == 3


def test_an_import_stopped_between_its_splits_is_not_trained_on(tmp_path, monkeypatch):
    # Importing file B over file A, stopped after B's training split: runs trained on B's features and were
    # scored on A's. A file of one split replacing that split on purpose still trains.
    from fedcache.store import interchange

    rng = np.random.default_rng(0)
    path, files = tmp_path / "store.zarr", {}
    for name in ("a", "b", "b-train"):
        labels = np.arange(30) % 2
        x = rng.normal(size=(30, 4)).astype(np.float32) + labels[:, None]
        files[name] = tmp_path / f"{name}.npz"
        halves = {"train__features": x[:20], "train__labels": labels[:20], "test__features": x[20:], "test__labels": labels[20:]}
        np.savez(files[name], **{k: v for k, v in halves.items() if name != "b-train" or k.startswith("train")})
    run = lambda: train(TrainConfig(store=path, dataset="mine", backbones=["enc"], method="fedavg",  # noqa: E731
                                    partition="iid", clients=2, rounds=1))
    interchange.import_file(path, files["a"], "mine", "enc")
    interchange.import_file(path, files["b-train"], "mine", "enc")  # on purpose: trains
    assert run().summary["rounds"] == 1
    interchange.import_file(path, files["a"], "mine", "enc")
    write = interchange._import_domain

    def stop_at_the_test_split(store, key, *a):
        if key.split == "test":
            raise KeyboardInterrupt
        return write(store, key, *a)

    monkeypatch.setattr(interchange, "_import_domain", stop_at_the_test_split)
    with pytest.raises(KeyboardInterrupt):
        interchange.import_file(path, files["b"], "mine", "enc")
    with pytest.raises(StoreError, match="different imported files.*import the one you mean again"):
        run()


def test_splits_resized_by_different_backends_are_one_encoder():
    # Same-size arrays are resized per batch ("torch"), other images one by one ("pil"): a dataset whose test
    # images are held otherwise than its training images is still one encoder's features, not refused.
    from types import SimpleNamespace

    from fedcache.federate.tables import _differ

    def info(backend, size=64):
        return SimpleNamespace(key={"weights_hash": "w", "preprocess": {"size": size, "backend": backend}})

    assert not _differ([info("torch")], [info("pil")])
    assert _differ([info("torch")], [info("torch", size=32)])


def test_a_run_killed_between_its_first_metrics_line_and_its_first_checkpoint_starts_again(store, tmp_path):
    """kill -9 after round 1's line and before round 1's checkpoint: a plain re-run was refused ("pass --resume")
    and --resume too ("no checkpoint ... start the run without --resume")."""
    whole = train(cfg(store, out=tmp_path / "whole"))
    out = tmp_path / "killed"
    out.mkdir()
    (out / "config.json").write_text((tmp_path / "whole" / "config.json").read_text())
    (out / "metrics.jsonl").write_text((tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    again = train(cfg(store, out=out))
    assert again.history == whole.history
    assert (out / "metrics.jsonl").read_text() == (tmp_path / "whole" / "metrics.jsonl").read_text()


def test_a_clear_cut_short_never_leaves_a_summary_without_its_metrics(store, tmp_path, monkeypatch):
    from pathlib import Path

    from fedcache.federate.rundir import RunDir

    train(cfg(store, out=tmp_path / "r"))
    real = Path.unlink
    removed = []

    def killed_after_two(self, *a, **kw):
        if len(removed) == 2:
            raise KeyboardInterrupt
        removed.append(self.name)
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "unlink", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        RunDir(tmp_path / "r").clear()
    left = {p.name for p in (tmp_path / "r").iterdir()}
    assert "summary.json" not in left and "config.json" in left, left


@pytest.mark.parametrize("kw", [dict(partition="dirichlet", clients=3, alpha=0.3), dict(partition="domain"),
                                dict(partition="iid", clients=4, few_shot=5, backbones=["tiny-timm-random", "tiny-clip-random"])],
                         ids=["dirichlet", "domain", "fused-few-shot"])
def test_partition_only_makes_the_partition_a_run_makes(kw, store, tmp_path):
    """`fedcache partition` reads the labels, domains and ids alone (``partition_only``): the partition it makes, in a
    store of its own, is the one a run makes reading the features, row for row."""
    import shutil

    from fedcache.partitioning import partition_only
    from fedcache.training import load_data

    made = {}
    for way in ("run", "partition"):
        shutil.copytree(store, tmp_path / way)
        spec = cfg(tmp_path / way, **kw)
        if way == "run":
            data, info = load_data(spec)
            made[way] = info, data.client_train, data.client_test
        else:
            part, info, _ = partition_only(spec)
            made[way] = info, part.train, part.test
    (run_info, *run_rows), (info, *rows) = made["run"], made["partition"]
    assert info == run_info
    for mine, theirs in zip(rows, run_rows):
        assert len(mine) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(mine, theirs))
