"""Which backbone a fused FedPCL client leans on (FedPCL Figure 4): prototype similarity, measured.

For every client, the cosine similarity between its local prototypes when FedPCL runs on one
backbone alone and when it runs on all of them fused, averaged over the classes both hold, then
normalised so a client's row sums to 1. As in the paper, the single- and multi-backbone
projections are trained separately, so the score compares two learned spaces: read it as the
paper's diagnostic, not as an attribution method.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedcache.partitioning import said_once
from fedcache.training import train
from fedcache.spec import RunSpec


@dataclass
class Contribution:
    scores: np.ndarray  # (clients, backbones), rows sum to 1
    clients: list[str]
    backbones: list[str]


@said_once()  # its runs' partition warnings said once, not by each run
def backbone_contribution(cfg: RunSpec) -> Contribution:
    cfg = cfg.replace(method="fedpcl", out=None, resume=False)
    fused = train(cfg)
    cols = []
    for b in cfg.data.backbones:
        single = train(cfg.replace(backbones=[b]))
        cols.append(_similarity(single.clients, fused.clients))
    scores = np.stack(cols, axis=1)
    scores = scores / np.clip(scores.sum(1, keepdims=True), 1e-12, None)
    return Contribution(scores, _client_names(cfg), list(cfg.data.backbones))


def _similarity(a: dict, b: dict) -> np.ndarray:
    both = (a["proto_count"] > 0) & (b["proto_count"] > 0)
    cos = torch.nn.functional.cosine_similarity(a["protos"], b["protos"], dim=-1)
    return ((cos * both).sum(1) / both.sum(1).clamp_min(1)).numpy()


def _client_names(cfg: RunSpec) -> list[str]:
    from fedcache.partitioning import partition_only

    part, _, train = partition_only(cfg)  # the clients' domains: the features are not read
    names = []
    for k, rows in enumerate(part.train):
        doms = sorted({train.domain_names[d] for d in train.domains[rows]})
        names.append(f"{k}: {doms[0]}" if len(doms) == 1 and len(train.domain_names) > 1 else f"client {k}")
    return names
