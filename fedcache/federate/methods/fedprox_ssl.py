"""FedProx-SSL: FedAvg-SSL with FedProx's proximal term mu/2 ||w - w_global||^2 in the local SimCLR loss."""
from __future__ import annotations

from dataclasses import dataclass

from fedcache.errors import ConfigError
from fedcache.federate.methods._simclr import SSLParams
from fedcache.federate.methods.base import METHODS
from fedcache.federate.methods.fedavg_ssl import FedAvgSSL


@dataclass(frozen=True)
class FedProxSSLParams(SSLParams):
    mu: float = 0.01  # FLESD grid-searches mu for FedProx; 0.01 is FedProx's own middle value

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mu < 0:
            raise ConfigError(f"fedprox-ssl needs mu >= 0 (got {self.mu})")


@METHODS.register("fedprox-ssl")
class FedProxSSL(FedAvgSSL):
    name = "fedprox-ssl"
    description = "unsupervised: FedAvg-SSL with a proximal term towards the global encoder"
    Params = FedProxSSLParams

    def proximal(self) -> float:
        return self.p.mu
