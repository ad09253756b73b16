"""FedAvg (McMahan et al., 2017): clients train the global head locally; the server averages."""
from __future__ import annotations

from fedcache.federate.methods.base import METHODS, LocalResult, Method, weighted_average
from fedcache.heads import Params, expand


@METHODS.register("fedavg")
class FedAvg(Method):
    name = "fedavg"
    description = "average of locally trained heads, weighted by sample counts"
    batchable = True

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        params = self.fit(expand(down, len(clients)), rnd, clients, self.loss, {"anchor": down})
        return LocalResult({}, params, self.sample_counts(clients))

    def loss(self, p, xb, yb, mask, info):
        return self.ce_loss(p, xb, yb, mask, info)

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return weighted_average(result.uploads, result.weights)
