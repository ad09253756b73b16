"""The round driver: the one loop that runs federated rounds, for K >= 1 federations at once.

The driver owns what a run means: which clients each round samples, what the server broadcasts, the
server's half of a round (checks, exact bytes, aggregation), the evaluation cadence, the metrics line
(accuracy, global accuracy, training loss, bytes), the run directory's files, checkpoints, resumption and
the summary. An engine only moves payloads: it takes each federation's broadcast to its sampled clients,
brings their uploads back (a ``Round`` per federation), and scores clients on their local test rows.

A run by itself is one federation. Several runs of one method (grid cells) step in lockstep as K
federations, each with its own method object (data, partition, seed, settings), schedule and run
directory; the stacked engine (``federate/stacked.py``) then trains all their sampled clients as one
computation. Engines: ``federate/inprocess.py`` (every client in this process), ``federate/stacked.py``,
and the Flower engines of ``flower/server.py`` (simulation and deployment).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from fedcache.errors import ConfigError
from fedcache.federate.clients import ClientStates
from fedcache.federate.divergence import check_finite
from fedcache.federate.local import rng_for
from fedcache.federate.methods.base import LocalResult, Method
from fedcache.federate.metrics import summarize
from fedcache.federate.rundir import CHECKPOINT, METRICS, RunDir, load_checkpoint, no_checkpoint, save_checkpoint
from fedcache.federate.schedule import Schedule
from fedcache.heads import Params
from fedcache.progress import StepCallback, said_now
from fedcache.wording import named, run_again

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One federation: its method object (data, partition, seed, settings), its schedule (the run spec's section:
    rounds, sampled fraction, evaluation cadence), where it writes (None: nowhere) and facts its summary adds."""

    method: Method
    schedule: Schedule
    out: RunDir | None = None
    facts: dict = field(default_factory=dict)


@dataclass
class RunState:
    rnd: int
    server: Params
    clients: Mapping[str, torch.Tensor]  # every client's personal state (ClientStates), where the engine keeps it; else {}
    bytes_up: int = 0
    bytes_down: int = 0
    params_up: list[int] = field(default_factory=list)  # per round, summed over the clients that sent
    seconds: float = 0.0
    losses: list[torch.Tensor] = field(default_factory=list)  # local-training losses since the last metrics line
    senders: list[int] = field(default_factory=list)  # per round: how many clients sent (0 for unfederated methods)
    evaluated_in: float = 0.0  # seconds of the evaluation since the driver last looked (not kept: this process's)
    # Accuracy of each client no round has trained, where it cannot change (inprocess.client_accuracy): this process's.
    untrained_scores: dict[int, float] = field(default_factory=dict)


@dataclass
class RunResult:
    summary: dict
    history: list[dict]
    server: Params
    clients: Mapping[str, torch.Tensor]  # name -> every client's personal state (N, ...), made when read
    checkpoint: dict = field(default_factory=dict)  # the run's own state after its last round, as a checkpoint keeps it
    paused: bool = False  # stopped before its last round (``run(stop_after=...)``): ``summary`` scores that round


@dataclass
class Round:
    """What an engine brings back from one federation's round: the clients whose uploads count (in id order),
    their stacked uploads and weights (``result``), and the mean local loss of each local-training call."""

    clients: list[int]
    result: LocalResult
    losses: list[torch.Tensor] = field(default_factory=list)


