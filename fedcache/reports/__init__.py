"""``fedcache report RUN_OR_GRID_DIR``: one self-contained HTML page and a markdown twin.

The HTML embeds every figure as a base64 data URI, so the single file still works when moved or
mailed; the markdown references the same PNGs in ``report-figures/`` next to it. Optional inputs
in the directory add sections: ``paper.json`` (written by ``fedcache reproduce``: the paper's numbers
beside fedcache's) and ``contribution.json`` (FedPCL's backbone heatmap, written by the demo).
"""
from __future__ import annotations

import base64
import contextlib
import html
import json
import logging
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fedcache import __version__, disk, interrupts
from fedcache.best import Result, best_marks, bold_meaning
from fedcache.errors import ConfigError, DamagedFileError
from fedcache.federate.metrics import SHARES, share_size
from fedcache.paths import (CONFIG, GRID, WRITE_ELSEWHERE, check_outside_stores, refused_problem,
                            removed_if_left_empty, writable_dir)
from fedcache.reports import figures
from fedcache.reports.layout import Layout
from fedcache.reports.options import options_text
from fedcache.reports.runs import SELECTION, Group, Run, find_runs, group_runs
from fedcache.store.locks import exclusive_lock
from fedcache.table import in_rounds
from fedcache.wording import count, named

HTML_NAME, MD_NAME, FIG_DIR = "report.html", "report.md", "report-figures"
PAPER, CONTRIBUTION = "paper.json", "contribution.json"
MAX_PARTITIONS = 24  # one bubble chart per setting; past a few dozen a page is scrolled past, not read

log = logging.getLogger(__name__)


@dataclass
class ReportPaths:
    html: Path
    markdown: Path
    figures: list[Path]


@dataclass
class Section:
    title: str
    text: str = ""
    table: list[list[str]] | None = None  # first row: header
    image: Path | None = None
    labels: list[str] = field(default_factory=list)  # the labels drawn in the image


def write_report(root: Path, out: Path | None = None) -> ReportPaths:
    given = named("--out", "out")
    out = writable_dir(out, given) if out else None  # before any figure is drawn
    if out is not None:
        check_outside_stores(out)
    runs = find_runs(root)
    option, advice = (given, WRITE_ELSEWHERE) if out else ("cannot write the report into", report_elsewhere())
    out = out or writable_dir(root, option, advice=advice)
    # One report at a time into one directory: two share the staging folder, and the second removed the first's
    # figures under it ("No such file or directory: .../.report-figures.partial/accuracy-per-round.png").
    # A report that fails (a full disk) leaves no folder it made: the lock's file goes with the lock, its staging
    # folder with the failure, and a new --out with them, as a run's or a grid's does (ownership.hold).
    with removed_if_left_empty(out), contextlib.ExitStack() as held:
        try:  # the lock makes the folder too: a file system may refuse either (/proc, /sys)
            held.enter_context(exclusive_lock(out / REPORT_LOCK, f"the report in {out}", wait=REPORT_WAIT,
                                              transient=True, advice="report again once it has finished"))
        except OSError as exc:
            if disk.is_full(exc):
                raise  # said as every full disk is (disk.full_disk)
            raise ConfigError(f"{option} {out}: {refused_problem(exc)}; {advice}") from None
        return _write_report(root, runs, out)


# The runs are only read: a colleague's read-only directory (or a read-only mount) is reported into another.
def report_elsewhere() -> str:
    return (f"its runs are only read, so give {named('--out DIR', 'out=DIR')}, a directory you can write to, "
            "for the report")


REPORT_LOCK = ".report.lock"
REPORT_KEPT = "the last report there (if any) is kept as it was"  # a full disk's advice: disk.again(kept=...)
REPORT_WAIT = 300.0  # seconds: a second report of the same directory waits for the first, then writes its own


