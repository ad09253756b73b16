"""FLESD (Shi et al., "Towards Communication-Efficient and Privacy-Preserving Federated Representation Learning"):
unlabelled clients train the MLP encoder locally with SimCLR for many epochs, then send the
representations of a public set (the paper's Eq. 11 and the official code; ``upload=similarities``
sends the P x P similarity matrix instead, dense or top-n%). The server forms each client's
similarities, ensembles them (Eq. 4-6), distils them into the global encoder with a momentum encoder
and a queue (Eq. 7-10), and sends the encoder back.

The public set is client 0's data, as in the paper and its official code: client 0 never trains
and is not part of the federation (the loop sees clients 1..N-1); the server holds its rows.
Defaults follow the paper and its official code (README command, options.py) except where the table
of differences in docs/methods/flesd.md says otherwise.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch

from fedcache.config import NonNegative, NonNegativeInt, Positive, PositiveInt, Range, UnitOpen
from fedcache.errors import ConfigError
from fedcache.federate.methods import _flesd as esd
from fedcache.federate.methods._simclr import SSLMethod, SSLSettings, embed, local_simclr
from fedcache.federate.methods.base import METHODS, LocalResult, MethodContext
from fedcache.heads import Params, expand
from fedcache.federate.local import here

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FLESDSettings(SSLSettings):
    target_t: Positive = 0.1  # tau_T of Eq. 5, also the student's (Eq. 7); official README: 0.1 for both
    momentum: UnitOpen = 0.999  # m of Eq. 10 (official code)
    queue: PositiveInt = 2048  # K, the queue of momentum keys (official code); capped by the public set
    # round: skip the loss until the queue first holds K keys; epoch: for the first K/B steps of every epoch (official code)
    queue_warmup: Literal["round", "epoch"] = "round"
    distill_epochs: NonNegativeInt = 200  # epochs over the public set per round (paper and official code)
    distill_batch: PositiveInt = 256  # official code, drop_last
    distill_lr: Positive = 1e-3  # Adam (paper)
    distill_wd: NonNegative = 1e-6  # Adam's L2 weight decay in distillation (official code)
    public_rows: NonNegativeInt = 0  # 0: all of client 0's rows (paper); else at most this many (seeded draw)
    upload: Literal["representations", "similarities"] = "representations"  # what a client sends
    top_percent: Annotated[float, Range(0, 100, lo_open=True)] = 100.0  # < 100: each row keeps its top n% (see docs)
    precision: Literal["float32", "float16", "int8"] = "float32"  # of the values sent


@METHODS.register("flesd")
class FLESD(SSLMethod):
    description = "unsupervised: local SimCLR, ensemble similarity distillation on a public set (no weights sent up)"
    Settings = FLESDSettings

    @classmethod
    def not_deployable(cls, params: Any) -> str:
        return ("its server distills on a public set (client 0's rows), which a deployment's server does not hold, and "
                + super().not_deployable(params))

    def __init__(self, ctx: MethodContext, params=None) -> None:
        super().__init__(ctx, params)
        d = ctx.data
        if d.n_clients < 2:
            raise ConfigError("flesd needs at least 2 clients: client 0's data is the public set, the others train")
        self.public = here(esd.public_rows(d.client_train[0], self.p.public_rows, ctx.seed))
        if len(self.public) < 1:
            raise ConfigError("flesd's public set (client 0's rows) is empty; give client 0 rows or use fewer clients")
        # The federation is clients 1..N-1; a copy, so the caller's data and context stay untouched.
        if esd.trains_nothing(len(self.public), self.p.distill_batch, self.p.queue, self.p.queue_warmup):
            log.warning("flesd: the queue of %d keys fills every step of an epoch over the %d public rows in batches of "
                        "%d, and queue_warmup=epoch skips the loss until it is full, so distillation trains nothing "
                        "(as the official code would); lower queue or distill_batch, or set queue_warmup=round",
                        self.p.queue, len(self.public), self.p.distill_batch)
        rest = dataclasses.replace(d, client_train=d.client_train[1:], client_test=d.client_test[1:])
        self.ctx = dataclasses.replace(ctx, data=rest)

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        params = local_simclr(self, rnd, clients, expand(down, len(clients)))
        with torch.no_grad():  # the public set's plain (unaugmented) features, as the official pubset_infer
            z = embed(params, self.ctx.data.train_features(self.public).expand(len(clients), -1, -1))
        up = esd.encode(z, self.p.upload, self.p.top_percent, self.p.precision)
        return LocalResult({}, up, self.sample_counts(clients))

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        ens = esd.ensemble(esd.client_matrices(result.uploads, self.p.top_percent), self.p.target_t)
        views = self.ctx.data.views[self.public]
        return esd.distil(server, ens, views, self.p, self.generator(rnd, 1))
