"""Trackers receive what metrics.jsonl holds and read back as written (offline: local files only)."""
from __future__ import annotations

import sys

import pytest

from fedcache.errors import ConfigError
from fedcache.trackers import flatten, open_trackers

PARAMS = {"train": {"method": "fedavg", "rounds": 3}, "optimizer": {"lr": 0.01}}
LINES = [{"round": r, "accuracy": 50.0 + r, "train_loss": 1.0 / r, "per_client": [1, 2], "global_accuracy": None,
          "bytes_up": 100 * r} for r in (1, 2, 3)]
SUMMARY = {"method": "fedavg", "mean_accuracy": 53.0, "worst10": 40.0, "random_weights": False}


def test_flatten_names_sections():
    assert flatten(PARAMS) == {"train.method": "fedavg", "train.rounds": "3", "optimizer.lr": "0.01"}


def test_tensorboard_event_files_hold_every_round(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tracker,) = open_trackers(["tensorboard"], tmp_path, "fedavg__seed=0", PARAMS)
    for line in LINES:
        tracker.log(line["round"], line)
    tracker.close(SUMMARY)
    events = EventAccumulator(str(tmp_path / "tensorboard" / "fedavg__seed=0"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("accuracy")] == [(1, 51.0), (2, 52.0), (3, 53.0)]
    assert [e.step for e in events.Scalars("train_loss")] == [1, 2, 3]
    assert "global_accuracy" not in events.Tags()["scalars"]  # None is not a number


@pytest.mark.slow  # MLflow creates its SQLite schema on first use: tens of seconds
def test_mlflow_run_has_params_and_metric_history(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    (tracker,) = open_trackers(["mlflow"], tmp_path, "fedavg__seed=0", PARAMS)
    for line in LINES:
        tracker.log(line["round"], line)
    tracker.close(SUMMARY)
    client = MlflowClient(tracking_uri=tracker.uri)
    run = client.get_run(tracker.run_id)
    assert run.data.params == flatten(PARAMS) and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "accuracy")] == [(1, 51.0), (2, 52.0), (3, 53.0)]
    assert run.data.metrics["final.mean_accuracy"] == 53.0 and "final.random_weights" not in run.data.metrics


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'fedcache\[tensorboard\]'"):
        open_trackers(["tensorboard"], tmp_path, "r", PARAMS)


def test_an_unknown_tracker_is_named(tmp_path):
    with pytest.raises(Exception, match="tensorboard"):
        open_trackers(["tensorbord"], tmp_path, "r", PARAMS)


MAKE_TRACKER = """
import sys, time
from pathlib import Path
from fedcache.trackers import open_trackers
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # both processes reach MLflow at once
(tracker,) = open_trackers(["mlflow"], Path(sys.argv[1]), "run-" + sys.argv[3], {"train": {"seed": sys.argv[3]}})
tracker.log(1, {"accuracy": 50.0})
tracker.close({"mean_accuracy": 50.0})
print(tracker.run_id)
"""


@pytest.mark.slow  # MLflow's schema, made once: tens of seconds
def test_two_processes_opening_mlflow_in_one_new_directory_both_run(tmp_path):
    """A grid's two workers (or two runs given one --track-dir) made and migrated mlflow.db at the same moment: one
    failed with "duplicate column name: step", and the half-made database failed every run after it."""
    pytest.importorskip("mlflow")
    import subprocess
    import time

    from mlflow.tracking import MlflowClient

    start = time.time() + 8  # past both interpreters' imports
    procs = [subprocess.Popen([sys.executable, "-c", MAKE_TRACKER, str(tmp_path), str(start), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}")
    for out, _ in outs:
        assert client.get_run(out.strip().splitlines()[-1]).info.status == "FINISHED"
    assert not (tmp_path / ".mlflow.db.lock").exists()
