"""The commands over many runs: `grid` (every `train` option, a comma list making an axis), `report`
and `reproduce` (a paper's table)."""
from __future__ import annotations

import importlib
import inspect
import json
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from fedcache.cli.common import (DEFAULT_STORE, ExtractProgress, StoreOpt, _csv, _progress, console, loading_torch,
                                 print_table, step_printer, typer_option)
from fedcache.cli.threads import ThreadsOpt, threads_for, threads_option
from fedcache.errors import ConfigError
from fedcache.extract.config import options as extract_options
from fedcache.spec import grid_options, option, options
from fedcache.wording import count, pasted


# `fedcache grid` takes every `train` option under the same name (a test checks it); a comma-separated
# value makes it an axis. These are declared by grid itself, or have no meaning for a grid:
GRID_OWN = ("dataset", "backbones", "method", "store", "settings", "seed", "out")
GRID_SKIPS = {"resume": "a grid resumes its unfinished cells by itself", "engine": "grid cells run in-process",
              "overwrite": "finished cells are kept; use another --out", "track_dir": "trackers write into the grid's --out"}
GRID_HOW = ("track", "keep_checkpoints", "device")  # how every cell runs: one value for the grid, not an axis
# A train option's help that names what a grid has not (train's --track-dir): the grid's own words.
GRID_HELP = {"track": "Also send every cell's metrics to: tensorboard, mlflow (comma-separated; pip install "
                      "'fedcache[tensorboard]' / 'fedcache[mlflow]'); written under the grid's --out."}


def _grid(config: Optional[Path], store: Optional[Path], dataset: Optional[str], backbones: Optional[str],
          method: Optional[str], settings: List[str], seeds: Optional[str], jobs: Optional[int], out: Optional[Path],
          select: Optional[str], threads: Optional[int], **train_options) -> None:
    """The cartesian grid of methods x options x settings x seeds, in parallel, resumable; writes results.csv and table.md.

    `train`'s options are accepted under the same names (not --resume, --overwrite, --track-dir or --engine: a grid resumes by itself and has its own --engine); v1,v2,... makes one an axis (`--alpha 0.1,1`, `--set lr=0.001,0.01`)."""
    # The spec's checks that need no torch come first (the options and their values, the grid file, the methods'
    # names, what a grid may not give): a bad one is its line at once. The checks that read the methods' settings,
    # then the engines, import torch.
    with loading_torch("grid spec checked and fedcache.grids.run imported"):
        spec = _spec_of(config, store, dataset, backbones, method, settings, seeds, jobs, out, select,
                        _switched_off(train_options))
        importlib.import_module("fedcache.grids.run")
    t0 = time.perf_counter()
    _check_device(spec)
    with threads_for(threads):
        trained = _run_with_progress(spec)
    _say_what_was_trained(spec, trained, time.perf_counter() - t0)


def _spec_of(config, store, dataset, backbones, method, settings, seeds, jobs, out, select, train_options: dict):
    """The grid's spec from the command line: every other `train` option is an axis (one value or several), but
    for those that say how every cell runs and grid's own engine options."""
    from fedcache.api import grid_spec

    how = {"track": _csv(train_options.pop("track") or ""), "keep_checkpoints": train_options.pop("keep_checkpoints"),
           "device": train_options.pop("device")}
    engine = {o.name: train_options.pop(o.name) for o in grid_options()}
    axes = {name: [str(value).lower()] if isinstance(value, bool) else _csv(value, option(name).flag)
            for name, value in train_options.items() if value is not None}
    return grid_spec(config=config, store=store, default_store=DEFAULT_STORE, dataset=dataset,
                     backbones=_csv(backbones, "--backbones") if backbones else None,
                     methods=_csv(method, "--method") if method else None, settings=settings, option_axes=axes or None,
                     seeds=_csv(seeds, "--seeds") if seeds else None, jobs=jobs, out=out,
                     select=_csv(select, "--select") if select else None, track=how["track"] or None,
                     keep_checkpoints=how["keep_checkpoints"], device=how["device"], **engine)


