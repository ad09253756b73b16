"""`fedcache train --engine flower-sim`: shard, then run the same ServerApp / ClientApp in Flower's
simulation engine (Ray), one virtual SuperNode per client.

Flower's public ``run_simulation`` gives the apps an empty run config; the run config reaches both
apps here through a Flower App directory (``project.write_app``), as it does under ``flwr run``.
That needs ``_run_simulation``'s ``app_dir`` and ``server_app_context`` arguments, which is why the
flwr version is pinned.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from fedcache.errors import ConfigError, FedcacheError
from fedcache.training import partition_request
from fedcache.flower.config import FlowerRun, ServerPaths
from fedcache.flower.project import write_app
from fedcache.flower.shard import SERVER, ShardSpec, open_shard, write_shards
from fedcache.spec import RunSpec
from fedcache.store.feature_store import FeatureStore

log = logging.getLogger(__name__)

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # Flower reports usage events over the network by default
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silences a Ray FutureWarning; no GPUs are used


def shard_spec(spec: RunSpec) -> ShardSpec:
    d = spec.data
    entries = FeatureStore(d.store, create=False).find(d.dataset, "train", d.backbones[0])
    n_domains = len(entries[0].attrs["domains"]) if entries else 1  # no entry: write_shards says what is missing
    return ShardSpec(Path(d.store), d.dataset, list(d.backbones), partition_request(spec, n_domains))


def flower_run(spec: RunSpec, shard_dir: Path, **extra) -> FlowerRun:
    return FlowerRun.from_spec(spec, shard_dir=str(shard_dir), **extra)


def train_flower_sim(spec: RunSpec, cpus: int | None = None) -> dict:
    """Shard into ``<out>/shards`` (a temporary directory without --out), simulate, return the summary.
    With --resume, the run in --out continues from its checkpoint on the shards already there."""
    e = spec.engine
    unsupported = [flag for flag, given in (("--validation", spec.schedule.validation), ("--no-batch", not e.batched),
                                            ("--overwrite", e.overwrite), ("--track", bool(e.track))) if given]
    if unsupported:
        raise FedcacheError(f"--engine flower-sim does not support {', '.join(unsupported)}; drop them")
    if e.resume and e.out is None:
        raise ConfigError("--resume continues the run in --out; give the --out of the interrupted run")
    with tempfile.TemporaryDirectory(prefix="fedcache-flower-") as tmp:
        base = Path(e.out) if e.out else Path(tmp)
        if not e.resume and (base / "config.json").exists():
            raise FedcacheError(f"{base} already holds a run; pass --resume to continue it, or choose another --out")
        shards, shard = base / "shards", shard_spec(spec)
        if e.resume:
            _check_shards(shards, shard)
        else:
            write_shards(shard, shards)
        paths = ServerPaths(shards / SERVER, base if e.out else None)
        return simulate(flower_run(spec, shards), paths, shard.request.n_clients, Path(tmp) / "app", cpus,
                        resume=e.resume, keep_checkpoints=e.keep_checkpoints)


def _check_shards(shards: Path, want: ShardSpec) -> None:
    """A resumed run trains on the shards it started with; they must be of the partition asked for."""
    if not (shards / SERVER).is_dir():
        raise ConfigError(f"--resume: {shards} holds no shards; start the run without --resume")
    _, info = open_shard(shards / SERVER)
    asked = {"dataset": want.dataset, "backbones": list(want.backbones), "request": want.request.to_dict()}
    had = {"dataset": info.dataset, "backbones": list(info.backbones), "request": info.request}
    if json.loads(json.dumps(had)) != json.loads(json.dumps(asked)):
        differ = [k for k in asked if json.loads(json.dumps(had[k])) != json.loads(json.dumps(asked[k]))]
        raise ConfigError(f"--resume: the shards in {shards} were made with other data or partition options "
                          f"({', '.join(differ)}); use the options of the interrupted run")


def simulate(run: FlowerRun, paths: ServerPaths, n_clients: int, app_dir: Path, cpus: int | None = None,
             resume: bool = False, keep_checkpoints: str = "last") -> dict:
    """Run ``run`` with ``n_clients`` virtual SuperNodes; returns the server's summary."""
    from flwr.app import Context, RecordDict
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    from fedcache.flower import client, server

    write_app(app_dir, run)
    summary: dict = {}

    def main(grid, context) -> None:  # keeps the summary in this process
        summary.update(server.serve(grid, run, paths, resume, keep_checkpoints))

    app = server.ServerApp()
    app.main()(main)
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus or min(2, os.cpu_count() or 1), "logging_level": "ERROR"}}
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run.to_config())
    _run_simulation(num_supernodes=n_clients, exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
                    client_app=client.app, server_app=app, backend_config=backend, app_dir=str(app_dir),
                    server_app_context=context, is_app=True)
    if not summary:
        raise FedcacheError("the Flower simulation ended without a result; see the log above for the ServerApp's error")
    return summary
