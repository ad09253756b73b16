"""Several runs of one method (grid cells) trained as one stacked computation: a federation axis.

The runs share the data tables, the method, the head and the round schedule; they may differ in partition
(alpha, seed, number of clients), seed, sampling fraction, optimizer settings and the method's declared
``row_params``. Every federation's clients are rows of one client stack (F federations x N_f clients).
Per round:

- each federation samples its clients with its own seed and its server broadcasts (its own method object,
  the very code of a single run);
- one ``local_update`` of a *joint* method object trains every sampled row of every federation at once: it
  sees the federations' clients as one list, takes each federation's step plan (its seed, its shuffles),
  per-row settings as (K,) tensors and per-federation optimizer blocks (``optim.RowOptim``); what a server
  broadcasts about all its clients (``run_broadcast``: FedPCL's local prototype sets) it gets once per
  federation, zero-padded to the federation with the most clients;
- the result is cut back into federations, and each federation's server checks, counts and aggregates
  its own slice (the round driver's ``close_round``): the aggregation is a reduction per federation
  segment, by the per-run code, so a federation's server is the one its own run computes from the same uploads.

Evaluation, metrics lines and summary are per federation with the round driver's functions. A method can
stack only if its class declares ``batchable`` (methods/base.py); its equality test compares a stack with
the runs one by one.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fedcache.errors import ConfigError
from fedcache.federate.local import recording_losses
from fedcache.federate.driver import (Round, RunConfig, RunResult, RunState, checkpoint_of, close_round, initial_state,
                                      run_summary, sample_clients, state_from_checkpoint)
from fedcache.federate.loop import InProcess, check_states
from fedcache.federate.methods.base import LocalResult, Method, batchable
from fedcache.federate.optim import RowOptim
from fedcache.heads import Params


@dataclass
class Federation:
    """One run of the stack: its own method object (data, partition, seed, settings) and schedule."""

    method: Method
    cfg: RunConfig
    facts: dict = dataclasses.field(default_factory=dict)  # added to its summary, as driver.run's ``facts``


def stack_key(f: Federation) -> tuple:
    """What runs must share to stack: everything but what the stack keeps per row or per federation."""
    m, c = f.method, f.method.ctx
    fixed = {k: v for k, v in dataclasses.asdict(m.p).items() if k not in m.row_params}
    return (type(m), c.head, c.optim.optimizer, c.local_epochs, c.batch_size, c.rounds, f.cfg.rounds,
            f.cfg.eval_every, repr(sorted(fixed.items())))


def why_not_stackable(f: Federation) -> str:
    """Empty when the run can join a stack; else the reason, as the grid reports it."""
    cls = type(f.method)
    if not batchable(cls):
        return f"{cls.name} does not declare that its runs can train stacked"
    if cls.not_batchable(f.method.p):
        return cls.not_batchable(f.method.p)
    if not f.cfg.batched:
        return "--no-batch trains its clients one by one"
    return ""


class Stack:
    """F federations' state and the joint method object that trains them together."""

    def __init__(self, feds: list[Federation]) -> None:
        if not feds:
            raise ValueError("a stack needs at least one federation")
        reasons = {why_not_stackable(f) for f in feds} - {""}
        if reasons or len({stack_key(f) for f in feds}) > 1:
            raise ConfigError("these runs cannot train stacked: " + ("; ".join(sorted(reasons)) or
                              "they differ in method, head, optimizer kind, round schedule or a setting that is not per row"))
        _check_same_tables(feds)
        self.feds = feds
        sizes = [f.method.ctx.data.n_clients for f in feds]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        self.joint = _joint_method(self)
        self.engines = [InProcess(f.method) for f in feds]  # each federation's clients: init, evaluation
        self.shapes: list[dict[str, list[int]]] = []  # per run, its client states' shapes after the client axis
        first = feds[0].method
        self.row_values = {n: torch.tensor([getattr(f.method.p, n) for f in feds for _ in range(f.method.ctx.data.n_clients)],
                                           dtype=torch.float32) for n in first.row_params}

    def rows_of(self, picks: list[list[int]]) -> list[int]:
        return [self.offsets[i] + k for i, pick in enumerate(picks) for k in pick]

    def split(self, rows: list[int]) -> list[tuple[int, list[int]]]:
        """Stack rows (sorted by federation) -> (federation index, its own client ids), in row order."""
        out: dict[int, list[int]] = {}
        for r in rows:
            i = int(np.searchsorted(self.offsets, r, side="right")) - 1
            out.setdefault(i, []).append(r - self.offsets[i])
        return list(out.items())

    def select(self, rows: list[int]) -> None:
        """Point the joint method's settings and optimizer at these rows for one ``local_update``."""
        j, first = self.joint, self.feds[0].method
        idx = torch.tensor(rows, dtype=torch.long)
        fields = {f.name: getattr(first.p, f.name) for f in dataclasses.fields(first.p)}
        j.p = types.SimpleNamespace(**{**fields, **{n: v[idx] for n, v in self.row_values.items()}})
        j.ctx.optim = RowOptim(tuple((len(ks), self.feds[i].method.ctx.optim) for i, ks in self.split(rows)))


