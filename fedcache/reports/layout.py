"""How a report lays out many runs: what varies and what is fixed, which settings split the figures into
panels, how a line is labelled and styled.

A comparison is read inside a panel: settings of the data and the partition (alpha, clients, few-shot,
...) each get their own panel, and the lines or bars inside one are the methods and their own settings
(lr, mu, ...). Labels show only what varies; what every run shares goes in one caption.
"""
from __future__ import annotations

import dataclasses
import itertools
import textwrap
from dataclasses import dataclass

from fedcache.best import is_panel_key
from fedcache.reports.runs import Group

MAX_LABEL = 40  # characters per line; a longer legend entry is wrapped onto more lines
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = (None, "o", "s", "^", "v", "D")


@dataclass(frozen=True)
class Style:
    color: str
    linestyle: str
    marker: str | None


@dataclass(frozen=True)
class Layout:
    fixed: dict[str, str]  # settings with one value across the report
    panel_keys: tuple[str, ...]
    legend_keys: tuple[str, ...]
    methods: tuple[str, ...]
    evaluated_on: str  # "test", "validation", or "test and validation" (a --select grid's report)
    # Every group's own settings (legend values), so that a label keeps its look in a figure that leaves some out
    # (final figures leave out candidates halving cut).
    settings: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def of(cls, groups: list[Group], methods: list[str] = (), swept: set[str] = frozenset()) -> "Layout":
        """``methods``: the grid's own order (table.md's), where the report has one; any other method follows
        as first seen. ``swept``: settings the grid sweeps over several values, which vary even where the runs found
        so far share one (an unfinished grid: its caption said "fixed: lr=1e-3" of a grid of two lr values)."""
        values: dict[str, set[str]] = {}
        for g in groups:
            for k, v in g.setting.items():
                values.setdefault(k, set()).add(str(v))
        # A key some groups lack varies too (its absence is a value).
        varying = [k for k, vs in values.items()
                   if len(vs) > 1 or k in swept or any(k not in g.setting for g in groups)]
        fixed = {k: next(iter(vs)) for k, vs in values.items() if k not in varying}
        layout = cls(fixed, tuple(k for k in varying if is_panel_key(k)), tuple(k for k in varying if not is_panel_key(k)),
                     _methods(groups, methods), evaluated_on(groups))
        return dataclasses.replace(layout, settings=tuple(sorted({layout._values(g, layout.legend_keys) for g in groups})))

    def panel(self, g: Group) -> tuple[tuple[str, str], ...]:
        return tuple((k, str(g.setting.get(k, "-"))) for k in self.panel_keys)

    def panels(self, groups: list[Group]) -> dict[tuple, list[Group]]:
        out: dict[tuple, list[Group]] = {}
        for g in groups:
            out.setdefault(self.panel(g), []).append(g)
        return out

    def ordered(self, groups: list[Group]) -> list[Group]:
        """Panels in the order of their settings' values (numbers as numbers: alpha 0.1, 1, 10), inside a
        panel the methods in the grid's order (else as first seen), each with its own settings' values in order.
        Run directories sort as text, by whatever their names begin with (a --select grid's chosen lr put alpha=1
        before alpha=0.1)."""
        methods = {m: i for i, m in enumerate(self.methods)}
        return sorted(groups, key=lambda g: (self._values(g, self.panel_keys), methods[g.method], self._values(g, self.legend_keys)))

    @staticmethod
    def _values(g: Group, keys: tuple[str, ...]) -> tuple:
        return tuple(_natural(g.setting.get(k)) for k in keys)

    def label(self, g: Group) -> str:
        """The method and its varying settings, wrapped onto lines of at most MAX_LABEL characters: cutting
        a long label short made two groups that differ only past the cut share one label, look and legend entry."""
        text = " ".join([g.method] + [f"{k}={g.setting.get(k, '-')}" for k in self.legend_keys])
        return textwrap.fill(text, MAX_LABEL, break_on_hyphens=False)

    @staticmethod
    def panel_title(panel: tuple[tuple[str, str], ...]) -> str:
        return ", ".join(f"{k}={v}" for k, v in panel) or "all runs"

    def caption(self) -> str:
        fixed = ", ".join(f"{k}={v}" for k, v in self.fixed.items())
        parts = [f"evaluated on the {self.evaluated_on} split{'s' if ' and ' in self.evaluated_on else ''}"]
        if fixed:
            parts.append(f"fixed: {fixed}")
        if self.panel_keys:
            parts.append(f"one panel per {', '.join(self.panel_keys)}")
        return "; ".join(parts)

    def styles(self, groups: list[Group]) -> dict[str, Style]:
        """One style per label, the same in every panel: colour by method, line style and marker by the
        method's own settings, so no two labels look alike; with one method, colour by its settings too."""
        palette = _palette(len(self.methods))
        colour = {m: palette[i % len(palette)] for i, m in enumerate(self.methods)}
        looks = list(itertools.product(MARKERS, LINE_STYLES))
        # The same own settings (lr=0.01, say) get the same look in every method, so a line style means one
        # value across the figure; past the palette's colours, methods sharing a colour start at other looks.
        own = sorted(set(self.settings) | {self._values(g, self.legend_keys) for g in groups})
        start = {m: (i // len(palette)) * 7 for i, m in enumerate(self.methods)}
        styles: dict[str, Style] = {}
        # One method: its settings take the colours too (six lr candidates in one blue were told apart by dashes).
        by_setting = len(self.methods) == 1 and len(own) > 1
        shades = _palette(len(own)) if by_setting else []
        for g in groups:
            i = own.index(self._values(g, self.legend_keys))
            marker, line = looks[(start[g.method] + i) % len(looks)]
            styles.setdefault(self.label(g), Style(shades[i % len(shades)] if by_setting else colour[g.method], line, marker))
        return styles


def evaluated_on(groups: list[Group]) -> str:
    """The split ``groups`` were scored on, or both ("test and validation")."""
    return " and ".join(sorted({"validation" if g.first.option("validation") else "test" for g in groups}))


def _natural(value) -> tuple:
    """A sort key: numbers by value before text, text as text, missing last."""
    if value is None:
        return (2, 0.0, "")
    try:
        return (0, float(value), str(value))
    except ValueError:
        return (1, 0.0, str(value))


def _palette(n: int) -> list[str]:
    from matplotlib import colormaps

    name = "tab10" if n <= 10 else "tab20"
    cmap = colormaps[name]
    return [cmap(i) for i in range(cmap.N)]


def _methods(groups: list[Group], order: list[str]) -> tuple[str, ...]:
    seen = dict.fromkeys(g.method for g in groups)
    return tuple(dict.fromkeys([*(m for m in order if m in seen), *seen]))
