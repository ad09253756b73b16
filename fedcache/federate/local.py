"""Local training of K clients at once: one batched step serves every client.

Each client keeps its own shuffling (seeded by run seed, round, client and epoch), its own
number of steps and its own optimizer state; shorter clients are masked out of later steps.
Running the same code with K = 1 per client (the loop path) gives the same numbers.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import numpy as np
import torch

from fedcache.federate.optim import OptimConfig, StackedOptimizer
from fedcache.store import mapping

Params = dict[str, torch.Tensor]
# loss(params, xb (K,B,D), yb (K,B), mask (K,B), step_info) -> per-client mean loss (K,), or that and the
# new buffers (BatchNorm running statistics) its training forward passes returned (heads.train_forward)
LossFn = Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor, dict], "torch.Tensor | tuple[torch.Tensor, Params]"]


def split_loss(out: "torch.Tensor | tuple[torch.Tensor, Params]") -> tuple[torch.Tensor, Params]:
    """A loss function's (per-client loss, new buffers)."""
    return out if isinstance(out, tuple) else (out, {})


def here(array: np.ndarray) -> torch.Tensor:
    """A host array as a tensor where the run's tensors are (``torch.get_default_device()``: a GPU's in a run on
    one, set by ``training``; the CPU otherwise)."""
    return torch.from_numpy(array).to(torch.get_default_device())


def rng_for(seed: int, *path: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *path]))


def step_plan(rows: list[np.ndarray], batch_size: int, epochs: int, seed: int, rnd: int, clients: list[int],
              first_epoch: int = 0) -> np.ndarray:
    """(K, S, B) row indices, -1 for padding: client k's epochs of shuffled mini-batches. Epochs are
    numbered from ``first_epoch``, so a round's later training phase gets shuffles of its own."""
    plans = []
    for k, r in zip(clients, rows):
        steps = []
        for e in range(first_epoch, first_epoch + epochs):
            perm = r[rng_for(seed, rnd, k, e, 1).permutation(len(r))]
            pad = (-len(perm)) % batch_size
            steps.append(np.concatenate([perm, np.full(pad, -1, np.int64)]).reshape(-1, batch_size))
        plans.append(np.concatenate(steps) if steps else np.zeros((0, batch_size), np.int64))
    s_max = max((len(p) for p in plans), default=0)
    out = np.full((len(plans), s_max, batch_size), -1, np.int64)
    for i, p in enumerate(plans):
        out[i, : len(p)] = p
    return out


def train(
    params: Params, trainable: tuple[str, ...], loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor,
    plan: np.ndarray, opt: OptimConfig, extra: dict | None = None,
) -> Params:
    """Run every step of ``plan``; returns the updated parameters (buffers updated too)."""
    params = dict(params)
    optimizer = StackedOptimizer(params, opt, trainable)
    x, y, plan = working_set(x, y, plan)
    plan_t = torch.from_numpy(plan).to(x.device)
    # Index arithmetic for every step at once: per step it cost as much as a small head's matmuls.
    # Every step is the plan's full width, padding included: a row's arithmetic then never depends on the
    # other rows of the step, so a run stacked with runs of other partitions computes its own run's numbers.
    rows, real = plan_t.clamp_min(0), plan_t >= 0
    active_steps = real.any(2)
    loss_sum, loss_steps = torch.zeros(plan.shape[0], device=x.device), torch.zeros(plan.shape[0], device=x.device)
    for s in range(plan.shape[1]):
        idx, mask, active = rows[:, s], real[:, s], active_steps[:, s]
        xb, yb = x[idx], y[idx]
        leaves = {n: params[n].detach().requires_grad_(True) for n in trainable}
        p = {**params, **leaves}
        loss, buffers = split_loss(loss_fn(p, xb, yb, mask, {"step": s, **(extra or {})}))
        grads = torch.autograd.grad(loss.sum(), list(leaves.values()), allow_unused=True)
        grads = {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(leaves, grads)}
        loss_sum += torch.where(active, loss.detach().float(), 0.0)
        loss_steps += active
        params.update({n: t.detach() for n, t in buffers.items()})
        params.update({n: t.detach() for n, t in leaves.items()})
        optimizer.step(params, grads, active)
    sink = _LOSSES.get()
    if sink is not None:
        sink.append(loss_sum / loss_steps.clamp_min(1))
    return params


# Above this share of a mapped table's rows, local training reads it through the mapping: its own copy would cost
# more (a copy per call, one per grid worker) than the page-cache pages the mapping shares.
WORKING_SET_SHARE = 0.25


def mapped_array(x: torch.Tensor) -> np.ndarray | None:
    """The array over a memory-mapped store file that ``x`` is a view of (``store.mapping``), else None."""
    if x.device.type != "cpu" or not x.is_contiguous() or not mapping.holds(x.data_ptr(), x.nbytes):
        return None
    return x.numpy()


def gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[idx]`` for an integer index tensor; from a store file's mapping, read so that the file does not
    stay mapped."""
    array = mapped_array(x)
    if array is None or idx.dtype not in (torch.int64, torch.int32):
        return x[idx]
    used, where = torch.unique(idx.cpu(), return_inverse=True)
    return torch.from_numpy(mapping.gather(array, used.numpy()))[where]


def working_set(x: torch.Tensor, y: torch.Tensor, plan: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The rows ``plan`` reads, copied out of ``x`` when ``x`` is a memory-mapped store file and they are a
    small share of it, and the plan renumbered to them; otherwise the arguments as given. Reading the steps'
    rows through the mapping would leave every folio of the file mapped (``store.mapping``)."""
    array = mapped_array(x)
    if array is None:
        return x, y, plan
    used = np.unique(plan[plan >= 0])
    if (plan < 0).any() and (not len(used) or used[0] != 0):
        used = np.insert(used, 0, 0)  # padding reads row 0 (train clamps -1 to 0), and so it still does
    if len(used) > WORKING_SET_SHARE * len(array):
        return x, y, plan
    local = np.where(plan >= 0, np.searchsorted(used, plan), -1)
    return torch.from_numpy(mapping.gather(array, used)), y[torch.from_numpy(used)], local


# Scoped to the round driver's `recording_losses()` block (a context variable, not process state): every
# method's local training goes through `train`, so the driver gets the training loss without each method
# having to return it.
_LOSSES: ContextVar[list[torch.Tensor] | None] = ContextVar("fedcache_train_losses", default=None)


@contextmanager
def recording_losses() -> Iterator[list[torch.Tensor]]:
    """Collect, per call of `train` inside the block, each client's mean loss over its local steps."""
    sink: list[torch.Tensor] = []
    token = _LOSSES.set(sink)
    try:
        yield sink
    finally:
        _LOSSES.reset(token)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-client mean over real rows: (K, B) -> (K,)."""
    m = mask.to(values.dtype)
    return (values * m).sum(1) / m.sum(1).clamp_min(1.0)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    return masked_mean(ce, mask)
