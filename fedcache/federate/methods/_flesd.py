"""FLESD's pieces as plain functions: what a client sends (the representations of the public set, as
the paper's Eq. 11 and the official code, or a similarity matrix over it, dense or top-n%), the
server's ensemble (Eq. 4-6) and the ensemble similarity distillation with a momentum encoder and a
FIFO queue (Eq. 7-10). Equation numbers: Shi et al., "Towards Communication-Efficient and
Privacy-Preserving Federated Representation Learning" (arXiv:2109.14611 v2)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.federate.methods._simclr import embed, view_pair
from fedcache.heads import Params
from fedcache.heads.base import bmm

INT8_SCALE = 127.0  # cosines and unit-vector components lie in [-1, 1] -> int8 codes in [-127, 127]
TIE = 1e-6  # the official top-n% filter keeps every entry within this of the row's k-th largest


# ---- what travels ------------------------------------------------------------------------------
def quantise(s: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == "int8":
        return torch.round(s.clamp(-1, 1) * INT8_SCALE).to(torch.int8)
    return s.to(torch.float16 if precision == "float16" else torch.float32)


def dequantise(q: torch.Tensor) -> torch.Tensor:
    return q.float() / INT8_SCALE if q.dtype == torch.int8 else q.float()


def kept_per_row(p: int, top_percent: float) -> int:
    """Entries a top-n% row keeps, the diagonal included: int(n / 100 * P) + 1 (official code)."""
    return min(p, int(top_percent / 100 * p) + 1)


def index_dtype(p: int) -> torch.dtype:
    return torch.int16 if p <= torch.iinfo(torch.int16).max + 1 else torch.int32


def encode(z: torch.Tensor, upload: str, top_percent: float, precision: str) -> Params:
    """(K, P, O) unit representations of the public set -> what the K clients send.

    ``representations``: Z itself (the paper's Eq. 11 and the official code; the server forms Z Z^T).
    ``similarities``: M = Z Z^T (Eq. 4), the whole P x P matrix or, with ``top_percent`` < 100, each
    row's kept_per_row - 1 largest off-diagonal entries with their column indices."""
    if upload == "representations":
        return {"reps": quantise(z, precision)}
    sims = bmm(z, z.transpose(1, 2))
    if top_percent >= 100:
        return {"sims": quantise(sims, precision)}
    p = sims.shape[-1]
    off = sims.masked_fill(torch.eye(p, dtype=torch.bool), -torch.inf)
    values, idx = off.topk(max(1, kept_per_row(p, top_percent) - 1), dim=-1)
    return {"values": quantise(values, precision), "indices": idx.to(index_dtype(p))}


def client_matrices(up: Params, top_percent: float):
    """Per client, (its P x P similarities, the mask of entries it contributes) as the server sees them."""
    if "reps" in up:
        for z in dequantise(up["reps"]):
            yield top_filter(server_similarities(z), top_percent), None
    elif "sims" in up:
        yield from ((dequantise(s), None) for s in up["sims"])
    else:
        p = up["values"].shape[1]
        for v, idx in zip(up["values"], up["indices"].long()):
            s = torch.eye(p).scatter_(-1, idx, dequantise(v))
            yield s, torch.eye(p, dtype=torch.bool).scatter_(-1, idx, True)


def server_similarities(z: torch.Tensor) -> torch.Tensor:
    """Eq. 4 on the server: normalise the received representations (P, O) and form Z Z^T."""
    z = F.normalize(z, dim=-1)
    return z @ z.T


def top_filter(s: torch.Tensor, top_percent: float) -> torch.Tensor:
    """The official code's top-n% filter: each row keeps its kept_per_row largest entries (ties within
    TIE of the k-th included) and the others become similarity 0 (which still weigh exp(-max / T) in
    the ensemble, as there)."""
    if top_percent >= 100:
        return s
    kth = s.topk(kept_per_row(s.shape[-1], top_percent), dim=-1).values[:, -1:]
    return torch.where(s > kth - TIE, s, torch.zeros_like(s))


# ---- server: ensemble (Eq. 5-6) -------------------------------------------------------------------
def sharpen(s: torch.Tensor, known: torch.Tensor | None, t: float) -> torch.Tensor:
    """Eq. 5: exp(s / T), each row shifted by its maximum first (as the official code does, against
    overflow at small T; the shift scales a row by a constant that Eq. 8's normalisation removes).
    Entries outside ``known`` (not sent) weigh 0."""
    if known is not None:
        s = s.masked_fill(~known, -torch.inf)
    return torch.exp((s - s.amax(-1, keepdim=True)) / t)


def ensemble(matrices, t: float) -> torch.Tensor:
    """Eq. 6: the mean over clients of their sharpened matrices, one P x P matrix at a time."""
    total, n = None, 0
    for s, known in matrices:
        e = sharpen(s, known, t)
        total, n = (e if total is None else total.add_(e)), n + 1
    return total / n


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
    """(batch, queue) that fit a public set of ``p`` rows: the queue a multiple of the batch (the official
    code asserts it) and at most one epoch of batches (it cannot hold more distinct rows than there are)."""
    b = min(batch, p)
    return b, max(b, min(queue, (p // b) * b) // b * b)


def trains_nothing(p: int, batch: int, queue: int, warmup: str) -> bool:
    """With the official per-epoch warm-up, a queue that takes every step of an epoch to fill leaves no
    step that trains (the official code then returns the encoder unchanged, and so does distil)."""
    b, q = sizes(p, batch, queue)
    return warmup == "epoch" and q // b >= p // b


def ema(teacher: Params, student: Params, m: float) -> None:
    """Eq. 10: theta_k <- m theta_k + (1 - m) theta_q, in place."""
    for n, t in teacher.items():
        t.mul_(m).add_(student[n].detach(), alpha=1 - m)


def warming(warmup: str, queue: Queue, step_in_epoch: int, batch: int) -> bool:
    """Whether this step only fills the queue. ``epoch`` (official code): the first K / B steps of every
    epoch; ``round``: until the queue first holds K real keys."""
    if warmup == "epoch":
        return step_in_epoch < len(queue.keys) // batch
    return not queue.full


def distil(enc: Params, ens: torch.Tensor, views: torch.Tensor, cfg, gen: torch.Generator) -> Params:
    """Train ``enc`` (one encoder, K = 1) to match the ensembled similarities ``ens`` over the public
    rows, whose augmented views are ``views`` (P, V, D). The student sees one view, the momentum
    encoder another (Eq. 10); Adam with L2 weight decay ``distill_wd`` as the official code."""
    student = {n: t.clone().requires_grad_(True) for n, t in enc.items()}
    teacher = {n: t.clone() for n, t in enc.items()}
    opt = torch.optim.Adam(list(student.values()), lr=cfg.distill_lr, weight_decay=cfg.distill_wd)
    b, qsize = sizes(len(views), cfg.distill_batch, cfg.queue)
    queue, step = Queue(qsize, cfg.out), 0
    for _ in range(cfg.distill_epochs):
        perm = torch.randperm(len(views), generator=gen, device=gen.device)
        for s in range(len(views) // b):  # drop_last, as the official loader
            rows = perm[s * b: (s + 1) * b]
            xa, xb = (views[rows, v].float()[None] for v in view_pair(step, views.shape[1]))
            step += 1
            with torch.no_grad():
                ema(teacher, student, cfg.momentum)  # before encoding the keys (official order)
                queue.push(embed(teacher, xb)[0], rows)
            if warming(cfg.queue_warmup, queue, s, b):
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