class Engine:
    """Moves payloads between each federation's server and its clients; the driver calls, in this order:
    ``init_clients`` (fresh runs), ``load_state_dict`` (resumed runs), ``start``, then per round ``round``
    and, when an evaluation is due, ``evaluate``; ``state_dict`` after each round."""

    def init_clients(self, runs: Sequence[Run]) -> list[Mapping[str, torch.Tensor]]:
        """Per federation, the personal state of every client (``ClientStates``), if the engine keeps it with the run
        state."""
        return [{} for _ in runs]

    def start(self, states: list[RunState]) -> None:
        """Before the first round of this process (e.g. wait for clients to connect, or stack the states)."""

    def round(self, states: list[RunState], rnd: int, picks: list[list[int]], downs: list[Params]) -> list[Round]:
        raise NotImplementedError

    def evaluate(self, i: int, state: RunState, glob: torch.Tensor | None) -> dict:
        """Federation ``i``'s ``accuracy`` and ``per_client`` (each client on its local test rows), and any facts
        of the engine's; ``glob``: the global model's logits on the global test split (None if it has none)."""
        raise NotImplementedError

    def facts(self, i: int) -> dict:
        """The engine's additions to federation ``i``'s summary."""
        return {}

    def start_again(self) -> str:
        """How a run of this engine is trained again from round 0, as advice in messages (a Flower deployment's
        submitter has no --overwrite)."""
        return run_again()

    def state_dict(self) -> dict:
        """What the engine needs, besides the runs' states, to resume (saved in the checkpoint)."""
        return {}

    def load_state_dict(self, saved: dict) -> None:
        pass


# (rounds done, rounds, each federation's metrics line or None): called as the rounds start (every line None,
# done the rounds a resumed run had done), then after each round.
RoundCallback = Callable[[int, int, list], None]


def run(runs: Sequence[Run], engine: Engine, on_round: RoundCallback | None = None, resume: bool = False,
        checkpoint: "object | None" = None, stop_after: int | None = None,
        on_step: StepCallback | None = None) -> list[RunResult]:
    """The runs' rounds, from the start or (``resume``) from their checkpoint, then each run's summary.

    A run by itself checkpoints into its run directory. A stack of runs keeps one ``checkpoint`` file (a path)
    for all of them, so their states are always of one round; each run's directory gets its metrics lines as
    they come and, at the end, its own checkpoint and summary, as a run by itself leaves them. A stack resumes
    from its checkpoint or, where it has none, from its runs' own (all of one round).

    ``stop_after``: pause after that round (before the last), as an interruption would, but on purpose: every
    run keeps its own checkpoint to continue from, and its result is scored at that round (``RunResult.paused``)
    without a summary.json, so a later call with ``resume`` continues it to the same numbers as one call.
    ``on_step(text)``: told once where evaluating took most of a round (``SlowEvaluation``)."""
    runs = list(runs)
    _check_lockstep(runs)
    where = _checkpoint_path(runs, checkpoint)
    states, histories = _initial(runs, engine, where, resume)
    at, rounds = states[0].rnd, runs[0].schedule.rounds
    last = rounds if stop_after is None else _stop_round(stop_after, at, rounds)
    engine.start(states)
    if on_round:  # progress shown as the rounds start (at a resumed run's checkpoint), not once the first is done
        on_round(states[0].rnd, rounds, [None] * len(runs))
    start, before = time.perf_counter(), [s.seconds for s in states]
    slow = SlowEvaluation(runs, on_step)
    for rnd in range(states[0].rnd, last):
        began = time.perf_counter()
        lines = _round(runs, engine, states, rnd)
        slow.after(rnd, time.perf_counter() - began, states)
        share = (time.perf_counter() - start) / len(runs)  # each run's share of the stack's time
        for r, s, h, line, b in zip(runs, states, histories, lines, before):
            s.rnd, s.seconds = rnd + 1, b + share
            if line is not None:
                h.append(line)
                if r.out is not None:
                    r.out.append(line)
        # Once the round is scored: a checkpoint between its training and its scoring would hold a round half closed
        # (losses not yet in a line, an engine's evaluation traffic not yet counted), for a resume to finish. An
        # interrupt while scoring costs the round's training again, on resume, to the same numbers.
        _persist(runs, where, _checkpoint(states, engine))
        if on_round:
            on_round(rnd + 1, rounds, lines)
    end = _finish if last == rounds else _pause
    return [end(r, i, s, h, engine, stacked=len(runs) > 1, trained=last > at)
            for i, (r, s, h) in enumerate(zip(runs, states, histories))]