def _run_with_progress(spec) -> list[dict]:
    """Run the grid under one bar; the rows of the cells it trained (a finished cell read back is none)."""
    from fedcache.grids import run_grid

    trained = []
    columns = TextColumn("grid"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[last]}")
    with _progress(*columns) as progress:
        tasks: list[int] = []  # made once the grid has a plan: a grid refused before it says only why

        def task() -> int:
            tasks[:] = tasks or [progress.add_task("grid", total=None, last="")]
            return tasks[0]

        on_step = step_printer(progress.console)  # no task yet: a grid its partitions refuse next never said "grid started"

        def on_plan(text: str) -> None:
            on_step(text)
            task()

        def on_cell(done: int, total: int, row: dict, text: str) -> None:  # in the log too, in the same words (run_grid)
            trained.append(row)
            progress.update(task(), total=total, completed=done, last=text)

        run_grid(spec, on_cell, on_plan=on_plan, on_step=on_step)
    return trained


def _say_what_was_trained(spec, trained: list[dict], seconds: float) -> None:
    # Unwrapped and unstyled: a log keeps each markdown row on one line, as in table.md.
    console.print((spec.out / "table.md").read_text(), soft_wrap=True, markup=False, highlight=False)
    if cells := _cells(trained):
        console.print(f"trained {count(cells, 'cell')} in {seconds:.1f} s: {60 * cells / seconds:.1f} cells per minute "
                      f"({spec.engine} engine)")
    else:  # a re-run of a finished grid: say so, rather than let the table pass for a fresh result
        console.print(f"nothing to train: every cell of this grid had finished in {spec.out} (their results are kept; "
                      "another --out trains them again)", soft_wrap=True)
    # A report made while the grid ran (or before it was continued) lacks what this command trained: said, so that it
    # is not read as the grid's.
    report = spec.out / "report.html"
    stale = report.exists() and report.stat().st_mtime < _last_result(spec.out)
    makes = "writes the HTML report anew (the report.html there lacks the cells trained since)" if stale else \
        "makes the HTML report"
    # The folder as typed, as the files beside it: pasted in another folder, a report of it is refused, not made.
    console.print(f"wrote {spec.out / 'results.csv'} and {spec.out / 'table.md'}; `fedcache report "
                  f"{pasted(str(spec.out))}` {makes}", soft_wrap=True)


def _last_result(out: Path) -> float:
    """When the grid's newest cell result was written (its cells', or a --select grid's stages' cells')."""
    found = [*out.glob("cells/*/summary.json"), *out.glob("*/cells/*/summary.json")]
    return max((p.stat().st_mtime for p in found), default=0.0)


def _cells(trained: list[dict]) -> int:
    """The cells among the rows the progress counted, each once: --prune halving counts a candidate at every rung it
    reaches (a validation cell and the test cell of one setting share a name but not their ``validation``)."""
    return len({(str(row.get("validation")), row.get("run_dir", i)) for i, row in enumerate(trained)})


def _check_device(spec) -> None:
    """The device, checked as a run checks it, before the progress bar: a bad one is a one-line error here too."""
    from fedcache.spec import EngineSpec

    EngineSpec(device=spec.device)


