"""FedAvg-SSL: FedAvg of locally trained SimCLR encoders (FLESD paper's weight-averaging baseline).

Unlabelled clients train the global MLP encoder with SimCLR on their cached augmented views and send
its weights; the server averages them (weighted by sample counts, or uniformly as the official
code). Evaluation: linear probe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedcache.federate.methods._simclr import SSLMethod, SSLSettings, local_simclr
from fedcache.federate.methods.base import METHODS, LocalResult, aggregation_weights, weighted_average
from fedcache.heads import Params, expand


@dataclass(frozen=True)
class FedAvgSSLSettings(SSLSettings):
    # samples: FedAvg's average weighted by row counts (the paper names FedAvg); uniform: the official
    # code's average_weights, a plain mean of the clients' encoders
    average: Literal["samples", "uniform"] = "samples"


@METHODS.register("fedavg-ssl")
class FedAvgSSL(SSLMethod):
    description = "unsupervised: average of locally trained SimCLR encoders (weights travel)"
    Settings = FedAvgSSLSettings

    def proximal(self) -> float:
        return 0.0

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        params = local_simclr(self, rnd, clients, expand(down, len(clients)), self.proximal())
        return LocalResult({}, params, self.sample_counts(clients))

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return weighted_average(result.uploads, aggregation_weights(self.p.average, result.weights))
