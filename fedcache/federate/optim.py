"""SGD and Adam over stacked (K, ...) parameters, with a per-client *active* mask.

Clients hold different amounts of data, so in a batched step some clients have already
finished their epoch; for them the step must be an exact no-op (no weight decay, no
momentum, no Adam time step). torch.optim cannot express that, hence these few lines.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch.optim.adam import adam as _torch_adam
from torch.optim.sgd import sgd as _torch_sgd

from fedcache.federate.optim_config import OPTIMIZER_PRESETS, OptimConfig, describe  # noqa: F401  (re-exported)
from fedcache.registry import Registry

Params = dict[str, torch.Tensor]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowOptim:
    """Consecutive blocks of rows with their own settings: (rows, config) in row order, one optimizer kind.

    Several federations trained as one stack (federate/stacked.py) each keep their own learning rate,
    decay, momentum or betas. Each block gets its own call of torch's fused kernel, on views of its rows,
    so a federation's update is the very computation its own run makes (a per-row learning-rate tensor
    would change the kernel's arithmetic)."""

    parts: tuple[tuple[int, OptimConfig], ...]

    def __post_init__(self) -> None:
        if len({c.optimizer for _, c in self.parts}) > 1:
            raise ValueError("one stack trains with one optimizer kind (sgd or adam)")

    @property
    def optimizer(self) -> str:
        return self.parts[0][1].optimizer


class StackedOptimizer:
    def __init__(self, params: Params, cfg: OptimConfig | RowOptim, keys: tuple[str, ...] | None = None) -> None:
        self.keys = tuple(keys) if keys is not None else tuple(params)
        k = next(iter(params.values())).shape[0]
        self.parts = cfg.parts if isinstance(cfg, RowOptim) else ((k, cfg),)
        if sum(n for n, _ in self.parts) != k:
            raise ValueError(f"optimizer settings for {sum(n for n, _ in self.parts)} rows, parameters have {k}")
        self.t = torch.zeros(k)  # steps taken so far, per client
        self.shapes = {n: params[n].shape[1:] for n in self.keys}
        # rows of parameters and gradients laid out for the kernels where a client's row is not a whole of LANES
        self.laid = {n: (_row_buffer(params[n]), _row_buffer(params[n])) for n in self.keys if _unaligned(params[n])}
        self.views = {n: tuple(b[:, :self.shapes[n].numel()].view(params[n].shape) for b in bufs) for n, bufs in self.laid.items()}
        self.whole = slice(0, k)
        self.m = {n: _row_buffer(params[n]) for n in self.keys}
        self.v = {n: _row_buffer(params[n]) for n in self.keys} if OPTIMIZERS.get(cfg.optimizer).second_moment else {}

    @torch.no_grad()
    def step(self, params: Params, grads: dict[str, torch.Tensor], active: torch.Tensor) -> None:
        """One step of the active clients; each block of rows (one block unless RowOptim) on its own, so a
        block whose rows are all active is updated in place (views), as a single run's would be."""
        _check_grads(params, grads, self.keys)
        start = 0
        for rows, cfg in self.parts:
            block = slice(start, start + rows)
            start += rows
            live = active[block]
            if rows == 0:  # a stack (or a federation of a stack) of no clients: all() of nothing is True
                continue
            if bool(live.all()):  # the common case
                self._step_rows(cfg, params, grads, block)
            elif bool(live.any()):
                self._step_rows(cfg, params, grads, live.nonzero().squeeze(1) + block.start)
        self.t += active.to(self.t.dtype)

    def _step_rows(self, cfg: OptimConfig, params: Params, grads: Params, rows: slice | torch.Tensor) -> None:
        """Update ``rows`` (a slice: views, updated in place, a padded key's through its buffer and copied back;
        indices: copies, written back)."""
        ps = [self._rows(n, params[n], rows, 0) for n in self.keys]
        ms = [self.m[n][rows] for n in self.keys]
        vs = [self.v[n][rows] for n in self.keys] if self.v else []
        self._apply_block(cfg, ps, [self._rows(n, grads[n], rows, 1) for n in self.keys], self.t[rows], ms, vs)
        for n, p in zip(self.keys, ps):
            if n in self.laid and isinstance(rows, slice):
                self._of(params[n], rows).copy_(self._of(self.views[n][0], rows))
            elif n in self.laid:
                params[n][rows] = p[:, :self.shapes[n].numel()].view(len(p), *self.shapes[n])
            elif not isinstance(rows, slice):
                params[n][rows] = p
        if isinstance(rows, slice):
            return
        for n, m in zip(self.keys, ms):
            self.m[n][rows] = m
        for n, v in zip(self.keys, vs):
            self.v[n][rows] = v

    def _rows(self, n: str, t: torch.Tensor, rows: slice | torch.Tensor, which: int) -> torch.Tensor:
        """``t[rows]`` as the kernels get it: as it is, or copied into rows of whole LANES (``which``: the buffer
        of parameters, 0, or of gradients, 1)."""
        if n not in self.laid:
            return t[rows]
        if isinstance(rows, slice):  # every step of a pass but those where some clients have finished it
            self._of(self.views[n][which], rows).copy_(self._of(t, rows))
            return self._of(self.laid[n][which], rows)
        out = self.laid[n][which][rows]
        out[:, :self.shapes[n].numel()] = t[rows].reshape(len(out), -1)
        return out

    def _of(self, t: torch.Tensor, rows: slice) -> torch.Tensor:
        return t if rows == self.whole else t[rows]  # a slice of every row costs more than the copy of a bias

    def _apply_block(self, cfg: OptimConfig, ps: list, gs: list, t: torch.Tensor, ms: list, vs: list) -> None:
        if bool((t == t[0]).all()):
            # Clients only ever drop out of a local pass, so active clients share one step count and
            # torch's fused kernels (an order of magnitude faster than elementwise Python) apply.
            _fused(cfg, ps, gs, ms, vs, float(t[0]))
            return
        rule = OPTIMIZERS.get(cfg.optimizer)
        for p, g, m, v in zip(ps, gs, ms, vs or [None] * len(ps)):  # general case: per-client step counts
            g = g.add(p, alpha=cfg.weight_decay) if cfg.weight_decay else g  # L2 decay in the gradient, as torch.optim does
            rule.update(cfg, p, g, m, v, t + 1)


