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

RULE = ("the highest mean over seeds of the validation score; ties go to the value listed first; "
        "a value that diverged on any seed is not chosen")


@dataclass(frozen=True)
class Choice:
    method: str
    fixed: tuple[tuple[str, str], ...]  # the group: settings not selected
    chosen: tuple[tuple[str, str], ...]  # the selected settings' chosen values
    score: float  # mean validation score over seeds of the chosen values
    candidates: tuple[tuple[tuple[tuple[str, str], ...], float | None], ...]  # every value tried, its score (None: diverged)


def choose(rows: list[dict], setting_keys: list[str], select: list[str], metric: str = "mean_accuracy") -> list[Choice]:
    """``rows``: one per validation cell, with ``method``, ``seed``, ``metric`` and each key of
    ``setting_keys`` (the grid's axes, in order); a row with ``diverged`` has no score. Returns one Choice per
    (method, other settings)."""
    unknown = [k for k in select if k not in setting_keys]
    if unknown:
        raise ConfigError(f"--select {','.join(unknown)}: not an axis of this grid (axes: {', '.join(setting_keys) or 'none'}); "
                          "give the values to choose from as an axis, e.g. --set lr=1e-3,1e-2 --select lr")
    others = [k for k in setting_keys if k not in select]
    scores: dict[tuple, dict[tuple, list[float | None]]] = {}
    for r in rows:
        group = (r["method"], tuple((k, str(r[k])) for k in others))
        value = tuple((k, str(r[k])) for k in select)
        score = None if r.get("diverged") or r.get(metric) is None else float(r[metric])
        scores.setdefault(group, {}).setdefault(value, []).append(score)
    choices = []
    for (method, fixed), by_value in scores.items():
        # A value with a diverged seed has no mean: averaging the other seeds would favour it.
        means = [(value, None if None in v else float(np.mean(v))) for value, v in by_value.items()]
        scored = [vm for vm in means if vm[1] is not None]
        if not scored:
            where = ", ".join(f"{k}={v}" for k, v in fixed)
            raise ConfigError(f"--select: every value of {', '.join(select)} diverged on validation for {method}"
                              f"{' at ' + where if where else ''}; add smaller values (e.g. a lower lr) to choose from")
        best = max(scored, key=lambda vm: vm[1])  # max keeps the first of equal scores: the value listed first
        choices.append(Choice(method, fixed, best[0], best[1], tuple(means)))
    return choices