def _grid_signature() -> inspect.Signature:
    """grid's own options, then every other run-spec option (every `train` option) as an optional axis
    (text, split on commas)."""
    own = [
        ("config", Optional[Path], typer.Option(None, "--config", "-c", help="A grid TOML file (docs/getting-started.md); options given here override it.")),
        ("store", Optional[Path], typer.Option(None, "--store", help="Feature store path (default: env FEDCACHE_STORE or fedcache-store.zarr).")),
        ("dataset", Optional[str], typer.Option(None, "--dataset", "-d", help="Dataset name in the store (see `fedcache store ls`).")),
        ("backbones", Optional[str], typer.Option(None, "--backbones", "--backbone", "-b", help="One backbone, or several to fuse (as in train).")),
        ("method", Optional[str], typer.Option(None, "--method", "-m", help="Comma-separated methods.")),
        ("settings", List[str], typer.Option([], "--set", help="key=v1,v2,...: a method/optimizer setting, or an axis of it; repeatable.")),
        ("seeds", Optional[str], typer.Option(None, "--seeds", "--seed", help="Comma-separated seeds. \\[default: 0]")),
        ("jobs", Optional[int], typer.Option(None, "--jobs", "-j", help="Worker processes, one torch thread each. \\[default: 1]")),
        ("out", Optional[Path], typer.Option(None, "--out", "-o", help="Grid directory: cells/, results.csv, table.md. Re-running skips finished cells.")),
        ("select", Optional[str], typer.Option(None, "--select", help="Axes to tune, e.g. lr: chosen per method and setting on the validation split (spare training rows), then run once on the test split.")),
        ("threads", Optional[int], threads_option()),
    ]
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=t) for n, t, d in own]
    for o in grid_options():  # grid's own options that the spec declares: text here, checked by grid_spec
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                        default=typer.Option(None, *o.flags, metavar=_metavar(o), help=o.help + ("" if o.default is None else f" \\[default: {o.default}]"))))
    for o in options():
        if o.name in GRID_OWN or o.name in GRID_SKIPS:
            continue
        what = escape(GRID_HELP.get(o.name, o.help).rstrip("."))
        # train's default, shown as train's help shows it (\\[ is a literal bracket in rich markup)
        default = ",".join(map(str, o.default)) if isinstance(o.default, tuple) else o.default
        shown = "" if o.default in (None, ()) else f" \\[default: {default}]"
        if o.name in GRID_HOW:
            opt, typ = typer.Option(None, *o.flags, help=f"{what}. One value for every cell, not an axis.{shown}"), Optional[str]
        elif o.base is bool:  # a switch sets every cell
            opt, typ = typer.Option(None, *o.flags, help=f"{what}. For every cell."), Optional[bool]
            if "/" not in o.flags[0]:  # its --no- form turns off a grid file's true; hidden: the help's width
                off = typer.Option(False, f"--no-{o.flags[0][2:]}", hidden=True, help=f"Turn off {o.flags[0]}.")
                params.append(inspect.Parameter(NO + o.name, inspect.Parameter.KEYWORD_ONLY, default=off, annotation=bool))
        else:
            opt, typ = typer.Option(None, *o.flags, help=f"{what}. v1,v2,... makes an axis.{shown}"), Optional[str]
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=typ))
    return inspect.Signature(params)


NO = "no_"  # the parameter of a switch's hidden --no- form: no_validation


def _switched_off(train_options: dict) -> dict:
    """The switches given in their --no- form (``no_validation``), as False: a grid file's true is overridden."""
    off = {k[len(NO):] for k in list(train_options) if k.startswith(NO) and train_options.pop(k)}
    for name in off:
        if train_options.get(name):
            raise ConfigError(f"--{name.replace('_', '-')} and --no-{name.replace('_', '-')} both given; keep one")
        train_options[name] = False
    return train_options


def _metavar(o) -> str:
    """What the help shows an option takes: the spec's type, though the option is read as text (grid_spec checks
    it with messages that name the flag)."""
    from fedcache.config import choices

    names = choices(o.type)
    listed = "[" + "|".join(map(str, names)) + "]"
    if names and len(listed) <= METAVAR_WIDTH:
        return listed
    return {int: "INTEGER", float: "FLOAT"}.get(o.base, "TEXT")  # a long list: the help names the choices


METAVAR_WIDTH = 14  # wider, the help's column of types leaves no room for the options' names in 80 columns


_grid.__signature__ = _grid_signature()


