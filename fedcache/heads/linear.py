"""The linear head W z + b (FedAvg on frozen features, FST-CBDG's classifier)."""
from __future__ import annotations

import torch

from fedcache.heads.base import HEADS, HeadSpec, Param, Params, affine, init_params


class LinearHead:
    name = "linear"
    body_keys: tuple[str, ...] = ()
    head_keys = ("weight", "bias")
    buffer_keys: tuple[str, ...] = ()

    def __init__(self, d_in: int, n_classes: int) -> None:
        self.d_in, self.n_classes, self.feature_dim = d_in, n_classes, d_in

    def layout(self) -> list[Param]:
        return [Param("weight", (self.d_in, self.n_classes), self.d_in), Param("bias", (1, self.n_classes), self.d_in)]

    def init(self, k: int, gen: torch.Generator) -> Params:
        return init_params(self.layout(), k, gen)

    def features(self, p: Params, x: torch.Tensor, mask=None) -> torch.Tensor:
        return x  # the frozen backbone's embedding is the representation

    def train_features(self, p: Params, x: torch.Tensor, mask=None) -> tuple[torch.Tensor, Params]:
        return x, {}

    def classify(self, p: Params, z: torch.Tensor) -> torch.Tensor:
        return affine(p["weight"], p["bias"], z)


HEADS.add("linear", HeadSpec("linear", "W z + b on the cached embedding", LinearHead))
