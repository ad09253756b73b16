"""Heads are small trainable modules written for a leading *client* axis.

Every parameter has shape (K, ...): K clients' heads are trained in one batched computation
(``torch.bmm``), and the per-client loop is the same code with K = 1. A head is functional:
parameters live in a dict of tensors, so methods can average, copy, freeze or send any part
of them, and the round loop can count exactly what travels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from fedcache.registry import Registry

Params = dict[str, torch.Tensor]


class Head(Protocol):
    """``features`` is the representation (what prototypes live in); ``classify`` maps it to logits.

    A head never writes into the parameters it is given: ``train_features`` (a training step's forward
    pass, with batch statistics) returns the new values of its buffers (BatchNorm running statistics)
    beside the representation, and whoever trains decides where they go."""

    name: str
    body_keys: tuple[str, ...]  # the representation's parameters (FedRep shares these)
    head_keys: tuple[str, ...]  # the classifier's parameters (FedRep keeps these personal)
    buffer_keys: tuple[str, ...]  # non-trainable state (BatchNorm running statistics)
    feature_dim: int

    # A head may also list its parameters, ``layout() -> list[Param]``, and build ``init`` from them with
    # ``init_params``: any one client's initial head can then be made without every client's (heads/draws.py).

    def init(self, k: int, gen: torch.Generator) -> Params: ...

    def features(self, p: Params, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor: ...

    def train_features(self, p: Params, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Params]:
        """(K, B, D) rows, ``mask`` (K, B) True for real rows -> (representation, new buffers; {} if none)."""
        ...

    def classify(self, p: Params, z: torch.Tensor) -> torch.Tensor: ...


# With few outputs MKL's batched GEMM runs z @ W (K, n, D) x (K, D, C) slowly and (W^T z^T)^T is faster
# (docs/performance.md, "Few-class layout"; `benchmarks/rounds.py --plain-affine` runs the other layout).
FEW_CLASSES = 10


def bmm(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """``add + a @ b`` for (K, n, m) x (K, m, p) (torch.baddbmm, or torch.bmm without ``add``), the same bits at
    one and two threads (at more, MKL may split a product of a small batch too). On the CPU torch gives each of
    K >= 2 products whole to one thread, but splits a single
    product (K = 1: a round's one client, a pooled head, a run's server state) across its threads, which sums
    in another order: a run's numbers changed with --threads (by six points over 60 rounds of one client each)
    and a run was not its stacked grid cell. One product is computed as the first of two (the same arithmetic
    as one thread's; the second is discarded, and its gradient is zero), or, large and without a gradient, in
    pieces as one batch (below)."""
    if a.device.type != "cpu":
        return _batched(a, b, add)
    if a.numel() and b.numel() and _no_gradient(a, b, add) and _worth_cutting(a, b):
        if add is not None and add.dim() < 3:  # broadcast as torch does: leading dims of one
            add = add.reshape((1,) * (3 - add.dim()) + tuple(add.shape))
        return _in_chunks(a, b, add)
    return _single(a, b, add) if a.shape[0] == 1 else _batched(a, b, add)


def _of(k: int, a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None) -> tuple:
    """Product ``k`` of a stack: its operands, and its addend where the addend has one per product."""
    return a[k:k + 1], b[k:k + 1], add[k:k + 1] if add is not None and add.shape[0] > 1 else add


def _single(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    # One thread's single product is the first of two's arithmetic, except a matrix-vector one (one row or column)
    if torch.get_num_threads() > 1 or 1 in (a.shape[1], b.shape[2]):
        return _batched(*(_twice(t) for t in (a, b, add)))[:1]
    return _batched(a, b, add)


# A large product without a gradient (evaluation over a test split, 50,000 rows at a time) is cut into CHUNK-row
# (or -column) pieces computed as one batch: one piece per thread, as fast as torch's split product and the same
# bits at one and two threads. Stacked (K >= 2: a grid's cells, a round's clients) each product is cut alone, so that
# a run and its stacked cell compute the very same pieces: a row's bits can depend on the size of the product
# that holds it (MKL's kernel for a block of the last few rows). A gradient is not cut: a weight's is a sum over
# rows, and over pieces it would sum in another order.
CHUNK = 256
PIECE_WORK = 2 ** 16  # multiply-adds a piece must hold to be worth its own product (256 rows x 256 of m x p)


def _worth_cutting(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a product is long enough to cut (1,024 rows or columns) and its pieces are not all overhead: a tall
    product of few columns on a small inner size (fst-cbdg's (D, C) x (C, C) algebra, 1,280 x 10 x 10) costs more
    cut into pieces than whole."""
    n, m, p = a.shape[1], a.shape[2], b.shape[2]
    return max(n, p) >= 4 * CHUNK and CHUNK * m * (p if n >= p else n) >= PIECE_WORK


def _no_gradient(*tensors: torch.Tensor | None) -> bool:
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors)


