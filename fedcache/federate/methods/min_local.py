"""Min-Local (FLESD paper's lower bound): every client trains its own SimCLR encoder, no communication.

Each client's encoder is scored by its own linear probe (fitted on the labelled training rows'
representation); the paper's "Min-Local" row is the worst of these, which the summary's per-client
list gives.
"""
from __future__ import annotations

import torch

from fedcache.federate.methods._simclr import SSLMethod, local_simclr, probe_logits
from fedcache.federate.methods.base import METHODS, LocalResult
from fedcache.heads import Params, expand


@METHODS.register("min-local")
class MinLocal(SSLMethod):
    name = "min-local"
    description = "unsupervised: local SimCLR encoders only, no communication (lower bound)"
    federated = False
    personalized = True
    has_global_model = False

    def init_clients(self, n: int) -> Params:
        return expand(self.init_server(), n)  # one common starting point, as the federated methods have

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        return LocalResult(local_simclr(self, rnd, clients, states), {}, self.sample_counts(clients))

    def client_logits(self, server: Params, states: Params, clients: list[int], x: torch.Tensor) -> torch.Tensor:
        c = self.ctx
        return torch.stack([probe_logits({n: t[i: i + 1] for n, t in states.items()}, c.data, self.eval_rows,
                                         x[i], self.p.probe_c, c.seed) for i in range(len(clients))])
