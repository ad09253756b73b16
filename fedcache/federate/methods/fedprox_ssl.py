"""FedProx-SSL: FedAvg-SSL with a proximal term towards the global encoder in the local SimCLR loss,
mu ||w - w_global||^2 as FLESD's official code adds it (FedProx's paper writes mu/2; see
docs/methods/fedprox-ssl.md)."""
from __future__ import annotations

from dataclasses import dataclass

from fedcache.config import NonNegative
from fedcache.federate.methods.base import METHODS
from fedcache.federate.methods.fedavg_ssl import FedAvgSSL, FedAvgSSLSettings


@dataclass(frozen=True)
class FedProxSSLSettings(FedAvgSSLSettings):
    mu: NonNegative = 1e-4  # FLESD's official README: "The default mu=1e-4 in the original paper"


@METHODS.register("fedprox-ssl")
class FedProxSSL(FedAvgSSL):
    description = "unsupervised: FedAvg-SSL with a proximal term towards the global encoder"
    Settings = FedProxSSLSettings

    def proximal(self) -> float:
        return self.p.mu