class SlowEvaluation:
    """Says once a run where an evaluation took SLOW_EVALUATION seconds and most of its round, while a later one
    could still be skipped: scoring every client, with thousands of them (each by its own model, for a
    personalized method), can cost far more than training the few a round samples, and nothing else says where
    the time goes."""

    def __init__(self, runs: list[Run], on_step: StepCallback | None) -> None:
        self.runs, self.on_step, self.said = runs, on_step, False

    def after(self, rnd: int, seconds: float, states: list[RunState]) -> None:
        spent = sum(s.evaluated_in for s in states)
        for s in states:
            s.evaluated_in = 0.0
        if self.said or spent < SLOW_EVALUATION or spent < seconds / 2 or not self._skippable_after(rnd):
            return
        self.said = True
        every = self.runs[0].schedule.eval_every
        clients = sum(r.method.ctx.data.n_clients for r in self.runs)
        runs = f" of {len(self.runs)} runs" if len(self.runs) > 1 else ""
        now = f" (now {every})" if every > 1 else ""
        said_now(log, self.on_step, f"evaluation took {spent:.1f} s of round {rnd + 1}'s {seconds:.1f} s, scoring "
                 f"{clients:,} clients{runs} on their test rows; {named('--eval-every', 'eval_every')} N{now} evaluates "
                 "every N-th round and the last")

    def _skippable_after(self, rnd: int) -> bool:
        """Whether a round after ``rnd``, not the last (always evaluated), is evaluated: a larger --eval-every skips it."""
        schedule = self.runs[0].schedule
        return any(evaluation_due(schedule, r) for r in range(rnd + 1, schedule.rounds - 1))


SLOW_EVALUATION = 5.0


def _stop_round(stop_after: int, at: int, rounds: int) -> int:
    if stop_after < 1 or at > stop_after:
        raise ConfigError(f"stop_after={stop_after}: the runs are at round {at}; pause at a round from {max(at, 1)} on")
    return min(stop_after, rounds)


def _round(runs: list[Run], engine: Engine, states: list[RunState], rnd: int) -> list[dict | None]:
    picks = [sample_clients(r.method, r.schedule, rnd) for r in runs]
    downs = [r.method.broadcast(s.server, rnd) for r, s in zip(runs, states)]
    got = engine.round(states, rnd, picks, downs)
    return [close_round(r.method, r.schedule, engine, i, s, rnd, d, g)
            for i, (r, s, d, g) in enumerate(zip(runs, states, downs, got))]


def _check_lockstep(runs: list[Run]) -> None:
    if not runs:
        raise ValueError("the driver needs at least one run")
    if len({(r.schedule.rounds, r.schedule.eval_every) for r in runs}) > 1:
        raise ConfigError("runs stepped together must share their rounds and evaluation cadence")


def _checkpoint_path(runs: list[Run], checkpoint):
    if checkpoint is not None:
        return checkpoint
    if len(runs) == 1 and runs[0].out is not None:
        return runs[0].out.path / CHECKPOINT
    return None


def sample_clients(method: Method, schedule: Schedule, rnd: int) -> list[int]:
    n = method.ctx.data.n_clients
    if method.all_clients or schedule.fraction >= 1:
        return list(range(n))
    m = max(1, round(schedule.fraction * n))
    return sorted(int(k) for k in rng_for(method.ctx.seed, rnd, 0, 0, 2).choice(n, m, replace=False))


def close_round(method: Method, schedule: Schedule, engine: Engine, i: int, state: RunState, rnd: int, down: Params,
                got: Round) -> dict | None:
    """What follows the clients' half of round ``rnd`` for federation ``i``: the server's half, and the metrics
    line if one is due (returned)."""
    if got.clients:
        settle(method, state, rnd, got.clients, down, got.result)
    state.losses += got.losses
    if not evaluation_due(schedule, rnd):
        return None
    line = metrics_line(method, state, engine, i, rnd)
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


def evaluation_due(schedule: Schedule, rnd: int) -> bool:
    return (rnd + 1) % schedule.eval_every == 0 or rnd + 1 == schedule.rounds


