"""The in-process engine: every client in this process, each federation's personal client states in its run
state (``federate/clients.py``), local updates batched (or one client at a time). ``run`` is the round driver
with this engine for a run by itself."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedcache.errors import FedcacheError
from fedcache.federate import driver
from fedcache.federate.clients import ClientStates
from fedcache.federate.driver import Engine, Round, Run, RunResult, RunState
from fedcache.federate.local import recording_losses
from fedcache.federate.methods.base import LocalResult, Method
from fedcache.federate.rundir import RunDir
from fedcache.federate.schedule import Schedule
from fedcache.heads import Params
from fedcache.heads.draws import BLOCK
from fedcache.progress import StepCallback

# (rounds done, rounds, the run's metrics line or None): as the rounds start (line None), then after each round.
OnRound = Callable[[int, int, "dict | None"], None]


@dataclass
class RunConfig:
    """A run by itself in this process, in one line (scripts, tests): its schedule's rounds, sampled fraction
    and evaluation cadence (the method's context holds the rest), the engine's choice, where it writes."""

    rounds: int = 50
    fraction: float = 1.0
    eval_every: int = 1
    batched: bool = True  # all sampled clients in one computation, or one by one
    out: Path | None = None  # an existing directory: the run directory
    resume: bool = False
    keep_checkpoints: str = "last"  # last | none (deleted at the end) | all (one per round besides the last)

    def schedule(self) -> Schedule:
        return Schedule(rounds=self.rounds, fraction=self.fraction, eval_every=self.eval_every)


def run(method: Method, cfg: RunConfig, on_round: OnRound | None = None, facts: dict | None = None) -> RunResult:
    """One run, in this process."""
    out = RunDir(cfg.out, cfg.keep_checkpoints) if cfg.out is not None else None
    return run_one(Run(method, cfg.schedule(), out, facts or {}), cfg.batched, on_round, cfg.resume)


def run_one(r: Run, batched: bool = True, on_round: OnRound | None = None, resume: bool = False,
            stop_after: int | None = None, on_step: StepCallback | None = None) -> RunResult:
    """The round driver with this engine, for a run by itself (``stop_after``, ``on_step``: see ``driver.run``)."""
    (result,) = driver.run([r], InProcess([r.method], batched), for_one_run(on_round), resume=resume,
                           stop_after=stop_after, on_step=on_step)
    return result


def for_one_run(on_round: OnRound | None) -> driver.RoundCallback | None:
    """``on_round`` as the round driver calls it for a run by itself (every engine's: the same calls)."""
    return (lambda done, total, lines: on_round(done, total, lines[0])) if on_round else None


class InProcess(Engine):
    """Federation by federation, each one's sampled clients in one computation (``batched``) or one by one."""

    def __init__(self, methods: list[Method], batched: bool = True) -> None:
        self.methods, self.batched = methods, batched

    def init_clients(self, runs) -> list[ClientStates]:
        return [ClientStates.of(m) for m in self.methods]

    def round(self, states: list[RunState], rnd: int, picks: list[list[int]], downs: list[Params]) -> list[Round]:
        return [self._round(m, s, rnd, clients, down) for m, s, clients, down in zip(self.methods, states, picks, downs)]

    def _round(self, method: Method, state: RunState, rnd: int, clients: list[int], down: Params) -> Round:
        with recording_losses() as losses:
            result = _local(method, self.batched, rnd, clients, down, state.clients.take(clients))
        check_states(method, state.clients, result.states)
        state.clients.put(clients, result.states)
        return Round(clients, result, losses)

    def evaluate(self, i: int, state: RunState, glob: torch.Tensor | None) -> dict:
        return client_accuracy(self.methods[i], state, glob)


def _local(method: Method, batched: bool, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
    if batched or not method.splittable:
        return method.local_update(rnd, clients, down, states)
    parts = [method.local_update(rnd, [k], down, {n: t[[i]] for n, t in states.items()}) for i, k in enumerate(clients)]
    cat = lambda dicts: {n: torch.cat([d[n] for d in dicts]) for n in dicts[0]} if dicts and dicts[0] else {}
    return LocalResult(cat([p.states for p in parts]), cat([p.uploads for p in parts]), torch.cat([p.weights for p in parts]))


# Taking and putting behave the same whatever --fraction is: a method gets its clients' states and returns all
# of them (check_states), and what it returns is what the run holds after the round. Only where the bytes go
# differs: when every client trains, the held tensors themselves are handed over (local training updates weights
# in place, and ``put`` copies only the tensors a method replaced, such as the BatchNorm statistics a head
# returns); a subset gets copies, written back, so a run of every client copies no state.
def check_states(method: Method, stacked: Params, returned: Params) -> None:
    """A method returns its clients' whole personal state: a state it kept only by updating the given
    tensors in place would survive a round of every client but be lost with --fraction < 1."""
    if set(returned) != set(stacked):
        raise FedcacheError(f"{method.name}.local_update returned states {sorted(returned)} for clients whose state is "
                            f"{sorted(stacked)}: a method returns every entry of the personal state it is given (and only those)")


# ---- evaluation -----------------------------------------------------------------------
# Clients per batched evaluation, to bound the (K, T, D) gather: a block of heads/draws.py, so that never-trained
# clients' random heads come as drawn, a block at a time, with no copy.
EVAL_CHUNK = BLOCK


def evaluate(method: Method, state: RunState) -> dict:
    """The accuracy fields of a metrics line, as the driver writes them for this engine."""
    glob = driver.global_logits(method, state.server)
    return {**client_accuracy(method, state, glob), **driver.global_accuracy(method, glob)}


def client_accuracy(method: Method, state: RunState, glob: torch.Tensor | None) -> dict:
    d = method.ctx.data
    with torch.no_grad():
        if method.personalized:
            per_client = _personal_accuracy(method, state)
        else:
            correct = d.test_correct(glob)
            per_client = mean_over_clients(correct, d.client_test)
    return {"accuracy": float(per_client.mean()), "per_client": [round(float(a), 4) for a in per_client]}


EVAL_CLIENTS = 1024  # clients whose local test rows are gathered at once when scoring the global model


def mean_over_clients(correct: np.ndarray, client_rows: list[np.ndarray]) -> np.ndarray:
    """100 x each client's share of ``correct`` over its rows (NaN for a client without any), exactly as
    ``100.0 * correct[rows].mean()`` gives it, but a block of clients per numpy call: with thousands of
    clients a call per client cost more than the rows it scores."""
    out = np.full(len(client_rows), np.nan)
    for lo in range(0, len(client_rows), EVAL_CLIENTS):
        block = client_rows[lo:lo + EVAL_CLIENTS]
        sizes = np.array([len(r) for r in block], dtype=np.int64)
        held = np.flatnonzero(sizes)
        if not len(held):
            continue
        starts = (np.cumsum(sizes) - sizes)[held]  # an empty client adds no rows, so each segment is one client's
        hits = np.add.reduceat(correct[np.concatenate(block)].astype(np.int64), starts)
        out[lo + held] = 100.0 * (hits / sizes[held])
    return out


def _personal_accuracy(method: Method, state: RunState) -> np.ndarray:
    d = method.ctx.data
    kept = state.untrained_scores if _scores_kept(method, state) else None
    acc = []
    for start in range(0, d.n_clients, EVAL_CHUNK):
        acc.extend(_chunk_accuracy(method, state, list(range(start, min(d.n_clients, start + EVAL_CHUNK))), kept))
    return np.array(acc)


def _scores_kept(method: Method, state: RunState) -> bool:
    """Whether a never-trained client's score is kept from the evaluation that first scored it: its state is the
    initial one until a round writes it (``ClientStates.trained``), and the method scores a client by its own state
    and rows alone. Kept, fedproto's run of 10 of 1,000 clients a round, 3 rounds each evaluated, took 0.43x the time
    of scoring them again (benchmarks/personal_eval.py)."""
    return isinstance(state.clients, ClientStates) and bool(state.clients.names) and method.scores_by_own_state()


def _chunk_accuracy(method: Method, state: RunState, clients: list[int], kept: dict[int, float] | None) -> list[float]:
    """The clients' accuracies: those ``kept`` holds for never-trained clients as kept, the others scored (and kept
    where never trained)."""
    if kept is None:
        return _scored(method, state, clients)
    trained = state.clients.trained
    todo = [k for k in clients if trained[k] or k not in kept]
    if todo:
        # Padded as the whole block is: a row's bits can depend on the size of the product that holds it
        # (heads.base.bmm).
        width = max(len(method.ctx.data.client_test[k]) for k in clients)
        scored = dict(zip(todo, _scored(method, state, todo, width)))
        kept.update((k, a) for k, a in scored.items() if not trained[k])
    return [kept[k] if k in kept and not trained[k] else scored[k] for k in clients]


def _scored(method: Method, state: RunState, clients: list[int], width: int | None = None) -> list[float]:
    x, y, mask = method.ctx.data.rows_of("test", clients, width)
    states = state.clients.take(clients) if state.clients else {}
    logits = method.client_logits(state.server, states, clients, x)
    hit = (logits.argmax(-1) == y) & mask
    return (100.0 * hit.sum(1) / mask.sum(1)).tolist()