def _write_report(root: Path, runs: list[Run], out: Path) -> ReportPaths:
    fig_dir, staged = out / FIG_DIR, out / f".{FIG_DIR}.partial"
    # Drawn beside the last report's figures, which give way only once every one is: a report that fails part way
    # (a full disk) leaves the last one whole, and a figure the new one does not draw goes with the old set.
    # The two texts are written there too, and moved out with the figures: renames, which a full disk cannot stop.
    # A full disk is said of the report: the staged file that did not fit is gone with its folder.
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    try:
        with disk.on_full_disk(out / HTML_NAME, "the report", remove=[staged], advice=disk.again(kept=REPORT_KEPT)):
            sections, title = _sections(root, runs, staged)
            disk.write_staged(staged / HTML_NAME, render_html(title, sections).encode())  # reads the figures
            for sec in sections:  # where the figures will be
                sec.image = fig_dir / sec.image.relative_to(staged) if sec.image else None
            disk.write_staged(staged / MD_NAME, render_markdown(title, sections, out).encode())
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    _commit(staged, out)
    return ReportPaths(out / HTML_NAME, out / MD_NAME, [s.image for s in sections if s.image])


def _commit(staged: Path, out: Path) -> None:
    """The staged report in place of the last one. A Ctrl-C waits until it is (a report whose figures were removed
    and not yet replaced would say they were kept); the last figures are moved aside, not removed, before the new
    ones go in: a killed process leaves them (as ``.report-figures.old``, which the next report removes)."""
    fig_dir, aside = out / FIG_DIR, out / f".{FIG_DIR}.old"
    shutil.rmtree(aside, ignore_errors=True)
    with interrupts.held():
        if fig_dir.exists():
            fig_dir.rename(aside)
        for name in (HTML_NAME, MD_NAME):
            (staged / name).replace(out / name)
        staged.rename(fig_dir)
        shutil.rmtree(aside, ignore_errors=True)


def _sections(root: Path, runs: list[Run], fig_dir: Path) -> tuple[list[Section], str]:
    """The report's sections, their figures drawn into ``fig_dir``, and its title."""
    groups = group_runs(runs)
    spec = _grid_spec(Path(root))
    for g in groups:  # a group with fewer seeds than its grid's is partial (the grid is unfinished)
        g.expected_seeds = len(spec["seeds"]) if spec else None
    unfinished = _unfinished(Path(root), runs, spec)
    swept = _swept(spec) if unfinished else set()
    layout = Layout.of(groups, spec["methods"] if spec else [], swept)  # the legend in table.md's order
    groups = layout.ordered(groups)
    if unfinished:
        log.warning("%s", unfinished.replace("**", "").strip())
    if other := other_versions(runs):
        log.warning("%s", other.replace("`", ""))
    sections = [Section("Results", unfinished + _results_text(root, runs, groups, layout),
                        table=summary_rows(groups, layout))]
    sections += _optional(Path(root) / SELECTION, _selection_sections, "Chosen on validation, then tested",
                          "run the same `fedcache grid` command again, which writes it again")
    sections += _optional(Path(root) / PAPER, _paper_sections, "Paper vs fedcache",
                          "run the same `fedcache reproduce` command again, which writes it again")
    scored = [g for g in groups if g.runs]  # a group whose every seed diverged has nothing to draw
    sections += _figure_sections(scored, layout, fig_dir, _fewer_seeds(groups, layout))
    sections += _partition_sections(scored, layout, fig_dir)
    sections += _optional(Path(root) / CONTRIBUTION, lambda d: _contribution_sections(d, fig_dir),
                          "FedPCL: which backbone each client leans on", "run `fedcache demo` again, which writes it again")
    return sections, f"fedcache report: {Path(root).resolve().name}"


def _optional(path: Path, build, title: str, advice: str) -> list[Section]:
    """The sections ``build`` makes of the JSON file at ``path``, a part the report can go on without: a torn or
    hand-edited one is a warning naming it, and a section of that title saying the part is missing and why."""
    if not path.exists():
        return []
    try:
        return build(disk.read_json(path, advice))
    except DamagedFileError as exc:
        damaged = exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # JSON, but not of the shape written
        # Raised while the part is built, so it may also be a bug of the report's: the traceback is kept (DEBUG).
        log.debug("building the part of %s failed", path, exc_info=True)
        damaged = DamagedFileError(path, f"not as fedcache writes it, or not read as written: {type(exc).__name__}: "
                                         f"{exc}", advice)
    log.warning("%s; the report goes on without it", damaged)
    return [Section(f"{title}: missing", f"**Not shown: {damaged}.**")]