def metrics_line(method: Method, state: RunState, engine: Engine, i: int, rnd: int) -> dict:
    began = time.perf_counter()
    glob = global_logits(method, state.server)
    line = {"round": rnd + 1, **engine.evaluate(i, state, glob), **global_accuracy(method, glob)}
    state.evaluated_in += time.perf_counter() - began
    return {**line, "train_loss": train_loss(state.losses), "bytes_up": state.bytes_up, "bytes_down": state.bytes_down}


def global_logits(method: Method, server: Params) -> torch.Tensor | None:
    """The global model's scores on the global test split (the server's copy of it), if there is one."""
    if not method.has_global_model:
        return None
    with torch.no_grad():
        return method.global_logits(server, method.ctx.data.scored_test())


def global_accuracy(method: Method, glob: torch.Tensor | None) -> dict:
    if glob is None:
        return {}
    return {"global_accuracy": 100.0 * float(method.ctx.data.global_correct(glob).float().mean())}


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
        **({"evaluated_clients": last["evaluated"]} if "evaluated" in last else {}),  # an engine that says whom
        "bytes_up": state.bytes_up, "bytes_down": state.bytes_down,
        "params_up_per_round": int(np.mean(state.params_up)) if state.params_up else 0,
        **_per_client(state),
        "rounds": state.rnd, "seconds": round(state.seconds, 4),
        "random_weights": bool(method.ctx.data.random_weights),
        **({"pools_data": True} if method.pools_data else {}),
        **({"uses_optimizer": False} if not method.uses_optimizer else {}),  # its config's optim section is unread
        **method.summary_extra(), **{k: v for k, v in (facts or {}).items() if k != "definitions"},
        "definitions": {**DEFINITIONS, **({"pools_data": POOLS_DATA} if method.pools_data else {}),
                        **(facts or {}).get("definitions", {})},  # an engine's own figures said too
    }


# Written into every summary, so that a number read from summary.json says what it is.
DEFINITIONS = {
    "std_accuracy": "std over clients of their accuracies at the last evaluation, population std (ddof=0): "
                    "every client of the run is counted, and std_accuracy**2 == variance. Not a std over seeds "
                    "(a grid's report gives that, sample std ddof=1)",
    "global_accuracy": "the global model's accuracy on every row of the evaluated split (a validation run: its spare "
                       "rows), not a mean over clients; null for methods without a global model",
    "worst10": "mean accuracy of the worst 10% of clients (worst20, worst40 and best10 likewise), at least one client "
               "each: with fewer than 10 clients worst10 is the single worst client",
    "variance": "variance over clients of their accuracies (population, in % squared): std_accuracy**2",
    "params_up_per_client": "parameters one client sends in one round, averaged over rounds and the clients that "
                            "sent (the FedPCL paper's '# of Comm Params')",
    "bytes_up_per_client": "bytes one client sends in one round, averaged likewise",
    "params_up_per_round": "parameters all clients that sent in a round send together, averaged over rounds",
    "bytes_up": "bytes sent by all clients over all rounds",
}


POOLS_DATA = ("the method trains on every client's rows in one place: a reference ceiling, not marked the best "
              "beside methods that keep data on clients")


def _per_client(state: RunState) -> dict:
    sent = sum(state.senders)
    return {"params_up_per_client": round(sum(state.params_up) / sent, 1) if sent else 0,
            "bytes_up_per_client": round(state.bytes_up / sent, 1) if sent else 0}