def _check_same_tables(feds: list[Federation]) -> None:
    first = feds[0].method.ctx.data
    for f in feds[1:]:
        d = f.method.ctx.data
        for name in ("x_train", "y_train", "x_test", "y_test"):
            a, b = getattr(first, name), getattr(d, name)
            if a.shape != b.shape or (a.data_ptr() != b.data_ptr() and not torch.equal(a, b)):
                raise ConfigError(f"runs on different data tables ({name}) cannot train stacked")


_STACKED: dict[type, type] = {}


def _joint_method(stack: Stack) -> Method:
    """An object of the federations' method class over every federation's clients: its data lists them all
    (federation after federation) and its step plans are each federation's own."""
    first = stack.feds[0].method
    cls = type(first)
    if cls not in _STACKED:
        _STACKED[cls] = type(f"Stacked{cls.__name__}", (_JointPlans, cls), {"__module__": __name__})
    data = dataclasses.replace(
        first.ctx.data,
        client_train=[r for f in stack.feds for r in f.method.ctx.data.client_train],
        client_test=[r for f in stack.feds for r in f.method.ctx.data.client_test])
    joint = _STACKED[cls](dataclasses.replace(first.ctx, data=data), first.p)
    joint.stack = stack
    return joint


class _JointPlans:
    """Mixin of the joint method object: a row's mini-batches and random streams are those of its own run
    (its seed, its client id), so every federation shuffles and draws exactly as when it runs alone."""

    stack: Stack

    def plan(self, rnd: int, clients: list[int], epochs: int | None = None, first_epoch: int = 0) -> np.ndarray:
        plans = [self.stack.feds[i].method.plan(rnd, ks, epochs, first_epoch) for i, ks in self.stack.split(clients)]
        steps, width = max(p.shape[1] for p in plans), plans[0].shape[2]
        out = np.full((len(clients), steps, width), -1, np.int64)
        at = 0
        for p in plans:
            out[at : at + len(p), : p.shape[1]] = p
            at += len(p)
        return out

    def client_seeds(self, clients: list[int]) -> list[tuple[int, int]]:
        return [s for i, ks in self.stack.split(clients) for s in self.stack.feds[i].method.client_seeds(ks)]

    def run_sizes(self, clients: list[int]) -> list[int]:
        return [len(ks) for _, ks in self.stack.split(clients)]


# ---- running ----------------------------------------------------------------------------------------
# The rounds are the round driver's (federate/driver.py) with the stack as the clients' half: each
# federation samples and broadcasts as its run does, one joint local_update trains every sampled row, and
# each federation's slice goes through the driver's ``close_round`` (checks, bytes, aggregation, metrics
# line) with an in-process engine over its view of the client stack. What stays here is the lockstep: the
# driver's ``run`` is one run's loop, and F runs must open every round before any of them trains.
@dataclass
class StackState:
    rnd: int
    states: list[RunState]  # per federation; ``clients`` are views of ``clients`` below
    clients: Params  # every federation's client state, stacked
    histories: list[list[dict]]
    seconds: float = 0.0


