"""Which result is marked the best: one rule for table.md, the report's results table and its figures' star, so
the three never mark different results among the same numbers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from fedcache.spec import is_option, option

# Settings that change the data a method sees: comparisons across them are not like for like. The report draws one
# panel per combination of their values; table.md's columns combine them with the methods' own settings.
PANEL_KEYS = ("split", "grid", "dataset", "backbones", "partition", "clients", "alpha", "shards", "few_shot", "subsample",
              "class_budget", "clients_per_domain", "classes_per_client", "repeat_rate", "fraction", "local_test",
              "local_test_mix", "run")
DIGITS = 2  # both tables print a mean with two decimals: results that print the same number tie


def is_panel_key(key: str) -> bool:
    """``alpha`` and its qualified spelling ``partition.alpha`` (a grid with perfedavg, whose own ``alpha``
    makes the short key ambiguous) split the figures alike."""
    return key in PANEL_KEYS or (is_option(key) and option(key).name in PANEL_KEYS)


def bold_meaning(panel_keys, references=()) -> str:
    """What bold marks, in words for a reader without the docs (table.md's line under the table, the report's
    caption): ``the highest mean of each alpha, among the results whose every seed ran to the end``.
    ``references``: the methods shown that pool every client's data (``Result.reference``)."""
    each = f" of each {' and '.join(panel_keys)}" if panel_keys else ""
    text = f"the highest mean{each}, among the results whose every seed ran to the end"
    if references:
        text += (f", not counting {' and '.join(references)} (trained on every client's data in one place: the "
                 "reference, marked only where no other method compares)")
    return text


@dataclass(frozen=True)
class Result:
    where: Hashable  # the values of the data settings (the report's panel): a result competes only inside its own
    mean: float | None
    whole: bool  # every seed has a result of the last round: none diverged, was stopped early or is still to run
    reference: bool = False  # a method that pools every client's data (centralized): the ceiling, not a contender


def best_marks(results: list[Result]) -> list[bool]:
    """Whether each result is the best of its data setting: the highest mean, as printed, of the whole results there,
    where two or more whole results compare (a lone result is nobody's winner). Ties are all marked.

    Per data setting, not per column of table.md: a column there is a data setting and one value of each swept
    method setting (lr, mu), and marking each column made every lr value a contest of its own, so one data setting
    had as many bests as lr values; the report's table (one row per method and setting) and its figures' star
    compare everything one panel holds. A method's own settings are part of what is compared; the data is not.
    A mean of fewer seeds, or of an earlier round, would flatter: such a result ("k of n seeds") is never marked,
    and is no contender either.
    A method that pools every client's data is the ceiling the others are read against, not one of them: such
    references compete among themselves only where no other result does (a grid of centralized's lr alone)."""
    contenders: dict[Hashable, dict[bool, list[float]]] = {}
    for r in results:
        if r.whole and r.mean is not None:
            contenders.setdefault(r.where, {}).setdefault(r.reference, []).append(round(r.mean, DIGITS))
    top = {}
    for where, by_kind in contenders.items():
        kind = False if False in by_kind else True
        if len(by_kind[kind]) > 1:
            top[where] = (kind, max(by_kind[kind]))
    return [r.whole and r.mean is not None and (r.reference, round(r.mean, DIGITS)) == top.get(r.where) for r in results]
