"""A grid's results: results.csv (one row per cell) and table.md (mean (std) over seeds per method and
setting, the best of each data setting in bold, as the report marks it)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcache.best import Result, best_marks, bold_meaning, is_panel_key
from fedcache.disk import write_text
from fedcache.errors import ConfigError
from fedcache.grids.cell import METRIC_COLUMNS
from fedcache.grids.rungs import paused_before_first_cut
from fedcache.grids.spec import RESULTS, TABLE, GridSpec, axis_label
from fedcache.table import Table, in_rounds
from fedcache.wording import count, keyword_names, named, pasted


def write_outputs(out: Path, table: Table, caption: str = "", beside: list[str] = (), axes: list[str] | None = None) -> None:
    table.to_csv(out / RESULTS)
    write_text(out / TABLE, summary_markdown(table, caption=caption, beside=beside, axes=axes) + "\n", "the results table")


def grid_caption(spec: GridSpec) -> str:
    """What every cell shares: data, fixed options and settings (one value), seeds; axes are the columns."""
    fixed = [f"{axis_label(k, spec.methods)}={vs[0]}" for k, vs in spec.sweep.items() if len(vs) == 1]
    return (f"{spec.dataset} on {'+'.join(spec.backbones)}; seeds {','.join(map(str, spec.seeds))}"
            + (f"; fixed: {', '.join(fixed)}" if fixed else "")
            + "; every other option at `fedcache train`'s default (each cell's config.json has them all)")


def summary_markdown(table: Table, metric: str = "mean_accuracy", caption: str = "", beside: list[str] = (),
                     axes: list[str] | None = None) -> str:
    """Methods as rows, the settings that vary as columns, mean (std) over seeds; the best of each data setting
    in bold (``fedcache.best``: the report's table marks the same results). Settings with one value across the grid go to
    the caption, not the column labels.
    ``beside``: settings shown next to each result instead of as columns (values chosen per cell).
    ``axes``: the grid's axes, when known; without them, every column but the figures may be one (so a swept
    ``rounds``, also a figure's name, is found only through them: its cells were pooled as seeds)."""
    rows = table.to_records()
    if not rows:
        return "(no runs)"
    named = axes if axes is not None else [k for k in rows[0] if k not in METRIC_COLUMNS]
    setting_keys = [k for k in named if k not in ("method", "seed", "run_dir", "diverged", "diverged_round", "stopped_at", *beside)
                    and len({str(r.get(k)) for r in rows}) > 1]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    shown = {k: axis_label(k, methods) for k in [*setting_keys, *beside]}  # as typed: --head is head, not head.name
    label = lambda r: ", ".join(f"{shown[k]}={r.get(k)}" for k in setting_keys) or metric.replace("_", " ")  # noqa: E731
    columns = list(dict.fromkeys(label(r) for r in rows))
    groups = {(m, col): [r for r in rows if r["method"] == m and label(r) == col] for m in methods for col in columns}
    stats = {key: _stats(mine, metric) for key, mine in groups.items()}
    # The report's rule (fedcache/best.py): the best of each data setting, a column's panel in the report.
    panel = [k for k in setting_keys if is_panel_key(k)]
    where = {label(r): tuple(str(r.get(k)) for k in panel) for r in rows}
    pooled = references(methods)
    marks = best_marks([Result(where[col], st[0], _whole(st, groups[m, col]), m in pooled)
                        for (m, col), st in stats.items()])
    best = dict(zip(stats, marks))
    said = metric.replace("_", " ") + (f" % ({_MEANING[metric]})" if metric in _MEANING else " %")
    lines = [f"{said}, mean (sample std, ddof=1) over seeds" + (f"; {caption}" if caption else ""), "",
             "| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for m in methods:
        cells_ = [_cell_text(stats[m, col], groups[m, col], beside, best[m, col], shown) for col in columns]
        lines.append(f"| {m} | " + " | ".join(cells_) + " |")
    if any(marks):
        lines += ["", _legend(panel, pooled)]
    return "\n".join(lines)


# What a figure of one run is, in the caption: table.md is read without the docs or the run's summary.json beside it.
_MEANING = {"mean_accuracy": "each run's mean over clients of their accuracy at its last evaluation"}


def _legend(panel: list[str], pooled: list[str]) -> str:
    """What bold means, under the table: the file is read without the docs or the report beside it."""
    return f"In bold: {bold_meaning(panel, pooled)}."


def references(methods: list[str]) -> list[str]:
    """The methods of ``methods`` that pool every client's data (``Method.pools_data``): the ceiling the others are
    read against, left out of the bold marks. A name fedcache does not know (a hand-made table) is none."""
    from fedcache.federate.methods import METHODS

    return [m for m in methods if m in METHODS and METHODS.get(m).pools_data]


def _stats(rows: list[dict], metric: str) -> tuple[float | None, float, int, int]:
    """(mean, sample std or NaN with one seed, seeds with a result, seeds that diverged) of one table cell."""
    vals = [r[metric] for r in rows if r[metric] is not None]
    lost = sum(1 for r in rows if _true(r.get("diverged")))  # no result, but a mean without them would flatter
    if not vals:
        return None, float("nan"), 0, lost
    std = float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")  # sample std, as the papers print
    return float(np.mean(vals)), std, len(vals), lost


def _whole(stats: tuple, rows: list[dict]) -> bool:
    """Every seed has a result of the last round: none diverged, none cut early by successive halving (a validation
    table's candidate shows its score of the round it stopped at)."""
    cut = any(r.get("stopped_at") is not None and r.get("rounds") is not None and int(r["stopped_at"]) < int(r["rounds"])
              for r in rows)
    return stats[0] is not None and not stats[3] and not cut


def _cell_text(stats: tuple, rows: list[dict], beside: list[str], best: bool, shown: dict[str, str]) -> str:
    mean, std, n, lost = stats
    if mean is None:
        return f"diverged ({count(lost, 'seed')}{in_rounds(rows)})" if lost else "-"
    text = f"{mean:.2f} ({std:.2f})" if std == std else f"{mean:.2f} (one seed)"
    if lost:
        text += f", {lost} of {n + lost} seeds diverged{in_rounds(rows)}"
    text += _stopped(rows)
    text += "".join(f", {shown[k]}={rows[0][k]}" for k in beside if k in rows[0])
    return f"**{text}**" if best else text


def _stopped(rows: list[dict]) -> str:
    """``, at round 3`` for a --prune halving candidate cut before the full rounds: its score is of that round, beside
    others of later rounds."""
    cut = {int(r["stopped_at"]) for r in rows if str(r.get("stopped_at") or "").isdigit()
           and str(r.get("rounds") or "").isdigit() and int(r["stopped_at"]) < int(r["rounds"])}
    return f", at round {min(cut)}" if cut else ""


def _true(value) -> bool:
    """A results.csv flag, read back as a bool or as its text."""
    return value is True or str(value).lower() == "true"


def load_results(out: Path) -> Table:
    """A finished grid's results.csv as a Table (numbers parsed)."""
    path = Path(out) / RESULTS
    if not path.exists():
        paused = paused_before_first_cut(Path(out))  # nothing has a result until its first cut
        with keyword_names():  # called from Python (a command of the command line keeps its flags' words)
            again = named("the same `fedcache grid` command", "the same fedcache.grid(...) call")
            first = named(f"`fedcache grid {pasted('--out', Path(out))} ...`", f"fedcache.grid(..., out={str(out)!r})")
        if paused:
            raise ConfigError(f"{out} has no {RESULTS} yet: its --prune halving grid is {paused}; run {again} again "
                              "to continue it")
        raise ConfigError(f"{out} has no {RESULTS}; run {first} first")
    return Table.from_csv(path)
