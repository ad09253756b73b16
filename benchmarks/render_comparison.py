"""Markdown tables from fedpcl_comparison.py results (so docs quote the JSON, not a hand copy).

    .venv/bin/python benchmarks/render_comparison.py benchmarks/results/fedpcl_digits5_1bb.json ...
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def render(path: Path) -> str:
    data = json.loads(path.read_text())
    cfg, res = data["config"], data["results"]
    best = max(r["mean"] for r in res.values())
    lines = [f"`{path.name}`: {cfg['dataset']}, backbones {cfg['backbones']}, partition {cfg['partition']}, "
             f"{cfg['clients']} clients, few-shot {cfg['few_shot']}, subsample {cfg['subsample']}, "
             f"{cfg['rounds']} rounds, seeds {cfg['seeds']}", "",
             "| method | accuracy % mean (std over clients) | std over seeds | worst 10% | variance | params up per client/round "
             "| params up/round | chosen on validation |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        mean = f"**{r['mean']:.2f}**" if r["mean"] == best else f"{r['mean']:.2f}"
        seeds = np.std(r["per_seed"], ddof=1)  # sample std over seeds, as the papers' code prints
        # Every client sends every round in these runs (fraction 1), so per client = per round / clients.
        per_client = r.get("params_up_per_client", r["params_up_per_round"] / cfg["clients"])
        lines.append(f"| {name} | {mean} ({r['std_over_clients']:.2f}) | {seeds:.2f} | {r['worst10']:.2f} | "
                     f"{r['variance']:.1f} | {per_client:,.0f} | {r['params_up_per_round']:,} | {' '.join(r['settings'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print("\n".join(render(Path(p)) for p in sys.argv[1:]))
