"""The run configuration a Flower run carries (``[tool.flwr.app.config]`` / ``flwr run --run-config``),
and the method both sides build from it.

Both apps read the same run config, so the server's and every client's ``Method`` are built with the
same method, parameters, optimizer, head and seed. Its keys are ``section.field``: the run spec's
``method``, ``optim``, ``head`` and ``schedule`` sections (fedcache/spec.py, the options of ``fedcache
train`` under the same fields; the shards already hold the data and the partition), and ``deploy.*``,
what only a deployment has. Values are plain strings, numbers and booleans: nothing but config
crosses the network with them.

Whoever can reach the SuperLink's port can submit a run config, so it names none of the server's own paths:
where the server reads its shard and writes its results is the SuperLink operator's setting
(``ServerPaths``, from the SuperLink's environment). Two method settings name files every machine opens
(promptfl's ``weights``, loaded with ``weights_only=True``; tpfl's ``data_root``): read, never executed.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcache.errors import ConfigError, FedcacheError
from fedcache.paths import writable_dir
from fedcache.federate.data import FederatedData
from fedcache.federate.methods import METHODS, Method
from fedcache.config import Checked, NonNegative, Positive, PositiveInt, fields_of, parse
from fedcache.federate.optim_config import OptimConfig
from fedcache.federate.rundir import RunDir
from fedcache.federate.schedule import Schedule
from fedcache.spec import (HeadChoice, MethodSpec, RunSpec, options, parse_pairs, parse_options, resolve_method,
                           to_flat)
from fedcache.training import instantiate
from fedcache.wording import named

RUN_SECTIONS = ("method", "optim", "head", "schedule")  # what the apps read of a run spec
DEPLOY = "deploy"


@dataclass(frozen=True)
class Deployment(Checked):
    section = DEPLOY

    min_clients: PositiveInt = 1  # a round with fewer replies than this (or than were sampled, if fewer) fails
    round_timeout: Positive = 600.0  # seconds the server waits for a round's replies
    connect_timeout: Positive = 120.0  # seconds the server waits for every client to connect
    rejoin_wait: NonNegative = 0.0  # seconds each later round waits for missing clients to reconnect
    shard_dir: str = ""  # simulation only: client k reads <shard-dir>/client-<k>
    # The Flower run id of an interrupted run to continue from its checkpoint (its directory under the
    # server's FEDCACHE_FLOWER_RUNS); a string, as Flower's run ids are unsigned 64-bit numbers.
    resume_run: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resume_run and not self.resume_run.isdigit():
            raise ConfigError(f"deploy.resume_run={self.resume_run!r}: give the Flower run id (digits) of the run to continue")


@dataclass(frozen=True)
class FlowerRun:
    """The run spec's method, optimizer, head and schedule sections, and what only a deployment has."""

    method: MethodSpec = MethodSpec("fedavg")
    optim: OptimConfig = OptimConfig(preset="default")
    head: HeadChoice = HeadChoice("linear")
    schedule: Schedule = field(default_factory=Schedule)
    deploy: Deployment = field(default_factory=Deployment)

    def __post_init__(self) -> None:
        if self.schedule.validation:
            raise ConfigError("schedule.validation=true: a Flower run scores on the test split of its shards; "
                              "tune with `fedcache train --validation` (in-process)")

    @classmethod
    def of(cls, **given: Any) -> "FlowerRun":
        """From option names (``method="fedpcl", rounds=5, settings="mu=0.5"``, as ``fedcache train``)
        and Deployment fields (``min_clients=2, out=...``)."""
        names = {f.name for f in dataclasses.fields(Deployment)}
        deploy = Deployment(**{k: given.pop(k) for k in list(given) if k in names})
        return cls._built(given, deploy)

    @classmethod
    def _built(cls, given: dict[str, Any], deploy: Deployment) -> "FlowerRun":
        given = dict(given)
        settings = given.pop("settings", None) or given.pop("method.settings", None)
        per = parse_options(given, RUN_SECTIONS, required=False)
        base = cls()
        method, optim, head = resolve_method(per["method"].get("name"), per["optim"].get("preset"), per["head"].get("name"),
                                             parse_pairs(settings), base)
        return cls(method, optim, head, dataclasses.replace(base.schedule, **per["schedule"]), deploy)

    @classmethod
    def from_spec(cls, spec: RunSpec, **deploy: Any) -> "FlowerRun":
        """The Flower run of ``spec`` (its data and partition are the shards')."""
        return cls(**{s: getattr(spec, s) for s in RUN_SECTIONS}, deploy=Deployment(**deploy))

    def _sections(self) -> dict:
        return {s: getattr(self, s) for s in RUN_SECTIONS}

    @classmethod
    def from_config(cls, config: dict) -> "FlowerRun":
        """The run a Flower run config asks for; a value refused is a ConfigError naming its key and where to correct
        it (both apps read it: the ServerApp refuses the run before any round)."""
        try:
            return cls._from_config(config)
        except FedcacheError as err:
            raise refused_config(err, config) from None

    @classmethod
    def _from_config(cls, config: dict) -> "FlowerRun":
        server_side = sorted(set(config) & set(SERVER_ENV))
        if server_side:
            raise ConfigError(
                f"run config {server_side} would name paths on the server; they are the SuperLink operator's "
                f"settings, not a run's: set {', '.join(SERVER_ENV[k] for k in server_side)} in the environment "
                "flower-superlink starts in (see docs/deploy.md)")
        deploy_keys = {f"{DEPLOY}.{f.name}": f for f in dataclasses.fields(Deployment)}
        spec_keys = set(to_flat(cls()._sections()))
        unknown = sorted(set(config) - set(deploy_keys) - spec_keys)
        if unknown:
            raise ConfigError(f"unknown run config keys {unknown}; fedcache's Flower app knows "
                              f"{sorted(spec_keys | set(deploy_keys))}")
        types = fields_of(Deployment)
        config = {**config, **_run_id_as_text(config)}
        deploy = {f.name: parse(f"run config {key}", config[key], types[f.name])
                  for key, f in deploy_keys.items() if key in config}
        return cls._built({k: v for k, v in config.items() if k in spec_keys}, Deployment(**deploy))

    def to_config(self) -> dict[str, str | int | float | bool]:
        return {**to_flat(self._sections()),
                **{f"{DEPLOY}.{k}": v for k, v in dataclasses.asdict(self.deploy).items()}}


