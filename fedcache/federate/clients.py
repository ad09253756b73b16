"""Every client's personal state, held row by row for the clients that have one of their own.

A method with personal state gives each of a run's N clients a state, read and written as if stacked (leading
axis N). With thousands of clients and a round sampling a few, most clients never train, and their state is
the method's initial one. Where the method can make one client's initial state without the others'
(``Method.initial_states``: a copy of the initial global model, zeros, the client's own zero-shot labels, its
row of every client's random heads drawn from one stream: heads/draws.py), ``ClientStates`` keeps rows only for
the clients a round has written and makes the others' when read; else (``init_clients`` alone can make them) it
holds every client's from the start. Either way a checkpoint keeps only the clients a round has trained, and ``restore`` puts them
back over the initial state of the rest.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from fedcache.heads import Params


class ClientStates(Mapping):
    """Name -> the state of every client as an (N, ...) tensor, made when read (``take`` reads some clients): for
    reading; ``put`` writes (``dict(states)`` is a copy to change)."""

    def __init__(self, n: int, initial: Callable[[list[int]], Params] | None, held: Params) -> None:
        """``initial``: the initial state of some clients (None: ``held`` is every client's, N rows); ``held``:
        the rows held from the start, whose names, shapes and dtypes every client's state has."""
        self.n, self._initial = n, initial
        self.names = tuple(held)
        self.rows: Params = dict(held) if initial is None else {k: t[:0] for k, t in held.items()}
        self.slot = np.arange(n) if initial is None else np.full(n, -1, np.int64)  # row of each client, -1: none yet
        self.used = n if initial is None else 0
        self.trained = np.zeros(n, bool)  # clients some round has written
        # Where a never-written client's state is made: the run's device, whatever the default device is when the
        # state is read (a result read after a GPU run).
        self.device = next(iter(held.values())).device if held else torch.device("cpu")

    @classmethod
    def of(cls, method, n: int | None = None) -> "ClientStates":
        """The initial state of ``n`` clients (default: the run's) of ``method``, held sparsely where it can be."""
        n = method.ctx.data.n_clients if n is None else n
        # initial_states makes the run's clients' states (a head drawn for every client depends on their number):
        # another number of clients takes init_clients'.
        one = method.initial_states([0]) if n and n == method.ctx.data.n_clients else None
        if not one:  # None: every client's at once; {}: no personal state
            return cls(n, None, method.init_clients(n))
        return cls(n, method.initial_states, one)

    # ---- reading ------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        """Every client's ``name``, (N, ...): the whole state made for this one read."""
        if name not in self.names:
            raise KeyError(name)
        return self.take(range(self.n), (name,))[name]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __reduce__(self):
        # Pickled, it would carry the method it makes initial states with, and the data behind it.
        raise TypeError("client states are not saved as they are: save dict(states), every client's state by name")

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def shape(self, name: str) -> tuple[int, ...]:
        """A client's ``name`` (the trailing axes)."""
        return tuple(self.rows[name].shape[1:])

    def take(self, clients: Sequence[int], names: Sequence[str] | None = None) -> Params:
        """The clients' states, (K, ...) in their order; when every client is asked for in order and all are held,
        the held tensors themselves (a run of every client trains them in place)."""
        idx = np.asarray(clients, dtype=np.int64)
        names = self.names if names is None else names
        if self._all_held_in_order(idx):
            return {k: self.rows[k] for k in names}
        slots = self.slot[idx]
        held = slots >= 0
        if held.all():
            return {k: self.rows[k][torch.from_numpy(slots)] for k in names}
        fresh = {k: t.to(self.device) for k, t in self._initial(idx[~held].tolist()).items()}
        if not held.any():
            return {k: fresh[k] for k in names}
        out = {}
        for k in names:
            part = fresh[k]
            out[k] = part.new_empty((len(idx), *part.shape[1:]))
            out[k][torch.from_numpy(np.flatnonzero(~held))] = part
            out[k][torch.from_numpy(np.flatnonzero(held))] = self.rows[k][torch.from_numpy(slots[held])]
        return out

    def _all_held_in_order(self, idx: np.ndarray) -> bool:
        return (len(idx) == self.n == self.used and len(next(iter(self.rows.values()), ())) == self.n
                and bool((idx == np.arange(self.n)).all()) and bool((self.slot == idx).all()))

    # ---- writing ------------------------------------------------------------------------------
    def put(self, clients: Sequence[int], states: Params) -> None:
        """The clients' new states (K, ...), as a round leaves them."""
        idx = np.asarray(clients, dtype=np.int64)
        if len(np.unique(idx)) != len(idx):
            raise ValueError("put: a client appears twice among the clients written at once")
        self.trained[idx] = True
        new = idx[self.slot[idx] < 0]
        if len(new):
            self._make_room(len(new), states)
            self.slot[new] = np.arange(self.used, self.used + len(new))
            self.used += len(new)
        if self._all_held_in_order(idx):
            for k, t in states.items():
                if not _same_memory(self.rows[k], t):
                    self.rows[k].copy_(t)
            return
        at = torch.from_numpy(self.slot[idx])
        for k, t in states.items():
            self.rows[k][at] = t

    def _make_room(self, more: int, like: Params) -> None:
        have = len(next(iter(self.rows.values())))
        if self.used + more <= have:
            return
        size = min(self.n, max(self.used + more, 2 * have, 16))  # doubling: a row is copied O(1) times on average
        for k, t in self.rows.items():
            grown = like[k].new_empty((size, *t.shape[1:]), dtype=t.dtype)
            grown[: self.used] = t[: self.used]
            self.rows[k] = grown

    # ---- checkpoints ------------------------------------------------------------------------------
    def checkpoint(self) -> dict:
        """The trained clients' states and their ids (``client_ids``); every other client's is its initial one."""
        if not self.names:
            return {"clients": {}}
        ids = np.flatnonzero(self.trained)
        return {"clients": self.take(ids), "client_ids": torch.from_numpy(ids)}

    def restore(self, rows: Params, ids: torch.Tensor | None) -> "ClientStates":
        """Put a checkpoint's rows back (``ids`` None: a checkpoint of fedcache before them, every client's)."""
        ids = torch.arange(self.n) if ids is None else ids
        if len(ids):
            self.put(ids.cpu().tolist(), rows)
        return self


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
