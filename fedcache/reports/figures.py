"""The report's figures. Each takes the groups and their `Layout` and returns a `Figure` result: PNG bytes
and the labels drawn in it (the HTML carries them, so a browser test can check they fit).

Figures are split into one panel per data/partition setting (`Layout.panel_keys`); inside a panel every
method has one colour and its own settings a line style, the same across panels, with mean +- sample std
over seeds as a band (curves) or an error bar (bars), and the best final accuracy of the panel marked.
"""
from __future__ import annotations

import io
import logging
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fedcache.best import Result, best_marks
from fedcache.errors import FedcacheError
from fedcache.reports.canvas import subplots
from fedcache.reports.layout import Layout, Style, evaluated_on
from fedcache.reports.runs import Group, Run

log = logging.getLogger(__name__)
MAX_PER_PANEL = 12  # lines or bars; beyond this a panel is unreadable: the best are shown, the title says so
PANEL_SIZE = (4.6, 3.3)  # inches; at 100 dpi a panel is 460 px wide
BEST = "★"
YLABEL_CHARS = 30  # characters per line of a panel's y label: about the height of a panel at its font size (7.5 px each)


@dataclass
class Figure:
    png: bytes
    labels: list[str]  # each line of every label drawn
    note: str = ""  # for the caption: the lines drawn as one because they coincide, named


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")  # tight: legends outside the axes are kept
    return buf.getvalue()


def _shown(groups: list[Group]) -> tuple[list[Group], str]:
    if len(groups) <= MAX_PER_PANEL:
        return groups, ""
    # A group with diverged seeds ranks last: its mean, of the other seeds, would flatter it.
    best = sorted(groups, key=lambda g: (bool(g.diverged), -(g.mean("mean_accuracy") or 0)))[:MAX_PER_PANEL]
    return [g for g in groups if g in best], f" (best {MAX_PER_PANEL} of {len(groups)})"


def _best(groups: list[Group]) -> list[Group]:
    """The best final accuracy of a panel, by the tables' rule (fedcache/best.py): of the groups whose every seed ran
    every round (an early score is of another round, and a mean without the seeds that diverged, or have not run
    yet, would flatter), where two or more compare; ties all."""
    marks = best_marks([Result((), g.mean("mean_accuracy"), g.complete, g.reference) for g in groups])
    return [g for g, best in zip(groups, marks) if best]


def _panels(layout: Layout, groups: list[Group], draw: Callable, width: float = 1.0) -> Figure:
    """One axes per panel of ``layout``, ``draw(ax, groups, styles) -> labels`` on each, one shared legend."""
    panels = layout.panels(groups)
    styles = layout.styles(groups)
    cols = max(1, min(len(panels), int(3 / width)))  # a page is about three narrow panels wide
    rows = math.ceil(len(panels) / cols)
    while cols > 1 and math.ceil(len(panels) / (cols - 1)) == rows:  # as many rows with fewer columns: no gaps (4 = 2 x 2)
        cols -= 1
    fig, axes = subplots((PANEL_SIZE[0] * width * cols, PANEL_SIZE[1] * rows), nrows=rows, ncols=cols, squeeze=False,
                         sharey=True, layout="constrained")  # constrained: rotated labels never overlap a panel
    labels: list[str] = []
    for ax, (panel, members) in zip(axes.flat, panels.items()):
        shown, note = _shown(members)
        labels += draw(ax, shown, layout, styles)
        ax.set_title(layout.panel_title(panel) + note, fontsize=9)
        ax.grid(True, color="0.92")
        ax.set_axisbelow(True)  # grid lines behind bars, not drawn across them
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    _ylabels(fig, axes, len(panels))
    unique = _legend(fig, axes, layout, groups, cols, width)
    # After the legend, which keeps each label's own line style: a shared line's dashes would read as a third style.
    same: dict[str, list[str]] = {}
    for ax, panel in zip(axes.flat, panels):
        for names in _coinciding(ax):
            same.setdefault(names, []).append(layout.panel_title(panel))
    lines = [line for label in labels + unique for line in label.splitlines()]  # a label may be wrapped
    return Figure(_png(fig), list(dict.fromkeys(lines)), _same_note(same, len(panels)))


