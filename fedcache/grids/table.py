"""A grid's results: results.csv (one row per cell) and table.md (mean (std) over seeds per method and
setting, best per column in bold)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcache.disk import write_text
from fedcache.errors import ConfigError
from fedcache.grids.cells import METRIC_COLUMNS
from fedcache.grids.spec import RESULTS, TABLE, GridSpec
from fedcache.table import Table
from fedcache.wording import count


def write_outputs(out: Path, table: Table, caption: str = "", beside: list[str] = (), axes: list[str] | None = None) -> None:
    table.to_csv(out / RESULTS)
    write_text(out / TABLE, summary_markdown(table, caption=caption, beside=beside, axes=axes) + "\n", "the results table")


def grid_caption(spec: GridSpec) -> str:
    """What every cell shares: data, fixed options and settings (one value), seeds; axes are the columns."""
    fixed = [f"{k}={vs[0]}" for k, vs in spec.sweep.items() if len(vs) == 1]
    return (f"{spec.dataset} on {'+'.join(spec.backbones)}; seeds {','.join(map(str, spec.seeds))}"
            + (f"; fixed: {', '.join(fixed)}" if fixed else "")
            + "; every other option at `fedcache train`'s default (each cell's config.json has them all)")


def summary_markdown(table: Table, metric: str = "mean_accuracy", caption: str = "", beside: list[str] = (),
                     axes: list[str] | None = None) -> str:
    """Methods as rows, the settings that vary as columns, mean (std) over seeds; the best mean of each
    column in bold where the column holds two methods or more. Settings with one value across the grid go to
    the caption, not the column labels.
    ``beside``: settings shown next to each result instead of as columns (values chosen per cell).
    ``axes``: the grid's axes, when known; without them, every column but the figures may be one (so a swept
    ``rounds``, also a figure's name, is found only through them: its cells were pooled as seeds)."""
    rows = table.to_records()
    if not rows:
        return "(no runs)"
    named = axes if axes is not None else [k for k in rows[0] if k not in METRIC_COLUMNS]
    setting_keys = [k for k in named if k not in ("method", "seed", "run_dir", "diverged", "stopped_at", *beside)
                    and len({str(r.get(k)) for r in rows}) > 1]
    label = lambda r: ", ".join(f"{k}={r.get(k)}" for k in setting_keys) or metric.replace("_", " ")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    columns = list(dict.fromkeys(label(r) for r in rows))
    stats: dict[tuple[str, str], tuple[float, float, int]] = {}
    lost: dict[tuple[str, str], int] = {}  # seeds that diverged: no result, but a mean without them would flatter
    for m in methods:
        for col in columns:
            mine = [r for r in rows if r["method"] == m and label(r) == col]
            vals = [r[metric] for r in mine if r[metric] is not None]
            lost[m, col] = sum(1 for r in mine if _true(r.get("diverged")))
            if vals:
                std = float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")  # sample std, as the papers print
                stats[m, col] = (float(np.mean(vals)), std, len(vals))
    # A best only where a column compares two methods or more (a lone result is nobody's winner), and only of
    # results no seed of which diverged.
    means = {col: [s[0] for (m, c), s in stats.items() if c == col and not lost[m, c]] for col in columns}
    best = {col: max(v) if len(v) > 1 else None for col, v in means.items()}
    lines = [f"{metric.replace('_', ' ')} %, mean (sample std, ddof=1) over seeds" + (f"; {caption}" if caption else ""), "",
             "| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for m in methods:
        cells_ = []
        for col in columns:
            if (m, col) not in stats:
                cells_.append(f"diverged ({count(lost[m, col], 'seed')})" if lost.get((m, col)) else "-")
                continue
            mean, std, n = stats[m, col]
            text = f"{mean:.2f} ({std:.2f})" if std == std else f"{mean:.2f} (one seed)"
            if lost[m, col]:
                text += f", {lost[m, col]} of {n + lost[m, col]} seeds diverged"
            chosen = next((r for r in rows if r["method"] == m and label(r) == col), {})
            text += "".join(f", {k}={chosen[k]}" for k in beside if k in chosen)
            top = best[col] is not None and not lost[m, col] and np.isclose(mean, best[col])
            cells_.append(f"**{text}**" if top else text)
        lines.append(f"| {m} | " + " | ".join(cells_) + " |")
    return "\n".join(lines)


def _true(value) -> bool:
    """A results.csv flag, read back as a bool or as its text."""
    return value is True or str(value).lower() == "true"


def load_results(out: Path) -> Table:
    """A finished grid's results.csv as a Table (numbers parsed)."""
    path = Path(out) / RESULTS
    if not path.exists():
        raise ConfigError(f"{out} has no {RESULTS}; run `fedcache grid --out {out}` first")
    return Table.from_csv(path)
