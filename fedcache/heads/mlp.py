"""FedPCL's baseline head: FC(D, 256) -> ReLU -> BatchNorm -> FC(256, C) (paper, Table 7).

BatchNorm is computed per client over that client's real rows only (padding rows of the
batched computation are masked out), with running statistics for evaluation.
"""
from __future__ import annotations

import torch

from fedcache.heads.base import HEADS, HeadSpec, Params, affine, uniform_init

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

    def init(self, k: int, gen: torch.Generator) -> Params:
        h = self.hidden
        return {
            "fc1.weight": uniform_init((k, self.d_in, h), self.d_in, gen),
            "fc1.bias": uniform_init((k, 1, h), self.d_in, gen),
            "bn.weight": torch.ones(k, 1, h), "bn.bias": torch.zeros(k, 1, h),
            "bn.running_mean": torch.zeros(k, 1, h), "bn.running_var": torch.ones(k, 1, h),
            "fc2.weight": uniform_init((k, h, self.n_classes), h, gen),
            "fc2.bias": uniform_init((k, 1, self.n_classes), h, gen),
        }

    def features(self, p: Params, x: torch.Tensor, mask: torch.Tensor | None = None, train: bool = False) -> torch.Tensor:
        h = torch.relu(torch.baddbmm(p["fc1.bias"], x, p["fc1.weight"]))
        if train:
            mask = torch.ones(h.shape[:2], dtype=torch.bool) if mask is None else mask
            mean, var = _masked_moments(h, mask)
            _update_running(p, mean.detach(), var.detach(), mask)
        else:
            mean, var = p["bn.running_mean"], p["bn.running_var"]
        return (h - mean) / torch.sqrt(var + BN_EPS) * p["bn.weight"] + p["bn.bias"]

    def classify(self, p: Params, z: torch.Tensor) -> torch.Tensor:
        return affine(p["fc2.weight"], p["fc2.bias"], z)


def _masked_moments(h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client batch mean and (biased) variance over real rows only."""
    w = mask.unsqueeze(-1).to(h.dtype)
    n = w.sum(1, keepdim=True).clamp_min(1.0)
    mean = (h * w).sum(1, keepdim=True) / n
    var = (((h - mean) ** 2) * w).sum(1, keepdim=True) / n
    return mean, var


def _update_running(p: Params, mean: torch.Tensor, var: torch.Tensor, mask: torch.Tensor) -> None:
    # Clients with no real row in this step (already finished their epoch) keep their statistics.
    active = mask.any(1).view(-1, 1, 1)
    n = mask.sum(1).view(-1, 1, 1).to(mean.dtype)
    unbiased = var * n / (n - 1).clamp_min(1.0)
    new_mean = (1 - BN_MOMENTUM) * p["bn.running_mean"] + BN_MOMENTUM * mean
    new_var = (1 - BN_MOMENTUM) * p["bn.running_var"] + BN_MOMENTUM * unbiased
    p["bn.running_mean"] = torch.where(active, new_mean, p["bn.running_mean"])
    p["bn.running_var"] = torch.where(active, new_var, p["bn.running_var"])


HEADS.add("mlp", HeadSpec("mlp", "FC(D,256)-ReLU-BN-FC(256,C), FedPCL's baseline head", MLPHead))