def _results_text(root: Path, runs: list[Run], groups: list[Group], layout: Layout) -> str:
    random = any(r.summary.get("random_weights") for r in runs)
    warn = " **Features from RANDOM weights: these accuracies say nothing about the method.**" if random else ""
    lost = sum(len(g.diverged) for g in groups)
    lost_text = f" ({count(lost, 'grid cell')} diverged: no result, named beside its group)" if lost else ""
    data, mixed = _data_text(runs, groups, layout)
    what = (f"{count(len(runs) - lost, 'run')}{lost_text} in {count(len(groups), 'group')} (method and setting; seeds "
            f"pooled) from `{root}`{data}; {layout.caption()}.{options_text(runs)}{mixed}{warn}{_cut_short(runs)}")
    other = other_versions(runs)
    what += f" {other}." if other else ""
    return what + "\n\n" + _reading(runs, groups, layout)


def _reading(runs: list[Run], groups: list[Group], layout: Layout) -> str:
    """How to read the results table: every column's figure defined, for a reader without the docs."""
    return ("How to read the table: accuracy is the mean over clients of each client's accuracy after the last round; "
            "± is the sample std (ddof=1) over seeds; the std over clients is the population std (ddof=0) within a run, "
            "averaged over seeds; global % is the global model's accuracy on every row of the split (over rows, not "
            "clients; - for methods without one); worst / best 10% is the mean accuracy of the worst / best tenth of the "
            f"clients ({shares_text(runs)}); variance is over clients (the std over clients squared), averaged over "
            "seeds; params up per client is what one client sends in one round (the FedPCL paper's '# of Comm Params'); "
            "seconds is a run's wall time, and cells the batched engine trained together each show their batch's; in "
            f"bold {bold_meaning(layout.panel_keys, references(groups))}, where two or more compare (table.md marks "
            "the same).")


def shares_text(runs: list[Run]) -> str:
    """How many clients the fairness figures' shares hold: with five clients the worst 10% and 20% are both the single
    worst client, which the two columns would not say."""
    sizes = {len(r.summary.get("per_client_accuracy") or ()) for r in runs} - {0}
    if len(sizes) != 1:
        return "each share rounded up to whole clients, at least one"
    n = sizes.pop()
    said: dict[tuple[bool, int], list[str]] = {}
    for key, frac, best in SHARES:
        said.setdefault((best, share_size(frac, n)), []).append(f"{'best' if best else 'worst'} {round(frac * 100)}%")
    parts = [f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} the {'best' if best else 'worst'} "
             + ("client" if k == 1 else f"{k} clients") for (best, k), names in said.items()]
    return f"of {count(n, 'client')}: {', '.join(parts)}"


def references(groups: list[Group]) -> list[str]:
    """The methods shown that pool every client's data, which the bold marks leave out (fedcache/best.py)."""
    return list(dict.fromkeys(g.method for g in groups if g.reference))


def _data_text(runs: list[Run], groups: list[Group], layout: Layout) -> tuple[str, str]:
    """The features the runs trained on (a mailed report named neither dataset nor backbone), and a warning where a
    panel, whose results are compared and one marked the best, holds runs on different features (separate runs
    of several methods in one folder)."""
    def data(r: Run) -> str | None:
        dataset, backbones = r.option("dataset"), r.option("backbones")
        if not dataset:
            return None
        return f"{dataset} on {'+'.join(backbones) if isinstance(backbones, (list, tuple)) else backbones}"

    seen = list(dict.fromkeys(d for d in map(data, runs) if d))
    if not seen:
        return "", ""
    mixed = [layout.panel_title(panel) for panel, gs in layout.panels(groups).items()
             if len({d for g in gs for d in map(data, [*g.runs, *g.diverged]) if d}) > 1]
    warn = (f" **Runs on different features share a panel ({'; '.join(mixed)}): their accuracies are not like for like, "
            "yet the table and figures compare them (the best is marked among them).**" if mixed else "")
    return f" ({'; '.join(seen)})", warn


def _cut_short(runs: list[Run]) -> str:
    """Runs whose per-round metrics are cut short: their table row holds, their curves (and their group's) stop early."""
    cut = [r.missing for r in runs if r.missing]
    return f" **Metrics cut short (torn or edited): {'; '.join(cut)}.**" if cut else ""


