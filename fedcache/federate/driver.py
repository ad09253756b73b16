"""The round driver: one schedule for every engine.

The driver owns what a run means: which clients each round samples, what the server broadcasts, the
server's half of a round (checks, exact bytes, aggregation), the evaluation cadence, the metrics line
(accuracy, global accuracy, training loss, bytes), ``metrics.jsonl``, checkpoints, resumption and
``summary.json``. An engine only moves payloads: it takes the broadcast to the sampled clients, brings
their uploads back (``Round``), and scores clients on their local test rows. The in-process engine is
``federate/loop.py``; the Flower engines (simulation and deployment) are ``flower/server.py``.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fedcache.errors import ConfigError
from fedcache.federate.checkpoints import CHECKPOINT, METRICS, append_line, load_checkpoint, read_history, save_checkpoint
from fedcache.federate.divergence import check_finite
from fedcache.federate.local import rng_for
from fedcache.federate.methods.base import LocalResult, Method
from fedcache.federate.metrics import summarize
from fedcache.heads import Params

log = logging.getLogger(__name__)

SUMMARY = "summary.json"


@dataclass
class RunConfig:
    rounds: int = 50
    fraction: float = 1.0
    eval_every: int = 1
    batched: bool = True  # the in-process engine's choice: all sampled clients in one computation, or one by one
    out: Path | None = None
    resume: bool = False
    keep_checkpoints: str = "last"  # last | none (deleted at the end) | all (one per round besides the last)

    def __post_init__(self) -> None:
        if self.rounds < 1 or not 0 < self.fraction <= 1 or self.eval_every < 1:
            raise ConfigError(f"need rounds >= 1, 0 < fraction <= 1, eval_every >= 1 (got {self})")


@dataclass
class RunState:
    rnd: int
    server: Params
    clients: Params  # the personal state of every client, stacked, where the engine keeps it (else empty)
    bytes_up: int = 0
    bytes_down: int = 0
    params_up: list[int] = field(default_factory=list)  # per round, summed over the clients that sent
    seconds: float = 0.0
    losses: list[torch.Tensor] = field(default_factory=list)  # local-training losses since the last metrics line
    senders: list[int] = field(default_factory=list)  # per round: how many clients sent (0 for unfederated methods)


@dataclass
class RunResult:
    summary: dict
    history: list[dict]
    server: Params
    clients: Params


@dataclass
class Round:
    """What an engine brings back from a round: the clients whose uploads count (in id order), their
    stacked uploads and weights (``result``), and the mean local loss of each local-training call."""

    clients: list[int]
    result: LocalResult
    losses: list[torch.Tensor] = field(default_factory=list)


class Engine:
    """Moves payloads between the server and the clients; the driver calls it, in this order:
    ``init_clients`` (fresh runs), ``load_state_dict`` (resumed runs), ``start``, then per round
    ``round`` and, when an evaluation is due, ``evaluate``; ``state_dict`` after each round."""

    def init_clients(self) -> Params:
        """The personal state of every client, stacked, if the engine keeps it with the run state."""
        return {}

    def start(self, state: RunState) -> None:
        """Before the first round of this process (e.g. wait for clients to connect)."""

    def round(self, state: RunState, rnd: int, clients: list[int], down: Params) -> Round:
        raise NotImplementedError

    def evaluate(self, state: RunState, glob: torch.Tensor | None) -> dict:
        """``accuracy`` and ``per_client`` (each client on its local test rows), and any facts of the
        engine's; ``glob``: the global model's logits on the global test split (None if it has none)."""
        raise NotImplementedError

    def facts(self) -> dict:
        """The engine's additions to the summary."""
        return {}

    def state_dict(self) -> dict:
        """What the engine needs, besides the run state, to resume (saved in the checkpoint)."""
        return {}

    def load_state_dict(self, saved: dict) -> None:
        pass


RoundCallback = Callable[[int, int, dict | None], None]