RoundCallback = Callable[[int, int], None]  # (rounds done, rounds)


@dataclass
class FederationResult(RunResult):
    checkpoint: dict = dataclasses.field(default_factory=dict)  # what its run's checkpoint.pt holds after the last round


def run_stack(feds: list[Federation], checkpoint: Path | None = None, on_round: RoundCallback | None = None
              ) -> list[FederationResult]:
    """Train the federations together; one result per federation, as ``driver.run`` returns for its run
    (``seconds`` is each federation's share of the stack's time). ``checkpoint``: a file written after
    every round and continued from when it exists (the same federations, in the same order)."""
    stack = Stack(feds)
    st = _load(stack, checkpoint) if checkpoint is not None and checkpoint.exists() else _fresh(stack)
    rounds = feds[0].cfg.rounds
    t0 = time.perf_counter() - st.seconds
    for rnd in range(st.rnd, rounds):
        for history, line in zip(st.histories, _round(stack, st, rnd)):
            if line is not None:
                history.append(line)
        st.rnd, st.seconds = rnd + 1, time.perf_counter() - t0
        for s in st.states:
            s.rnd, s.seconds = st.rnd, st.seconds / len(feds)
        if checkpoint is not None:
            _save(stack, st, checkpoint)
        if on_round:
            on_round(rnd + 1, rounds)
    return [_result(f, e, s, h) for f, e, s, h in zip(feds, stack.engines, st.states, st.histories)]


def _result(f: Federation, engine: InProcess, s: RunState, history: list[dict]) -> FederationResult:
    own = dataclasses.replace(s, clients={n: t.clone() for n, t in s.clients.items()})  # not views of the whole stack
    summary = run_summary(f.method, own, history, {**engine.facts(), **f.facts})
    return FederationResult(summary, history, own.server, own.clients, checkpoint_of(own))


def _round(stack: Stack, st: StackState, rnd: int) -> list[dict | None]:
    """One round of every federation; each one's metrics line, or None where none is due."""
    feds = stack.feds
    picks = [sample_clients(f.method, f.cfg, rnd) for f in feds]
    downs = [f.method.broadcast(s.server, rnd) for f, s in zip(feds, st.states)]
    rows = stack.rows_of(picks)
    stack.select(rows)
    idx = torch.tensor(rows, dtype=torch.long)
    with recording_losses() as losses:
        states = {n: t[idx] for n, t in st.clients.items()}
        result = stack.joint.local_update(rnd, rows, _per_row(stack.joint, downs, picks), states)
    check_states(stack.joint, st.clients, result.states)
    losses = _checked(losses, len(rows))
    for n, t in result.states.items():
        st.clients[n][idx] = t  # before the metrics lines: evaluation reads the clients' new states
    lines, at = [], 0
    for i, (f, pick) in enumerate(zip(feds, picks)):
        part = slice(at, at + len(pick))
        at += len(pick)
        mine = LocalResult({n: t[part] for n, t in result.states.items()}, {n: t[part] for n, t in result.uploads.items()},
                           result.weights[part])
        got = Round(pick, mine, [loss[part] for loss in losses])
        lines.append(close_round(f.method, f.cfg, stack.engines[i], st.states[i], rnd, downs[i], got))
    return lines


def _per_row(joint: Method, downs: list[Params], picks: list[list[int]]) -> Params:
    """Each federation's broadcast (leading axis 1) repeated for its sampled clients, (K, ...); the method's
    ``run_broadcast`` entries once per federation with sampled clients, (R, ...), zero-padded to the widest."""
    if not downs[0]:
        return {}
    for d in downs:
        bad = [n for n, t in d.items() if t.shape[0] != 1]
        if bad:
            raise ValueError(f"a stacked method broadcasts tensors with a leading axis of 1; {', '.join(bad)} has not")
    out = {}
    for n in downs[0]:
        parts = [(d[n], len(p)) for d, p in zip(downs, picks) if p]
        if n in joint.run_broadcast:
            widest = [max(dims) for dims in zip(*(t.shape[1:] for t, _ in parts))]
            out[n] = torch.cat([_zero_padded(t, widest) for t, _ in parts])
        elif len({t.shape for t, _ in parts}) > 1:
            raise ConfigError(f"{joint.name}'s broadcast {n!r} differs in shape between the runs, which the method does "
                              "not declare (run_broadcast): these runs cannot train stacked")
        else:
            out[n] = torch.cat([t.expand(k, *t.shape[1:]) for t, k in parts])
    return out