def other_versions(runs: list[Run]) -> str:
    """The runs whose config.json another fedcache wrote (said as a checkpoint or a store of another version is:
    "written by a newer fedcache"): a note, as the report reads them all the same, by this version's reading of
    their files; runs that recorded no version (before config.json had one) are not named."""
    other: dict[str, list[Run]] = {}
    for r in runs:
        version = r.config.get("fedcache_version")
        if isinstance(version, str) and version != __version__:
            other.setdefault(version, []).append(r)
    if not other:
        return ""
    first = next(iter(other.values()))[0].path / CONFIG
    n = sum(map(len, other.values()))
    which = f"`{first}` was" if n == 1 else f"{count(n, 'run')}' config.json (`{first}`, ...) were"
    return (f"{which} written by another fedcache ({', '.join(other)}; this report's is {__version__}), whose files "
            "the report reads as this version's own")


def _unfinished(root: Path, runs: list[Run], spec: dict | None) -> str:
    """A grid reported before every cell has a result (still running, or stopped): said first, since its table,
    its bold best and its figures would otherwise pass for the whole grid's."""
    expected = _grid_cells(root)
    if expected is None or len(runs) >= expected:
        return ""
    has = "has" if len(runs) == 1 else "have"
    seen = {r.summary.get("method") for r in runs}
    none = [m for m in (spec or {}).get("methods", []) if m not in seen]
    none_text = f"; no cell of {', '.join(none)} has one yet" if none else ""
    return (f"**Unfinished grid: {len(runs)} of its {expected} cells {has} a result{none_text}** (the grid is still "
            "running, or stopped before the others: run the same `fedcache grid` command to finish it, then report "
            "again); what follows shows these alone. ")


def _swept(spec: dict) -> set[str]:
    """The settings grid.json sweeps over several values."""
    return {k for k, vs in (spec.get("sweep") or {}).items() if isinstance(vs, list) and len(vs) > 1}


def _grid_cells(root: Path) -> int | None:
    """How many cells the grid at ``root`` has (a --select grid: its validation and test stages; its test stage
    alone: one chosen value of each selected axis), from grid.json; None where ``root`` is no grid's directory."""
    spec = _grid_spec(root)
    if spec is None:
        return None
    select = set(spec.get("select") or [])
    if (root.parent / SELECTION).exists() and "validation" not in (spec.get("sweep") or {}):
        outer = _grid_spec(root.parent)  # the test stage's grid.json sweeps every value; only the chosen ran
        select = set(outer.get("select") or []) if outer else select
        return _cells(spec, skip=select) if select else None
    return _cells(spec) + _cells(spec, skip=select) if select else _cells(spec)


def _grid_spec(root: Path) -> dict | None:
    try:
        spec = json.loads((root / GRID).read_text())
        ok = isinstance(spec, dict) and isinstance(spec.get("methods"), list) and isinstance(spec.get("seeds"), list)
        return spec if ok else None
    except (OSError, ValueError):
        return None


def _cells(spec: dict, skip: set[str] = frozenset()) -> int:
    """Methods x seeds x the values of every axis but those in ``skip`` (one value each)."""
    sweep = dict(spec.get("sweep") or {})
    return len(spec["methods"]) * len(spec["seeds"]) * math.prod(len(v) for k, v in sweep.items() if k not in skip)


def _fmt(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:,.{digits}f}" + (f" ± {std:,.{digits}f}" if std is not None else "")


