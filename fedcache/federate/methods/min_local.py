"""Min-Local (FLESD paper's lower bound): every client trains its own SimCLR encoder, no communication.

Each client's encoder is scored by its own linear probe (fitted on the labelled training rows'
representation) on the client's local test rows (``accuracy``), and on the whole test split: the
paper's "Min-Local" row is the worst of these, ``worst_client_global_accuracy`` in the summary.
"""
from __future__ import annotations

import torch

from fedcache.federate.methods._simclr import SSLMethod, local_simclr, probe_many
from fedcache.federate.methods.base import METHODS, LocalResult, MethodContext
from fedcache.heads import Params, expand


@METHODS.register("min-local")
class MinLocal(SSLMethod):
    description = "unsupervised: local SimCLR encoders only, no communication (lower bound)"
    federated = False
    personalized = True
    has_global_model = False

    def __init__(self, ctx: MethodContext, params=None) -> None:
        super().__init__(ctx, params)
        self.whole_test: dict[int, float] = {}  # client -> its probe's accuracy on the whole test split, last evaluation

    def initial_states(self, clients: list[int]) -> Params:
        return expand(self.init_server(), len(clients))  # one common starting point, as the federated methods have

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        return LocalResult(local_simclr(self, rnd, clients, states), {}, self.sample_counts(clients))

    def client_logits(self, server: Params, states: Params, clients: list[int], x: torch.Tensor) -> torch.Tensor:
        c, d = self.ctx, self.ctx.data
        out = []
        for i, k in enumerate(clients):
            own = {n: t[i: i + 1] for n, t in states.items()}
            local, whole = probe_many(own, d, self.eval_rows, [x[i], d.scored_test()], self.p.probe_c, c.seed)
            self.whole_test[k] = 100.0 * float(d.global_correct(whole).float().mean())
            out.append(local)
        return torch.stack(out)

    def scores_by_own_state(self) -> bool:
        return True  # a client's probe is fitted on its own state's features (whole_test keeps its last score)

    def summary_extra(self) -> dict:
        if not self.whole_test:
            return {}
        acc = [round(self.whole_test[k], 4) for k in sorted(self.whole_test)]
        return {"worst_client_global_accuracy": min(acc), "per_client_global_accuracy": acc}
