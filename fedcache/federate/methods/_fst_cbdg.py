"""FST-CBDG's pieces (Yan & Guo, "Lightweight Unsupervised Federated Learning with Pretrained Vision
Language Model"), batched over K clients: pseudo-label moving average (Eq. 4), self-training loss
(Eq. 3), class-balanced synthetic counts (Eq. 7) and the Gaussian synthetic instances (Eq. 5)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedcache.federate.local import masked_mean, rng_for, trim_padding

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
    x: list[torch.Tensor] | None  # per client, unit features of its rows (n_i, D) (refresh="all" only)
    gens: list[torch.Generator]

    @staticmethod
    def streams(seed: int, rnd: int, clients: list[int]) -> list[torch.Generator]:
        """Seeded per (run seed, round, client): a client draws the same instances alone or batched."""
        return [torch.Generator().manual_seed(int(rng_for(seed, rnd, k, 0, SYNTHETIC_STREAM).integers(2**62)))
                for k in clients]

    def batch_q(self, s: int) -> torch.Tensor:
        k = torch.arange(self.q.shape[0]).unsqueeze(1)
        return self.q[k, self.step_pos(s).clamp_min(0)]

    def step_pos(self, s: int) -> torch.Tensor:
        """Positions of step s, trimmed exactly as train() trims the step's rows."""
        return trim_padding(self.pos[:, s])

    def refresh_batch(self, s: int, f: torch.Tensor, mask: torch.Tensor, beta: float) -> None:
        """Eq. 4 for the step's rows only: f (K, B, C) the current model's probabilities on the batch."""
        k = torch.arange(self.q.shape[0]).unsqueeze(1).expand_as(mask)
        p = self.step_pos(s).clamp_min(0)
        new = ema(self.q[k, p], f, beta)
        self.q[k[mask], p[mask]] = new[mask]

    def refresh_all(self, params: dict[str, torch.Tensor], active: torch.Tensor, beta: float) -> None:
        """Eq. 4 for every row of the clients still training, with the current heads ``params``.

        Client by client over its real rows only: with Dirichlet partitions one client can hold 10x
        the rows of another, and padding them all to the largest would multiply the work."""
        w, b = params["weight"].detach(), params["bias"].detach()
        for i in active.nonzero().flatten().tolist():
            x = self.x[i]
            f = torch.softmax((w[i].T @ x.T).T + b[i], -1)  # (w^T x^T)^T: see _clip.linear_logits
            self.q[i, : len(x)] = ema(self.q[i, : len(x)], f, beta)


def draw_synthetic(n: torch.Tensor, share: torch.Tensor, anchors: torch.Tensor, sigma: float,
                   gens: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 5 for one step: client i draws its ``share[i]`` of the n_i synthetic instances of an epoch
    (stochastically rounded), classes in proportion to n_i, features N(T_k, sigma^2 I).
    Returns (z (K, P, D), y (K, P), mask (K, P)); clients with share 0 draw nothing."""
    draws = []
    for i, g in enumerate(gens):
        expected = float(n[i].sum()) * float(share[i])
        if expected <= 0:
            draws.append(torch.zeros(0, dtype=torch.long))
            continue
        count = int(expected) + int(torch.rand((), generator=g) < expected - int(expected))
        draws.append(torch.multinomial(n[i].double(), count, replacement=True, generator=g) if count else
                     torch.zeros(0, dtype=torch.long))
    p_max = max((len(y) for y in draws), default=0)
    z = torch.empty(len(gens), p_max, anchors.shape[1])
    y = torch.zeros(len(gens), p_max, dtype=torch.long)
    mask = torch.zeros(len(gens), p_max, dtype=torch.bool)
    for i, (g, yi) in enumerate(zip(gens, draws)):
        k = len(yi)
        # Drawn in place: at sharding s=2 these are ~20M floats a round, the method's largest cost.
        z[i, :k].normal_(generator=g).mul_(sigma).add_(anchors[yi])
        z[i, k:] = 0.0
        y[i, :k], mask[i, :k] = yi, True
    return z, y, mask