def summary_rows(groups: list[Group], layout: Layout | None = None) -> list[list[str]]:
    """One row per group: the method, a column per setting that varies, then the figures."""
    layout = layout or Layout.of(groups)
    keys = layout.panel_keys + layout.legend_keys
    # A --select report's rows are of both splits, each saying its own in the split column.
    scored = "accuracy % on the row's split" if "split" in keys else f"{layout.evaluated_on} accuracy %"
    header = ["method", *keys, "seeds", scored, "std over clients", "global %",
              "worst 10%", "best 10%", "variance", "params up per client/round", "params up/round", "bytes up (total)", "seconds"]
    # table.md's rule (fedcache/best.py): in the running, the groups whose every seed reached the end (not stopped by
    # halving, none diverged or still to run), each against the others of its panel.
    marks = best_marks([Result(layout.panel(g), g.mean("mean_accuracy"), g.complete, g.reference) for g in groups])
    rows = [header]
    for g, bold in zip(groups, marks):
        acc = _fmt(g.mean("mean_accuracy"), g.std("mean_accuracy"))
        if g.stopped_at is not None:
            then = ", then diverged" if any(r.summary.get("diverged") for r in g.runs) else ""
            acc += f" (stopped at round {g.stopped_at}{then})"
        if g.diverged:
            rounds = in_rounds([r.summary for r in g.diverged])
            acc += f" ({len(g.diverged)} of {len(g.runs) + len(g.diverged)} seeds diverged{rounds}; the mean is of the " \
                   "others)" if g.runs else f" (every seed diverged{rounds})"
        tried = len(g.runs) + len(g.diverged)
        if g.unfinished_seeds:
            acc += f" ({g.unfinished_seeds} of {g.expected_seeds} seeds not run yet)"
        rows.append([g.method, *(str(g.setting.get(k, "-")) for k in keys),
                     f"{tried} of {g.expected_seeds}" if g.unfinished_seeds else str(tried),
                     f"**{acc}**" if bold else acc, _fmt(g.mean("std_accuracy")), _fmt(g.mean("global_accuracy")),
                     _fmt(g.mean("worst10")), _fmt(g.mean("best10")), _fmt(g.mean("variance"), digits=1),
                     _fmt(g.mean("params_up_per_client"), digits=0), _fmt(g.mean("params_up_per_round"), digits=0),
                     _fmt(g.mean("bytes_up"), digits=0),
                     _fmt(g.mean("seconds"))])
    return rows


def _selection_sections(sel: dict) -> list[Section]:
    """A --select grid's choices (selection.json): per method and setting, the value chosen on validation and
    every candidate's validation score, so a test result is read beside the value it was run with."""
    skip = {"method", "chosen", "validation_score", "candidates", "cuts", "full_rounds", "revived"}
    keys = list(dict.fromkeys(k for c in sel["choices"] for k in c if k not in skip))
    # Only the settings that tell choices apart: the fixed ones (partition, clients, rounds, ...) are in the results'
    # caption, and repeated on every row they pushed the candidates' scores off the page.
    keys = [k for k in keys if len({str(c.get(k, "-")) for c in sel["choices"]}) > 1]
    rows = [["method", *keys, "chosen", "validation score", "candidates (validation score)"]]
    for c in sel["choices"]:
        shown = lambda values: ", ".join(f"{k}={v}" for k, v in values.items() if k in sel["selected"])
        tried = "; ".join(f"{shown(v)}: {'diverged' if v.get('diverged') else _fmt(v['validation_score'])}{_stop_note(v, c)}"
                          for v in c["candidates"])
        rows.append([c["method"], *(str(c.get(k, "-")) for k in keys), shown(c["chosen"]), _fmt(c["validation_score"]), tried])
    text = (f"{', '.join(sel['selected'])} chosen per method and setting on the validation split (spare training rows): "
            f"{sel['rule']}. The split=test panels and rows ran the chosen values once on the test split, with the same "
            "seeds and partitions; the split=validation ones are every candidate, scored on validation.")
    if "prune" in sel:
        p = sel["prune"]
        text += (f" Candidates were cut by successive halving (reduction factor {p['reduction_factor']}): {p['note']}; "
                 "a score marked 'at round r' is of that round, where the candidate stopped; 'diverged by round r': "
                 "on its way to that round's cut.")
        if any(c.get("revived") for c in sel["choices"]):
            text += (" Kept candidates that diverged after a cut were replaced by the next best of that cut "
                     "(selection.json: revived).")
    return [Section("Chosen on validation, then tested", text, table=rows)]


def _stop_note(candidate: dict, choice: dict) -> str:
    at = candidate.get("stopped_at")
    if at is None or at == choice.get("full_rounds"):
        return ""
    # A diverged candidate's stop is the rung that cut it: it diverged on its way there, in any round up to it.
    return f" by round {at}" if candidate.get("diverged") else f" at round {at}"


def _paper_sections(paper: dict) -> list[Section]:
    """paper.json (fedcache reproduce): the paper's numbers beside fedcache's."""
    rows = [["what", "paper", "fedcache", "note"]]
    for r in paper["rows"]:
        rows.append([r["what"], _fmt(r.get("paper")), _fmt(r.get("fedcache")), r.get("note", "")])
    return [Section(f"Paper vs fedcache: {paper['title']}", paper.get("text", ""), table=rows)]


