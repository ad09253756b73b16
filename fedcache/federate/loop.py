"""The in-process engine: every client in this process, their personal states stacked in the run state,
local updates batched (or one client at a time); ``run`` is the round driver with this engine."""
from __future__ import annotations

import numpy as np
import torch

from fedcache.errors import FedcacheError
from fedcache.federate.checkpoints import CHECKPOINT, METRICS  # noqa: F401  (re-exported: where runs write)
from fedcache.federate.divergence import DivergedError  # noqa: F401  (re-exported)
from fedcache.federate import driver
from fedcache.federate.driver import (Engine, Round, RoundCallback, RunConfig, RunResult, RunState, global_accuracy,
                                      global_logits, run_summary, sample_clients, settle, train_loss)  # noqa: F401
from fedcache.federate.local import recording_losses
from fedcache.federate.methods.base import LocalResult, Method
from fedcache.heads import Params


def run(method: Method, cfg: RunConfig, on_round: RoundCallback | None = None, facts: dict | None = None) -> RunResult:
    return driver.run(method, cfg, InProcess(method, cfg.batched), on_round, facts)


class InProcess(Engine):
    def __init__(self, method: Method, batched: bool = True) -> None:
        self.method, self.batched = method, batched

    def init_clients(self) -> Params:
        return self.method.init_clients(self.method.ctx.data.n_clients)

    def round(self, state: RunState, rnd: int, clients: list[int], down: Params) -> Round:
        with recording_losses() as losses:
            result = _local(self.method, self.batched, rnd, clients, down, _gather(state.clients, clients))
        check_states(self.method, state.clients, result.states)
        _scatter(state.clients, result.states, clients)
        return Round(clients, result, losses)

    def evaluate(self, state: RunState, glob: torch.Tensor | None) -> dict:
        return client_accuracy(self.method, state, glob)


def _local(method: Method, batched: bool, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
    if batched or not method.splittable:
        return method.local_update(rnd, clients, down, states)
    parts = [method.local_update(rnd, [k], down, _gather(states, [i])) for i, k in enumerate(clients)]
    cat = lambda dicts: {n: torch.cat([d[n] for d in dicts]) for n in dicts[0]} if dicts and dicts[0] else {}
    return LocalResult(cat([p.states for p in parts]), cat([p.uploads for p in parts]), torch.cat([p.weights for p in parts]))


# Gather and scatter behave the same whatever --fraction is: a method gets its clients' states and
# returns all of them (check_states), and what it returns is what the store holds after the round.
# Only where the bytes go differs: when every client trains, the stored tensors themselves are handed
# over (local training updates weights in place, and _scatter copies only the tensors a method
# replaced, such as the BatchNorm statistics a head returns); a subset gets copies, written back.
# Copying every round too cost 1.05x (fedproto) and 1.10x (solo) the time of a 10-client mlp-head run
# (interleaved A/B, 6 runs each, one thread).
def _gather(stacked: Params, idx: list[int]) -> Params:
    if stacked and idx == list(range(len(next(iter(stacked.values()))))):
        return dict(stacked)
    return {n: t[idx] for n, t in stacked.items()}


def check_states(method: Method, stacked: Params, returned: Params) -> None:
    """A method returns its clients' whole personal state: a state it kept only by updating the given
    tensors in place would survive a round of every client but be lost with --fraction < 1."""
    if set(returned) != set(stacked):
        raise FedcacheError(f"{method.name}.local_update returned states {sorted(returned)} for clients whose state is "
                            f"{sorted(stacked)}: a method returns every entry of the personal state it is given (and only those)")


def _scatter(stacked: Params, part: Params, idx: list[int]) -> None:
    for n, t in part.items():
        if not _same_memory(stacked[n], t):
            stacked[n][idx] = t


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


# ---- evaluation -----------------------------------------------------------------------
EVAL_CHUNK = 16  # clients per batched evaluation, to bound the (K, T, D) gather


def evaluate(method: Method, state: RunState) -> dict:
    """The accuracy fields of a metrics line, as the driver writes them for this engine."""
    glob = global_logits(method, state.server)
    return {**client_accuracy(method, state, glob), **global_accuracy(method, glob)}


def client_accuracy(method: Method, state: RunState, glob: torch.Tensor | None) -> dict:
    d = method.ctx.data
    with torch.no_grad():
        if method.personalized:
            per_client = _personal_accuracy(method, state)
        else:
            correct = (glob.argmax(1) == d.y_test).numpy()
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
    acc = []
    for start in range(0, d.n_clients, EVAL_CHUNK):
        clients = list(range(start, min(d.n_clients, start + EVAL_CHUNK)))
        x, y, mask = d.rows_of("test", clients)
        states = {n: t[clients[0] : clients[-1] + 1] for n, t in state.clients.items()}  # views: read only
        logits = method.client_logits(state.server, states, clients, x)
        hit = (logits.argmax(-1) == y) & mask
        acc.extend((100.0 * hit.sum(1) / mask.sum(1)).tolist())
    return np.array(acc)
