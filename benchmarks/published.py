"""Workloads other frameworks published timings for, run by `fedcache train` on cached features.

flute-lr-mnist  FLUTE's LR-MNIST task (microsoft/msrflute, README "Flower comparison" and experiments/cv_lr_mnist):
                logistic regression on 784-d pixels, 1,000 clients, 10 per round, batch 10, SGD lr 0.03, 1 local
                epoch, 100 rounds, test every 20 rounds. Here: fedavg with a linear head on the pixels as features,
                clients of 2 label-sorted shards each (MNIST's non-IID split in FLUTE is FedML's: 2 digits per
                client, power-law sizes). Data: real MNIST with --mnist FILE (keras' mnist.npz: x_train, y_train,
                x_test, y_test); without it scikit-learn's 1,797 handwritten 8x8 digits, MNIST-sized: the images
                are split into 1,297 training and 500 test sources, and each row is a source digit scaled to a
                16-22 px box and placed near the centre of a 28x28 canvas (seeded), 60,000 training and 10,000
                test rows, pixels in [0, 1] as 784-d features: MNIST's shapes, not its images.
pfl-cifar10     pfl-research's CIFAR-10 benchmark shape (apple/pfl-research, benchmarks/image_classification/configs/
                baseline.yaml): the 50,000 training images as 1,000 IID clients of 50, 50 per round, batch 10, 1 local
                epoch, SGD lr 0.1, 1,500 rounds, evaluation every 10. Here: fedavg with a linear head on cached
                features (pfl-research trains a small CNN on the pixels). Data: --cifar10 PATH, the CIFAR-10 JPEG tree
                (train/<class>/*.jpg and test/<class>/*.jpg, or a .tar.gz of it), extracted once into --store by
                `fedcache extract -d imagefolder` with --backbone at --image-size (default efficientnet-lite0 at
                64 px, all 60,000 images); or --cifar10-features FILE, features already in `fedcache store import`'s
                layout. Without either it is skipped.
Every input reaches the store through `fedcache store import` (or `fedcache extract`), and every run is a whole
`python -m fedcache.cli train` process as users run it (the command's thread policy; no run directory): its wall
time from start to exit (imports, reading the store, the partition, the rounds) and its rounds per second (rounds
over the summary's seconds: the rounds with their evaluations), median of --trials runs after one untimed round
(which stores the partition and brings the files into the page cache). Each run starts once other work keeps
less than --quiet-below cores busy (waiting at most --quiet-wait seconds), and records the cores other work kept
busy while it ran.

    .venv/bin/python benchmarks/published.py --cifar10 ../shared/data/cifar10-jpeg.tar.gz [--mnist mnist.npz] [--trials 3]
    .venv/bin/python benchmarks/published.py --render    # the markdown table of docs/performance.md
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from _results import write  # benchmarks/ is on sys.path when a script here runs
from _runs import fedcache, timed_train, wait_for_quiet

RESULT = Path(__file__).resolve().parent / "results" / "published.json"
SGD = {"optimizer": "sgd", "momentum": "0", "weight_decay": "0"}
WORKLOADS = {
    "flute-lr-mnist": {"method": "fedavg", "head": "linear", "partition": "shards", "shards": "2", "clients": "1000",
                       "fraction": "0.01", "batch-size": "10", "local-epochs": "1", "rounds": "100", "eval-every": "20",
                       "set": {**SGD, "lr": "0.03"}},
    "pfl-cifar10": {"method": "fedavg", "head": "linear", "partition": "iid", "clients": "1000", "fraction": "0.05",
                    "batch-size": "10", "local-epochs": "1", "rounds": "1500", "eval-every": "10", "set": {**SGD, "lr": "0.1"}},
}
TINY = {"clients": "20", "fraction": "0.1", "rounds": "3", "eval-every": "1"}
# What the frameworks' authors published for these workloads, and on what.
PUBLISHED = {
    "flute-lr-mnist": {
        "source": "microsoft/msrflute README.md, 'Flower Comparison' (experiments/cv_lr_mnist/README.md)",
        "figures": {"FLUTE (Gloo), CPU": 200.0, "Flower 1.0 (Ray simulation), CPU": 1814.0,
                    "FLUTE (NCCL), 2 GPUs": 91.0, "Flower 1.0, 2 GPUs": 4904.0},
        "hardware": "not named in the README; its run command starts 4 worker processes (torch.distributed.run "
                    "--nproc_per_node=4)",
        "accuracy": "about 80%",
    },
    "pfl-cifar10": {
        "source": "apple/pfl-research benchmarks/image_classification/configs/baseline.yaml; the framework comparison "
                  "of the pfl-research paper (arXiv 2404.06430, Section 4.1, Table 1; publications/pfl/*/cifar10)",
        "figures": {},
        "hardware": "1 NVIDIA A100 GPU (40 GB) and 10 CPUs (publications/pfl/*/cifar10/README.md)",
        "accuracy": None,
    },
}


def digits_like_mnist(n_train: int, n_test: int, seed: int = 0) -> dict[str, np.ndarray]:
    """scikit-learn's 8x8 digits as MNIST-sized 28x28 rows (module docstring); test rows come from other source
    images than training rows."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(d.target))
    sources = {"train": order[:1297], "test": order[1297:]}
    sizes = np.arange(16, 23)
    # every source at every box size once; a row picks one and a place for it
    scaled = {int(s): [np.asarray(Image.fromarray((img * 255 / 16).astype(np.uint8)).resize((s, s), Image.BILINEAR),
                                  dtype=np.float32) / 255 for img in d.images] for s in sizes}
    out: dict[str, np.ndarray] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        picks, box = rng.choice(sources[split], n), rng.choice(sizes, n)
        x = np.zeros((n, 28, 28), np.float32)
        for i, (src, s) in enumerate(zip(picks, box)):
            top, left = (28 - s) // 2 + rng.integers(-2, 3, 2)
            x[i, top:top + s, left:left + s] = scaled[int(s)][src]
        out[f"{split}__features"], out[f"{split}__labels"] = x.reshape(n, 784), d.target[picks]
    return out


