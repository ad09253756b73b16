"""The report's figures, each a function (groups -> PNG bytes) so HTML and markdown share them."""
from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np

from fedcache.errors import FedcacheError
from fedcache.reports.runs import Group, Run

log = logging.getLogger(__name__)
MAX_LINES = 12  # beyond this a line plot is unreadable: the best groups are shown


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # here, not at import: importing fedcache must not change a caller's backend
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return buf.getvalue()


def _top(groups: list[Group]) -> list[Group]:
    return sorted(groups, key=lambda g: -(g.mean("mean_accuracy") or 0))[:MAX_LINES]


def accuracy_per_round(groups: list[Group]) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in _top(groups):
        x, y = g.curve("accuracy")
        ax.plot(x, y, marker="o" if len(x) < 15 else None, ms=3, label=g.label)
    ax.set_xlabel("round")
    ax.set_ylabel("mean client accuracy %")
    ax.set_title("Accuracy per round (mean over seeds)", fontsize=10)
    ax.grid(True, color="0.9")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return _png(fig)


def client_distribution(groups: list[Group]) -> bytes:
    plt = _plt()
    shown = _top(groups)
    fig, ax = plt.subplots(figsize=(max(5, 1.0 + 0.8 * len(shown)), 4))
    ax.boxplot([g.per_client() for g in shown], showmeans=True)
    ax.set_xticks(range(1, len(shown) + 1), [g.label for g in shown], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("final accuracy % per client")
    ax.set_title("Per-client accuracy (all seeds pooled; triangle = mean)", fontsize=10)
    ax.grid(True, axis="y", color="0.9")
    return _png(fig)


FAIRNESS = (("worst10", "worst 10%"), ("worst20", "worst 20%"), ("worst40", "worst 40%"), ("mean_accuracy", "mean"), ("best10", "best 10%"))


def fairness(groups: list[Group]) -> bytes:
    plt = _plt()
    shown = _top(groups)
    fig, ax = plt.subplots(figsize=(max(6, 1.5 + 0.9 * len(shown)), 4))
    width = 0.8 / len(FAIRNESS)
    x = np.arange(len(shown))
    for j, (key, name) in enumerate(FAIRNESS):
        ax.bar(x + (j - len(FAIRNESS) / 2 + 0.5) * width, [g.mean(key) or 0 for g in shown], width, label=name)
    ax.set_xticks(x, [g.label for g in shown], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("accuracy %")
    ax.set_title("Fairness: mean accuracy of the worst / best clients (as FedPCL Tables 12-13)", fontsize=10)
    ax.legend(fontsize=7, ncols=5, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
    ax.grid(True, axis="y", color="0.9")
    return _png(fig)


def bytes_per_round(groups: list[Group]) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in _top(groups):
        for key, style in (("bytes_up", "-"), ("bytes_down", ":")):
            x, total = g.curve(key)
            if len(x) == 0:
                continue
            per_round = np.diff(np.r_[0, total]) / np.diff(np.r_[0, x])
            ax.plot(x, per_round, style, label=f"{g.label} {key.split('_')[1]}")
    ax.set_yscale("symlog")
    ax.set_xlabel("round")
    ax.set_ylabel("bytes per round (all clients)")
    ax.set_title("Bytes sent per round (solid: up, dotted: down)", fontsize=10)
    ax.grid(True, color="0.9")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return _png(fig)


def partition_charts(run: Run, folder: Path) -> list[Path]:
    """The bubble chart and sizes of the run's partition, read back from its store; [] when it is gone."""
    from fedcache.reports.partition_plots import plot_partition
    from fedcache.federate.partitions.storage import load_partition, table_keys
    from fedcache.store.feature_store import FeatureStore

    t, part = run.config.get("train", {}), run.config.get("partition", {})
    try:
        store = FeatureStore(Path(t["store"]), create=False)
        train_t = store.read(t["dataset"], "train", t["backbones"][0])
        test_t = store.read(t["dataset"], "test", t["backbones"][0])
        p = load_partition(store, t["dataset"], part["partition_id"], table_keys(train_t), table_keys(test_t))
    except (FedcacheError, KeyError, OSError) as exc:  # a report must still be written when the store moved or was pruned
        log.warning("partition chart of %s skipped: %s", run.path, exc)
        return []
    prefix = folder / f"partition-{part['partition_id'][:10]}"
    return plot_partition(p, train_t.labels, train_t.class_names, prefix, train_t.domains, train_t.domain_names)
