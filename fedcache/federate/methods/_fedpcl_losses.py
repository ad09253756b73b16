"""FedPCL's local losses (and the supervised-contrastive row of its loss ablation), batched over K clients.

Every function returns the per-client mean loss (K,) over the real rows of the batch.
z are L2-normalised projections (K, B, H) of one run's rows; ``sets`` are its prototype sets (``proto_sets``
of what its server sent); ``tau`` is the temperature.
"""
from __future__ import annotations

import torch

from fedcache.federate.local import masked_mean
from fedcache.heads.base import bmm

NEG_INF = float("-inf")


def proto_sets(method, down: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The prototype sets to contrast against, per the ablation: [(P (M, C, H), present (M, C))], from what
    the run's server broadcast (``global`` (1, C, H); ``local`` (1, R, C, H), the latest set of each of the R
    clients that have sent one)."""
    sets = []
    glob, glob_mask = down["global"], down["global_mask"]
    if method.p.prototypes in ("both", "global"):
        sets.append((glob, glob_mask))
    if method.p.prototypes in ("both", "local"):
        have = down["local_count"][0] > 0
        reported = have.any(1)
        # Only the clients that have reported are gathered, before anything else: this runs at every local step,
        # and filling all N clients' sets (N x C x H) cost a step in proportion to the federation's size.
        have = have[reported]
        # A client's missing classes are filled with the global prototype (official code).
        filled = torch.where(have.unsqueeze(-1), down["local"][0][reported], glob)
        sets.append((filled, have | glob_mask))
    return sets


def _reduce(per_set: torch.Tensor, valid: torch.Tensor, how: str) -> torch.Tensor:
    """(K, B, M) per prototype set -> (K, B): sum (official) or mean (NeurIPS Eq. 9) over the valid sets."""
    per_set = per_set.masked_fill(~valid, 0.0)
    total = per_set.sum(-1)
    return total if how == "sum" else total / valid.sum(-1).clamp_min(1)


def paper_term(z, y, P, present, tau) -> tuple[torch.Tensor, torch.Tensor]:
    """NeurIPS Eq. 8/9: -log exp(z.P_y/tau) / sum_{a != y} exp(z.P_a/tau), per row and set: (K, B, M)."""
    k, m, c = z.shape[0], P.shape[0], P.shape[1]  # as one product per client: see heads/base.py bmm
    s = bmm(z, P.reshape(m * c, -1).T.expand(k, -1, -1)).view(k, -1, m, c) / tau
    onehot = torch.nn.functional.one_hot(y, P.shape[1]).bool().unsqueeze(2)  # (K, B, 1, C)
    pos = (s * onehot).sum(-1)
    neg = s.masked_fill(onehot | ~present.view(1, 1, *present.shape), NEG_INF)
    valid = present[:, y].permute(1, 2, 0) & torch.isfinite(neg.logsumexp(-1))  # positive and a negative exist
    return -(pos - neg.logsumexp(-1)), valid


def batch_term(z, y, mask, P, present, tau) -> tuple[torch.Tensor, torch.Tensor]:
    """The official ConLoss: anchors are the prototypes of each row's class, contrasted with the batch's
    rows (two identical views, as for data without augmentation); positives share the label. (K, B, M)."""
    z2, y2, m2 = torch.cat([z, z], 1), torch.cat([y, y], 1), torch.cat([mask, mask], 1)
    anchors = P[:, y2].permute(1, 0, 2, 3)  # (K, M, 2B, H)
    k, m, i = anchors.shape[:3]
    s = bmm(anchors.reshape(k, m * i, -1), z2.transpose(1, 2)).view(k, m, i, -1) / tau
    n = z2.shape[1]
    not_self = ~torch.eye(n, dtype=torch.bool)
    cols = (m2.unsqueeze(1) & not_self).unsqueeze(1)  # (K, 1, 2B, 2B)
    pos = cols & (y2.unsqueeze(2) == y2.unsqueeze(1)).unsqueeze(1)
    log_prob = s - s.masked_fill(~cols, NEG_INF).logsumexp(-1, keepdim=True)
    per_anchor = -_positives(log_prob, pos)  # (K, M, 2B)
    per_row = 0.5 * (per_anchor[..., : n // 2] + per_anchor[..., n // 2:])  # both views of a row
    valid = present[:, y].permute(1, 2, 0) & (pos.sum(-1)[..., : n // 2] > 0).permute(0, 2, 1)
    return per_row.permute(0, 2, 1), valid


def _positives(log_prob: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Mean log-probability of each anchor's positives. Selected, not multiplied by the mask: a client with no
    real row in a step has no column to normalise over, so its log_prob is +inf, and inf * 0 is NaN."""
    return torch.where(pos, log_prob, 0.0).sum(-1) / pos.sum(-1).clamp_min(1)


def fedpcl(method, z, y, mask, sets, tau) -> torch.Tensor:
    """The rows against their run's ``sets`` (``proto_sets``), summed or averaged over the sets."""
    total = torch.zeros(z.shape[:2])
    for P, present in sets:
        if method.p.contrast == "batch":
            per_set, valid = batch_term(z, y, mask, P, present, tau)
        else:
            per_set, valid = paper_term(z, y, P, present, tau)
        total = total + _reduce(per_set, valid, method.p.local_reduce)
    return masked_mean(total, mask)


def supcon(method, z, y, mask, sets, tau) -> torch.Tensor:
    """Supervised contrastive loss on the local embeddings only (Khosla et al.): anchors are rows."""
    z2, y2, m2 = torch.cat([z, z], 1), torch.cat([y, y], 1), torch.cat([mask, mask], 1)
    s = bmm(z2, z2.transpose(1, 2)) / tau
    n = z2.shape[1]
    cols = m2.unsqueeze(1) & ~torch.eye(n, dtype=torch.bool)
    pos = cols & (y2.unsqueeze(2) == y2.unsqueeze(1))
    log_prob = s - s.masked_fill(~cols, NEG_INF).logsumexp(-1, keepdim=True)
    per_anchor = -_positives(log_prob, pos)
    return masked_mean(0.5 * (per_anchor[:, : n // 2] + per_anchor[:, n // 2:]), mask)


LOSSES = {"fedpcl": fedpcl, "supcon": supcon}
