"""FedPCL's baseline head: FC(D, 256) -> ReLU -> BatchNorm -> FC(256, C) (paper, Table 7).

BatchNorm is computed per client over that client's real rows only (padding rows of the
batched computation are masked out), with running statistics for evaluation.
"""
from __future__ import annotations

import torch

from fedcache.heads.base import HEADS, HeadSpec, Param, Params, affine, bmm, init_params

HIDDEN = 256
BN_MOMENTUM = 0.1
BN_EPS = 1e-5


class MLPHead:
    name = "mlp"
    body_keys = ("fc1.weight", "fc1.bias", "bn.weight", "bn.bias")
    head_keys = ("fc2.weight", "fc2.bias")
    buffer_keys = ("bn.running_mean", "bn.running_var")

    def __init__(self, d_in: int, n_classes: int, hidden: int = HIDDEN) -> None:
        self.d_in, self.n_classes, self.hidden, self.feature_dim = d_in, n_classes, hidden, hidden

    def layout(self) -> list[Param]:
        h, c = self.hidden, self.n_classes
        return [Param("fc1.weight", (self.d_in, h), self.d_in), Param("fc1.bias", (1, h), self.d_in),
                Param("bn.weight", (1, h), fill=1.0), Param("bn.bias", (1, h)),
                Param("bn.running_mean", (1, h)), Param("bn.running_var", (1, h), fill=1.0),
                Param("fc2.weight", (h, c), h), Param("fc2.bias", (1, c), h)]

    def init(self, k: int, gen: torch.Generator) -> Params:
        return init_params(self.layout(), k, gen)

    def features(self, p: Params, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(bmm(x, p["fc1.weight"], p["fc1.bias"]))
        scale = torch.rsqrt(p["bn.running_var"] + BN_EPS) * p["bn.weight"]
        return torch.addcmul(p["bn.bias"], h - p["bn.running_mean"], scale)

    def train_features(self, p: Params, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Params]:
        # Always the masked statistics, also where a step has no padding row: a client's statistics then round
        # the same whichever other clients share the step (a stack of runs computes each run's own numbers).
        real = (torch.ones(x.shape[:2], dtype=x.dtype) if mask is None else mask.to(x.dtype)).unsqueeze(-1)
        z, mean, var = train_body(x, real, p["fc1.weight"], p["fc1.bias"], p["bn.weight"], p["bn.bias"])
        return z, running_statistics(p, mean.detach(), var.detach(), real)

    def classify(self, p: Params, z: torch.Tensor) -> torch.Tensor:
        return affine(p["fc2.weight"], p["fc2.bias"], z)


def train_body(x, real, w1, b1, gamma, beta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FC -> ReLU -> BatchNorm over each client's real rows: (z, batch mean, batch variance).
    ``real`` is (K, B, 1) with 1 for real rows."""
    h = torch.relu(bmm(x, w1, b1))
    # Moments as a mean, a centring and a mean of squares: torch.var_mean over the row axis is much slower
    # (CHANGELOG.md, "Measurements and investigations").
    n = real.sum(1, keepdim=True).clamp_min(1.0)
    mean = (h * real).sum(1, keepdim=True) / n
    centred = h - mean
    var = (centred * centred * real).sum(1, keepdim=True) / n
    return torch.addcmul(beta, centred * torch.rsqrt(var + BN_EPS), gamma), mean, var


def running_statistics(p: Params, mean: torch.Tensor, var: torch.Tensor, real: torch.Tensor) -> Params:
    """The new running statistics, as torch's BatchNorm keeps them (unbiased variance); ``real`` as in train_body."""
    old_mean, old_var = p["bn.running_mean"], p["bn.running_var"]
    n = real.sum(1, keepdim=True)
    new_mean = torch.lerp(old_mean, mean, BN_MOMENTUM)
    new_var = torch.lerp(old_var, var * n / (n - 1).clamp_min(1.0), BN_MOMENTUM)
    # Clients with no real row in this step (already finished their epoch) keep their statistics.
    active = n > 0
    return {"bn.running_mean": torch.where(active, new_mean, old_mean), "bn.running_var": torch.where(active, new_var, old_var)}


HEADS.add("mlp", HeadSpec("mlp", "FC(D,256)-ReLU-BN-FC(256,C), FedPCL's baseline head", MLPHead))
