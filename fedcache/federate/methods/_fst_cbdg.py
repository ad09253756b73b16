"""FST-CBDG's pieces (Yan & Guo, "Lightweight Unsupervised Federated Learning with Pretrained Vision
Language Model"), batched over K clients: pseudo-label moving average (Eq. 4), self-training loss
(Eq. 3), class-balanced synthetic counts (Eq. 7) and the Gaussian synthetic instances (Eq. 5)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedcache.federate.local import masked_mean, rng_for
from fedcache.heads.base import affine, bmm

SYNTHETIC_STREAM = 5  # rng stream of a client's synthetic instances in a round


def pseudo_counts(q: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """m_k: a client's rows whose pseudo-label argmax is k. q (K, n, C), valid (K, n) -> (K, C)."""
    hard = torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]) * valid.unsqueeze(-1)
    return hard.sum(1)


def balanced_counts(m: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. 7: m_k + n_k = (1 + gamma) m_{k*}, k* the client's largest pseudo-class; (K, C) -> (K, C)."""
    target = torch.round((1.0 + gamma) * m.max(-1, keepdim=True).values.double()).long()
    return (target - m).clamp_min(0)


def equal_counts(m: torch.Tensor, gamma: float) -> torch.Tensor:
    """Table 4's "equal sampling": as many synthetic instances in all as Eq. 7 asks for, but the same
    number for every class, whatever the client holds."""
    total = balanced_counts(m, gamma).sum(-1, keepdim=True)
    return torch.div(total + m.shape[-1] - 1, m.shape[-1], rounding_mode="floor").expand_as(m).clone()


SAMPLING = {"balanced": balanced_counts, "equal": equal_counts}


def ema(q: torch.Tensor, f: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 4: q^t = beta q^{t-1} + (1 - beta) f(z)."""
    return beta * q + (1.0 - beta) * f


def soft_cross_entropy(logits: torch.Tensor, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 3: -E_j[q_j . log f(z_j)] per client over the batch's real rows: (K, B, C) -> (K,)."""
    return masked_mean(-(q * torch.log_softmax(logits, -1)).sum(-1), mask)


@dataclass
class LocalPass:
    """What K clients carry through one local pass: pseudo-labels over their rows (updated in place),
    the step plan in positions of those rows, and one random stream per client for synthetic data."""

    q: torch.Tensor  # (K, n, C)
    pos: torch.Tensor  # (K, S, B) positions in each client's row list, -1 for padding
    valid: torch.Tensor  # (K, n) real positions
    x: RowPieces | None  # the clients' unit features, in pieces (refresh="all" only)
    gens: list[torch.Generator]

    @classmethod
    def start(cls, q: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor, x: RowPieces | None,
              gens: list[torch.Generator]) -> LocalPass:
        """A client starts its pass from its pseudo-labels q^{t-1} (Algorithm 1): a copy of the clients' state
        q (K, n_max, C), cut to the widest of these K clients (``valid``'s width)."""
        return cls(q[:, : valid.shape[1]].clone(), pos, valid, x, gens)

    def write_into(self, q: torch.Tensor) -> torch.Tensor:
        """The clients' pseudo-labels after the pass, to keep for their next round: the state ``q`` with this
        pass's q^t over its first columns."""
        out = q.clone()
        out[:, : self.q.shape[1]] = self.q
        return out

    def refresh(self, rows: str, s: int, params: dict[str, torch.Tensor], logits: torch.Tensor, mask: torch.Tensor,
                beta: float) -> None:
        """Eq. 4 at step s, q^t = beta q^{t-1} + (1 - beta) f(z): for every row of the client (Algorithm 1 line 14,
        "for each image", ``rows="all"``) with the current heads ``params``, or only for the step's mini-batch
        (``rows="batch"``) with the step's ``logits`` (K, B, C)."""
        REFRESH[rows](self, s, params, logits, mask, beta)

    @staticmethod
    def streams(seed: int, rnd: int, clients: list[int]) -> list[torch.Generator]:
        """Seeded per (run seed, round, client): a client draws the same instances alone or batched."""
        return [torch.Generator().manual_seed(int(rng_for(seed, rnd, k, 0, SYNTHETIC_STREAM).integers(2**62)))
                for k in clients]

    def batch_q(self, s: int) -> torch.Tensor:
        k = torch.arange(self.q.shape[0]).unsqueeze(1)
        return self.q[k, self.step_pos(s).clamp_min(0)]

    def step_pos(self, s: int) -> torch.Tensor:
        """Positions of step s, as wide as train()'s step."""
        return self.pos[:, s]

    def refresh_batch(self, s: int, f: torch.Tensor, mask: torch.Tensor, beta: float) -> None:
        """Eq. 4 for the step's rows only: f (K, B, C) the current model's probabilities on the batch."""
        k = torch.arange(self.q.shape[0]).unsqueeze(1).expand_as(mask)
        p = self.step_pos(s).clamp_min(0)
        new = ema(self.q[k, p], f, beta)
        self.q[k[mask], p[mask]] = new[mask]

    def refresh_all(self, params: dict[str, torch.Tensor], active: torch.Tensor, beta: float) -> None:
        """Eq. 4 for every row of the clients still training, with the current heads ``params``."""
        k, p, f = self.x.probabilities(params["weight"].detach(), params["bias"].detach(), active)
        self.q[k, p] = ema(self.q[k, p], f, beta)


WIDTHS = (256, 64)  # rows of a piece: a client's rows in pieces of 256, a small rest in pieces of 64


@dataclass
class Pieces:
    """Pieces of one width: (P, D, width) rows, transposed ((w^T x^T)^T is the faster layout: heads/base.py affine),
    their clients, and each row's position in its client's rows (-1: padding)."""

    xt: torch.Tensor
    owner: torch.Tensor
    at: torch.Tensor

    def active(self, active: torch.Tensor) -> "Pieces":
        """The pieces of the ``active`` clients: a prefix, as the pieces run from the client with the most rows
        (which trains the most steps) down, so a view."""
        take = active[self.owner]
        n = int(take.sum())
        if bool(take[:n].all()):
            return Pieces(self.xt[:n], self.owner[:n], self.at[:n])
        return Pieces(self.xt[take], self.owner[take], self.at[take])  # clients that stop otherwise (not in a pass)


@dataclass
class RowPieces:
    """K clients' rows (n_i, D) cut into pieces of WIDTHS, the last padded, laid out for a batched product per width
    with every client's own head. Client by client, its products were single ones that torch splits across threads
    (a run's numbers moved with --threads) and sized by the client (its bits by its size); padding every client to
    the largest would multiply the work (one Dirichlet client can hold 10x another's rows). A client's pieces
    depend on its size alone, so a run and its grid cell compute the same products."""

    groups: list[Pieces]

    @classmethod
    def of(cls, x: list[torch.Tensor]) -> RowPieces:
        """The pieces of the clients' rows ``x``, (n_i, D) each."""
        sizes = [len(r) for r in x]
        order = sorted(range(len(x)), key=lambda i: (-sizes[i], i))
        big, small = WIDTHS
        # Whole pieces of 256 but for a rest of 192 rows or fewer, in pieces of 64: never 64 rows of padding or
        # more (a piece of 64 computes a row at about 1.25x the cost of one of 256 with 100 classes).
        whole = [-(-n // big) if n % big > big - small else n // big for n in sizes]
        spans = {big: [(i, lo) for i in order for lo in range(0, whole[i] * big, big)],
                 small: [(i, lo) for i in order for lo in range(whole[i] * big, sizes[i], small)]}
        return cls([_pieces(spans[width], x, width) for width in WIDTHS])

    def probabilities(self, w: torch.Tensor, b: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """softmax(x W + b) of every row of the ``active`` clients (K,), each with its client's head ``w`` (K, D, C),
        ``b`` (K, 1, C): the rows' clients, their positions, and (R, C) probabilities (computed (P, C, width): a
        softmax along the last axis of the product's transpose took as long as the product)."""
        ks, ps, fs = [], [], []
        for group in self.groups:
            g = group.active(active)
            scores = bmm(w.transpose(1, 2)[g.owner], g.xt) + b.transpose(1, 2)[g.owner]
            f = torch.softmax(scores, 1).transpose(1, 2)
            real = g.at >= 0
            ks.append(g.owner.unsqueeze(1).expand_as(g.at)[real])
            ps.append(g.at[real])
            fs.append(f[real])
        return torch.cat(ks), torch.cat(ps), torch.cat(fs)


def _pieces(spans: list[tuple[int, int]], x: list[torch.Tensor], width: int) -> Pieces:
    """Pieces of ``width`` rows, (client, first row) each, from the clients' rows ``x``."""
    device, dim = torch.get_default_device(), x[0].shape[1] if x else 0
    xt = torch.zeros((len(spans), width, dim), device=device)
    at = torch.full((len(spans), width), -1, dtype=torch.long, device=device)
    for j, (i, lo) in enumerate(spans):
        n = min(width, len(x[i]) - lo)
        xt[j, :n] = x[i][lo:lo + n]
        at[j, :n] = torch.arange(lo, lo + n, device=device)
    owner = torch.tensor([i for i, _ in spans], dtype=torch.long, device=device)
    return Pieces(xt.transpose(1, 2), owner, at)


# Which rows Eq. 4 refreshes at each step (the ``refresh`` setting).
REFRESH = {
    "all": lambda lp, s, params, logits, mask, beta: lp.refresh_all(params, mask.any(1), beta),
    "batch": lambda lp, s, params, logits, mask, beta: lp.refresh_batch(s, torch.softmax(logits.detach(), -1), mask, beta),
}


def draw_classes(n: torch.Tensor, share: torch.Tensor, gens: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """The classes of one step's synthetic instances: client i draws its ``share[i]`` of the n_i of an
    epoch (stochastically rounded), classes in proportion to n_i. Returns y (K, P) and mask (K, P)."""
    draws = []
    n, share = n.cpu(), share.cpu()  # drawn on the clients' own (CPU) streams, whatever device the run is on
    for i, g in enumerate(gens):
        expected = float(n[i].sum()) * float(share[i])
        count = int(expected) + int(torch.rand((), generator=g, device=g.device) < expected - int(expected)) if expected > 0 else 0
        draws.append(torch.multinomial(n[i].double(), count, replacement=True, generator=g) if count else
                     torch.zeros(0, dtype=torch.long, device=g.device))
    p_max = max((len(y) for y in draws), default=0)
    y = torch.zeros(len(gens), p_max, dtype=torch.long)
    mask = torch.zeros(len(gens), p_max, dtype=torch.bool)
    for i, yi in enumerate(draws):
        y[i, : len(yi)], mask[i, : len(yi)] = yi, True
    return y, mask


def tsamp_loss(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, n: torch.Tensor, share: torch.Tensor,
               weighting: str) -> torch.Tensor:
    """One step's L_tSamp (Eq. 6) per client, (K, P, C) logits of the step's drawn instances -> (K,).

    A step draws its ``share`` (b / M of the client's rows) of the epoch's n = sum_k n_k instances, so
    the sum of their cross-entropies divided by ``share`` estimates the epoch's sum (Eq. 6 as written,
    ``sum``; every instance weighs lambda / share, against a real row's 1 / b). ``epoch`` divides by
    share * n instead, the epoch's mean; ``step`` by the step's own draws (each instance lambda / P_s,
    nothing on steps that draw none)."""
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    total = (ce * mask).sum(1)
    norm = TSAMP_NORM[weighting](mask, n.sum(1).to(total.dtype), share.to(total.dtype))
    return torch.where(norm > 0, total / norm.clamp_min(1e-30), torch.zeros_like(total))


TSAMP_NORM = {
    "sum": lambda mask, n, share: share,
    "epoch": lambda mask, n, share: share * n,
    "step": lambda mask, n, share: mask.sum(1).to(share.dtype),
}


def explicit_logits(p: dict[str, torch.Tensor], y: torch.Tensor, mask: torch.Tensor, anchors: torch.Tensor, sigma: float,
                    gens: list[torch.Generator]) -> torch.Tensor:
    """Eq. 5 as written: draw every instance z ~ N(T_y, sigma^2 I) (D numbers each), score it with the head."""
    z = torch.empty(*y.shape, anchors.shape[1])
    for i, g in enumerate(gens):
        k = int(mask[i].sum())
        # Drawn in place where the generator is (at sharding s=2 these are ~20M floats a round).
        noise = z[i, :k] if z.device == g.device else torch.empty(k, z.shape[-1], device=g.device)
        z[i, :k] = noise.normal_(generator=g).to(z.device).mul_(sigma).add_(anchors[y[i, :k]])
        z[i, k:] = 0.0
    return affine(p["weight"], p["bias"], z)


def implicit_logits(p: dict[str, torch.Tensor], y: torch.Tensor, mask: torch.Tensor, anchors: torch.Tensor, sigma: float,
                    gens: list[torch.Generator]) -> torch.Tensor:
    """The same logits and head gradients in distribution, without drawing any D-dimensional instance.

    A linear head sees z = T_y + sigma e only through W^T z = W^T T_y + sigma u with u = W^T e ~ N(0, W^T W),
    a C-dimensional draw. Its weight gradient sum_j z_j g_j^T needs e itself only through E G (D x C):
    split e into its part in span(W), which u fixes (W (W^T W)^+ u), and the orthogonal rest, which is
    independent of u and enters as Pi N L with N a D x C standard normal matrix, Pi the projection off
    span(W) and L the symmetric square root of G^T G (L symmetric is what makes Pi N L's covariance
    (G^T G) kron Pi; G^T G is singular, softmax gradients summing to zero, so no Cholesky factor).
    So each instance costs C random numbers instead of D, plus D x C per client and step
    (docs/methods/fst-cbdg.md, "Drawing the synthetic instances")."""
    return _ImplicitGaussian.apply(p["weight"], p["bias"], y, mask, anchors, sigma, gens)


class _ImplicitGaussian(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, b, y, mask, anchors, sigma, gens):
        # W^T W and the C x C algebra run in float64 (W^T W of correlated anchors is ill-conditioned, and a
        # float32 Gram made the projection off span(W) visibly non-idempotent); the other products with D
        # rows and the draws stay float32 (torch's vectorised sampler; float64 draws took 4x as long).
        wd = w.double()
        root, pinv = _root_and_pinv(bmm(wd.transpose(1, 2), wd))  # of W^T W, (K, C, C)
        u = torch.zeros(*y.shape, w.shape[2], dtype=torch.float64)
        for i, g in enumerate(gens):
            k = int(mask[i].sum())
            if k and sigma:
                u[i, :k] = torch.randn(k, w.shape[2], generator=g, device=g.device).to(u.device).double() @ root[i]  # root is symmetric
        # W^T T_c for every class, (K, C_anchor, C): K products, not einsum's one of K C columns, which torch
        # splits across threads (a run's numbers moved with --threads)
        base = bmm(anchors.expand(len(w), *anchors.shape), w)
        # Padding rows score b, as a zero instance does in the explicit draws.
        logits = base.gather(1, y.unsqueeze(-1).expand(-1, -1, w.shape[2])) * mask.unsqueeze(-1) + b + (sigma * u).float()
        ctx.save_for_backward(w, y, mask, anchors, u, pinv)
        ctx.sigma, ctx.gens = sigma, gens
        return logits

    @staticmethod
    def backward(ctx, g):
        w, y, mask, anchors, u, pinv = ctx.saved_tensors
        onehot = torch.nn.functional.one_hot(y, anchors.shape[0]).to(g.dtype) * mask.unsqueeze(-1)
        grad_w = bmm(anchors.T.expand(len(w), *anchors.T.shape), bmm(onehot.transpose(1, 2), g))  # sum_j T_{y_j} g_j^T
        if ctx.sigma:
            # Padding rows carry no instance: their gradients must not enter G^T G (a masked loss gives
            # them zero anyway; this keeps the function right for any loss).
            real_g = (g * mask.unsqueeze(-1)).double()
            grad_w = grad_w + ctx.sigma * _noise_part(w, real_g, u, pinv, mask, ctx.gens)
        return grad_w.contiguous(), g.sum(1, keepdim=True), None, None, None, None, None


def _noise_part(w, g, u, pinv, mask, gens) -> torch.Tensor:
    """E G for E (D x P) the instances' noise (see implicit_logits): its part in span(W), W (W^T W)^+ U^T G,
    plus Pi N L = (N - W (W^T W)^+ W^T N) L, with L the symmetric root of G^T G. Grouped as
    W A + N L so that only three products have D rows."""
    root_gg, _ = _root_and_pinv(bmm(g.transpose(1, 2), g))
    n = torch.zeros_like(w)
    for i, gen in enumerate(gens):
        if mask[i].any():
            n[i] = torch.randn(w.shape[1], w.shape[2], generator=gen, device=gen.device)
    a = bmm(pinv, bmm(u.transpose(1, 2), g) - bmm(bmm(w.transpose(1, 2), n).double(), root_gg))
    return bmm(w, a.float(), bmm(n, root_gg.float()))


def _root_and_pinv(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For symmetric positive semi-definite (K, C, C) m: its symmetric square root R (R R^T = m) and its
    pseudo-inverse. The symmetric root, unlike V sqrt(L) alone, does not depend on how eigh picks
    eigenvectors of (nearly) equal eigenvalues, so the batched and per-client paths draw the same."""
    vals, vecs = torch.linalg.eigh(m)
    keep = vals > vals.amax(-1, keepdim=True).clamp_min(1e-300) * 1e-12
    vals = vals.clamp_min(0.0)
    root = (vecs * vals.sqrt().unsqueeze(-2)) @ vecs.transpose(1, 2)
    inv = torch.where(keep, 1.0 / torch.where(keep, vals, torch.ones_like(vals)), torch.zeros_like(vals))
    return root, (vecs * inv.unsqueeze(-2)) @ vecs.transpose(1, 2)


SYNTHETIC = {"implicit": implicit_logits, "explicit": explicit_logits}
