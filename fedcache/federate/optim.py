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
        self.m = {n: torch.zeros_like(params[n]) for n in self.keys}
        self.v = {n: torch.zeros_like(params[n]) for n in self.keys} if OPTIMIZERS.get(cfg.optimizer).second_moment else {}

    @torch.no_grad()
    def step(self, params: Params, grads: dict[str, torch.Tensor], active: torch.Tensor) -> None:
        """One step of the active clients; each block of rows (one block unless RowOptim) on its own, so a
        block whose rows are all active is updated in place (views), as a single run's would be."""
        start = 0
        for rows, cfg in self.parts:
            block = slice(start, start + rows)
            start += rows
            live = active[block]
            if bool(live.all()):  # the common case
                self._step_rows(cfg, params, grads, block)
            elif bool(live.any()):
                self._step_rows(cfg, params, grads, live.nonzero().squeeze(1) + block.start)
        self.t += active.to(self.t.dtype)

    def _step_rows(self, cfg: OptimConfig, params: Params, grads: Params, rows: slice | torch.Tensor) -> None:
        """Update ``rows`` (a slice: views, updated in place; indices: copies, written back)."""
        ps = [params[n][rows] for n in self.keys]
        ms = [self.m[n][rows] for n in self.keys]
        vs = [self.v[n][rows] for n in self.keys] if self.v else []
        self._apply_block(cfg, ps, [grads[n][rows] for n in self.keys], self.t[rows], ms, vs)
        if isinstance(rows, slice):
            return
        for n, p, m in zip(self.keys, ps, ms):
            params[n][rows], self.m[n][rows] = p, m
        for n, v in zip(self.keys, vs):
            self.v[n][rows] = v

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
