"""FedPCL's projection network: FC(K*D, 256) -> ReLU -> L2-normalise, the prototype space.

A linear classifier FC(256, C) sits on top for the loss ablations that use cross-entropy; the
method itself predicts by the nearest prototype and never trains it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fedcache.heads.base import HEADS, HeadSpec, Param, Params, affine, bmm, init_params

DIM = 256


class ProjectionHead:
    name = "projection"
    body_keys = ("proj.weight", "proj.bias")
    head_keys = ("cls.weight", "cls.bias")
    buffer_keys: tuple[str, ...] = ()

    def __init__(self, d_in: int, n_classes: int, dim: int = DIM) -> None:
        self.d_in, self.n_classes, self.feature_dim = d_in, n_classes, dim

    def layout(self) -> list[Param]:
        d = self.feature_dim
        return [Param("proj.weight", (self.d_in, d), self.d_in), Param("proj.bias", (1, d), self.d_in),
                Param("cls.weight", (d, self.n_classes), d), Param("cls.bias", (1, self.n_classes), d)]

    def init(self, k: int, gen: torch.Generator) -> Params:
        return init_params(self.layout(), k, gen)

    def features(self, p: Params, x: torch.Tensor, mask=None) -> torch.Tensor:
        return F.normalize(torch.relu(bmm(x, p["proj.weight"], p["proj.bias"])), dim=-1)

    def train_features(self, p: Params, x: torch.Tensor, mask=None) -> tuple[torch.Tensor, Params]:
        return self.features(p, x, mask), {}

    def classify(self, p: Params, z: torch.Tensor) -> torch.Tensor:
        return affine(p["cls.weight"], p["cls.bias"], z)


HEADS.add("projection", HeadSpec("projection", "FC(D,256)-ReLU-L2norm (+ FC(256,C)), FedPCL's projection network", ProjectionHead))
