"""FedNTD (Lee et al., "Preservation of the Global Knowledge by Not-True Distillation in Federated
Learning", NeurIPS 2022): FedAvg whose local loss also distils the global model's predictions over the
classes other than the true one, so local training forgets less of what other clients taught.

The loss is the official code's NTD_Loss: CE + beta * tau^2 * batch mean of KL(global || local) over the
not-true classes at temperature tau."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedcache.config import NonNegative, Positive
from fedcache.federate.local import cross_entropy, masked_mean
from fedcache.federate.stacking import stackable
from fedcache.federate.methods.base import METHODS
from fedcache.federate.methods.fedavg import FedAvg, FedAvgSettings
from fedcache.heads import forward, train_forward


@dataclass(frozen=True)
class FedNTDSettings(FedAvgSettings):
    # The official config/fedntd.json (NTD_Loss's own defaults are tau = 3, beta = 1). FST-CBDG, which
    # compares against FedNTD, does not state them.
    tau: Positive = 1.0  # softmax temperature of both the local and the global logits
    beta: NonNegative = 1.0  # weight of the not-true distillation term


@METHODS.register("fedntd")
@stackable(per_row=("beta",))  # tau divides the logits inside not_true_kl: one value per stack
class FedNTD(FedAvg):
    description = "FedAvg plus distillation of the global model's not-true-class predictions"
    Settings = FedNTDSettings

    def loss(self, p, xb, yb, mask, info):
        xb = self.inputs(xb)
        logits, buffers = train_forward(self.head, p, xb, mask)
        with torch.no_grad():
            # The teacher is the received global model in eval mode (BatchNorm with its running statistics):
            # the official ClientTrainer deep-copies a model that the previous client's evaluation left in
            # eval mode (only the very first client of a run copies it in train mode).
            anchor = {n: t.expand(len(xb), *t.shape[1:]) for n, t in info["anchor"].items()}
            teacher = forward(self.head, anchor, xb, mask)
        # tau^2 as in the official NTD_Loss (the paper's Eq. has none): it keeps the term's gradient
        # scale independent of tau, as in Hinton et al.'s distillation.
        ntd = self.p.tau**2 * masked_mean(not_true_kl(logits, teacher, yb, self.p.tau), mask)
        return cross_entropy(logits, yb, mask) + self.p.beta * ntd, buffers


def not_true_kl(student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """KL(teacher || student) per row between the temperature-softened distributions over the
    not-true classes: (..., C) logits and (...) labels -> (...)."""
    c = student.shape[-1]
    keep = ~F.one_hot(y, c).bool()
    s = student[keep].view(*y.shape, c - 1) / tau
    t = teacher[keep].view(*y.shape, c - 1) / tau
    log_t = F.log_softmax(t, -1)
    return (log_t.exp() * (log_t - F.log_softmax(s, -1))).sum(-1)
