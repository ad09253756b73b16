"""MLflow: one run per run in the experiment ``fedcache`` of a local SQLite store, ``<directory>/mlflow.db``
(MLflow's plain-file store is in maintenance mode). `mlflow ui --backend-store-uri sqlite:///<directory>/mlflow.db`
shows it."""
from __future__ import annotations

import time

from fedcache.trackers.base import ROUND_KEYS, Tracker, numbers, register

EXPERIMENT = "fedcache"
MAX_PARAM = 500  # MLflow's limit on a parameter value's length


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
        self.uri = f"sqlite:///{(directory / 'mlflow.db').resolve()}"
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
