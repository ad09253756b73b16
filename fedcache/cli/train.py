"""The commands that train or prepare one run: `demo`, `train`, `partition`, and for a Flower deployment
`shard` and `flower-app`. Their options (but demo's) are generated from fedcache/spec.py."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fedcache.cli.common import (DEFAULT_STORE, ExtractProgress, StoreOpt, _csv, _progress, _signed, _spec_params, console, err,
                                 given_on_command_line, import_with_torch, loading_torch, print_table, step_printer)
from fedcache.cli.threads import ThreadsOpt, threads_for, threads_param
from fedcache.paths import writable_file
from fedcache.errors import ConfigError, UnknownNameError
from fedcache.spec import DataPartition, RunSpec, options, refuse_unread_options, split_values, typed_keys
from fedcache.wording import count, pasted, typed_as


# `train` takes one value of each option; a comma list asked for several runs, which `grid` makes.
SEVERAL = "`fedcache train` runs one value: `fedcache grid` takes the same options, a comma list making an axis ({pair})"


def demo(
    store: Path = StoreOpt,
    # The default said with spaces: as one word (a,b,c) it was longer than the help's column at 80 columns, and cut.
    backbones: Optional[str] = typer.Option(None, "--backbones", "--backbone", "-b",
                                            help="Backbones to extract and fuse (several: FedPCL's setting). \\[default: "
                                                 "efficientnet-lite0, efficientnet-lite1, efficientnet-lite2]"),
    rounds: int = typer.Option(50, help="Federated rounds per method."),
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="Where the runs and report.html go."),
    threads: Optional[int] = ThreadsOpt,
) -> None:
    """The main job on the embedded default: extract digits5-offline, probe it, compare methods, write the report."""
    demos = import_with_torch("fedcache.demo")
    t0 = time.perf_counter()
    with threads_for(threads), _progress() as progress:
        chosen = demos.BACKBONES if backbones is None else _csv(backbones)
        res = demos.run_demo(store, chosen, rounds, progress=ExtractProgress(progress), out=out)
    warn = " [yellow](RANDOM WEIGHTS)[/]" if res.random_weights else ""
    fused = "+".join(b.removeprefix("efficientnet-") for b in res.backbones)
    # Each table's title a line of its own: as the table's title it was wrapped to the table's width, mid-phrase.
    console.print(f"[bold]Linear probe per domain, {fused} on {demos.DATASET}[/]{warn}", soft_wrap=True)
    probe = Table("domain", "train", "test", "accuracy %")
    for r in res.probes:
        probe.add_row(r.domain, str(r.n_train), str(r.n_test), f"{r.accuracy:.1f}")
    print_table(probe)
    console.print(f"[bold]One client per domain, 10 training images per class, {rounds} rounds, features {fused}[/]{warn}: "
                  "accuracy % as mean (std) over clients; params and bytes up per round", soft_wrap=True)
    fed = Table()
    for col in ("method", "acc % (std)", "global %", "params up", "bytes up", "sec"):
        fed.add_column(col, no_wrap=True, min_width=max(len(col), 5))
    for name, s in res.runs.items():
        glob = f"{s['global_accuracy']:.2f}" if s.get("global_accuracy") is not None else "-"
        # A run read back took no time now: its summary's seconds, of the demo that trained it, passed for this one's.
        sec = REUSED if name in res.reused else f"{s['seconds']:.1f}"
        fed.add_row(name, f"{s['mean_accuracy']:.2f} ({s['std_accuracy']:.2f})", glob, f"{s['params_up_per_round']:,}",
                    f"{s['bytes_up'] // max(1, s['rounds']):,}", sec)
    print_table(fed, optional=("sec",))
    if res.reused:
        console.print(f"{REUSED}: finished by an earlier demo with the same settings, read back from {out} (its "
                      "seconds are in each run's summary.json); delete a method's folder there to train it again",
                      soft_wrap=True, highlight=False, markup=False)
    console.print(f"report: [bold]{res.report}[/]")
    console.print(f"total {time.perf_counter() - t0:.1f}s; store: {store} (a re-run reuses the cached features and runs)")
    console.print(_after_the_demo(store, res.backbones, rounds, demos.DATASET), soft_wrap=True, highlight=False, markup=False)


REUSED = "reused"  # the demo table's seconds of a run read back, not trained


def _after_the_demo(store: Path, backbones, rounds: int, dataset: str) -> str:
    """What to run next, on the demo's features: the demo ran each method once with its defaults; a comparison
    tunes them on validation, over seeds, and tests once."""
    where = "" if store == DEFAULT_STORE else f"--store {store} "
    return (f"next, a comparison tuned on validation and tested once (docs/getting-started.md): fedcache grid {where}"
            f"-d {dataset} -b {','.join(backbones)} -m fedavg,fedproto --partition domain --few-shot 10 --rounds {rounds} "
            "--set lr=1e-3,1e-2 --select lr --seeds 0,1,2 --out runs/cmp && fedcache report runs/cmp")


def train(threads: int | None = None, **given) -> None:
    """Federated rounds on cached features."""
    with loading_torch("run spec made and fedcache.training imported"):  # the spec's method imports torch
        try:
            spec = RunSpec.of(**given)  # its options, checked before the method is
        except (ConfigError, UnknownNameError) as exc:
            raise _one_value_only(exc, given) from None
        refuse_unread_options(spec, given_on_command_line(given))
        training = importlib.import_module("fedcache.training")
    training.check_not_a_cell(spec.engine.out)
    with threads_for(threads), typed_as(typed_keys(given.get("settings"), spec.method.name)):
        summary, how = ENGINES[spec.engine.name](spec)
    # One line in a log too: wrapped at the console's width, a grep for the result found half of it.
    scored = " (scored on validation: spare training rows)" if spec.schedule.validation else ""
    console.print(_result_line(summary) + how + scored + (f" -> {spec.engine.out}" if spec.engine.out else ""), soft_wrap=True)


def _one_value_only(exc: ConfigError | UnknownNameError, given: dict) -> ConfigError | UnknownNameError:
    """An option or --set refused for a value that was a comma list: `train` runs one value, where `grid` (its
    options under the same names) makes the list an axis, which the user had most likely meant (a list of pairs is
    refused as that by ``spec.parse_pairs``). Said only where the refusal names that value; the error is the same one, told more."""
    said = str(exc)
    for pair in given.get("settings") or []:
        value = pair.partition("=")[2]
        values = split_values(value)
        if len(values) < 2 or value not in said or any("=" in v for v in values):  # pairs: said by parse_pairs
            continue
        return _told(exc, SEVERAL.format(pair=f"--set {pair}"))
    listed = next((o for o in options() if o.base is not tuple and isinstance(given.get(o.name), str)
                   and "," in given[o.name] and given[o.name] in said), None)
    return _told(exc, SEVERAL.format(pair=f"{listed.flag} {given[listed.name]}")) if listed else exc


def _told(exc: Exception, more: str) -> Exception:
    exc.args = (f"{str(exc).rstrip('.')}; {more}", *exc.args[1:])
    return exc


def _train_in_process(spec: RunSpec) -> tuple[dict, str]:
    from fedcache.training import check_out, train as run_train

    check_out(spec)  # a bad --out is reported before a progress bar is drawn
    with _rounds_progress() as progress:
        return run_train(spec, _rounds_bar(progress, spec), on_step=_step_lines(progress)).summary, ""


def _train_flower_sim(spec: RunSpec) -> tuple[dict, str]:
    from fedcache.flower.sim import train_flower_sim

    # In a child process, as from Python: interrupted, Flower's simulation leaves threads behind that keep its
    # process from exiting; the child ends itself, and this command says how to go on.
    with _rounds_progress() as progress:
        summary = train_flower_sim(spec, on_round=_rounds_bar(progress, spec), on_step=_step_lines(progress))
    return summary, " (Flower simulation)"


def _rounds_progress():
    # The time elapsed counts while a round runs: the bar alone stood still for a first round of 10 to 20 s.
    return _progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     TextColumn("{task.fields[acc]}"))


def _step_lines(progress):
    """Every engine's ``on_step``: the line above the rounds bar (or before it is drawn)."""
    return step_printer(progress.console)


