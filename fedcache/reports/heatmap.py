"""FedPCL Figure 4 as a heatmap: which single backbone each client's fused prototypes resemble."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcache.reports.contribution import Contribution
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


def backbone_heatmap(spec, out: Path) -> list[str]:
    """FedPCL's ``fedcache backbone-heatmap``: run FedPCL fused and on each backbone alone, write the heatmap
    to ``out``; the lines to print are the scores and the file written."""
    from fedcache.errors import ConfigError
    from fedcache.reports.contribution import backbone_contribution
    from fedcache.paths import writable_file

    if len(spec.data.backbones) < 2:
        raise ConfigError(f"backbone-heatmap compares fused backbones with each alone: name at least two with "
                          f"--backbones (got {','.join(spec.data.backbones)})")
    writable_file(out, "--out")  # before the runs, not after
    c = backbone_contribution(spec)
    width = max(len(n) for n in c.clients)
    lines = [" ".join([f"{'client':<{width}}", *(f"{b:>{max(len(b), 6)}}" for b in c.backbones)])]
    for name, row in zip(c.clients, c.scores):
        lines.append(" ".join([f"{name:<{width}}", *(f"{v:>{max(len(b), 6)}.3f}" for b, v in zip(c.backbones, row))]))
    return lines + [f"wrote {plot_contribution(c, out)}"]
