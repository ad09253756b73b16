"""Pictures of a partition: who holds which classes, and how much data each client has.

``plot_partition`` writes ``<prefix>-bubbles.png`` (clients x classes, bubble area
proportional to the row count, as in FedPCL's non-IID figure) and ``<prefix>-sizes.png``
(training rows per client, stacked by domain when there are several). Both stay legible
up to about 100 clients x 100 classes: the figure grows with the grid (within limits),
markers shrink to their cell and tick labels are thinned; where a cell would be under MIN_BUBBLE_PTS (from
about 250 clients, or about 230 classes) the first shows the rows as colour instead (a heatmap).
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np

from fedcache import disk
from fedcache.federate.partitions import Partition
from fedcache.reports.canvas import subplots
from fedcache.wording import count

MAX_TICKS = 25
MAX_FIG_INCHES = 16.0
MIN_BUBBLE_PTS = 4.0  # a grid cell narrower than this (points) shows rows as colour, not bubbles
DPI = 110
TITLE_PTS = 10  # the title's font size


def client_class_counts(partition: Partition, train_labels: np.ndarray, n_classes: int) -> np.ndarray:
    """(clients, classes) training row counts."""
    labels = np.asarray(train_labels)
    return np.stack([np.bincount(labels[rows], minlength=n_classes)[:n_classes] for rows in partition.train])


def _thin(n: int) -> np.ndarray:
    """Tick positions: every one when few, else a round step giving at most MAX_TICKS."""
    step = 1 if n <= MAX_TICKS else int(np.ceil(n / MAX_TICKS / 5) * 5)
    return np.arange(0, n, step)


def _title(partition: Partition, n_domains: int = 1) -> str:
    """The scheme with the settings it ran with: defaults filled in (a default alpha is stored as null, and a
    Dirichlet partition's title said no alpha at all), settings that change nothing (subsample 1) left out."""
    r = partition.request
    hidden = ("scheme", "n_clients", "seed", "local_test", "local_test_mix", "min_size")  # not about the training rows
    inert = {"subsample": 1.0, "repeat_rate": 0.0}
    extras = [f"{k}={v}" for k, v in r.effective(n_domains).items()
              if k not in hidden and v is not None and inert.get(k, object()) != v]
    return (f"{r.scheme} partition, {partition.n_clients} clients, seed {r.seed}"
            + (f" ({', '.join(extras)})" if extras else ""))


def _bubbles(counts: np.ndarray, class_names: Sequence[str], title: str, path: Path) -> Path:
    n_clients, n_classes = counts.shape
    width = min(MAX_FIG_INCHES, max(6.0, 2.5 + 0.22 * n_clients))
    height = min(MAX_FIG_INCHES, max(4.0, 1.5 + 0.16 * n_classes))
    # The largest bubble just fills one grid cell, whatever the grid size.
    cell_pts = min(0.8 * width * 72 / n_clients, 0.8 * height * 72 / n_classes)
    if cell_pts < MIN_BUBBLE_PTS:
        return _heatmap(counts, class_names, title, path, width, height)
    fig, ax = subplots(figsize=(width, height), dpi=DPI)
    biggest = max(int(counts.max()), 1)
    area = (counts / biggest) * (0.95 * cell_pts) ** 2
    x, y = np.nonzero(counts)
    ax.scatter(x, y, s=area[x, y], c="tab:blue", alpha=0.65, edgecolors="navy", linewidths=0.4 if cell_pts > 6 else 0)
    ax.set_xlim(-0.7, n_clients - 0.3)
    ax.set_ylim(-0.7, n_classes - 0.3)
    ax.set_xticks(_thin(n_clients))
    ax.set_xticklabels([str(i) for i in _thin(n_clients)], fontsize=8)
    _client_by_class(ax, class_names, n_classes, title)
    ax.grid(True, color="0.92", linewidth=0.5)
    ax.set_axisbelow(True)
    _size_legend(ax, biggest, cell_pts)
    return _saved(fig, path)


def _heatmap(counts: np.ndarray, class_names: Sequence[str], title: str, path: Path, width: float,
             height: float) -> Path:
    """Cells too small for a bubble each (about 250 clients, or 230 classes): rows per client and class as colour.
    Bubbles shrank to specks and then to nothing, and the figure showed an empty grid. Clients (classes) beyond
    the plot's pixels share a column (row) that shows their most: averaged by the drawing instead, a class held
    by one client in a hundred faded to white."""
    n_clients, n_classes = counts.shape
    fig, ax = subplots(figsize=(width, height), dpi=DPI)
    # At most half the figure's pixels each way: the plot's own take more than half, so each cell is a pixel at least
    shown, (per_class, per_client) = _most_per_pixel(counts.T, int(height * DPI / 2), int(width * DPI / 2))
    image = ax.imshow(np.ma.masked_equal(shown.astype(float), 0), aspect="auto", origin="lower", cmap=_held(),
                      interpolation="nearest", extent=(-0.5, n_clients - 0.5, -0.5, n_classes - 0.5), vmin=1)
    _client_by_class(ax, class_names, n_classes, title)
    shared = " and ".join(f"{n} {what}" for n, what in ((per_client, "clients"), (per_class, "classes")) if n > 1)
    label = "training rows" + (f" (a cell: the most of {shared})" if shared else "")
    fig.colorbar(image, ax=ax, label=label, fraction=0.04, pad=0.02)
    return _saved(fig, path)


def _most_per_pixel(a: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, tuple[int, int]]:
    """``a`` with runs of rows and of columns merged, each into its maximum, to fit ``rows`` x ``cols``; the runs'
    lengths (1: not merged)."""
    per = (-(-a.shape[0] // max(rows, 1)), -(-a.shape[1] // max(cols, 1)))
    padded = np.zeros((-(-a.shape[0] // per[0]) * per[0], -(-a.shape[1] // per[1]) * per[1]), a.dtype)
    padded[: a.shape[0], : a.shape[1]] = a
    merged = padded.reshape(padded.shape[0] // per[0], per[0], padded.shape[1] // per[1], per[1]).max(axis=(1, 3))
    return merged, per


def _held():
    """Blues from a visible blue: one row is never drawn white, the colour of none."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    return ListedColormap(colormaps["Blues"](np.linspace(0.3, 1.0, 256)))


def _client_by_class(ax, class_names: Sequence[str], n_classes: int, title: str) -> None:
    ticks = _thin(n_classes)
    ax.set_yticks(ticks)
    ax.set_yticklabels([_short(class_names[i]) if i < len(class_names) else str(i) for i in ticks], fontsize=8)
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    _set_title(ax, title)


def _set_title(ax, title: str) -> None:
    """The title in lines the figure holds: one wider than the figure (a domain-dirichlet partition's settings, at
    the narrowest figure) was cut at both edges."""
    fits = int(ax.figure.get_figwidth() * 72 / (0.6 * TITLE_PTS))  # characters of about 0.6 em each
    ax.set_title(textwrap.fill(title, max(fits, 20)), fontsize=TITLE_PTS)


def _saved(fig, path: Path) -> Path:
    """``fig`` as a PNG written beside ``path`` and renamed over it: an interrupted or killed save left a part of a
    PNG there (over the last chart of that name), taken for the chart."""
    fig.tight_layout()
    disk.save_atomic(path, lambda f: fig.savefig(f, format="png"), 0, "the figure")
    return path


def _short(name: str, n: int = 14) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _size_legend(ax, biggest: int, cell_pts: float) -> None:
    refs = sorted({max(1, int(round(biggest * f))) for f in (1.0, 0.5, 0.1)}, reverse=True)
    handles = [
        ax.scatter([], [], s=(r / biggest) * (0.95 * cell_pts) ** 2, c="tab:blue", alpha=0.65, edgecolors="navy", linewidths=0.4)
        for r in refs
    ]
    ax.legend(handles, [count(r, "row") for r in refs], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, frameon=False, labelspacing=1.2, borderaxespad=0)


def _sizes(partition: Partition, train_domains, domain_names, title: str, path: Path) -> Path:
    n_clients = partition.n_clients
    width = min(MAX_FIG_INCHES, max(6.0, 2.5 + 0.12 * n_clients))
    fig, ax = subplots(figsize=(width, 4.0), dpi=110)
    x = np.arange(n_clients)
    present = np.unique(np.asarray(train_domains)) if train_domains is not None else np.zeros(1, int)
    bottom = np.zeros(n_clients)
    for j, d in enumerate(present):
        if train_domains is None:
            heights = np.array([len(r) for r in partition.train], dtype=float)
        else:
            heights = np.array([np.sum(np.asarray(train_domains)[r] == d) for r in partition.train], dtype=float)
        label = (domain_names[d] if domain_names is not None and d < len(domain_names) else f"domain {d}") if len(present) > 1 else None
        ax.bar(x, heights, bottom=bottom, width=0.8, color=f"C{j % 10}", label=label)
        bottom += heights
    ax.set_xticks(_thin(n_clients))
    ax.set_xticklabels([str(i) for i in _thin(n_clients)], fontsize=8)
    ax.set_xlim(-0.7, n_clients - 0.3)
    ax.set_xlabel("client")
    ax.set_ylabel("training rows")
    _set_title(ax, title)
    ax.grid(True, axis="y", color="0.9", linewidth=0.5)
    ax.set_axisbelow(True)
    if len(present) > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, borderaxespad=0)
    return _saved(fig, path)


def plot_partition(
    partition: Partition,
    train_labels: np.ndarray,
    class_names: Sequence[str],
    path_prefix: str | Path,
    train_domains: np.ndarray | None = None,
    domain_names: Sequence[str] | None = None,
) -> list[Path]:
    """Write ``<prefix>-bubbles.png`` and ``<prefix>-sizes.png``; return their paths."""
    prefix = Path(path_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    n_classes = max(len(class_names), int(np.max(train_labels)) + 1 if len(train_labels) else 0)
    counts = client_class_counts(partition, train_labels, n_classes)
    n_domains = len(np.unique(np.asarray(train_domains))) if train_domains is not None else 1
    title = _title(partition, n_domains)
    return [
        _bubbles(counts, class_names, title, Path(f"{prefix}-bubbles.png")),
        _sizes(partition, train_domains, domain_names, title, Path(f"{prefix}-sizes.png")),
    ]