def _rounds_bar(progress, spec: RunSpec):
    """The run's rounds as a bar with the last accuracy: every engine's ``on_round``."""
    task = None

    def on_round(done: int, total: int, line: dict | None) -> None:
        nonlocal task
        if task is None:  # drawn as the rounds start: a run that cannot (no store, no features) is its error alone
            resumed = f" (resumed after round {done})" if done else ""  # the first call is at the checkpoint
            task = progress.add_task(f"{spec.method.name} rounds{resumed}", total=total, completed=done, acc="")
        acc = f"acc {line['accuracy']:.1f}%" if line else ""
        progress.update(task, completed=done, acc=acc)

    return on_round


ENGINES = {"in-process": _train_in_process, "flower-sim": _train_flower_sim}  # the names of spec.EngineSpec.name
_signed(train, _spec_params(options()) + [threads_param()])


def _result_line(s: dict) -> str:
    glob = f", global {s['global_accuracy']:.2f}%" if s.get("global_accuracy") is not None else ""
    rnd = " [yellow](RANDOM WEIGHTS)[/]" if s.get("random_weights") else ""
    rnd += " [yellow](BYPASSED THE FEATURE CACHE: raw images)[/]" if s.get("bypasses_cache") else ""
    return (f"[bold]{s['method']}[/]: {s['mean_accuracy']:.2f}% mean over clients (std {s['std_accuracy']:.2f}){glob}; "
            f"{s.get('params_up_per_client', 0):,.0f} params up per client per round ({s['params_up_per_round']:,} per round "
            f"over the clients that sent), {s['bytes_up']:,} B up and {s['bytes_down']:,} B down in all; "
            f"{count(s['rounds'], 'round')} in {s['seconds']:.2f}s{rnd}")