def run(method: Method, cfg: RunConfig, engine: Engine, on_round: RoundCallback | None = None,
        facts: dict | None = None) -> RunResult:
    """The run: rounds from the start or from ``cfg.out``'s checkpoint, then the summary (written to
    ``summary.json`` with ``facts`` added, when ``cfg.out`` is set)."""
    state = initial_state(method, cfg, engine)
    history = resumed_history(cfg, state.rnd) if cfg.resume else []
    engine.start(state)
    t0 = time.perf_counter() - state.seconds
    for rnd in range(state.rnd, cfg.rounds):
        clients = sample_clients(method, cfg, rnd)
        down = method.broadcast(state.server, rnd)
        line = close_round(method, cfg, engine, state, rnd, down, engine.round(state, rnd, clients, down))
        if line is not None:
            history.append(line)
        state.rnd, state.seconds = rnd + 1, time.perf_counter() - t0
        _persist(cfg, state, line, engine)
        if on_round:
            on_round(rnd + 1, cfg.rounds, line)
    summary = run_summary(method, state, history, {**engine.facts(), **(facts or {})})
    _finish(cfg, summary)
    return RunResult(summary, history, state.server, state.clients)


def resumed_history(cfg: RunConfig, upto: int) -> list[dict]:
    """The metrics lines up to the checkpoint's round. Unreadable lines are dropped (a torn last line is
    the round a crash interrupted, run again); a line of a round the checkpoint covers is not run again,
    so its loss is said rather than left as a silent gap in the history and report."""
    history = read_history(cfg.out, upto)
    lost = sorted({r + 1 for r in range(upto) if evaluation_due(cfg, r)} - {line["round"] for line in history})
    if lost:
        log.warning("%s lacked readable metrics lines of rounds %s (damaged or edited); the resumed run's history "
                    "and report miss them: run it again with --overwrite to have them", Path(cfg.out) / METRICS, lost)
    return history


def sample_clients(method: Method, cfg: RunConfig, rnd: int) -> list[int]:
    n = method.ctx.data.n_clients
    if method.all_clients or cfg.fraction >= 1:
        return list(range(n))
    m = max(1, round(cfg.fraction * n))
    return sorted(int(k) for k in rng_for(method.ctx.seed, rnd, 0, 0, 2).choice(n, m, replace=False))


def close_round(method: Method, cfg: RunConfig, engine: Engine, state: RunState, rnd: int, down: Params,
                got: Round) -> dict | None:
    """What follows the clients' half of round ``rnd``: the server's half, and the metrics line if one is due
    (returned)."""
    if got.clients:
        settle(method, state, rnd, got.clients, down, got.result)
    state.losses += got.losses
    if not evaluation_due(cfg, rnd):
        return None
    line = metrics_line(method, state, engine, rnd)
    state.losses = []
    return line


def settle(method: Method, state: RunState, rnd: int, clients: list[int], down: Params, result: LocalResult) -> None:
    """The server's half of a round, the same on every engine: check, count the bytes, aggregate."""
    check_finite(method, result, clients, rnd, down)
    if method.federated:
        up = [method.upload_size(result.uploads, i) for i in range(len(clients))]
        state.bytes_up += sum(b for _, b in up)
        state.bytes_down += method.download_size(down)[1] * len(clients)
        state.params_up.append(sum(p for p, _ in up))
        state.senders.append(len(clients))
    else:
        state.params_up.append(0)
        state.senders.append(0)
    state.server = method.aggregate(state.server, result, clients, rnd)


def evaluation_due(cfg: RunConfig, rnd: int) -> bool:
    return (rnd + 1) % cfg.eval_every == 0 or rnd + 1 == cfg.rounds


def metrics_line(method: Method, state: RunState, engine: Engine, rnd: int) -> dict:
    glob = global_logits(method, state.server)
    line = {"round": rnd + 1, **engine.evaluate(state, glob), **global_accuracy(method, glob)}
    return {**line, "train_loss": train_loss(state.losses), "bytes_up": state.bytes_up, "bytes_down": state.bytes_down}


def global_logits(method: Method, server: Params) -> torch.Tensor | None:
    """The global model's scores on the global test split (the server's copy of it), if there is one."""
    if not method.has_global_model:
        return None
    with torch.no_grad():
        return method.global_logits(server, method.ctx.data.x_test)


def global_accuracy(method: Method, glob: torch.Tensor | None) -> dict:
    if glob is None:
        return {}
    return {"global_accuracy": 100.0 * float((glob.argmax(1) == method.ctx.data.y_test).float().mean())}


