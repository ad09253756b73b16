"""Accuracy per client and the fairness figures FedPCL reports (worst / best fractions, variance)."""
from __future__ import annotations

import math

import numpy as np


# The shares of clients FedPCL's fairness tables average over: (key, fraction, the best ones rather than the worst).
SHARES = (("worst10", 0.1, False), ("worst20", 0.2, False), ("worst40", 0.4, False), ("best10", 0.1, True))


def share_size(fraction: float, n: int) -> int:
    """How many of ``n`` clients a share holds: rounded up, at least one."""
    return max(1, math.ceil(fraction * n))


def fairness(per_client: np.ndarray) -> dict[str, float]:
    """Mean of the worst 10/20/40% and best 10% of clients (at least one client each), and variance."""
    acc = np.sort(np.asarray(per_client, dtype=np.float64))
    k = {key: share_size(frac, len(acc)) for key, frac, _ in SHARES}
    means = {key: float(acc[-k[key]:].mean() if best else acc[:k[key]].mean()) for key, _, best in SHARES}
    return {**means, "variance": float(acc.var())}


def summarize(per_client: np.ndarray) -> dict[str, float]:
    acc = np.asarray(per_client, dtype=np.float64)
    return {"mean_accuracy": float(acc.mean()), "std_accuracy": float(acc.std()), **fairness(acc)}
