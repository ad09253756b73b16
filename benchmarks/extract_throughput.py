"""Extraction throughput: backbone forward alone vs the whole pipeline, in one run.

The whole pipeline is decode + transform + forward + write to the Zarr store, timed by
the runner per entry (model and dataset loading excluded). Forward-only runs the same
encoder on random tensors of the same shape and batch size. Random weights are fine
for speed. Usage:

    .venv/bin/python benchmarks/extract_throughput.py [--device cpu|cuda] [--out FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedcache.extract.datasets import DatasetOptions
from fedcache.extract.devices import plan_device
from fedcache.extract.loading import load_backbone, load_dataset
from fedcache.extract.runner import ExtractConfig, extract

CASES = [  # backbone, image size, source of images
    ("efficientnet-lite0", 64, "arrays"),
    ("efficientnet-lite0", 64, "jpeg-files"),
    ("efficientnet-lite0", 224, "jpeg-files"),
    ("clip-rn50", 224, "jpeg-files"),
]


def forward_only(name: str, size: int, plan, batch: int, seconds: float) -> float:
    bb = load_backbone(name, random_init=name.startswith("clip"))
    bb.image_encoder.to(plan.device)
    if plan.channels_last:
        bb.image_encoder.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size)
    if plan.device.type == "cuda":
        x = x.to(plan.device)
    amp = torch.autocast(plan.device.type, dtype=plan.autocast_dtype) if plan.autocast_dtype else contextlib.nullcontext()

    def step():
        with torch.inference_mode(), amp:
            y = bb.image_encoder(x.contiguous(memory_format=torch.channels_last) if plan.channels_last else x)
            return y.float().cpu()

    step()  # warm-up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += batch
    return n / (time.perf_counter() - t0)


def jpeg_folder(root: Path, n_per_class: int) -> Path:
    """digits5-offline's svhn domain written as JPEG files: decoding is part of the work."""

    ds = load_dataset("digits5-offline", DatasetOptions())
    s = ds.samples("train", "svhn")
    counts: dict[int, int] = {}
    for i in range(len(s)):
        c = int(s.labels[i])
        if counts.get(c, 0) < n_per_class:
            d = root / ds.classes[c]
            d.mkdir(parents=True, exist_ok=True)
            s.source.load(i).resize((96, 96)).save(d / f"{i}.jpg", quality=90)
            counts[c] = counts.get(c, 0) + 1
    return root


def pipeline(name: str, size: int, source: str, device: str, batch: int, workdir: Path, folder: Path) -> dict:
    if source == "arrays":
        dataset, opts, domains = "digits5-offline", DatasetOptions(), ["svhn"]
    else:
        dataset, opts, domains = "imagefolder", DatasetOptions(path=folder, test_fraction=0.2), None
    cfg = ExtractConfig(dataset=dataset, backbones=[name], store=workdir / f"{name}-{size}-{source}.zarr",
                        dataset_options=opts, splits=("train",), domains=domains, device=device,
                        image_size=size, batch_size=batch, random_init=name.startswith("clip"))
    reports = extract(cfg)
    rows = sum(r.rows for r in reports)
    secs = sum(r.seconds for r in reports)
    return {"images": rows, "seconds": secs, "images_per_s": rows / secs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--per-class", type=int, default=100, help="JPEG images per class (x10 classes)")
    ap.add_argument("--forward-seconds", type=float, default=8.0)
    ap.add_argument("--cases", default="all", help="comma-separated case indices, or all")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "extract_throughput.json")
    ap.add_argument("--tiny", action="store_true", help="20 JPEGs, one case, a moment each: checks the script runs")
    args = ap.parse_args(argv)
    if args.tiny:
        args.per_class, args.forward_seconds, args.batch, args.cases = 2, 0.1, 8, "1"
    plan = plan_device(args.device)
    cases = CASES if args.cases == "all" else [CASES[int(i)] for i in args.cases.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = jpeg_folder(Path(tmp) / "jpeg", args.per_class)
        for name, size, source in cases:
            # Forward-only before and after the pipeline: the mean cancels slow drift of the machine.
            before = forward_only(name, size, plan, args.batch, args.forward_seconds)
            pipe = pipeline(name, size, source, args.device, args.batch, Path(tmp), folder)
            after = forward_only(name, size, plan, args.batch, args.forward_seconds)
            fwd = (before + after) / 2
            row = {"backbone": name, "size": size, "source": source, "forward_images_per_s": fwd,
                   "forward_before_after": [before, after], **pipe, "ratio": pipe["images_per_s"] / fwd}
            print(json.dumps(row), file=sys.stderr)
            results.append(row)
    meta = {"device": str(plan.device), "gpu": torch.cuda.get_device_name() if plan.device.type == "cuda" else None,
            "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "batch": args.batch, "load_average_at_end": round(os.getloadavg()[0], 2), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
