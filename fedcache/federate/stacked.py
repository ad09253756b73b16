"""The stacked engine: several runs of one method (grid cells) trained as one computation.

The runs share the data tables, the method, the head and the round schedule; they may differ in partition
(alpha, seed, number of clients), seed, sampling fraction, optimizer settings and the settings the method
declares (``federate/stacking.py``). The round driver steps them in lockstep, each with its own method
object, sampling, broadcast, checks, aggregation, evaluation and run directory, as if it ran alone; this
engine only carries their clients' half of a round: every federation's clients are rows of one client stack
(F federations x N_f clients), and one ``local_update`` of a *joint* method object trains every sampled row
of every federation at once. The joint object sees the federations' clients as one list, takes each
federation's step plan (its seed, its shuffles), per-row settings as (K,) tensors, per-federation optimizer
blocks (``optim.RowOptim``) and each row's broadcast; its ``@per_run`` functions run on each federation's
own method object. The result is cut back into federations for the driver.
"""
from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator, Mapping

import numpy as np
import torch

from fedcache.errors import ConfigError
from fedcache.federate.clients import ClientStates
from fedcache.federate.driver import Engine, Round, Run, RunState
from fedcache.federate.inprocess import check_states, client_accuracy
from fedcache.federate.local import recording_losses
from fedcache.federate.methods.base import LocalResult, Method
from fedcache.federate.optim import RowOptim
from fedcache.federate.stacking import Joint, PerRunOnly, RunRows, stacking_of, why_not_stackable
from fedcache.heads import Params


def stack_key(r: Run) -> tuple:
    """What runs must share to stack: everything but what the stack keeps per row, per run or per federation."""
    m, c = r.method, r.method.ctx
    varying = stacking_of(type(m)).varying
    fixed = {k: v for k, v in dataclasses.asdict(m.p).items() if k not in varying}
    return (type(m), c.head, c.optim.optimizer, c.local_epochs, c.batch_size, c.rounds, r.schedule.rounds,
            r.schedule.eval_every, repr(sorted(fixed.items())))


def why_alone(r: Run) -> str:
    """Empty when the run can join a stack; else the reason, as the grid reports it."""
    return why_not_stackable(type(r.method), r.method.p)


class Stacked(Engine):
    """F federations' client states, stacked, and the joint method object that trains them together."""

    def __init__(self, runs: list[Run]) -> None:
        if not runs:
            raise ValueError("a stack needs at least one run")
        reasons = {why_alone(r) for r in runs} - {""}
        if reasons or len({stack_key(r) for r in runs}) > 1:
            raise ConfigError("these runs cannot train stacked: " + ("; ".join(sorted(reasons)) or
                              "they differ in method, head, optimizer kind, round schedule or a setting that is not per row"))
        _check_same_tables(runs)
        self.methods = [r.method for r in runs]
        sizes = [m.ctx.data.n_clients for m in self.methods]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        self.declared = stacking_of(type(self.methods[0]))
        self.joint = _joint_method(self.methods)
        self.widest: dict[str, list[int]] = {}
        self.row_values = {n: torch.tensor([getattr(m.p, n) for m in self.methods for _ in range(m.ctx.data.n_clients)],
                                           dtype=torch.float32) for n in self.declared.per_row}

    def init_clients(self, runs) -> list[ClientStates]:
        return [ClientStates.of(m) for m in self.methods]

    def start(self, states: list[RunState]) -> None:
        """The widest shape of each state entry over the runs (fresh or resumed): a round's rows are padded to it."""
        shapes = [{n: s.clients.shape(n) for n in s.clients} for s in states]
        self.widest = {n: [max(dims) for dims in zip(*(sh[n] for sh in shapes))] for n in shapes[0]}

    def _padded(self, name: str, t: torch.Tensor, widest: list[int]) -> torch.Tensor:
        if list(t.shape[1:]) == widest:
            return t
        if name not in self.declared.padded_states:
            raise ConfigError(f"{self.joint.name}'s client state {name!r} differs in shape between the runs, which the "
                              "method does not declare (padded_states): these runs cannot train stacked")
        return zero_padded(t, widest)

    def round(self, states: list[RunState], rnd: int, picks: list[list[int]], downs: list[Params]) -> list[Round]:
        rows = [self.offsets[i] + k for i, pick in enumerate(picks) for k in pick]
        self._select(rows, picks, downs)
        given = self._taken(states, picks)
        with recording_losses() as losses:
            result = self.joint.local_update(rnd, rows, RowBroadcast(self.joint.name, downs, picks), given)
        check_states(self.joint, given, result.states)
        losses = _checked(losses, len(rows))
        out = list(_per_federation(result, losses, picks))
        for s, got in zip(states, out):  # before the metrics lines: evaluation reads the clients' new states
            if got.clients:
                s.clients.put(got.clients, {n: t[(slice(None), *(slice(0, d) for d in s.clients.shape(n)))]
                                            for n, t in got.result.states.items()})
        return out

    def _taken(self, states: list[RunState], picks: list[list[int]]) -> Params:
        """The sampled clients' states, run after run, each entry padded to the widest run's shape."""
        parts = [s.clients.take(pick) for s, pick in zip(states, picks) if pick]
        return {n: torch.cat([self._padded(n, p[n], w) for p in parts]) for n, w in self.widest.items()}

    def _select(self, rows: list[int], picks: list[list[int]], downs: list[Params]) -> None:
        """Point the joint method's settings, optimizer and runs at these rows for one ``local_update``."""
        j, first = self.joint, self.methods[0]
        idx = torch.tensor(rows, dtype=torch.long)
        fields = {f.name: getattr(first.p, f.name) for f in dataclasses.fields(first.p)}
        fields.update({n: PerRunOnly(j.name, n) for n in self.declared.per_run})
        j.p = types.SimpleNamespace(**{**fields, **{n: v[idx] for n, v in self.row_values.items()}})
        runs = [(i, pick) for i, pick in enumerate(picks) if pick]
        j.ctx.optim = RowOptim(tuple((len(pick), self.methods[i].ctx.optim) for i, pick in runs))
        bounds = np.cumsum([0, *(len(pick) for _, pick in runs)]).tolist()
        j.cohort = [RunRows(self.methods[i], pick, slice(a, b), downs[i], len(rows))
                    for (i, pick), a, b in zip(runs, bounds[:-1], bounds[1:])]

    def evaluate(self, i: int, state: RunState, glob: torch.Tensor | None) -> dict:
        return client_accuracy(self.methods[i], state, glob)


