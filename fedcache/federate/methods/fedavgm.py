"""FedAvgM (Hsu et al., 2019): FedAvg whose server steps along a momentum of the averaged client updates."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedcache.config import Positive, UnitOpen
from fedcache.federate.methods.base import METHODS, LocalResult
from fedcache.federate.methods.fedavg import FedAvg, FedAvgSettings
from fedcache.federate.stacking import stackable
from fedcache.heads import Params

MOMENTUM = "v."  # prefix of the server's momentum buffers in its state; they never travel


@dataclass(frozen=True)
class FedAvgMSettings(FedAvgSettings):
    server_momentum: UnitOpen = 0.9  # beta; the paper sweeps it in [0, 1): 0 with server_lr = 1 is FedAvg
    server_lr: Positive = 1.0  # the server's step along its momentum (the paper's effective rate is server_lr / (1 - beta))


# Both settings are read only by each run's own server (aggregate), never by the clients' joint local_update.
@METHODS.register("fedavgm")
@stackable(per_run=("server_momentum", "server_lr"))
class FedAvgM(FedAvg):
    description = "FedAvg whose server steps along a momentum of the averaged client updates"
    Settings = FedAvgMSettings

    def init_server(self) -> Params:
        model = super().init_server()
        return {**model, **{MOMENTUM + n: torch.zeros_like(model[n]) for n in self.trainable(model)}}

    def broadcast(self, server: Params, rnd: int) -> Params:
        return {n: t for n, t in server.items() if not n.startswith(MOMENTUM)}

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        """v <- beta v + (w - average); w <- w - server_lr v, over the trainable tensors. BatchNorm running
        statistics take the plain average: a momentum step could overshoot a variance below zero. With beta = 0
        and server_lr = 1 the step lands on the average itself, FedAvg's head to the bit (w - (w - average)
        rounds away from it), as Flower's FedAvgM returns the plain average when there is no server optimizer."""
        model = self.broadcast(server, rnd)
        average = super().aggregate(model, result, clients, rnd)
        plain = self.p.server_momentum == 0 and self.p.server_lr == 1
        out = dict(average)
        for n in self.trainable(model):
            v = self.p.server_momentum * server[MOMENTUM + n] + (model[n] - average[n])
            out[MOMENTUM + n] = v
            if not plain:
                out[n] = model[n] - self.p.server_lr * v
        return out