def _ylabels(fig, axes, panels: int) -> None:
    """The y axis is shared: labelled once per row whose panels show the same, once for the figure where all do;
    else on each panel, which says what it shows (a --select report's test and validation panels were all labelled
    "test and validation accuracy %")."""
    same = len({ax.get_ylabel() for ax in list(axes.flat)[:panels]}) == 1
    for r, row in enumerate(axes):
        shown = list(row)[:panels - r * len(row)]
        if len({ax.get_ylabel() for ax in shown}) == 1:
            for ax in shown[1:]:
                ax.set_ylabel("")
        for ax in (ax for ax in shown if ax.get_ylabel()):
            _wrap_ylabel(ax)
    if same and len(axes) > 1:  # once for the figure: a label as long as two panels are tall ran into the next row's
        text = axes[0, 0].get_ylabel().replace("\n", " ")
        for ax in axes[:, 0]:
            ax.set_ylabel("")
        fig.supylabel(text, fontsize=10)


def _wrap_ylabel(ax) -> None:
    """A label longer than the panel is tall ran past its top, into the legend."""
    log = " (log scale)" if ax.get_yscale() == "log" else ""  # the panels share it: one panel's curves chose it
    ax.set_ylabel(textwrap.fill(ax.get_ylabel() + log, YLABEL_CHARS))


def _legend(fig, axes, layout: Layout, groups: list[Group], cols: int, width: float) -> list[str]:
    """One legend under the panels, each label once; returns the labels."""
    handles = [h for ax in axes.flat for h in ax.get_legend_handles_labels()[0]]
    names = [n for ax in axes.flat for n in ax.get_legend_handles_labels()[1]]
    unique = dict(zip(names, handles))
    # In the table's order (methods as listed, each with its own settings in order), not the panels' first sighting
    # of each: a --select report's legend read "fedavg lr=1e-3, fedprox lr=1e-2, fedavg lr=1e-2, fedprox lr=1e-3".
    rank = {layout.label(g): (layout.methods.index(g.method), layout._values(g, layout.legend_keys)) for g in groups}
    unique = dict(sorted(unique.items(), key=lambda kv: (0, *rank[kv[0]]) if kv[0] in rank else (1,)))
    if unique:
        fig.legend(unique.values(), unique.keys(), loc="outside lower center",
                   ncols=max(1, min(len(unique), int(3 * cols * width))), fontsize=8, frameon=False)
    return list(unique)


SAME = 0.004  # of a panel's width and height: about a pixel of its axes, within which two lines draw as one
DASH = 6.0  # points: each colour's stretch of a shared line (about 8 px; a bytes figure's faint "down" line in step)


def _coinciding(ax) -> list[str]:
    """Lines that coincide, every point within SAME, hid all but the last drawn, and the legend named them all: each
    is redrawn in dashes that leave gaps for the others' (at their true values, no offset), so every line shows along
    the shared one. Lines of every kind (width and alpha): a bytes figure's faint "down" line, drawn over its bold
    "up" where a method sends as much each way (fedavg), did not show at all. Returns each set's names, "a = b"
    (lines named by gid)."""
    ax.get_xlim(), ax.get_ylim()  # the limits autoscaling chose: the axes fractions below are of the drawn panel
    to_axes = ax.transScale + ax.transLimits  # log and symlog axes included: a pixel is a pixel
    sets: list[list] = []
    for line in ax.get_lines():
        x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        if line.get_gid() is None or line.get_transform() != ax.transData or len(x) < 2:
            continue  # halving cuts, end markers and stars are no series
        xy = to_axes.transform(np.column_stack([x, y]))
        match = next((s for s in sets if s[0][1].shape == xy.shape and np.abs(s[0][1] - xy).max() <= SAME), None)
        if match is None:
            match = []
            sets.append(match)
        match.append((line, xy))
    named = []
    for s in (s for s in sets if len(s) > 1):
        for i, (line, _) in enumerate(s):
            dash = DASH / line.get_linewidth()  # matplotlib scales dashes by the width: thin and thick lines in step
            line.set_linestyle((i * dash, (dash, (len(s) - 1) * dash)))
        named.append(" = ".join(dict.fromkeys(line.get_gid().replace("\n", " ") for line, _ in s)))
    return list(dict.fromkeys(n for n in named if " = " in n))