def train_loss(losses: list[torch.Tensor]) -> float | None:
    """Mean over the rounds since the last metrics line, over sampled clients and over each local-training
    call, of a client's mean loss over its local steps; None for methods that train nothing locally."""
    return round(float(torch.cat(losses).mean()), 6) if losses else None


def run_summary(method: Method, state: RunState, history: list[dict], facts: dict | None = None) -> dict:
    """summary.json: the last evaluation's accuracies and fairness figures, traffic, time, and the
    method's and the caller's facts."""
    last = history[-1]
    per_client = np.array(last["per_client"])
    return {
        "method": method.name, **summarize(per_client),
        "global_accuracy": last.get("global_accuracy"),
        "per_client_accuracy": last["per_client"],
        "bytes_up": state.bytes_up, "bytes_down": state.bytes_down,
        "params_up_per_round": int(np.mean(state.params_up)) if state.params_up else 0,
        **_per_client(state),
        "rounds": state.rnd, "seconds": round(state.seconds, 4),
        "random_weights": bool(method.ctx.data.random_weights),
        **method.summary_extra(), **(facts or {}),
        "definitions": DEFINITIONS,
    }


# Written into every summary, so that a number read from summary.json says what it is.
DEFINITIONS = {
    "std_accuracy": "std over clients of their accuracies at the last evaluation, population std (ddof=0): "
                    "every client of the run is counted, and std_accuracy**2 == variance. Not a std over seeds "
                    "(a grid's report gives that, sample std ddof=1)",
    "params_up_per_client": "parameters one client sends in one round, averaged over rounds and the clients that "
                            "sent (the FedPCL paper's '# of Comm Params')",
    "bytes_up_per_client": "bytes one client sends in one round, averaged likewise",
    "params_up_per_round": "parameters all clients that sent in a round send together, averaged over rounds",
    "bytes_up": "bytes sent by all clients over all rounds",
}


def _per_client(state: RunState) -> dict:
    sent = sum(state.senders)
    return {"params_up_per_client": round(sum(state.params_up) / sent, 1) if sent else 0,
            "bytes_up_per_client": round(state.bytes_up / sent, 1) if sent else 0}


# ---- persistence -------------------------------------------------------------------------
def initial_state(method: Method, cfg: RunConfig, engine: Engine) -> RunState:
    if not cfg.resume:
        return RunState(0, method.init_server(), engine.init_clients())
    ck = load_checkpoint(cfg.out, method.name)
    engine.load_state_dict(ck.get("engine", {}))
    return state_from_checkpoint(method, cfg, ck)


def state_from_checkpoint(method: Method, cfg: RunConfig, ck: dict) -> RunState:
    # Older checkpoints kept no losses, and no senders: the sampled clients of those rounds sent.
    senders = ck.get("senders") or [len(sample_clients(method, cfg, r)) if method.federated else 0 for r in range(ck["rnd"])]
    return RunState(ck["rnd"], ck["server"], ck["clients"], ck["bytes_up"], ck["bytes_down"], list(ck["params_up"]),
                    ck["seconds"], list(ck.get("losses", [])), list(senders))


def checkpoint_of(state: RunState) -> dict:
    """The run state as a checkpoint keeps it (``state_from_checkpoint`` reads it back)."""
    return {"rnd": state.rnd, "server": state.server, "clients": state.clients, "bytes_up": state.bytes_up,
            "bytes_down": state.bytes_down, "params_up": state.params_up, "seconds": state.seconds,
            "losses": state.losses, "senders": state.senders}  # so that a run resumed between two metrics lines reports the same train_loss


def _persist(cfg: RunConfig, state: RunState, line: dict | None, engine: Engine) -> None:
    if cfg.out is None:
        return
    if line is not None:
        append_line(cfg.out / METRICS, line)
    ck = checkpoint_of(state)
    extra = engine.state_dict()
    save_checkpoint(cfg.out, {**ck, "engine": extra} if extra else ck, cfg.keep_checkpoints == "all")


def _finish(cfg: RunConfig, summary: dict) -> None:
    if cfg.out is None:
        return
    write_summary(cfg.out, summary)
    if cfg.keep_checkpoints == "none":
        (cfg.out / CHECKPOINT).unlink(missing_ok=True)


def write_summary(out: Path, summary: dict) -> None:
    """summary.json, written last: its presence marks the run finished."""
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
