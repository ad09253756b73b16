"""Shared pieces of the self-supervised methods (flesd, fedavg-ssl, fedprox-ssl, min-local).

The representation being learned is a small MLP encoder on top of the frozen cached features:
x -> h = relu(x W1 + b1) (the representation a linear probe scores) -> z = unit(h W2 + b2) (the
projection that contrastive training and FLESD's similarities use, SimCLR's convention). Parameters
are stacked over K clients (leading axis), like every other method's. Clients never read labels;
only the evaluation probe does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.config import Checked, NonNegativeInt, Positive, PositiveInt
from fedcache.errors import ConfigError
from fedcache.federate.local import here, masked_mean, train
from fedcache.federate.methods.base import Method, MethodContext
from fedcache.federate.probe import fit_probe
from fedcache.heads import Params
from fedcache.heads.base import bmm

ENCODER_KEYS = ("w1", "b1", "w2", "b2")
MASKED = -1e9  # logit of excluded pairs: finite, so fully padded rows give no NaN gradients


@dataclass(frozen=True)
class SSLSettings(Checked):
    hidden: PositiveInt = 512  # width of the representation h
    out: PositiveInt = 128  # width of the projection z
    temperature: Positive = 0.4  # SimCLR's NT-Xent temperature (FLESD's official code: 0.4)
    # nt-xent: SimCLR's loss (the paper); cross-view: the official code's MoCo-style InfoNCE (see CONTRASTIVE)
    contrastive: Literal["nt-xent", "cross-view"] = "nt-xent"
    probe_rows: NonNegativeInt = 10000  # labelled training rows the evaluation probe is fitted on (0: all)
    probe_c: Positive = 1.0  # inverse L2 strength of the probe's logistic regression


# ---- encoder ----------------------------------------------------------------------------------
def init_encoder(dim: int, hidden: int, out: int, gen: torch.Generator) -> Params:
    """One encoder, stacked as K = 1; torch.nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    def uniform(*shape, fan_in):
        return ((torch.rand(1, *shape, generator=gen, device=gen.device) * 2 - 1) / math.sqrt(fan_in)).to(
            torch.get_default_device())

    return {"w1": uniform(dim, hidden, fan_in=dim), "b1": uniform(1, hidden, fan_in=dim),
            "w2": uniform(hidden, out, fan_in=hidden), "b2": uniform(1, out, fan_in=hidden)}


def represent(p: Params, x: torch.Tensor) -> torch.Tensor:
    """(K, B, D) -> (K, B, hidden): the representation a linear probe evaluates."""
    return torch.relu(bmm(x.to(p["w1"].dtype), p["w1"], p["b1"]))


def embed(p: Params, x: torch.Tensor) -> torch.Tensor:
    """(K, B, D) -> (K, B, out) unit vectors: the space of the contrastive loss and of FLESD's similarities."""
    return F.normalize(bmm(represent(p, x), p["w2"], p["b2"]), dim=-1)


# ---- SimCLR -------------------------------------------------------------------------------------
def nt_xent(z1: torch.Tensor, z2: torch.Tensor, mask: torch.Tensor, t: float) -> torch.Tensor:
    """SimCLR's loss of K clients' batches: (K, B, O) unit views, (K, B) real rows -> (K,).

    Each of the 2B views has its other view as positive and the other 2B - 2 real views as negatives;
    the per-client loss is the mean over its real views."""
    b = z1.shape[1]
    z = torch.cat([z1, z2], 1)
    valid = torch.cat([mask, mask], 1)
    sim = bmm(z, z.transpose(1, 2)) / t
    eye = torch.eye(2 * b, dtype=torch.bool)
    sim = sim.masked_fill(eye | ~valid[:, None, :], MASKED)
    pos = torch.arange(2 * b).roll(b)  # view i of row r pairs with view i + B (mod 2B)
    loss = torch.logsumexp(sim, -1) - sim[:, torch.arange(2 * b), pos]
    return masked_mean(loss, valid)


def cross_view(z1: torch.Tensor, z2: torch.Tensor, mask: torch.Tensor, t: float) -> torch.Tensor:
    """FLESD's official local loss ("adopted from the mocov2 code, not exactly SimCLR"): each first view
    scores every real second view, its own is the positive (B - 1 negatives, one direction) -> (K,)."""
    sim = (bmm(z1, z2.transpose(1, 2)) / t).masked_fill(~mask[:, None, :], MASKED)
    b = z1.shape[1]
    loss = torch.logsumexp(sim, -1) - sim[:, torch.arange(b), torch.arange(b)]
    return masked_mean(loss, mask)


CONTRASTIVE = {"nt-xent": nt_xent, "cross-view": cross_view}


def proximal(p: Params, start: Params, mu: float) -> torch.Tensor:
    """FLESD's official FedProx term, mu ||w - w_global||^2 summed over the encoder (no 1/2) -> (K,)."""
    return mu * sum(((p[n] - start[n]) ** 2).flatten(1).sum(1) for n in ENCODER_KEYS)


