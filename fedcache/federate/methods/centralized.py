"""Centralized: one head trained on every client's training data pooled (the upper bound)."""
from __future__ import annotations

import numpy as np

from fedcache.federate.local import step_plan, train
from fedcache.federate.methods.base import METHODS, LocalResult, Method
from fedcache.heads import Params


POOLED = 2**31  # shuffling stream of the pooled data, distinct from every client's


@METHODS.register("centralized")
class Centralized(Method):
    description = "one head on all training data pooled; no federation (upper bound)"
    federated = False
    splittable = False
    pools_data = True
    all_clients = True

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        c = self.ctx
        rows = np.concatenate(self.client_rows(clients))
        plan = step_plan([rows], c.batch_size, c.local_epochs, c.seed, rnd, [POOLED])
        params = train(dict(down), self.trainable(down), self.ce_loss, c.data.x_train, c.data.y_train, plan, c.optim)
        return LocalResult({}, params, self.sample_counts(clients).sum().view(1))

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return result.uploads
