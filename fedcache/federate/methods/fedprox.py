"""FedProx (Li et al., 2020): FedAvg plus a proximal term mu/2 ||w - w_global||^2 in the local loss."""
from __future__ import annotations

from dataclasses import dataclass

from fedcache.config import NonNegative
from fedcache.federate.stacking import stackable
from fedcache.federate.methods.base import METHODS
from fedcache.federate.methods.fedavg import FedAvg, FedAvgSettings


@dataclass(frozen=True)
class FedProxSettings(FedAvgSettings):
    mu: NonNegative = 0.01  # the FedProx paper sweeps {0.001, 0.01, 0.1, 1}; a negative mu pushes away


@METHODS.register("fedprox")
@stackable(per_row=("mu",))
class FedProx(FedAvg):
    description = "FedAvg with a proximal term pulling local heads towards the global one"
    Settings = FedProxSettings

    def loss(self, p, xb, yb, mask, info):
        anchor = info["anchor"]
        prox = sum(((p[n] - anchor[n]) ** 2).flatten(1).sum(1) for n in self.trainable(p))
        ce, buffers = self.ce_loss(p, xb, yb, mask, info)
        return ce + 0.5 * self.p.mu * prox, buffers