def view_pair(step: int, n_views: int) -> tuple[int, int]:
    """The two augmented views a step contrasts: consecutive views, cycling, so every view is used."""
    return step % n_views, (step + 1) % n_views


def require_views(data, name: str) -> None:
    if data.views is None or data.views.shape[1] < 2:
        got = 0 if data.views is None else data.views.shape[1]
        raise ConfigError(f"{name} trains on augmented views and needs at least 2 per training image (found {got}); "
                          "extract them with `fedcache extract --views 2`")


def local_simclr(method, rnd: int, clients: list[int], start: Params, mu: float = 0.0) -> Params:
    """SimCLR on each client's own rows for ``local_epochs`` epochs, from ``start`` (K stacked encoders).
    ``mu`` > 0 adds the proximal term towards ``start`` (``proximal``)."""
    c = method.ctx
    views = c.data.views
    blind = torch.zeros((), dtype=torch.long).expand(len(views))  # labels never reach training
    t, contrast = method.p.temperature, CONTRASTIVE[method.p.contrastive]

    def loss(p, xb, yb, mask, info):
        a, b = view_pair(info["step"], xb.shape[2])
        total = contrast(embed(p, xb[:, :, a]), embed(p, xb[:, :, b]), mask, t)
        return total + proximal(p, start, mu) if mu else total

    # The optimizer updates in place: train a copy so ``start`` stays the proximal anchor.
    own = {n: t.clone() for n, t in start.items()}
    return train(own, ENCODER_KEYS, loss, views, blind, method.plan(rnd, clients), c.optim)


# ---- evaluation ------------------------------------------------------------------------------------
def probe_rows(rows: list[np.ndarray], cap: int, seed: int) -> np.ndarray:
    """The labelled training rows the evaluation probe fits on: the clients' rows, at most ``cap`` (seeded)."""
    pool = np.sort(np.concatenate(rows))
    if cap and len(pool) > cap:
        pool = np.sort(np.random.default_rng(np.random.SeedSequence([seed, 11])).choice(pool, cap, replace=False))
    return pool


def probe_logits(p: Params, data, rows: np.ndarray, x: torch.Tensor, c: float, seed: int) -> torch.Tensor:
    """Linear evaluation: fit a logistic regression on the representation of the labelled training
    ``rows``, then score ``x`` (N, D) -> (N, C) log-probabilities (classes absent from ``rows``: never)."""
    return probe_many(p, data, rows, [x], c, seed)[0]


def probe_many(p: Params, data, rows: np.ndarray, xs: list[torch.Tensor], c: float, seed: int) -> list[torch.Tensor]:
    """``probe_logits`` of several inputs with one fitted probe."""
    with torch.no_grad():
        h_train = represent(p, data.train_features(here(rows))[None])[0].cpu().numpy()
    model = fit_probe(h_train, data.y_train[here(rows)].cpu().numpy(), c, seed)
    outs = []
    for x in xs:
        with torch.no_grad():
            h = represent(p, x[None])[0].cpu().numpy()
        out = torch.full((len(x), data.n_classes), MASKED)
        proba = np.maximum(model.predict_proba(h), 1e-30)  # log(0) would be -inf
        out[:, here(model[-1].classes_)] = here(np.log(proba)).float()
        outs.append(out)
    return outs


# ---- the common method skeleton --------------------------------------------------------------------
class SSLMethod(Method):
    """Unlabelled clients train the MLP encoder with SimCLR; evaluation is a linear probe of its representation."""

    Settings = SSLSettings
    # Its own MLP encoder (hidden, out) scored by a linear probe: no head is read, so another --head would be
    # recorded in config.json and never run.
    heads = ("linear",)
    uses_views = True
    default_preset = "flesd"  # Adam 1e-3, weight decay 1e-6: FLESD's local optimiser (official code)

    def __init__(self, ctx: MethodContext, params=None) -> None:
        super().__init__(ctx, params)
        require_views(ctx.data, self.name)
        # Fixed before a method may narrow its federation (FLESD's public client still has labelled rows).
        self.eval_rows = probe_rows(ctx.data.client_train, self.p.probe_rows, ctx.seed)

    @classmethod
    def not_deployable(cls, params: Any) -> str:
        # On a client of its own the probe would fit on that client's rows alone: other numbers than the paper's.
        return ("its evaluation fits its linear probe on labelled training rows pooled from every client (the "
                "papers' linear evaluation), which no machine of a deployment holds")

    def init_server(self) -> Params:
        return init_encoder(self.ctx.data.dim, self.p.hidden, self.p.out, self.generator(0, 0))

    def global_logits(self, server: Params, x: torch.Tensor) -> torch.Tensor:
        return probe_logits(server, self.ctx.data, self.eval_rows, x, self.p.probe_c, self.ctx.seed)