def _check_grads(params: Params, grads: dict[str, torch.Tensor], keys: tuple[str, ...]) -> None:
    """A gradient unlike its parameter is a method's mistake, which the kernels broadcast without a word (and a
    padded row's copy casts: an unpadded key's kernel raises on another dtype)."""
    for n in keys:
        p, g = params[n], grads[n]
        if g.shape != p.shape or g.dtype != p.dtype:
            raise ValueError(f"the gradient of {n!r} is {tuple(g.shape)} {g.dtype}; its parameter is "
                             f"{tuple(p.shape)} {p.dtype}")


# torch's fused kernels compute a vector's width of elements at a time and a tensor's last numel % width elements
# one by one, which rounds otherwise (a fused multiply-add, or not). Stacked, a client's last elements are its
# neighbour's vector mates; alone (--no-batch, a Flower client) they are its tail: a client's update depended on the
# clients stacked with it (fedproto, batched and --no-batch: 1.2 points apart on a client after 6 rounds). A
# client's row of any other size than a whole of LANES (a bias of 10 classes) goes to the kernel padded to one, so
# each of its elements is a vector's, stacked or alone; the padding stays zero (zero gradient, parameter, moments).
LANES = 64


def _unaligned(p: torch.Tensor) -> bool:
    return p.shape[1:].numel() % LANES != 0


