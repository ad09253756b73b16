"""What a method declares so that several of its runs (grid cells) can train as one stack.

The stacked engine (``federate/stacked.py``) trains F runs of one method together: one ``local_update`` of a
*joint* method object covers every sampled client of every run, so one batched step serves them all. A
method opts in with one decorator on its class, and its file otherwise reads as its algorithm:

- ``@stackable(per_row=..., per_run=..., padded_states=..., memory=..., refuse=...)`` on the class says which
  settings may differ between the runs of a stack and how the joint object sees them: a ``per_row`` setting
  arrives as a (K,) float32 tensor, one value per client row; a ``per_run`` setting is read only inside
  ``@per_run`` functions, where it is the run's own value. ``padded_states`` are client-state entries whose
  trailing axes depend on the run's partition (zero-padded to the widest run).
  ``memory(params, rows, clients, dim, n_classes, batch)`` estimates the bytes a run holds in a stack beyond its
  heads and mini-batches (``batch``: the mini-batch size); ``refuse`` says why runs with given settings cannot
  stack. The declaration is the class's own: a subclass changes what ``local_update`` computes, so it must
  declare again.
- ``@per_run(*rows)`` marks a method function that computes over *one run's* clients (a prototype pass, a
  loss against the run's own prototype sets, a client's random stream). In a run by itself it is a plain
  call. In a stack, the joint object calls it once per run on that run's own method object (its seed,
  partition and settings), with the arguments named in ``rows`` cut to the run's rows, an argument named
  ``clients`` given as the run's own client ids and one named ``down`` as the run's own broadcast; the
  results are joined in row order. So a run's numbers there are those of its run alone.

The joint object reads a client's rows, mini-batches and settings only through ``client_rows``, ``plan``,
``sample_counts``, ``self.p`` and ``ctx.optim``, a broadcast row by row, and client states row by row. Each
declaration has an equality test (tests/federate/test_stacked.py): a stack computes what its runs compute
one by one, bit for bit.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedcache.errors import ConfigError
from fedcache.wording import named


@dataclass(frozen=True)
class Stacking:
    per_row: tuple[str, ...] = ()
    per_run: tuple[str, ...] = ()
    padded_states: tuple[str, ...] = ()
    memory: Callable[..., int] = lambda params, rows, clients, dim, n_classes, batch: 0
    refuse: Callable[[Any], str] = lambda params: ""

    @property
    def varying(self) -> tuple[str, ...]:
        """Settings the runs of one stack may differ in."""
        return self.per_row + self.per_run


_DECLARED: dict[type, Stacking] = {}


def stackable(per_row: tuple[str, ...] = (), per_run: tuple[str, ...] = (), padded_states: tuple[str, ...] = (),
              memory: Callable[..., int] | None = None, refuse: Callable[[Any], str] | None = None) -> Callable[[type], type]:
    """Class decorator: runs of this method may train stacked (see the module docstring)."""
    def declare(cls: type) -> type:
        known = {f for f in getattr(cls.Settings, "__dataclass_fields__", {})}
        unknown = sorted(set(per_row + per_run) - known)
        if unknown:
            raise TypeError(f"{cls.__qualname__} declares stacked settings {unknown} that its Settings lack")
        _DECLARED[cls] = Stacking(per_row, per_run, padded_states, memory or Stacking.memory,
                                  refuse or Stacking.refuse)
        return cls
    return declare


def stacking_of(cls: type) -> Stacking | None:
    """The class's own declaration (never its parent's), or None if its runs cannot stack."""
    return _DECLARED.get(cls)


def why_not_stackable(cls: type, params: Any) -> str:
    """Empty when runs of ``cls`` with ``params`` can join a stack; else the reason."""
    declared = stacking_of(cls)
    if declared is None:
        return f"{cls.name} does not declare that its runs can train stacked"
    return declared.refuse(params)


# ---- functions computed run by run -------------------------------------------------------------
def per_run(*rows: str, combine: Callable[[list], Any] | None = None) -> Callable:
    """Decorator of a method function computed over one run's clients (see the module docstring).

    ``rows``: the arguments with a leading client-row axis (tensors, dicts of tensors, lists). ``combine``
    joins the runs' results (default: concatenated along the row axis, element by element for tuples and
    dicts); ``same`` for a fact every run of a stack must share."""
    def decorate(fn: Callable) -> Callable:
        names = list(inspect.signature(fn).parameters)[1:]
        unknown = set(rows) - set(names)
        if unknown:
            raise TypeError(f"per_run({', '.join(sorted(unknown))}): {fn.__qualname__} has no such argument")

        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            bound = dict(zip(names, args), **kwargs)
            if not isinstance(self, Joint):
                # Row arguments are slices here too: autograd then hands back a gradient of the same layout as in
                # a stack, and the layout decides which kernels the backward pass takes (and how they round).
                return fn(self, **{n: _whole(v) if n in rows else v for n, v in bound.items()})
            outs = [fn(run.method, **run.arguments(bound, rows)) for run in self.cohort]
            return (combine or join)(outs)

        return call

    return decorate


def _whole(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v[0: len(v)] for k, v in value.items()}
    return value[0: len(value)]


def join(outs: list) -> Any:
    """The runs' results in row order: tensors and lists concatenated, tuples and dicts element by element."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outs)
    if isinstance(first, tuple):
        return tuple(join([o[i] for o in outs]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: join([o[k] for o in outs]) for k in first}
    if isinstance(first, list):
        return [x for o in outs for x in o]
    raise TypeError(f"a per_run function returned {type(first).__name__}; give it a combine= to join the runs' results")


def same(outs: list) -> Any:
    """The value every run computed; a stack whose runs disagree cannot train their rows as one."""
    if any(o != outs[0] for o in outs[1:]):
        processes = named("--engine processes", "engine='processes'")
        raise ConfigError(f"the stacked runs disagree on a fact their rows must share this round ({outs}): "
                          f"run the grid with {processes}")
    return outs[0]


@dataclass
class RunRows:
    """One run's share of a joint call: its method object, its own client ids and its rows in the stack's order."""

    method: Any
    clients: list[int]
    rows: slice
    down: dict
    total: int  # rows of the whole call

    def arguments(self, bound: dict, rows: tuple[str, ...]) -> dict:
        return {n: self._cut(n, v, n in rows) for n, v in bound.items()}

    def _cut(self, name: str, value: Any, per_row: bool) -> Any:
        if name == "clients":
            return self.clients
        if name == "down":
            return self.down
        if not per_row:
            return value
        if isinstance(value, dict):
            return {k: self._rows_of(f"{name}[{k!r}]", v) for k, v in value.items()}
        return self._rows_of(name, value)

    def _rows_of(self, name: str, value: Any) -> Any:
        if len(value) != self.total:
            raise ValueError(f"per_run argument {name} has {len(value)} rows, the call {self.total}: a per_run "
                             "function takes every client row of the call")
        return value[self.rows]


class Joint:
    """Mixin of the stacked engine's joint method object: ``cohort`` is the current call's runs, in row order;
    a row's mini-batches are those of its own run (its seed, its client id)."""

    cohort: list[RunRows]

    def plan(self, rnd: int, clients: list[int], epochs: int | None = None, first_epoch: int = 0):
        import numpy as np

        plans = [run.method.plan(rnd, run.clients, epochs, first_epoch) for run in self.cohort]
        steps, width = max(p.shape[1] for p in plans), plans[0].shape[2]
        out = np.full((sum(len(p) for p in plans), steps, width), -1, np.int64)
        at = 0
        for p in plans:
            out[at: at + len(p), : p.shape[1]] = p
            at += len(p)
        return out


class PerRunOnly:
    """What a joint object's ``p`` holds for a per_run setting: readable only inside a ``@per_run`` function,
    where it is the run's own value. Any use elsewhere (arithmetic, comparison, truth) is an error rather
    than the first run's value applied to every run."""

    def __init__(self, method: str, name: str) -> None:
        self._where = f"{method}'s setting {name!r}"

    def _refuse(self, *_: Any) -> Any:
        raise TypeError(f"{self._where} differs between stacked runs and is read only in @per_run functions "
                        "(federate/stacking.py); read it there, or declare it per_row")

    __bool__ = __float__ = __int__ = __index__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __pow__ = __rpow__ = __neg__ = __hash__ = _refuse

    def __repr__(self) -> str:
        return f"<{self._where}, per run>"
