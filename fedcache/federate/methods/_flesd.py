"""FLESD's pieces as plain functions: what a client sends (a similarity matrix over the public set,
dense or top-n%, optionally quantised), the server's ensemble (Eq. 5-6) and the ensemble similarity
distillation with a momentum encoder and a FIFO queue (Eq. 7-10). Equation numbers: Fan et al.,
"FLESD: Federated Self-Supervised Learning via Ensemble Similarity Distillation"."""
from __future__ import annotations

import numpy as np
import torch

from fedcache.federate.methods._simclr import embed, view_pair
from fedcache.heads import Params

INT8_SCALE = 127.0  # cosine similarities in [-1, 1] -> int8 codes in [-127, 127]


# ---- what travels ------------------------------------------------------------------------------
def quantise(s: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == "int8":
        return torch.round(s.clamp(-1, 1) * INT8_SCALE).to(torch.int8)
    return s.to(torch.float16 if precision == "float16" else torch.float32)


def dequantise(q: torch.Tensor) -> torch.Tensor:
    return q.float() / INT8_SCALE if q.dtype == torch.int8 else q.float()


def neighbours(p: int, top_percent: float) -> int:
    """Entries a sparse row carries besides the diagonal (self-similarity is 1, never sent)."""
    return max(1, min(p - 1, int(top_percent / 100 * p)))


def index_dtype(p: int) -> torch.dtype:
    return torch.int16 if p <= torch.iinfo(torch.int16).max + 1 else torch.int32


def encode(sims: torch.Tensor, top_percent: float, precision: str) -> Params:
    """(K, P, P) similarity matrices -> the uploads: dense {"sims"}, or per row the top-n% off-diagonal
    entries as {"values", "indices"} (the official code's top-n% filter, in a format that is actually smaller)."""
    if top_percent >= 100:
        return {"sims": quantise(sims, precision)}
    p = sims.shape[-1]
    off = sims.masked_fill(torch.eye(p, dtype=torch.bool), -torch.inf)
    values, idx = off.topk(neighbours(p, top_percent), dim=-1)
    return {"values": quantise(values, precision), "indices": idx.to(index_dtype(p))}


def decode(up: Params) -> tuple[torch.Tensor, torch.Tensor]:
    """Uploads -> (K, P, P) similarities and the (K, P, P) mask of entries known (sparse: the sent
    ones plus the diagonal)."""
    if "sims" in up:
        s = dequantise(up["sims"])
        return s, torch.ones_like(s, dtype=torch.bool)
    k, p, _ = up["values"].shape
    idx = up["indices"].long()
    s = torch.eye(p).expand(k, p, p).clone()
    s.scatter_(-1, idx, dequantise(up["values"]))
    known = torch.eye(p, dtype=torch.bool).expand(k, p, p).clone()
    known.scatter_(-1, idx, True)
    return s, known


# ---- server: ensemble (Eq. 5-6) -------------------------------------------------------------------
def ensemble(sims: torch.Tensor, known: torch.Tensor, t: float) -> torch.Tensor:
    """Eq. 5-6: sharpen each client's matrix, exp(s / T), and average over clients. Each row is
    shifted by its maximum first (as the official code does, against overflow at small T); the shift
    scales a row by a constant that Eq. 8's normalisation removes. Entries a client did not send
    weigh 0 in its term."""
    s = sims.masked_fill(~known, -torch.inf)
    return torch.exp((s - s.amax(-1, keepdim=True)) / t).mean(0)


# ---- server: similarity distillation (Eq. 7-9) ---------------------------------------------------
def targets(ens: torch.Tensor, rows: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Eq. 8: the target distribution of each query row over the anchors (the queue's rows)."""
    w = ens[rows][:, anchors]
    return w / w.sum(1, keepdim=True)


def student_logits(q: torch.Tensor, anchors: torch.Tensor, t: float) -> torch.Tensor:
    """Eq. 7 before the softmax: (B, O) unit queries against (A, O) unit anchor keys."""
    return q @ anchors.T / t


def distill_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. 9: mean over queries of KL(target || softmax(logits))."""
    logp = torch.log_softmax(logits, 1)
    return (torch.xlogy(target, target) - target * logp).sum(1).mean()


class Queue:
    """MoCo's FIFO queue of momentum-encoder keys and the public rows they encode."""

    def __init__(self, size: int, dim: int) -> None:
        self.keys = torch.zeros(size, dim)
        self.rows = torch.zeros(size, dtype=torch.long)
        self.ptr = self.seen = 0

    def push(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        n = len(keys)  # the queue size is a multiple of the batch size: a batch never wraps
        self.keys[self.ptr: self.ptr + n], self.rows[self.ptr: self.ptr + n] = keys, rows
        self.ptr, self.seen = (self.ptr + n) % len(self.keys), self.seen + n

    @property
    def full(self) -> bool:
        return self.seen >= len(self.keys)


def sizes(p: int, batch: int, queue: int) -> tuple[int, int]:
    """(batch, queue) that fit a public set of ``p`` rows: the queue a multiple of the batch and at most
    one epoch of batches (it cannot hold more distinct rows than there are)."""
    b = min(batch, p)
    return b, max(b, min(queue, (p // b) * b) // b * b)


def distil(enc: Params, ens: torch.Tensor, views: torch.Tensor, cfg, gen: torch.Generator) -> Params:
    """Train ``enc`` (one encoder, K = 1) to match the ensembled similarities ``ens`` over the public
    rows, whose augmented views are ``views`` (P, V, D). The student sees one view, the momentum
    encoder another (Eq. 10); loss steps start once the queue is full."""
    student = {n: t.clone().requires_grad_(True) for n, t in enc.items()}
    teacher = {n: t.clone() for n, t in enc.items()}
    opt = torch.optim.Adam(list(student.values()), lr=cfg.distill_lr)
    b, qsize = sizes(len(views), cfg.distill_batch, cfg.queue)
    queue, step = Queue(qsize, cfg.out), 0
    for _ in range(cfg.distill_epochs):
        perm = torch.randperm(len(views), generator=gen)
        for s in range(len(views) // b):  # drop_last, as the official loader
            rows = perm[s * b: (s + 1) * b]
            xa, xb = (views[rows, v].float()[None] for v in view_pair(step, views.shape[1]))
            step += 1
            with torch.no_grad():
                for n, t in teacher.items():  # Eq. 10, before encoding the keys (official order)
                    t.mul_(cfg.momentum).add_(student[n].detach(), alpha=1 - cfg.momentum)
                queue.push(embed(teacher, xb)[0], rows)
            if not queue.full:
                continue
            logits = student_logits(embed(student, xa)[0], queue.keys, cfg.target_t)
            loss = distill_loss(logits, targets(ens, rows, queue.rows))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {n: t.detach() for n, t in student.items()}


def public_rows(rows: np.ndarray, cap: int, seed: int) -> np.ndarray:
    """The public set: client 0's rows (official code), at most ``cap`` of them (seeded draw)."""
    if cap and len(rows) > cap:
        rows = np.random.default_rng(np.random.SeedSequence([seed, 13])).choice(rows, cap, replace=False)
    return np.sort(rows)