# ---- start, checkpoints, end ----------------------------------------------------------------------
def _initial(runs: list[Run], engine: Engine, where, resume: bool) -> tuple[list[RunState], list[list[dict]]]:
    if not resume:
        clients = engine.init_clients(runs)
        return [RunState(0, r.method.init_server(), c) for r, c in zip(runs, clients)], [[] for _ in runs]
    ck = _resumed_checkpoint(runs, where)
    if len(ck["runs"]) != len(runs):
        raise ConfigError(f"{where} is a checkpoint of {len(ck['runs'])} runs, not of these {len(runs)}; delete it to start over")
    log.info("resuming %s after round %d", ", ".join(dict.fromkeys(r.method.name for r in runs)), ck["rnd"])
    engine.load_state_dict(ck.get("engine", {}))
    here = torch.get_default_device()
    states = [state_from_checkpoint(r.method, r.schedule, _to(saved, here)) for r, saved in zip(runs, ck["runs"])]
    return states, [resumed_history(r, ck["rnd"], engine.start_again()) for r in runs]


def _resumed_checkpoint(runs: list[Run], where) -> dict:
    """The stack's checkpoint, or one made of its runs' own (runs paused or interrupted by themselves, stacked
    anew): their states are each run's alone, so they only need to be of one round."""
    if where is not None and where.exists():
        return load_checkpoint(where)
    own = [r.out.path / CHECKPOINT for r in runs if r.out is not None]
    if len(runs) == 1 or len(own) < len(runs) or not all(p.exists() for p in own):
        raise no_checkpoint(where.parent if where else "the run")  # fedcache.train(resume=True) reaches it too
    cks = [load_checkpoint(p) for p in own]
    at = {ck["rnd"] for ck in cks}
    if len(at) > 1:
        raise ConfigError(f"these runs cannot continue stacked: their checkpoints are of rounds {sorted(at)}, not of one round")
    if any(len(ck["runs"]) != 1 or ck.get("engine") for ck in cks):
        raise ConfigError(f"{', '.join(map(str, own))}: not each a checkpoint of one run by itself; delete them to start over")
    return {"rnd": at.pop(), "runs": [ck["runs"][0] for ck in cks]}


def resumed_history(r: Run, upto: int, again: str) -> list[dict]:
    """The metrics lines up to the checkpoint's round. Unreadable lines are dropped (a torn last line is
    the round a crash interrupted, run again); a line of a round the checkpoint covers is not run again,
    so its loss is said rather than left as a silent gap in the history and report, with ``again``: how to
    train the run again to have it."""
    if r.out is None:
        return []
    history = r.out.history(upto)
    lost = sorted({k + 1 for k in range(upto) if evaluation_due(r.schedule, k)} - {line["round"] for line in history})
    if lost:
        log.warning("%s lacked readable metrics lines of rounds %s (damaged or edited); the resumed run's history "
                    "and report miss them: %s to have them", r.out.path / METRICS, lost, again)
    return history


