"""pFedMe (Dinh et al., "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020).

Each client keeps a personalised model theta close to its local copy w of the global model: per
mini-batch, theta approximately solves min f(theta) + lam/2 ||theta - w||^2 (``inner_steps`` plain
gradient steps of size ``personal_lr``), then w moves along the Moreau envelope's gradient
lam (w - theta). The server averages the clients' w and mixes the average into the global model with
``beta``. The step of w is the run's optimizer: the method's own preset ("pfedme": SGD, no momentum,
no weight decay, lr = the paper's eta) makes it the paper's w <- w - eta lam (w - theta).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fedcache.config import Checked, NonNegative, Positive, PositiveInt
from fedcache.federate.methods.base import METHODS, LocalResult, Method, aggregation_weights, gradients, weighted_average
from fedcache.federate.optim import StackedOptimizer
from fedcache.heads import Params, expand, forward
from fedcache.federate.local import here


@dataclass(frozen=True)
class PFedMeSettings(Checked):
    lam: Positive = 15.0  # official --lamda 15: CIFAR-10 and 3 of 4 MNIST commands (Synthetic 20)
    inner_steps: PositiveInt = 5  # K, official default --K 5
    # Step size of the inner solver for theta: the official CIFAR-10 and Synthetic commands
    # (--personal_learning_rate 0.01; its MNIST commands use 0.05-0.1).
    personal_lr: Positive = 0.01
    beta: Positive = 1.0  # server mixing, official default --beta 1.0 (beta = 1: plain average)
    # Algorithm 1 of the paper averages the sampled clients' w uniformly; the official code weights by
    # sample count (its uniform line is commented out).
    aggregate: Literal["uniform", "samples"] = "uniform"
    # L2 coefficient in the inner solver's gradient: 0 in the paper; the official pFedMeOptimizer adds
    # mu * theta with mu = 0.001.
    personal_l2: NonNegative = 0.0


@METHODS.register("pfedme")
class PFedMe(Method):
    description = "personalised models tied to the global one by a Moreau-envelope (L2) term"
    Settings = PFedMeSettings
    default_preset = "pfedme"  # SGD at the paper's eta: the w update of Algorithm 1
    personalized = True

    def initial_states(self, clients: list[int]) -> Params:
        return expand(self.init_server(), len(clients))  # theta before any training: the initial global model

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        w = expand(down, len(clients))
        keys = self.trainable(w)
        theta = dict(w)  # theta restarts from the received global model, as in the official code
        opt = StackedOptimizer(w, self.ctx.optim, keys)
        for idx in here(self.plan(rnd, clients)).unbind(1):
            batch = self.batch(idx)
            active = batch[2].any(1)
            theta = self.personalize(theta, w, keys, batch, active)
            opt.step(w, {n: self.p.lam * (w[n] - theta[n]) for n in keys}, active)
        # BatchNorm statistics are only ever updated by theta's forward passes; they travel with w.
        uploads = {**w, **{n: theta[n] for n in self.head.buffer_keys}}
        return LocalResult(theta, uploads, aggregation_weights(self.p.aggregate, self.sample_counts(clients)))

    def personalize(self, theta: Params, w: Params, keys: tuple[str, ...], batch: tuple, active: torch.Tensor) -> Params:
        """``inner_steps`` gradient steps on f(theta; batch) + lam/2 ||theta - w||^2, warm-started."""
        lr, lam, l2 = self.p.personal_lr, self.p.lam, self.p.personal_l2
        everyone = bool(active.all())
        for _ in range(self.p.inner_steps):
            g, theta = gradients(self.ce_loss, theta, keys, batch)
            for n in keys:
                step = lr * (g[n] + lam * (theta[n] - w[n]) + l2 * theta[n])
                if everyone:  # the usual case: no mask needed
                    theta[n] = theta[n] - step
                else:
                    on = active.view(-1, *([1] * (w[n].dim() - 1)))
                    theta[n] = torch.where(on, theta[n] - step, theta[n])
        return theta

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        avg = weighted_average(result.uploads, result.weights)
        return {n: (1 - self.p.beta) * server[n] + self.p.beta * avg[n] for n in server}

    def client_logits(self, server: Params, states: Params, clients: list[int], x):
        return forward(self.head, states, x)

    def scores_by_own_state(self) -> bool:
        return True