FIGURES = (
    ("Accuracy per round", figures.accuracy_per_round, "accuracy-per-round.png",
     "Mean over seeds, band: ± sample std over seeds; ★ the best final accuracy of the panel, where two or more "
     "compare."),
    ("Final accuracy", figures.final_accuracy, "final-accuracy.png",
     "Mean over seeds, error bars: ± sample std over seeds; ★ the best of the panel among the results that ran to the end, where two or more compare."),
    ("Training loss per round", figures.train_loss_per_round, "train-loss-per-round.png",
     "The sampled clients' mean loss over their local steps; band: ± sample std over seeds."),
    ("Per-client accuracy distribution", figures.client_distribution, "per-client-accuracy.png",
     "Final accuracy of every client, all seeds pooled: box from the first to the third quartile, black line the "
     "median, whiskers to the furthest client within 1.5 box lengths, circles the clients beyond, white triangle "
     "the mean."),
    ("Fairness", figures.fairness, "fairness.png",
     "Mean accuracy of the worst / best share of clients (as FedPCL Tables 12-13; {shares}), mean over seeds."),
    ("Bytes sent per round", figures.bytes_per_round, "bytes-per-round.png",
     "All sampled clients together; each label's bytes up (bold) and down (faint, in the same line style)."),
)


# The captions of the figures whose spread is over seeds, where every label has one seed: no band, no error bars.
ONE_SEED = {
    "accuracy-per-round.png": "One seed per line (no spread to draw); ★ the best final accuracy of the panel, where "
                              "two or more compare.",
    "final-accuracy.png": "One seed per bar (no error bars); ★ the best of the panel among the results that ran to the end, where two or more compare.",
    "train-loss-per-round.png": "The sampled clients' mean loss over their local steps; one seed per line.",
}


# The figures whose star marks the best (fedcache/best.py): a group drawn from fewer seeds is said to be no contender.
MARKS_BEST = {"accuracy-per-round.png", "final-accuracy.png"}


# Figures of every round: a candidate stopped early by successive halving is drawn up to where it stopped. The
# others compare final figures, which such a candidate has only of an earlier round: it is left out of them.
PER_ROUND = {"accuracy-per-round.png", "train-loss-per-round.png", "bytes-per-round.png"}


def _fewer_seeds(groups: list[Group], layout: Layout) -> str:
    """What the figures' means leave out: groups not drawn (every seed diverged) and groups drawn from fewer seeds
    than the others (some diverged, or an unfinished grid has not run them yet), named as the legend names them."""
    def name(g: Group) -> str:
        where = f" ({layout.panel_title(layout.panel(g))})" if layout.panel_keys else ""
        return layout.label(g).replace("\n", " ") + where

    gone = [name(g) for g in groups if not g.runs]
    fewer = []
    for g in groups:
        if g.runs and (g.diverged or g.unfinished_seeds):
            why = ", ".join(filter(None, [f"{len(g.diverged)} diverged" if g.diverged else "",
                                          f"{g.unfinished_seeds} not run yet" if g.unfinished_seeds else ""]))
            of = g.expected_seeds or len(g.runs) + len(g.diverged)
            fewer.append(f"{name(g)}: {count(len(g.runs), 'seed')} of {of} ({why})")
    text = f" Not drawn, every seed diverged: {', '.join(gone)}." if gone else ""
    text += f" Drawn from fewer seeds: {'; '.join(fewer)}{{best}}." if fewer else ""
    return text


def _figure_sections(groups: list[Group], layout: Layout, fig_dir: Path, fewer_seeds: str = "") -> list[Section]:
    out = []
    finished = [g for g in groups if g.stopped_at is None]
    shares = shares_text([r for g in finished for r in g.runs])
    for title, draw, name, text in FIGURES:
        text = text.replace("{shares}", shares)
        shown = groups if name in PER_ROUND else finished
        if not shown:
            continue
        if all(len(g.runs) <= 1 for g in shown):
            text = ONE_SEED.get(name, text)
        if len(shown) < len(groups):
            text += " Candidates that --prune halving stopped early are left out (their curves are in Accuracy per round)."
        elif name in PER_ROUND and len(finished) < len(groups):
            text += (" Dotted vertical lines: the rounds at which --prune halving cut candidates; a curve that ends at "
                     "one stopped there (cut, or chosen as the last one left).")
        text += fewer_seeds.replace("{best}", "; not marked best" if name in MARKS_BEST else "")
        fig = draw(shown, layout)
        if fig is None:
            continue
        path = fig_dir / name
        disk.write_staged(path, fig.png)
        out.append(Section(title, text + fig.note, image=path, labels=fig.labels))
    return out