def _run_id_as_text(config: dict) -> dict:
    """``deploy.resume_run=7`` as ``'7'``: `flwr ls` shows a run id as a number, and the number is typed unquoted."""
    key = f"{DEPLOY}.resume_run"
    given = config.get(key)
    return {key: str(given)} if isinstance(given, int) and not isinstance(given, bool) else {}


def refused_config(err: FedcacheError, config: dict) -> ConfigError:
    """``err`` as one line that names the run config key at fault and where to correct it. The checks are
    ``fedcache train``'s, whose messages name its options (``--set lr='abc'``, ``--head``) or only the value
    (``unknown method 'fedavgg'``): a submitter of ``flwr run`` knows the keys."""
    message = str(err).removeprefix("run config ").rstrip(".")
    named = [k for k in config if k in message]
    if not named:  # the key of the option the message names (--set: method.settings), else of the value it quotes
        named = [o.key for o in options(*RUN_SECTIONS) if o.key in config and re.search(rf"{re.escape(o.flag)}\b", message)]
    if not named:
        named = [k for k, v in config.items() if isinstance(v, str) and v and repr(v) in message]
    where = "".join(f"{k}={config[k]!r}: " for k in named if k not in message)
    return ConfigError(f"run config refused: {where}{message}; correct it in `flwr run --run-config` or in the App's "
                       "pyproject.toml [tool.flwr.app.config], and submit the run again")


def build_method(run: FlowerRun, data: FederatedData) -> Method:
    """The method as ``fedcache train`` builds it (same preset, --set routing and head choice)."""
    check_deployable(run.method)
    return instantiate(run, data)