def _in_chunks(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    """(K, n, m) x (K, m, p) with rows of ``a`` in pieces if n is the larger side, else columns of ``b``, each
    product's pieces a batch. The rows left over come from a last whole piece of each, its last CHUNK rows (a
    single left-over row alone would be a matrix-vector product, summed in another order), all K of them one
    product or a batch, like any product."""
    dim = 1 if a.shape[1] >= b.shape[2] else 2
    size = (a if dim == 1 else b).shape[dim]
    whole = size // CHUNK * CHUNK
    pieces = _row_pieces if dim == 1 else _column_pieces
    out = torch.cat([pieces(*_span(*_of(k, a, b, add), dim, 0, whole)) for k in range(a.shape[0])])
    if whole == size:
        return out
    last = _span(a, b, add, dim, size - CHUNK, size)
    last = _single(*last) if a.shape[0] == 1 else _batched(*last)
    return torch.cat([out, last.narrow(dim, CHUNK - (size - whole), size - whole)], dim)


def _span(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None, dim: int, start: int, stop: int) -> tuple:
    """The operands of the output's rows (dim 1) or columns (dim 2) from ``start`` to ``stop``."""
    size = (a if dim == 1 else b).shape[dim]

    def cut(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or t.dim() < 3 or t.shape[dim] != size else t.narrow(dim, start, stop - start)
    return (cut(a), b, cut(add)) if dim == 1 else (a, cut(b), cut(add))


def _row_pieces(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    k = a.shape[1] // CHUNK
    out = _batched(a.reshape(k, CHUNK, -1), b.expand(k, *b.shape[1:]), _split(add, 1, k))
    return out.reshape(1, -1, out.shape[-1])


def _column_pieces(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    k = b.shape[2] // CHUNK
    out = _batched(a.expand(k, *a.shape[1:]), b[0].reshape(b.shape[1], k, CHUNK).transpose(0, 1), _split(add, 2, k))
    return out.transpose(0, 1).reshape(1, out.shape[1], -1)


def _split(add: torch.Tensor | None, dim: int, k: int) -> torch.Tensor | None:
    """A (1, n, p) addend cut like the product: its pieces along ``dim`` become the batch."""
    if add is None or add.dim() < 3 or add.shape[dim] == 1:
        return add
    return add[0].reshape(*add.shape[1:dim], k, CHUNK, *add.shape[dim + 1:]).movedim(dim - 1, 0)


def _batched(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    return torch.bmm(a, b) if add is None else torch.baddbmm(add, a, b)


def _twice(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.expand(2, *t.shape[1:]) if t is not None and t.dim() == 3 else t  # a lower-rank add broadcasts


def affine(weight: torch.Tensor, bias: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """z W + b for K stacked layers: (K, n, D) -> (K, n, C), in the faster layout for C."""
    if weight.shape[-1] > FEW_CLASSES:
        return bmm(z, weight, bias)
    return transposed_affine(weight, bias, z)


def transposed_affine(weight: torch.Tensor, bias: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """z W + b computed as (W^T z^T)^T + b; the same values, and a weight gradient that autograd lays
    out transposed (any consumer that needs a layout makes its own copy)."""
    return bmm(weight.transpose(1, 2), z.transpose(1, 2)).transpose(1, 2) + bias


def forward(head: Head, p: Params, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return head.classify(p, head.features(p, x, mask))


def train_forward(head: Head, p: Params, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Params]:
    """A training step's logits and the head's new buffers."""
    z, buffers = head.train_features(p, x, mask)
    return head.classify(p, z), buffers


@dataclass(frozen=True)
class HeadSpec:
    name: str
    description: str
    build: type  # called as build(d_in, n_classes, **options)


HEADS: Registry[HeadSpec] = Registry("head")


def make_head(name: str, d_in: int, n_classes: int) -> Head:
    return HEADS.get(name).build(d_in, n_classes)


def uniform_init(shape: tuple[int, ...], fan_in: int, gen: torch.Generator) -> torch.Tensor:
    """PyTorch's default Linear init (Kaiming-uniform with a=sqrt(5)), reproducible from ``gen``."""
    bound = 1.0 / fan_in**0.5
    # Drawn where the generator is, then moved: a run on a GPU starts from the CPU run's very weights. Scaled in place:
    # the same floats as (u * 2 - 1) * bound without two more tensors of every client's draws.
    u = torch.rand(shape, generator=gen, device=gen.device)
    return u.mul_(2).sub_(1).mul_(bound).to(torch.get_default_device())


@dataclass(frozen=True)
class Param:
    """One of a head's parameters: one client's shape, drawn by ``uniform_init`` with ``fan_in`` when it has one,
    else filled with ``fill``."""
    name: str
    shape: tuple[int, ...]
    fan_in: int | None = None
    fill: float = 0.0


def init_params(layout: list[Param], k: int, gen: torch.Generator) -> Params:
    """K clients' parameters, each drawn tensor for all K at once, in the layout's order."""
    return {p.name: uniform_init((k, *p.shape), p.fan_in, gen) if p.fan_in else torch.full((k, *p.shape), p.fill)
            for p in layout}


def stack(states: list[Params]) -> Params:
    return {k: torch.stack([s[k] for s in states]) for k in states[0]} if states else {}


def unstack(p: Params, k: int) -> list[Params]:
    return [{name: t[i].clone() for name, t in p.items()} for i in range(k)]


def expand(p: Params, k: int) -> Params:
    """One set of parameters (leading axis 1) copied for K clients."""
    return {name: t.expand(k, *t.shape[1:]).clone() for name, t in p.items()}


def as_rows(p: Params, k: int) -> Params:
    """One set of parameters (leading axis 1, or already K) seen as K rows, without copying: for reading only."""
    return {name: t.expand(k, *t.shape[1:]) for name, t in p.items()}
