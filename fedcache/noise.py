"""Seeded noise for the privacy studies (FedPCL Table 15): on prototypes and on images.

Both kinds are built from ``torch.rand`` on the seeded generator, whose documented range is [0, 1):
every logarithm below is ``log1p(-u)`` of such a ``u``, whose argument ``1 - u`` is never 0, so no draw
can be infinite. The uniforms are float64, so the tails reach about 36 s (Laplace) and 8.6 sigma
(Gaussian) before the result is cast to float32.
"""
from __future__ import annotations

import math

import torch

from fedcache.errors import ConfigError

KINDS = ("gaussian", "laplace")


def _uniform(shape, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(tuple(shape), generator=gen, dtype=torch.float64, device=gen.device)


def _laplace(shape, gen: torch.Generator) -> torch.Tensor:
    """Laplace(0, 1) from one uniform u in [0, 1): its half picks the sign, its position within the half
    (rescaled to [0, 1), exactly in floating point) the Exp(1) magnitude -log(1 - v)."""
    u = _uniform(shape, gen)
    upper = u >= 0.5
    v = 2 * u - upper.double()
    return torch.where(upper, 1.0, -1.0).double() * -torch.log1p(-v)


def _gaussian(shape, gen: torch.Generator) -> torch.Tensor:
    """N(0, 1) by Box-Muller, radius sqrt(-2 log(1 - u1)) with u1 in [0, 1)."""
    u = _uniform((2, *shape), gen)
    return torch.sqrt(-2 * torch.log1p(-u[0])) * torch.cos(2 * math.pi * u[1])


_SAMPLERS = {"gaussian": _gaussian, "laplace": _laplace}


def sample_noise(kind: str, shape, scale: float, gen: torch.Generator) -> torch.Tensor:
    """Gaussian N(0, s^2) or Laplace(0, s) as float32, finite, reproducible from ``gen``."""
    if kind not in _SAMPLERS:
        raise ConfigError(f"noise must be one of {', '.join(KINDS)}, got {kind!r}")
    return (scale * _SAMPLERS[kind](shape, gen)).float()


def perturb(x: torch.Tensor, kind: str, scale: float, p: float, gen: torch.Generator) -> torch.Tensor:
    """(1 - p) x + e: the form of the FedPCL code's add_noise_img / add_noise_proto."""
    return (1 - p) * x + sample_noise(kind, x.shape, scale, gen).to(x.device, x.dtype)