def _partition_sections(groups: list[Group], layout: Layout, fig_dir: Path) -> list[Section]:
    """Each distinct partition of the panel settings, drawn once for its first run's seed (every seed draws its
    own), titled by every panel that used it: a --select grid's validation and test panels share theirs."""
    panels = list(layout.panels(groups).items())
    used: dict[str, tuple[Run, list[str], set]] = {}
    for panel, members in panels:
        run = members[0].runs[0]
        pid = run.config.get("partition", {}).get("partition_id")
        if pid:
            where = used.setdefault(pid, (run, [], set()))
            where[1].append(layout.panel_title(panel) if layout.panel_keys else "every run")
            where[2].update({r.summary.get("seed", r.option("seed")) for g in members for r in g.runs} - {None})
    out = []
    for i, (run, wheres, seeds) in enumerate(list(used.values())[:MAX_PARTITIONS]):
        note = (f"Seed {run.option('seed')}'s partition; each of the {len(seeds)} seeds draws its own "
                "the same way." if len(seeds) > 1 else "")
        if len(used) > MAX_PARTITIONS and i == MAX_PARTITIONS - 1:
            note += f" The first {MAX_PARTITIONS} of {len(used)} partitions are shown."
        for path in figures.partition_charts(run, fig_dir):
            kind = "who holds which classes" if path.name.endswith("bubbles.png") else "training rows per client"
            out.append(Section(f"Partition ({'; '.join(wheres)}): {kind}", note.strip(), image=path))
    return out


def _contribution_sections(d: dict, fig_dir: Path) -> list[Section]:
    """contribution.json (the demo's FedPCL run): the backbone heatmap."""
    import numpy as np

    from fedcache.reports.contribution import Contribution
    from fedcache.reports.heatmap import plot_contribution

    c = Contribution(np.array(d["scores"]), d["clients"], d["backbones"])
    png = plot_contribution(c, fig_dir / "backbone-heatmap.png")
    return [Section("FedPCL: which backbone each client leans on (paper Figure 4)", d.get("text", ""), image=png)]


def save_contribution(c, path: Path, text: str = "") -> Path:
    """Keep a backbone contribution beside a run so its report shows the heatmap."""
    path = Path(path)
    disk.write_text(path, json.dumps({"scores": c.scores.tolist(), "clients": c.clients, "backbones": c.backbones,
                                      "text": text}), "the backbone contribution")
    return path


# ---- rendering ----------------------------------------------------------------------------------
CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td{white-space:nowrap}
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"""


def _cell_html(text: str) -> str:
    bold = text.startswith("**") and text.endswith("**")
    inner = html.escape(text.strip("*") if bold else text)
    return f"<b>{inner}</b>" if bold else inner


def _inline_html(text: str) -> str:
    """A paragraph's markdown marks as the page shows them: **bold** (an unfinished grid's warning) bold, `code` (a
    command, a path) as code; the page showed the backticks, and the warning as plain as the text around it."""
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text)).replace("**", "")
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def render_html(title: str, sections: list[Section]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        for paragraph in filter(None, s.text.split("\n\n")):
            parts.append(f"<p>{_inline_html(paragraph)}</p>")
        if s.table:
            head, *body = s.table
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{_cell_html(c)}</td>" for c in row) + "</tr>" for row in body]
            parts.append("</table>")
        if s.image:
            data = base64.b64encode(s.image.read_bytes()).decode()
            labels = html.escape(json.dumps(s.labels), quote=True)
            parts.append(f"<img alt='{html.escape(s.title)}' data-labels='{labels}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def render_markdown(title: str, sections: list[Section], out: Path) -> str:
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        if s.text:
            lines += [s.text, ""]
        if s.table:
            head, *body = s.table
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
            lines.append("")
        if s.image:
            lines += [f"![{s.title}]({s.image.relative_to(out).as_posix()})", ""]
    return "\n".join(lines)
