"""Tune on validation, then test once: the choice of hyperparameters for `fedcache grid --select`.

A grid's validation cells are scored; for every method and every value of the settings that are not
being selected (alpha, say), the values of the selected settings (lr, say) with the best mean validation
score over seeds are chosen, and only those are run on the test split. Choosing on the test split would
report an optimistic number: the test split is read once, for the chosen values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcache.errors import ConfigError

RULE = "the highest mean over seeds of the validation score; ties go to the value listed first"


@dataclass(frozen=True)
class Choice:
    method: str
    fixed: tuple[tuple[str, str], ...]  # the group: settings not selected
    chosen: tuple[tuple[str, str], ...]  # the selected settings' chosen values
    score: float  # mean validation score over seeds of the chosen values
    candidates: tuple[tuple[tuple[tuple[str, str], ...], float], ...]  # every value tried and its score


def choose(rows: list[dict], setting_keys: list[str], select: list[str], metric: str = "mean_accuracy") -> list[Choice]:
    """``rows``: one per validation cell, with ``method``, ``seed``, ``metric`` and each key of
    ``setting_keys`` (the grid's axes, in order). Returns one Choice per (method, other settings)."""
    unknown = [k for k in select if k not in setting_keys]
    if unknown:
        raise ConfigError(f"--select {','.join(unknown)}: not an axis of this grid (axes: {', '.join(setting_keys) or 'none'}); "
                          "give the values to choose from as an axis, e.g. --set lr=1e-3,1e-2 --select lr")
    others = [k for k in setting_keys if k not in select]
    scores: dict[tuple, dict[tuple, list[float]]] = {}
    for r in rows:
        group = (r["method"], tuple((k, str(r[k])) for k in others))
        value = tuple((k, str(r[k])) for k in select)
        if r.get(metric) is not None:
            scores.setdefault(group, {}).setdefault(value, []).append(float(r[metric]))
    choices = []
    for (method, fixed), by_value in scores.items():
        means = [(value, float(np.mean(v))) for value, v in by_value.items()]
        best = max(means, key=lambda vm: vm[1])  # max keeps the first of equal scores: the value listed first
        choices.append(Choice(method, fixed, best[0], best[1], tuple(means)))
    return choices
