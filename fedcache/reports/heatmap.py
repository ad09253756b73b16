"""FedPCL Figure 4 as a heatmap: which single backbone each client's fused prototypes resemble."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcache.federate.contribution import Contribution
from fedcache.reports.canvas import subplots


def plot_contribution(c: Contribution, path: Path, title: str = "") -> Path:
    fig, ax = subplots(figsize=(2.4 + 1.4 * len(c.backbones), 1.8 + 0.5 * len(c.clients)))
    im = ax.imshow(c.scores, cmap="YlGnBu", vmin=0, vmax=max(0.5, float(c.scores.max())), aspect="auto")
    for (i, j), v in np.ndenumerate(c.scores):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=9, color="black" if v < 0.45 else "white")
    ax.set_xticks(range(len(c.backbones)), [b.replace("-", "-\n", 1) if len(b) > 12 else b for b in c.backbones])
    ax.set_yticks(range(len(c.clients)), c.clients)
    ax.set_xlabel("single backbone")
    ax.set_title(title or "Similarity of single-backbone and fused\nlocal prototypes (rows sum to 1)", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
