"""What the CLIP-feature methods (clip-zs, clip-fc-centralized, fst-cbdg) share: a linear head on
L2-normalised image features, initialised from class anchors (text embeddings or prototypes)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData
from fedcache.federate.local import here, rng_for
from fedcache.federate.methods.base import head_named
from fedcache.heads import Params
from fedcache.heads.base import affine, bmm

PROTOTYPE_STREAM = 9  # rng stream of the server's labelled prototype rows, distinct from every other draw


def unit(x: torch.Tensor) -> torch.Tensor:
    """CLIP compares image and text by cosine similarity, so the classifier sees unit-norm features."""
    return F.normalize(x, dim=-1)


def anchor_head(anchors: torch.Tensor, scale: float = 1.0) -> Params:
    """The linear head W = scale * anchors, b = 0 (FST-CBDG Algorithm 1 line 6), leading axis 1."""
    c = anchors.shape[0]
    return {"weight": (scale * anchors).T.contiguous().unsqueeze(0), "bias": torch.zeros(1, 1, c)}


def linear_logits(p: Params, z: torch.Tensor) -> torch.Tensor:
    """W z + b for K stacked linear heads: (K, n, D) -> (K, n, C), as LinearHead.classify computes."""
    return affine(p["weight"], p["bias"], z)


def cosine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """unit(x) @ w for (N, D) x and (D, C) w, dividing the (N, C) product rather than the (N, D)
    features; the product is taken as (w^T x^T)^T, twice as fast here for few classes (heads/base.py)."""
    return bmm(w.T.unsqueeze(0), x.T.unsqueeze(0))[0].T / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def unit_logits(params: Params, x: torch.Tensor) -> torch.Tensor:
    """(N, D) -> (N, C): the linear head W z + b (leading axis 1) on normalised features."""
    with torch.no_grad():
        return cosine(x, params["weight"][0]) + params["bias"][0]


def require_linear(head: str, method: str) -> None:
    if head != "linear":
        raise ConfigError(f"{method} trains a linear classifier initialised from class anchors, not {head!r}; "
                          f"drop {head_named()}")


def prototype_anchors(data: FederatedData, shots: int, seed: int) -> torch.Tensor:
    """(C, D) unit class means of ``shots`` labelled rows per class, drawn from the rows clients hold.

    An extension for backbones without a text tower: the server holds these few labelled examples
    (they never travel); drawing them from client rows keeps them off the --validation rows."""
    if shots < 1:
        raise ConfigError(f"anchors=prototypes needs shots >= 1, got {shots}")
    held = np.unique(np.concatenate(data.client_train)) if data.client_train else np.zeros(0, np.int64)
    y = data.y_train.cpu().numpy()[held]
    rng = rng_for(seed, 0, 0, 0, PROTOTYPE_STREAM)
    rows = []
    for c in range(data.n_classes):
        have = held[y == c]
        if not len(have):
            raise ConfigError(f"anchors=prototypes: no client holds class {data.class_names[c]!r}; "
                              "use a text tower (anchors=text) or a partition that covers every class")
        rows.append(rng.choice(have, min(shots, len(have)), replace=False))
    return torch.stack([unit(unit(data.train_features(here(r))).mean(0)) for r in rows])