def _checked(losses: list[torch.Tensor], rows: int) -> list[torch.Tensor]:
    if any(len(loss) != rows for loss in losses):
        raise ValueError("a stacked method's local training must train every sampled row in each call")
    return losses


# ---- state and checkpoints ---------------------------------------------------------------------------
def _fresh(stack: Stack) -> StackState:
    parts = [e.init_clients() for e in stack.engines]
    stack.shapes = [{n: list(t.shape[1:]) for n, t in p.items()} for p in parts]
    clients = {n: torch.cat([_padded(stack, n, p[n]) for p in parts]) for n in parts[0]} if parts[0] else {}
    states = [initial_state(f.method, dataclasses.replace(f.cfg, resume=False), e) for f, e in zip(stack.feds, stack.engines)]
    return _with_views(stack, StackState(0, states, clients, [[] for _ in stack.feds]))


def _padded(stack: Stack, name: str, t: torch.Tensor) -> torch.Tensor:
    """One run's client state ``name``, zero-padded to the widest run's shape where the method declares it
    may differ (``Method.padded_states``)."""
    widest = [max(dims) for dims in zip(*(s[name] for s in stack.shapes))]
    if list(t.shape[1:]) == widest:
        return t
    if name not in stack.joint.padded_states:
        raise ConfigError(f"{stack.joint.name}'s client state {name!r} differs in shape between the runs, which the "
                          "method does not declare (padded_states): these runs cannot train stacked")
    return _zero_padded(t, widest)


def _zero_padded(t: torch.Tensor, widest: list[int]) -> torch.Tensor:
    """``t`` with its axes after the first zero-padded at their ends to ``widest``."""
    if list(t.shape[1:]) == widest:
        return t
    out = t.new_zeros(t.shape[0], *widest)
    out[(slice(None), *(slice(0, d) for d in t.shape[1:]))] = t
    return out


def _with_views(stack: Stack, st: StackState) -> StackState:
    for i, s in enumerate(st.states):
        a, b = stack.offsets[i], stack.offsets[i + 1]
        # Views cut to the run's own shape: evaluation and the results read the stack's tensors.
        s.clients = {n: t[(slice(a, b), *(slice(0, d) for d in stack.shapes[i][n]))] for n, t in st.clients.items()}
    return st


def _save(stack: Stack, st: StackState, path: Path) -> None:
    """One file for the whole stack, replaced atomically: the federations' states are always of one round."""
    runs = [{k: v for k, v in checkpoint_of(s).items() if k != "clients"} for s in st.states]
    ck = {"rnd": st.rnd, "seconds": st.seconds, "clients": st.clients, "shapes": stack.shapes, "runs": runs,
          "histories": json.dumps(st.histories)}
    tmp = path.with_suffix(".tmp")
    torch.save(ck, tmp)
    os.replace(tmp, path)  # a crash mid-write leaves the previous checkpoint intact


def _load(stack: Stack, path: Path) -> StackState:
    ck = torch.load(path, weights_only=True)  # tensors, dicts, lists, numbers and text only
    if not isinstance(ck.get("runs"), list) or len(ck["runs"]) != len(stack.feds) or "shapes" not in ck:
        raise ConfigError(f"{path} is not a checkpoint of this stack of {len(stack.feds)} runs; delete it to start over")
    stack.shapes = ck["shapes"]
    states = [state_from_checkpoint(f.method, f.cfg, {**run, "clients": {}}) for f, run in zip(stack.feds, ck["runs"])]
    return _with_views(stack, StackState(ck["rnd"], states, ck["clients"], json.loads(ck["histories"]), ck["seconds"]))