def _to(value, device: torch.device):
    """A checkpoint's tensors (in dicts and lists) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    return value


def state_from_checkpoint(method: Method, schedule: Schedule, ck: dict) -> RunState:
    # Older checkpoints kept no losses, and no senders: the sampled clients of those rounds sent.
    senders = ck.get("senders") or [len(sample_clients(method, schedule, r)) if method.federated else 0
                                    for r in range(ck["rnd"])]
    return RunState(ck["rnd"], ck["server"], restored_clients(method, ck), ck["bytes_up"], ck["bytes_down"],
                    list(ck["params_up"]), ck["seconds"], list(ck.get("losses", [])), list(senders))


def checkpoint_of(state: RunState) -> dict:
    """One run's state as a checkpoint keeps it (``state_from_checkpoint`` reads it back): of the clients' personal
    state, the rows of those a round has trained and their ``client_ids`` (a run of 10,000 clients that has trained
    100 of them keeps 100 clients' state)."""
    clients = state.clients.checkpoint() if isinstance(state.clients, ClientStates) else {"clients": dict(state.clients)}
    return {"rnd": state.rnd, "server": state.server, **clients, "bytes_up": state.bytes_up,
            "bytes_down": state.bytes_down, "params_up": state.params_up, "seconds": state.seconds,
            "losses": state.losses, "senders": state.senders}  # so that a run resumed between two metrics lines reports the same train_loss


def restored_clients(method: Method, ck: dict) -> Mapping[str, torch.Tensor]:
    """Every client's personal state from a checkpoint: its trained clients' rows over the others' initial state
    (a checkpoint without ``client_ids``, of fedcache before them, holds every client's)."""
    if not ck["clients"]:  # a method without personal state, or an engine that does not keep it (Flower's)
        return ClientStates(method.ctx.data.n_clients, None, {})
    return ClientStates.of(method).restore(ck["clients"], ck.get("client_ids"))


def _checkpoint(states: list[RunState], engine: Engine) -> dict:
    extra = engine.state_dict()
    return {"rnd": states[0].rnd, "seconds": sum(s.seconds for s in states), "runs": [checkpoint_of(s) for s in states],
            **({"engine": extra} if extra else {})}


def _persist(runs: list[Run], where, ck: dict) -> None:
    if len(runs) == 1 and runs[0].out is not None and where == runs[0].out.path / CHECKPOINT:
        runs[0].out.save_checkpoint(ck)  # with its copy per round where the run keeps them all
    elif where is not None:
        save_checkpoint(where, ck)


def _pause(r: Run, i: int, state: RunState, history: list[dict], engine: Engine, stacked: bool,
           trained: bool) -> RunResult:
    """A run stopped before its last round: scored at this round (the metrics line of a round without one is
    computed, not logged, so that the run's files stay those of an uninterrupted run) and, where it trained in
    a stack, its own checkpoint written, so that it continues by itself or in any other stack."""
    summary = _summary(r, i, state, history, engine, trained)
    own = checkpoint_of(state)
    if stacked and r.out is not None:
        r.out.save_checkpoint({"rnd": state.rnd, "seconds": state.seconds, "runs": [own]})
    return RunResult(summary, history, state.server, state.clients, own, paused=True)


def _finish(r: Run, i: int, state: RunState, history: list[dict], engine: Engine, stacked: bool,
            trained: bool) -> RunResult:
    own = checkpoint_of(state)
    if not trained and r.out is not None and r.out.finished():
        # A resume of a finished run: its stored result, its files left as they were (as the Flower engines leave
        # them). Scored and written again, its summary could differ from the one its report and grid already read.
        log.info("the run in %s had finished all its rounds (%d): nothing to train", r.out.path, state.rnd)
        return RunResult(r.out.summary(), history, state.server, state.clients, own)
    summary = _summary(r, i, state, history, engine, trained)
    if r.out is not None:
        r.out.finish(summary, {"rnd": state.rnd, "seconds": state.seconds, "runs": [own]} if stacked else None)
    return RunResult(summary, history, state.server, state.clients, own)


def _summary(r: Run, i: int, state: RunState, history: list[dict], engine: Engine, trained: bool) -> dict:
    # The engine's facts read before a round is scored again: that scoring (a pause, a damaged last line, a resume
    # that trained nothing) is no round of the run, and its evaluation traffic (a Flower engine's) would make the
    # figures other than an uninterrupted run's, whose checkpointed facts already count that round's evaluation.
    facts = {**engine.facts(i), **r.facts}
    return run_summary(r.method, state, [_last_line(r, i, state, history, engine, trained)], facts)


def _last_line(r: Run, i: int, state: RunState, history: list[dict], engine: Engine, trained: bool) -> dict:
    """The metrics line of the run's round now, its summary's source: the logged one, else scored again from the
    state (a pause at a round that logs none, or a run resumed at its last round whose line was damaged: the
    checkpoint holds that round's state, and scoring reads nothing else). Not logged: the training loss that line
    said is not in the checkpoint. ``trained``: whether this call trained that round; where not (resumed at the
    round it ends at), the logged line is kept but the round scored again all the same, since a method's summary
    may hold what its evaluation found beside the line (min-local's probes on the whole test split)."""
    if history and history[-1]["round"] == state.rnd:
        if not trained:
            metrics_line(r.method, state, engine, i, state.rnd - 1)
        return history[-1]
    return metrics_line(r.method, state, engine, i, state.rnd - 1)
