"""MLflow: one run per run in the experiment ``fedcache`` of a local SQLite store, ``<directory>/mlflow.db``
(MLflow's plain-file store is in maintenance mode). `mlflow ui --backend-store-uri sqlite:///<directory>/mlflow.db`
shows it."""
from __future__ import annotations

import time

from fedcache.store.locks import exclusive_lock
from fedcache.trackers.base import ROUND_KEYS, Tracker, numbers, register

EXPERIMENT = "fedcache"
MAX_PARAM = 500  # MLflow's limit on a parameter value's length
LOCK = ".mlflow.db.lock"
MAKE_WAIT = 600.0  # seconds a run waits for another process to make the database (its migrations take tens of seconds)


@register
class MLflow(Tracker):
    name, extra = "mlflow", "mlflow"

    def __init__(self, directory, run_name, params) -> None:
        super().__init__(directory, run_name, params)
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise self.missing(exc) from None
        directory.mkdir(parents=True, exist_ok=True)
        db = directory / "mlflow.db"
        self.uri = f"sqlite:///{db.resolve()}"
        # MLflow creates and migrates its schema on first use, and so does every process that finds none: two at once
        # (a grid's workers, two runs given one --track-dir) broke each other's migration ("duplicate column name"),
        # and the half-made database failed every run after. One process makes it (and the experiment); the others
        # wait, then find both.
        with exclusive_lock(directory / LOCK, f"the MLflow database {db}", wait=MAKE_WAIT, transient=True):
            self.client = MlflowClient(tracking_uri=self.uri)
            exp = self.client.get_experiment_by_name(EXPERIMENT)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(EXPERIMENT)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, v[:MAX_PARAM]) for k, v in params.items()])

    def log(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in numbers(metrics, ROUND_KEYS).items()])

    def close(self, summary: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        final = [Metric(f"final.{k}", v, now, 0) for k, v in numbers(summary).items()]
        self.client.log_batch(self.run_id, metrics=final)
        self.client.set_terminated(self.run_id)

    def fail(self) -> None:
        self.client.set_terminated(self.run_id, status="KILLED")
