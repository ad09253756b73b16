"""Per-FedAvg (Fallah et al., "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020).

FedAvg on the MAML objective F(w) = f(w - alpha grad f(w)): the global model is trained to be a good
starting point for one local gradient step. Each client personalises it with that one step. The outer
step (the paper's beta) is the run's optimizer: the method's own preset ("perfedavg": SGD, no momentum,
no weight decay) makes it the paper's w <- w - beta grad F(w); the server averages uniformly, as
Algorithm 1 does (``aggregate=samples`` weights by sample count, as the pFedMe repository's code).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal

import torch

from fedcache.config import Checked, Positive
from fedcache.federate.local import here, split_loss
from fedcache.federate.methods.base import METHODS, LocalResult, Method, aggregation_weights, gradients, weighted_average
from fedcache.federate.optim import StackedOptimizer
from fedcache.heads import Params, expand, forward

# Mini-batches one local step draws: D and D' (first order), plus D'' for the Hessian term (HF).
BATCHES = {"fo": 2, "hf": 3}
ADAPT = 2**31 + 1  # shuffling stream of the evaluation-time adaptation batch, distinct from training


@dataclass(frozen=True)
class PerFedAvgSettings(Checked):
    # Step size of the personalisation step. The pFedMe repository (which implements Per-FedAvg) runs
    # it with --learning_rate 0.005 --beta 0.001; beta, the outer step, is the learning rate of the
    # run's optimizer (the perfedavg preset: SGD 0.001).
    alpha: Positive = 0.005
    variant: Literal["fo", "hf"] = "fo"  # "fo": first-order Per-FedAvg; "hf": Hessian-free (Hessian-vector product)
    aggregate: Literal["uniform", "samples"] = "uniform"  # paper: uniform over the sampled clients


@METHODS.register("perfedavg")
class PerFedAvg(Method):
    description = "FedAvg on the MAML objective; each client adapts the global head with one gradient step"
    Settings = PerFedAvgSettings
    default_preset = "perfedavg"  # SGD at the paper's beta: the outer step of Algorithm 1
    personalized = True

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        w = expand(down, len(clients))
        keys = self.trainable(w)
        opt = StackedOptimizer(w, self.ctx.optim, keys)
        for batches in self.step_batches(rnd, clients):
            grads, buffers = meta_gradient(self.ce_loss, w, keys, batches, self.p.alpha)
            w.update(buffers)
            opt.step(w, grads, batches[0][2].any(1))
        return LocalResult({}, w, aggregation_weights(self.p.aggregate, self.sample_counts(clients)))

    def step_batches(self, rnd: int, clients: list[int]) -> Iterator[list[tuple]]:
        """Consecutive mini-batches of the usual plan, grouped per step, so an epoch still sees every
        row once; where a client's last group runs short, its first batch stands in for the rest."""
        g = BATCHES[self.p.variant]
        plan = here(self.plan(rnd, clients))
        k, s, b = plan.shape
        plan = torch.cat([plan, plan.new_full((k, -s % g, b), -1)], 1).view(k, -1, g, b)
        for group in plan.unbind(1):
            first = group[:, 0]
            yield [self.batch(torch.where((idx >= 0).any(1, keepdim=True), idx, first)) for idx in group.unbind(1)]

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return weighted_average(result.uploads, result.weights)

    def client_logits(self, server: Params, states: Params, clients: list[int], x):
        """The global model after one alpha-step on one training batch of each client (the paper's
        personalised model); the batch is the first of a fixed shuffle, the same every evaluation."""
        w = expand(server, len(clients))
        keys = self.trainable(w)
        batch = self.batch(here(self.plan(ADAPT, clients, epochs=1)[:, 0]))
        with torch.enable_grad():  # the loop evaluates under no_grad
            g, p = gradients(self.ce_loss, w, keys, batch)
        return forward(self.head, {**p, **{n: w[n] - self.p.alpha * g[n] for n in keys}}, x)


def meta_gradient(loss_fn, w: Params, keys: tuple[str, ...], batches: list[tuple], alpha: float) -> tuple[Params, Params]:
    """Stochastic gradient of f(w - alpha grad f(w; D); D') w.r.t. w, and the updated buffers.

    First order: the gradient at the adapted point. With a third batch D'' (HF) the Hessian term is
    kept too, as (I - alpha H(w; D'')) g, through one Hessian-vector product."""
    g1, p = gradients(loss_fn, w, keys, batches[0])
    temp = {**p, **{n: w[n] - alpha * g1[n] for n in keys}}
    g2, p = gradients(loss_fn, temp, keys, batches[1])
    if len(batches) > 2:
        hv = hessian_vector(loss_fn, {**p, **{n: w[n] for n in keys}}, keys, batches[2], g2)
        g2 = {n: g2[n] - alpha * hv[n] for n in keys}
    return g2, {n: t for n, t in p.items() if n not in keys}


def hessian_vector(loss_fn, params: Params, keys: tuple[str, ...], batch: tuple, v: Params) -> Params:
    leaves = {n: params[n].detach().requires_grad_(True) for n in keys}
    loss, _ = split_loss(loss_fn({**params, **leaves}, *batch, {}))  # the Hessian's pass updates no statistics
    g = torch.autograd.grad(loss.sum(), list(leaves.values()), create_graph=True, allow_unused=True)
    dot = sum((gi * v[n]).sum() for n, gi in zip(leaves, g) if gi is not None)
    hv = torch.autograd.grad(dot, list(leaves.values()), allow_unused=True)
    return {n: (h if h is not None else torch.zeros_like(leaves[n])) for n, h in zip(leaves, hv)}
