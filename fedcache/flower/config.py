"""The run configuration a Flower run carries (``[tool.flwr.app.config]`` / ``flwr run --run-config``),
and the method both sides build from it.

Both apps read the same run config, so the server's and every client's ``Method`` are built with the
same method, parameters, optimizer, head and seed. Values are plain strings and numbers: nothing
but config crosses the network with them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData
from fedcache.federate.methods import Method, MethodContext
from fedcache.federate.train import resolve_settings


@dataclass(frozen=True)
class FlowerRun:
    method: str = "fedavg"
    rounds: int = 3
    fraction: float = 1.0
    seed: int = 0
    local_epochs: int = 1
    batch_size: int = 32
    preset: str = ""  # default: the method's
    head: str = ""  # default: the method's
    settings: str = ""  # space-separated key=value pairs, as `fedcache train --set`
    eval_every: int = 1
    min_clients: int = 1  # a round with fewer replies than this (or than were sampled, if fewer) fails
    round_timeout: float = 600.0  # seconds the server waits for a round's replies
    connect_timeout: float = 120.0  # seconds the server waits for every client to connect
    rejoin_wait: float = 0.0  # seconds each later round waits for missing clients to reconnect
    server_shard: str = ""  # the shards' server/ directory, on the SuperLink's machine
    shard_dir: str = ""  # simulation only: client k reads <shard-dir>/client-<k>
    out: str = ""  # where the server writes metrics.jsonl, rounds.jsonl, summary.json ("" = nowhere)

    @classmethod
    def from_config(cls, config: dict) -> "FlowerRun":
        names = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - set(names))
        if unknown:
            raise ConfigError(f"unknown run config keys {unknown}; fedcache's Flower app knows {sorted(names)}")
        kw = {}
        for key, value in config.items():
            f = names[key]
            kind = type(f.default)
            try:
                kw[f.name] = kind(value) if kind is not str else str(value)
            except (TypeError, ValueError):
                raise ConfigError(f"run config {key}={value!r}: expected a {kind.__name__}") from None
        run = cls(**kw)
        if run.min_clients < 1 or run.rounds < 1 or run.round_timeout <= 0:
            raise ConfigError(f"run config needs rounds >= 1, min-clients >= 1, round-timeout > 0 (got {run})")
        return run

    def to_config(self) -> dict:
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}


def build_method(run: FlowerRun, data: FederatedData) -> Method:
    """The method as ``fedcache train`` builds it (same preset, --set routing and head choice)."""
    r = resolve_settings(run.method, run.settings.split(), run.preset or None, run.head or None)
    reason = r.method_cls.not_deployable(r.params)
    if reason:
        raise ConfigError(f"{run.method} cannot run on Flower: {reason}; run it with the in-process engine "
                          "(`fedcache train`)")
    ctx = MethodContext(data, r.head, r.optim, run.local_epochs, run.batch_size, run.seed, run.rounds)
    return r.method_cls(ctx, r.params)