def report(
    run_dir: Path = typer.Argument(..., help="A run directory (train --out), a grid directory (grid --out), or any folder of them."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where report.html, report.md and report-figures/ go (default: the directory itself)."),
) -> None:
    """A self-contained HTML report (and markdown): tables, accuracy per round, fairness, bytes, partitions."""
    from fedcache.reports import write_report

    paths = write_report(run_dir, out)
    console.print(f"wrote {paths.html} ({len(paths.figures)} figures embedded) and {paths.markdown}")


EXTRACT_OPTIONS = {o.name: o for o in extract_options()}  # reproduce extracts: its --data-root and --weights are extract's


def reproduce(
    preset: Optional[str] = typer.Argument(None, help="A paper table (leave out to list them)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would run and what data, weights and methods are missing (exit 1 if any is)."),
    store: Path = StoreOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default: runs/<preset>)."),
    data_root: Optional[Path] = typer_option(EXTRACT_OPTIONS["data_root"]),
    weights: List[str] = typer_option(EXTRACT_OPTIONS["weights"]),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Grid worker processes."),
    threads: Optional[int] = ThreadsOpt,
) -> None:
    """Reproduce a paper's table: extract, run the grids, report with the paper's numbers beside fedcache's."""
    from fedcache import reproduce as rp
    from fedcache.grids.spec import grid_fields, grid_flag

    if preset is None:
        for name in rp.names():
            console.print(f"[bold]{name}[/]: {rp.get(name).title}")
        return
    p, w = rp.get(preset), EXTRACT_OPTIONS["weights"].parse(weights)
    grid_fields({"jobs": jobs}, grid_flag)  # before any extraction, in the words `fedcache grid --jobs 0` says it
    out = rp.check_out(out or Path("runs") / preset, store)
    console.print(f"[bold]{p.title}[/] ({p.source}; {len(p.paper)} reported numbers)\n{p.notes}")
    for line in rp.plan_lines(p):
        console.print(f"  {line}")
    needs = rp.check(p, store, data_root, w)
    _say_needs(needs, dry_run)
    if dry_run:
        return
    with threads_for(threads), _progress() as progress:
        html = rp.reproduce(p, store, out, data_root, w, jobs, ExtractProgress(progress), _grid_bars(progress))
    _say_paper(out)
    console.print(f"report: {html}")


def _say_needs(needs: list, dry_run: bool) -> None:
    """The needs' table; a dry run ends with exit status 1 while any is missing (a script checks the machine by it)."""
    table = Table("kind", "name", "status", "how", box=None)
    for n in needs:
        status = "[red]missing[/]" if not n.ok else "[yellow]download[/]" if n.how.startswith("downloaded") else "[green]ok[/]"
        table.add_row(n.kind, escape(n.name), status, escape(n.how))
    print_table(table, flexible="how")
    missing = [n for n in needs if not n.ok]
    if dry_run and missing:
        console.print(f"{count(len(missing), 'need')} of {len(needs)} missing (the 'how' column says how to get "
                      "each): a run would stop at the first", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _grid_bars(progress):
    """A bar for each grid of the preset as its cells finish: a paper's grids ran for hours without a line."""
    tasks: dict[str, int] = {}

    def on_cell(key: str, done: int, total: int, row: dict) -> None:
        if key not in tasks:
            tasks[key] = progress.add_task(f"grid {key}", total=total, unit="")  # cells, not images: no rate
        progress.update(tasks[key], total=total, completed=done)

    return on_cell


def _say_paper(out: Path) -> None:
    """The paper's numbers beside fedcache's, as paper.json holds them: the command printed only the report's path."""
    rows = json.loads((out / "paper.json").read_text())["rows"]
    table = Table("paper's number", "paper", "fedcache", "from", box=None)
    for r in rows:
        mine = "-" if r["fedcache"] is None else f"{r['fedcache']:.2f}"
        table.add_row(escape(r["what"]), f"{r['paper']:.2f}", mine, escape(r["note"]))
    print_table(table, flexible="paper's number")