def _row_buffer(p: torch.Tensor) -> torch.Tensor:
    """Zeros for (K, ...) ``p``: like it, or (K, its row's size rounded up to a whole of LANES)."""
    if not _unaligned(p):
        return torch.zeros_like(p)
    return p.new_zeros(len(p), -(-p.shape[1:].numel() // LANES) * LANES)


class SGD:
    """SGD with momentum (torch.optim.SGD's, no dampening or Nesterov)."""

    second_moment = False

    @staticmethod
    def update(c: OptimConfig, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: None, t: torch.Tensor) -> None:
        """One step on (K', ...) tensors with per-row step counts ``t``, in place; ``g`` has the decay in it."""
        if c.momentum:
            g = m.mul_(c.momentum).add_(g)
        p.sub_(g, alpha=c.lr)

    @staticmethod
    def torch_step(c: OptimConfig, ps, gs, ms, vs, steps_done: float, kw: dict) -> None:
        _torch_sgd(ps, gs, ms if c.momentum else [None] * len(ps), weight_decay=c.weight_decay,
                   momentum=c.momentum, lr=c.lr, dampening=0.0, nesterov=False, maximize=False, **kw)


class Adam:
    """Adam with L2 weight decay in the gradient (torch.optim.Adam's, no AMSGrad)."""

    second_moment = True

    @staticmethod
    def update(c: OptimConfig, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> None:
        b1, b2 = c.betas
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        shape = (-1, *([1] * (p.dim() - 1)))
        step = (c.lr / (1 - b1**t)).view(shape)
        denom = (v / (1 - b2**t).view(shape)).sqrt_().add_(c.eps)
        p.sub_(m / denom * step)

    @staticmethod
    def torch_step(c: OptimConfig, ps, gs, ms, vs, steps_done: float, kw: dict) -> None:
        steps = [torch.tensor(steps_done) for _ in ps]  # torch increments these itself
        _torch_adam(ps, gs, ms, vs, [], steps, amsgrad=False, beta1=c.betas[0], beta2=c.betas[1],
                    lr=c.lr, weight_decay=c.weight_decay, eps=c.eps, maximize=False, **kw)


OPTIMIZERS: Registry[type] = Registry("optimizer")  # the names of OptimConfig.optimizer
OPTIMIZERS.add("sgd", SGD)
OPTIMIZERS.add("adam", Adam)


def _fused(cfg: OptimConfig, ps: list, gs: list, ms: list, vs: list, steps_done: float) -> None:
    """One step through torch.optim's functional SGD / Adam, with its fused CPU kernels where this torch
    has them (checked once per process) and its single-tensor loop otherwise."""
    # The fused kernels read a gradient as if laid out like its parameter; the optimizer guarantees that
    # itself rather than trusting every head to hand back contiguous gradients.
    gs = [g.contiguous() for g in gs]
    _torch_step(cfg, ps, gs, ms, vs, steps_done, kernel_options())


@functools.cache
def kernel_options() -> dict:
    """``{"fused": True}`` when this torch runs fused SGD and Adam on CPU tensors, else ``{"foreach": False}``.

    Asked once, by running both on a one-element tensor, instead of catching a failure on every step.
    """
    try:
        for optimizer in OPTIMIZERS.names():
            p, g, m, v = (torch.zeros(1) for _ in range(4))
            momentum = 0.0 if "momentum" in OptimConfig(optimizer).ignored() else 0.9
            _torch_step(OptimConfig(optimizer, 0.1, momentum), [p], [g], [m], [v], 0.0, {"fused": True})
    except (RuntimeError, TypeError):
        log.info("torch %s has no fused CPU optimizer kernels; using the single-tensor loop", torch.__version__)
        return {"foreach": False}
    return {"fused": True}


def _torch_step(cfg: OptimConfig, ps, gs, ms, vs, steps_done: float, kw: dict) -> None:
    OPTIMIZERS.get(cfg.optimizer).torch_step(cfg, ps, gs, ms, vs, steps_done, kw)