def _same_note(same: dict[str, list[str]], panels: int) -> str:
    """The caption's words for the lines drawn as one: which, and in which panels where not in all."""
    if not same:
        return ""
    where = lambda titles: "" if len(titles) == panels else f" ({'; '.join(titles)})"  # noqa: E731
    return (" Lines that coincide share one path in alternating dashes of their colours: "
            + ", ".join(f"{names}{where(titles)}" for names, titles in same.items()) + ".")


def _curves(key: str, ylabel: str) -> Callable:
    """Draws the per-round curves of ``key``, the y axis labelled ``ylabel`` ({split}: the split the panel shows)."""
    def draw(ax, groups: list[Group], layout: Layout, styles: dict[str, Style]) -> list[str]:
        best = _best(groups)
        for g in groups:
            x, mean, std = g.band(key)
            if len(x) == 0:
                continue
            label, st = layout.label(g), styles[layout.label(g)]
            ax.plot(x, mean, st.linestyle, color=st.color, marker=st.marker, markevery=max(1, len(x) // 8), ms=4,
                    lw=1.4, label=label, gid=label)
            ax.fill_between(x, mean - std, mean + std, color=st.color, alpha=0.12, lw=0)
            if g.stopped_at is not None or len(x) == 1:  # where a curve ends early; one point alone draws no line
                ax.plot(x[-1:], mean[-1:], st.marker or "o", color=st.color, ms=5, mec="black", mew=0.5)
            if any(g is b for b in best) and key == "accuracy":
                ax.plot(x[-1:], mean[-1:], "*", color=st.color, ms=13, mec="black", mew=0.6)
        _halving_cuts(ax, groups)
        _whole_rounds(ax)
        if key == "train_loss" and _spans_decades(ax):
            ax.set_yscale("log")  # a diverging setting's loss (1e7) flattened every other curve onto 0
        ax.set_ylabel(ylabel.format(split=evaluated_on(groups)))  # the panel's split: a --select report has both
        return []

    return draw


def _spans_decades(ax, decades: float = 2.0) -> bool:
    """Whether the positive values drawn in ``ax`` span more than ``decades`` orders of magnitude. Data lines only:
    a halving cut's axvline has y 0 to 1 in axes units, which read as a loss of 1 made losses of 0.002 to 0.05 log."""
    data = [line for line in ax.get_lines() if line.get_transform() == ax.transData]
    values = np.concatenate([np.asarray(line.get_ydata(), float) for line in data] or [np.zeros(0)])
    positive = values[np.isfinite(values) & (values > 0)]
    return len(positive) > 0 and positive.max() > 10 ** decades * positive.min()


def _halving_cuts(ax, groups: list[Group]) -> None:
    """The rounds at which successive halving stopped candidates (--prune halving): a curve ending at one was cut
    there, or chosen there as the last one left."""
    for i, r in enumerate(sorted({g.stopped_at for g in groups if g.stopped_at is not None})):
        ax.axvline(r, color="0.45", ls=":", lw=1.1, zorder=0, label=None if i else HALVING_CUT)


HALVING_CUT = "a cut of successive halving"


def _whole_rounds(ax) -> None:
    """Round ticks 1, 2, 5, 10, ...: no 2.5."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def accuracy_per_round(groups: list[Group], layout: Layout) -> Figure:
    return _panels(layout, groups, _curves("accuracy", "{split} accuracy %, mean over clients"))


def train_loss_per_round(groups: list[Group], layout: Layout) -> Figure | None:
    if not any(line.get("train_loss") is not None for g in groups for r in g.runs for line in r.history):
        return None
    return _panels(layout, groups, _curves("train_loss", "training loss"))


def _bars(ax, groups: list[Group], layout: Layout, styles: dict[str, Style]) -> list[str]:
    best = _best(groups)
    labels = [layout.label(g) for g in groups]
    means = [g.mean("mean_accuracy") or 0.0 for g in groups]
    # One seed has no spread: no error bar (a std of 0 drew a cap on the bar, under "no error bars").
    errs = [np.nan if (std := g.std("mean_accuracy")) is None else std for g in groups]
    colours = [styles[l].color for l in labels]
    hatches = [{"-": "", "--": "//", ":": "..", "-.": "xx"}[styles[l].linestyle] for l in labels]
    x = np.arange(len(groups))
    bars = ax.bar(x, means, 0.7, yerr=errs, capsize=3, color=colours, edgecolor="white")
    for bar, hatch in zip(bars, hatches):
        bar.set_hatch(hatch)
    for i in (groups.index(g) for g in best):
        ax.annotate(BEST, (x[i], means[i] + np.nan_to_num(errs[i])), ha="center", va="bottom", fontsize=14)
    ax.margins(y=0.12)  # room above the tallest error bar for the star, which ran into the panel's title
    ax.set_xticks(x, labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(f"final {evaluated_on(groups)} accuracy %")
    return labels


def final_accuracy(groups: list[Group], layout: Layout) -> Figure:
    return _panels(layout, groups, _bars, width=1.2)


def _boxes(ax, groups: list[Group], layout: Layout, styles: dict[str, Style]) -> list[str]:
    from matplotlib.cbook import boxplot_stats

    labels = [layout.label(g) for g in groups]
    for x, (g, label) in enumerate(zip(groups, labels), start=1):
        (stats,) = boxplot_stats(np.asarray(g.per_client(), dtype=float))
        _box(ax, x, stats, styles[label].color)
    ax.set_xticks(range(1, len(groups) + 1), labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("final accuracy % per client")
    return labels


def _box(ax, x: float, stats: dict, color: str, half: float = 0.25) -> None:
    """A box plot's box (quartiles), median, whiskers (1.5 IQR), mean (triangle) and outliers, as plain artists:
    ``Axes.boxplot`` reads every rcParam, which makes matplotlib choose its backend and import pyplot (canvas.py)."""
    from matplotlib.patches import Rectangle

    q1, q3 = stats["q1"], stats["q3"]
    ax.add_patch(Rectangle((x - half, q1), 2 * half, q3 - q1, facecolor=color, alpha=0.5, edgecolor="black",
                           zorder=1.8))  # over the grid lines, under the median
    ax.plot([x - half, x + half], [stats["med"]] * 2, color="black", lw=1.6)  # tab:orange vanished on orange boxes
    for end, edge in ((stats["whislo"], q1), (stats["whishi"], q3)):
        ax.plot([x, x], [end, edge], color="black", linewidth=1)
        ax.plot([x - half / 2, x + half / 2], [end, end], color="black", linewidth=1)
    ax.plot([x], [stats["mean"]], marker="^", color="white", markeredgecolor="black", linestyle="none")
    if len(stats["fliers"]):
        ax.plot([x] * len(stats["fliers"]), stats["fliers"], marker="o", markerfacecolor="none", color="black",
                linestyle="none")


def client_distribution(groups: list[Group], layout: Layout) -> Figure:
    return _panels(layout, groups, _boxes, width=1.2)


FAIRNESS = (("worst10", "worst 10%"), ("worst20", "worst 20%"), ("worst40", "worst 40%"), ("mean_accuracy", "mean"),
            ("best10", "best 10%"))


def _fairness(ax, groups: list[Group], layout: Layout, styles: dict[str, Style]) -> list[str]:
    labels = [layout.label(g) for g in groups]
    x = np.arange(len(groups))
    width = 0.8 / len(FAIRNESS)
    greys = [str(v) for v in np.linspace(0.15, 0.8, len(FAIRNESS))]
    for j, (key, name) in enumerate(FAIRNESS):
        ax.bar(x + (j - len(FAIRNESS) / 2 + 0.5) * width, [g.mean(key) or 0 for g in groups], width, label=name,
               color=greys[j])
    ax.set_xticks(x, labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("accuracy % of that share of clients")
    return labels


def fairness(groups: list[Group], layout: Layout) -> Figure:
    return _panels(layout, groups, _fairness, width=1.3)


def _bytes(ax, groups: list[Group], layout: Layout, styles: dict[str, Style]) -> list[str]:
    drawn = []
    for g in groups:
        label, st = layout.label(g), styles[layout.label(g)]
        # Down in the label's own line style, faint: a dotted "down" was also the look of some labels' "up".
        for key, width, alpha, way in (("bytes_up", 1.4, 1.0, "up"), ("bytes_down", 0.8, 0.35, "down")):
            x, total = g.curve(key)
            if len(x):
                per_round = np.diff(np.r_[0, total]) / np.diff(np.r_[0, x])
                drawn.append(per_round)
                # Named by way too: where up and down coincide, the caption says "fedavg up = fedavg down".
                ax.plot(x, per_round, st.linestyle, color=st.color, lw=width, alpha=alpha,
                        label=label if key == "bytes_up" else None, gid=f"{label} {way}")
    # symlog: methods send bytes of different orders and a first round may send none down; within one decade
    # it draws no tick at all, so the figure could not be read, and a linear axis from 0 serves.
    values = np.concatenate(drawn) if drawn else np.zeros(0)
    positive = values[values > 0]
    if len(positive) and positive.max() >= 10 * positive.min():
        ax.set_yscale("symlog")
    else:
        ax.set_ylim(bottom=0)
    from matplotlib.ticker import EngFormatter

    ax.yaxis.set_major_formatter(EngFormatter(unit="B", sep=" "))  # 256 kB, not 250000
    _whole_rounds(ax)
    ax.set_ylabel("bytes per round, all clients (faint: down)")
    return []


def bytes_per_round(groups: list[Group], layout: Layout) -> Figure:
    return _panels(layout, groups, _bytes)


def _store_of(run: Run) -> Path:
    """The run's store: a relative path as from where the run started (recorded since config.json had "cwd"),
    else as from here (a project folder moved with its store)."""
    given = Path(run.option("store"))
    started = Path(run.config.get("cwd") or ".") / given
    return started if started.exists() or not given.exists() else given


def _labels_of(store, dataset: str, split: str, backbone: str):
    """The rows of a table (labels, domains, ids, checked) without its features, which a chart never shows."""
    rows = store.rows(dataset, split, backbone)
    rows.close()
    return rows


def partition_charts(run: Run, folder: Path) -> list[Path]:
    """The bubble chart and sizes of the run's partition, read back from its store; [] when it is gone."""
    from fedcache.federate.partitions.storage import load_partition, table_keys
    from fedcache.reports.partition_plots import plot_partition
    from fedcache.store.feature_store import FeatureStore

    dataset, backbone, part = run.option("dataset"), (run.option("backbones") or [None])[0], run.config.get("partition", {})
    try:
        store = FeatureStore(_store_of(run), create=False)
        train_t, test_t = (_labels_of(store, dataset, split, backbone) for split in ("train", "test"))
        changed = set(train_t.entry_ids + test_t.entry_ids) - set(part.get("entries", train_t.entry_ids + test_t.entry_ids))
        if changed:  # the chart would show the classes of other data than the run trained on
            raise FedcacheError(f"the store's features of {dataset} are not those the run read (entries "
                                f"{', '.join(sorted(changed))} are newer)")
        p = load_partition(store, dataset, part["partition_id"], table_keys(train_t), table_keys(test_t))
    except (FedcacheError, KeyError, OSError, TypeError) as exc:  # a report must still be written when the store moved or was pruned
        log.warning("partition chart of %s skipped: %s", run.path, exc)
        return []
    prefix = folder / f"partition-{part['partition_id'][:10]}"
    return plot_partition(p, train_t.labels, train_t.class_names, prefix, train_t.domains, train_t.domain_names)