def mnist_file(path: Path) -> dict[str, np.ndarray]:
    """keras' mnist.npz (uint8 28x28 images, integer labels) as 784-d pixel features in [0, 1]."""
    with np.load(path, allow_pickle=False) as f:
        return {"train__features": f["x_train"].reshape(len(f["x_train"]), 784).astype(np.float32) / 255,
                "train__labels": f["y_train"].astype(np.int64),
                "test__features": f["x_test"].reshape(len(f["x_test"]), 784).astype(np.float32) / 255,
                "test__labels": f["y_test"].astype(np.int64)}


def import_pixels(store: Path, arrays: dict[str, np.ndarray], tmp: Path) -> None:
    path = tmp / "pixels.npz"
    np.savez(path, **arrays, classes=np.array(json.dumps([str(c) for c in range(10)])))
    fedcache("store", "import", str(path), "-d", "digits-784", "-b", "pixels", "--store", str(store))


def cifar10_tree(source: Path, tmp: Path, per_class: int | None) -> Path:
    """The JPEG tree as a folder: ``source`` itself, or its tarball unpacked; with ``per_class``, a copy of only
    that many images of each class of each split (the first by name)."""
    if source.is_dir() and per_class is None:
        return source
    root = tmp / "cifar10"
    if source.is_dir():
        for image in _first(sorted(p for p in source.glob("*/*/*") if p.is_file()), per_class, lambda p: p.parent):
            target = root / image.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(image.read_bytes())
        return root
    with tarfile.open(source) as tar:
        files = [m for m in tar.getmembers() if m.isfile() and len(Path(m.name).parts) == 3]
        kept = {m.name for m in _first(sorted(files, key=lambda m: m.name), per_class, lambda m: Path(m.name).parent)}
        # In the archive's order: a gzip stream cannot seek back, so each member out of order reads it from the start.
        members = [m for m in files if m.name in kept]
        tar.extractall(root, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return root


def _first(items: list, per_class: int | None, folder) -> list:
    """The first ``per_class`` items of each folder (all of them without a limit)."""
    if per_class is None:
        return items
    seen: dict = {}
    kept = []
    for item in items:
        seen[folder(item)] = seen.get(folder(item), 0) + 1
        if seen[folder(item)] <= per_class:
            kept.append(item)
    return kept


def cifar10_features(store: Path, root: Path, backbone: str, size: int) -> dict:
    """Extract the JPEG tree's features into the store (a check when they are there): what, and how long it took."""
    t0 = time.perf_counter()
    fedcache("extract", "-d", "imagefolder", "--path", str(root), "-b", backbone, "--image-size", str(size),
             "--store", str(store))
    return {"backbone": backbone, "image_size": size, "seconds": round(time.perf_counter() - t0, 1)}


def train_options(name: str, tiny: bool) -> list[str]:
    opts = {**WORKLOADS[name], **(TINY if tiny else {})}
    settings = [a for k, v in opts.pop("set").items() for a in ("--set", f"{k}={v}")]
    return [a for k, v in opts.items() for a in (f"--{k}", v)] + settings


def run_workload(name: str, store: Path, data: tuple[str, str], trials: int, tiny: bool, quiet: tuple[float, float]) -> dict:
    opts = train_options(name, tiny)
    args = ["--store", str(store), "-d", data[0], "-b", data[1], *opts]
    fedcache("train", *args, "--rounds", "1")  # untimed: the partition is stored, the files are in the page cache
    runs = []
    for _ in range(trials):
        waited = wait_for_quiet(*quiet)
        runs.append({**timed_train(args), "waited_for_quiet": waited})
    def med(key: str) -> float | None:  # None where no run could say it (rounds quicker than the summary's 0.01 s)
        values = [r[key] for r in runs if r[key] is not None]
        return round(statistics.median(values), 2) if values else None

    return {"train_options": opts, "runs": runs, "median_wall_seconds": med("wall_seconds"),
            "median_rounds_per_second": med("rounds_per_second"), "median_accuracy": med("mean_accuracy")}


def measure(a: argparse.Namespace, store: Path, tmp: Path) -> dict:
    results: dict = {}
    quiet = (a.quiet_below, 0.0 if a.tiny else a.quiet_wait)
    pixels = mnist_file(a.mnist) if a.mnist else digits_like_mnist(600 if a.tiny else 60000, 100 if a.tiny else 10000)
    import_pixels(store, pixels, tmp)
    results["flute-lr-mnist"] = {"data": "MNIST (--mnist)" if a.mnist else "scikit-learn digits as MNIST-sized rows",
                                 **run_workload("flute-lr-mnist", store, ("digits-784", "pixels"), a.trials, a.tiny, quiet)}
    if a.cifar10_features:
        fedcache("store", "import", str(a.cifar10_features), "-d", "cifar10-features", "-b", "imported", "--store", str(store))
        results["pfl-cifar10"] = {"data": f"{a.cifar10_features.name} (--cifar10-features)",
                                  **run_workload("pfl-cifar10", store, ("cifar10-features", "imported"), a.trials, a.tiny, quiet)}
    elif a.cifar10:
        root = cifar10_tree(a.cifar10, tmp, a.per_class)
        extracted = cifar10_features(store, root, a.backbone, a.image_size)
        subset = f", {a.per_class} images per class and split" if a.per_class else ""
        results["pfl-cifar10"] = {"data": f"CIFAR-10 JPEG tree{subset}, {a.backbone} at {a.image_size} px",
                                  "extraction": extracted,
                                  **run_workload("pfl-cifar10", store, ("imagefolder", a.backbone), a.trials, a.tiny, quiet)}
    else:
        print("pfl-cifar10 skipped: give --cifar10 PATH or --cifar10-features FILE", file=sys.stderr)
    for name, res in results.items():
        res["published"] = PUBLISHED[name]
    return results


def render(path: Path = RESULT) -> str:
    """The table of docs/performance.md from a results file."""
    doc = json.loads(path.read_text())
    lines = ["| workload | here: whole process (median) | rounds per second | published (their hardware) | "
             "published time / ours |", "|---|---|---|---|---|"]
    for name, res in doc["result"].items():
        ours, pub = res["median_wall_seconds"], res["published"]
        figures = "; ".join(f"{k}: {v:.0f} s" for k, v in pub["figures"].items()) or "not restated here"
        ratios = "; ".join(f"{k}: {v / ours:.0f}x" for k, v in pub["figures"].items()) or "-"
        lines.append(f"| {name} ({res['data']}) | {ours} s | {res['median_rounds_per_second']} | {figures} "
                     f"({pub['hardware']}) | {ratios} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mnist", type=Path, default=None, help="keras' mnist.npz: real MNIST instead of the digits.")
    p.add_argument("--cifar10", type=Path, default=None, help="The CIFAR-10 JPEG tree, or a .tar.gz of it.")
    p.add_argument("--cifar10-features", type=Path, default=None, help="CIFAR-10 features in `fedcache store import`'s layout.")
    p.add_argument("--backbone", default="efficientnet-lite0", help="Backbone that extracts --cifar10.")
    p.add_argument("--image-size", type=int, default=64, help="Its input size.")
    p.add_argument("--per-class", type=int, default=None, help="Extract only this many --cifar10 images per class and split.")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--quiet-below", type=float, default=0.5,
                   help="Each run waits until the machine's busy cores (other work) fall below this ...")
    p.add_argument("--quiet-wait", type=float, default=600, help="... for at most this many seconds.")
    p.add_argument("--store", type=Path, default=None, help="Keep the features here (default: a temporary store).")
    p.add_argument("--tiny", action="store_true", help="Tiny shapes and rounds, one trial: the smoke test.")
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--render", action="store_true", help="Print the markdown table of --out and exit.")
    a = p.parse_args(argv)
    if a.render:
        print(render(a.out))
        return
    if a.tiny:
        a.trials = 1
    with tempfile.TemporaryDirectory() as tmp:
        store = a.store or Path(tmp) / "store.zarr"
        result = measure(a, store, Path(tmp))
    write({"description": __doc__.split("\n")[0], "command": "benchmarks/published.py " + " ".join(argv or sys.argv[1:]),
           "result": result}, a.out)


if __name__ == "__main__":
    main()
