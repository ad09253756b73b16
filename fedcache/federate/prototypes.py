"""Class prototypes for K clients at once (FedProto, FedPCL, prototype anchors)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.heads.base import bmm


def padded_rows(rows: list[np.ndarray], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, n_max) row indices and a mask of the real ones (``width``: n_max, at least the longest's)."""
    n = max((len(r) for r in rows), default=0) if width is None else width
    idx = np.zeros((len(rows), n), dtype=np.int64)
    mask = np.zeros((len(rows), n), dtype=bool)
    for i, r in enumerate(rows):
        idx[i, : len(r)] = r
        mask[i, : len(r)] = True
    # Built on the host, moved once: where the run's tensors are (a GPU's, in a run on one).
    here = torch.get_default_device()
    return torch.from_numpy(idx).to(here), torch.from_numpy(mask).to(here)


def class_sums(z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client class sums of z (K, n, H) over the real rows -> (K, C, H), and counts (K, C)."""
    onehot = F.one_hot(y, n_classes).to(z.dtype) * mask.unsqueeze(-1).to(z.dtype)
    return bmm(onehot.transpose(1, 2), z), onehot.sum(1)


def class_means(z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client class means of z (K, n, H) -> prototypes (K, C, H) and counts (K, C); absent classes are 0."""
    sums, counts = class_sums(z, y, mask, n_classes)
    return means_of(sums, counts), counts


def means_of(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return sums / counts.clamp_min(1.0).unsqueeze(-1)


def aggregate(protos: torch.Tensor, counts: torch.Tensor, weighted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Server side: (M, C, H) client prototypes -> (C, H) global ones and a presence mask (C,).

    ``weighted``: by each client's class count (FedPCL NeurIPS Eq. 6 without its extra 1/|N_j|, which would make
    the weights sum to 1/|N_j| rather than 1); otherwise a plain mean over the
    clients that hold the class (the FedProto / FedPCL official code)."""
    w = counts if weighted else (counts > 0).to(protos.dtype)
    total = w.sum(0)
    glob = torch.einsum("mc,mch->ch", w, protos) / total.clamp_min(1e-12).unsqueeze(-1)
    return glob, total > 0


def nearest(z: torch.Tensor, protos: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Scores for nearest-prototype prediction: minus squared L2 distance, -inf for absent classes."""
    d = distances(z, protos) ** 2
    return (-d).masked_fill(~present.unsqueeze(-2), float("-inf"))


CDIST_BY_PRODUCT = 25  # torch.cdist computes by a product where rows or prototypes are more (its compute_mode's doc)


def distances(z: torch.Tensor, protos: torch.Tensor) -> torch.Tensor:
    """torch.cdist(z, protos) for (K, n, H) and (K, C, H), as cdist computes it, with its product through ``bmm``:
    cdist split one client's product across threads, and the distances' last bits moved with the thread count."""
    if max(z.shape[-2], protos.shape[-2]) <= CDIST_BY_PRODUCT:
        return torch.cdist(z, protos)  # pair by pair, each distance whole on one thread
    if z.dim() != 3 or protos.dim() != 3 or z.shape[0] != protos.shape[0] or not z.numel() or not protos.numel():
        return torch.cdist(z, protos)  # shapes no caller passes (cdist broadcasts them; bmm would not)
    zz, pp = z.pow(2).sum(-1, keepdim=True), protos.pow(2).sum(-1, keepdim=True)
    a = torch.cat([-2 * z, zz, torch.ones_like(zz)], -1)
    b = torch.cat([protos, torch.ones_like(pp), pp], -1)
    return bmm(a, b.transpose(1, 2)).clamp_min_(1e-30).sqrt_()