def may_keep_client_state(cls: type[Method]) -> bool:
    """Whether ``cls``'s clients may hold personal state (it makes their initial one): only such a method must be
    built, on the server shard's data, to tell whether a resume is refused (``refuse_resume_with_client_state``)."""
    return cls.init_clients is not Method.init_clients or cls.initial_states is not Method.initial_states


def refuse_resume_with_client_state(method: Method, out: Path, resume_as: str) -> None:
    """A resumed Flower run's nodes start from their initial state: a method whose clients keep state between rounds
    would go on from a state other than the interrupted run's. Its directory holds a Flower run, which the in-process
    engine cannot continue either, so the advice is to start again elsewhere. A run that had finished is not refused:
    its resume trains no round, and shows its result as the in-process engine's does."""
    if not method.init_clients(1) or RunDir(out).finished():
        return
    again = SUBMIT_ANEW if deployed(resume_as) else f"start it again without {resume_as} in another {named('--out', 'out')}"
    raise ConfigError(f"{resume_as}: {method.name} keeps personal client state on the nodes, which a resumed Flower run "
                      f"does not have, so the run in {out} cannot continue; {again} (runs of the in-process engine, "
                      f"{named('`fedcache train` without --engine', 'fedcache.train')}, resume)")


# How a deployment's run that cannot resume starts again: the submitter's words, not the simulation's --resume.
SUBMIT_ANEW = f"submit the run anew without {DEPLOY}.resume_run"


def deployed(resume_as: str) -> bool:
    """Whether the resume was a deployment's (``resume_as`` is its ``deploy.resume_run='7'``), not a ``--resume`` of
    the simulation: its advice is then ``SUBMIT_ANEW``."""
    return resume_as.startswith(f"{DEPLOY}.")


def check_deployable(method: MethodSpec) -> None:
    reason = METHODS.get(method.name).not_deployable(method.params)
    if reason:
        raise ConfigError(f"{method.name} cannot run on Flower: {reason}; run it with the in-process engine "
                          "(`fedcache train`)")


# The server's own paths: run config key a submitter might try -> the environment variable that sets it.
SERVER_ENV = {f"{DEPLOY}.server_shard": "FEDCACHE_FLOWER_SERVER_SHARD", f"{DEPLOY}.out": "FEDCACHE_FLOWER_RUNS"}


@dataclass(frozen=True)
class ServerPaths:
    """Where the ServerApp reads and writes: set by whoever runs the SuperLink, never by a run config."""

    server_shard: Path | None  # the shards' server/ directory
    out: Path | None  # this run's metrics.jsonl, rounds.jsonl, summary.json, server_state.pt (None: nowhere)

    @classmethod
    def from_env(cls, run_id: int, env: dict[str, str] | None = None) -> "ServerPaths":
        """FEDCACHE_FLOWER_SERVER_SHARD, and FEDCACHE_FLOWER_RUNS/run-<run id> (Flower's id of this run)."""
        env = os.environ if env is None else env
        shard, runs = env.get(SERVER_ENV[f"{DEPLOY}.server_shard"]), env.get(SERVER_ENV[f"{DEPLOY}.out"])
        return cls(Path(shard) if shard else None, Path(runs) / f"run-{int(run_id)}" if runs else None)

    def checked(self) -> "ServerPaths":
        """The paths as the environment gave them, refused in its words where they cannot serve (a shard that is
        a file or missing, runs below a file or in a folder this user cannot write): a deployment has no --store or
        --out to name."""
        shard_var, runs_var = SERVER_ENV[f"{DEPLOY}.server_shard"], SERVER_ENV[f"{DEPLOY}.out"]
        if self.server_shard is not None and not self.server_shard.is_dir():
            why = "is a file" if self.server_shard.exists() else "does not exist"
            raise ConfigError(f"{shard_var}={self.server_shard} {why}; set it to the server/ directory `fedcache shard` "
                              "wrote, in the environment flower-superlink starts in")
        if self.out is not None:
            writable_dir(self.out, runs_var, advice=f"set {runs_var} to a directory the SuperLink's user can write to")
        return self