PARTITION_OPTIONS = [*options("data", "partition"), next(o for o in options("schedule") if o.name == "seed")]


def _scheme_line(effective: dict) -> str:
    """``dirichlet alpha 0.5``: the scheme with its own options as they ran (the defaults filled in)."""
    from fedcache.federate.partitions.core import COMMON_OPTIONS

    own = [f"{k.replace('_', '-')} {v}" for k, v in effective.items()
           if k not in COMMON_OPTIONS and k != "min_size" and v is not None]
    return " ".join([effective["scheme"], *own])


def partition(plot: Optional[Path] = None, **given) -> None:
    """Make (or find) a seeded partition, store it beside the features, and optionally plot it."""
    from fedcache.partitioning import partition_only

    spec = DataPartition.of(**given)  # no method: its class imports torch (seconds), which a partition needs none of
    refuse_unread_options(spec, given_on_command_line(given))
    if plot is not None:  # before the partition is made, not after
        writable_file(Path(f"{plot}-bubbles.png"), "--plot")
    # A million rows' labels, domains and ids read and partitioned take under a second; no feature is read.
    part, info, train = partition_only(spec, on_step=_said)
    sizes, tests = [len(r) for r in part.train], [len(r) for r in part.test]
    console.print(f"partition [bold]{info['partition_id']}[/] ({_scheme_line(info['effective'])}, {len(sizes)} clients): train sizes "
                  f"{min(sizes)}-{max(sizes)} (total {sum(sizes)}), local test sizes {min(tests)}-{max(tests)}")
    if plot is not None:
        from fedcache.reports.partition_plots import plot_partition

        for path in plot_partition(part, train.labels, train.class_names, plot, train.domains, train.domain_names):
            console.print(f"wrote {path}")


_signed(partition, _spec_params(PARTITION_OPTIONS, backbones="Any extracted backbone (only labels and domains are used).",
                               seed="Partition seed (use the run's --seed).")
        + [inspect.Parameter("plot", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                             default=typer.Option(None, help="Write <PLOT>-bubbles.png and <PLOT>-sizes.png."))])


_said = step_printer(err)  # beside progress, not in the command's output


def shard(out: Path, **given) -> None:
    """One self-contained feature store per client (only its rows) plus the server's, for a Flower deployment."""
    from fedcache.store.feature_store import FeatureStore

    # The options and the store are checked without the method, whose class imports torch (seconds): a bad option
    # or a store that is not there is its line at once.
    data = DataPartition.of(**given)
    refuse_unread_options(data, given_on_command_line(given))
    FeatureStore(data.data.store, create=False)
    with loading_torch("shard spec made and fedcache.flower.shard imported"):
        spec = RunSpec.of(method="fedavg", **given)  # the method is not used: only the data and the partition
        from fedcache.flower.shard import describe, write_shards
        from fedcache.flower.sim import shard_spec
    with _progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()) as progress:
        task = None

        def on_shard(done: int, total: int) -> None:
            nonlocal task
            if task is None:  # drawn once the partition is made: a sharding refused before it is its error alone
                task = progress.add_task("shards", total=total)
            progress.update(task, completed=done)

        # the method that will train on the shards is not known here: a view they leave out is warned of (views None)
        paths = write_shards(dataclasses.replace(shard_spec(spec), views=None), out, on_shard)
    console.print(describe(paths))


_signed(shard, _spec_params(PARTITION_OPTIONS, seed="Partition seed (use the run's --seed).")
        + [inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Path, default=typer.Option(
            ..., "--out", "-o", help="New directory: client-000 ... client-<N-1> and server."))])


def flower_app(out: Path = typer.Argument(..., help="Directory for the Flower App (a pyproject.toml) that `flwr run` ships.")) -> None:
    """Write the Flower App project of fedcache's generic ServerApp / ClientApp (see docs/deploy.md)."""
    from fedcache.flower.project import write_app

    console.print(f"wrote {write_app(out)}; run it with `flwr run {pasted(out)} CONNECTION --run-config \"...\"`", soft_wrap=True)