def _per_federation(result: LocalResult, losses: list[torch.Tensor], picks: list[list[int]]) -> Iterator[Round]:
    at = 0
    for pick in picks:
        part = slice(at, at + len(pick))
        at += len(pick)
        mine = LocalResult({n: t[part] for n, t in result.states.items()}, {n: t[part] for n, t in result.uploads.items()},
                           result.weights[part])
        yield Round(pick, mine, [loss[part] for loss in losses])


class RowBroadcast(Mapping):
    """The federations' broadcasts row by row, as the joint ``local_update`` reads them: an entry is each
    federation's (leading axis 1) repeated for its sampled rows, built when first read. An entry whose shape
    differs between the federations (FedPCL's sets of the clients of its run that have sent one) has no row form: the method
    reads it in its ``@per_run`` functions, where ``down`` is the run's own broadcast."""

    def __init__(self, method: str, downs: list[Params], picks: list[list[int]]) -> None:
        self.method, self.parts = method, [(d, len(p)) for d, p in zip(downs, picks) if p]
        self.names, self.cache = list(downs[0]), {}
        for d in downs:
            bad = [n for n, t in d.items() if t.shape[0] != 1]
            if bad:
                raise ValueError(f"a stacked method broadcasts tensors with a leading axis of 1; {', '.join(bad)} has not")

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.cache:
            parts = [(d[name], k) for d, k in self.parts]
            if len({t.shape for t, _ in parts}) > 1:
                raise ConfigError(f"{self.method}'s broadcast {name!r} differs in shape between the stacked runs: read it in "
                                  "a @per_run function (federate/stacking.py), where down is the run's own")
            self.cache[name] = torch.cat([t.expand(k, *t.shape[1:]) for t, k in parts])
        return self.cache[name]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _checked(losses: list[torch.Tensor], rows: int) -> list[torch.Tensor]:
    if any(len(loss) != rows for loss in losses):
        raise ValueError("a stacked method's local training must train every sampled row in each call")
    return losses


def _check_same_tables(runs: list[Run]) -> None:
    first = runs[0].method.ctx.data
    for r in runs[1:]:
        d = r.method.ctx.data
        for name in ("x_train", "y_train", "x_test", "y_test"):
            a, b = getattr(first, name), getattr(d, name)
            if a.shape != b.shape or (a.data_ptr() != b.data_ptr() and not torch.equal(a, b)):
                raise ConfigError(f"runs on different data tables ({name}) cannot train stacked")


_JOINT: dict[type, type] = {}


def _joint_method(methods: list[Method]) -> Method:
    """An object of the runs' method class over every run's clients: its data lists them all (run after run)
    and its step plans and ``@per_run`` functions are each run's own (``stacking.Joint``)."""
    first = methods[0]
    cls = type(first)
    if cls not in _JOINT:
        _JOINT[cls] = type(f"Stacked{cls.__name__}", (Joint, cls), {"__module__": __name__})
    data = dataclasses.replace(first.ctx.data, client_train=[r for m in methods for r in m.ctx.data.client_train],
                               client_test=[r for m in methods for r in m.ctx.data.client_test])
    return _JOINT[cls](dataclasses.replace(first.ctx, data=data), first.p)


def zero_padded(t: torch.Tensor, widest: list[int]) -> torch.Tensor:
    """``t`` with its axes after the first zero-padded at their ends to ``widest``."""
    if list(t.shape[1:]) == widest:
        return t
    out = t.new_zeros(t.shape[0], *widest)
    out[(slice(None), *(slice(0, d) for d in t.shape[1:]))] = t
    return out
