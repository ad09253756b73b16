"""benchmarks/threads.py, published.py and command_exit.py at tiny sizes (they measure nothing here)."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from PIL import Image

from tests.benchmarks.test_smoke import bench
from tests.conftest import SHARED_DATA

CIFAR_JPEG = SHARED_DATA / "cifar10-jpeg.tar.gz"


@pytest.mark.slow
def test_threads_runs_both_arms_idle_and_beside_load(tmp_path):
    out = tmp_path / "threads.json"
    bench("threads").main(["--tiny", "--only", "linear-1280", "--out", str(out)])
    doc = json.loads(out.read_text())
    res = doc["result"]
    default = res["torch_default_threads"]
    for condition in ("idle", "loaded"):
        runs = res["runs"][condition]["linear-1280"]
        assert all(1 <= r["threads"] <= default for r in runs["policy"])  # said by the command's log line
        assert [r["threads"] for r in runs["default"]] == [default]
        ratio = res["summary"][condition]["linear-1280"]["default_over_policy"]
        assert len(ratio["per_trial"]) == 1 and ratio["median"] > 0
        assert res["same_final_state"][condition]["linear-1280"] == [True]  # whatever the threads: the same numbers
    assert all(r["background_cores"] is None or r["background_cores"] >= 0.3 for rs in res["runs"]["loaded"]["linear-1280"].values() for r in rs)
    assert doc["load_processes"] == 1
    table = bench("threads").render(out)
    assert "| loaded | linear-1280 |" in table and "default / policy" in table


def test_the_load_stops_when_its_block_ends():
    threads = bench("threads")
    with threads.Load(2, seconds=60) as load:
        assert all(p.poll() is None for p in load.procs)
    assert all(p.returncode is not None for p in load.procs)
    t0 = time.monotonic()
    with threads.Load(1, seconds=0.5) as load:  # and each stops by itself after its seconds
        load.procs[0].wait(timeout=30)
    assert time.monotonic() - t0 < 30


def _jpeg_tree(root, per_class: int = 3) -> None:
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / split / c / f"{i:04d}.jpg")


@pytest.mark.slow
def test_published_runs_both_workloads(tmp_path):
    tree, out = tmp_path / "cifar", tmp_path / "published.json"
    _jpeg_tree(tree, per_class=12)
    published = bench("published")
    published.main(["--tiny", "--cifar10", str(tree), "--per-class", "10", "--backbone", "tiny-timm-random",
                    "--image-size", "32", "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert set(res) == {"flute-lr-mnist", "pfl-cifar10"}
    for r in res.values():
        (run,) = r["runs"]
        # The command picks its threads by the cores other work leaves free: one on a busy machine,
        # torch's default on an idle one (CI), so only the range is fixed here.
        assert 1 <= run["threads"] <= (os.cpu_count() or 1)
        assert run["rounds"] == 3 and r["median_wall_seconds"] > 0
    assert res["flute-lr-mnist"]["published"]["figures"]["FLUTE (Gloo), CPU"] == 200.0
    assert "10 images per class" in res["pfl-cifar10"]["data"]
    table = published.render(out)
    assert "flute-lr-mnist" in table and "pfl-cifar10" in table


def test_digits_are_mnist_shaped_and_seeded():
    digits = bench("published").digits_like_mnist(50, 20)
    assert digits["train__features"].shape == (50, 784) and digits["test__features"].shape == (20, 784)
    assert 0 <= digits["train__features"].min() and digits["train__features"].max() <= 1
    assert set(digits["train__labels"]) <= set(range(10))
    again = bench("published").digits_like_mnist(50, 20)
    assert all(np.array_equal(digits[k], again[k]) for k in digits)


def test_published_reads_a_tarball_of_the_tree_keeping_the_first_images_of_each_class(tmp_path):
    """The tarball's path on any machine (the real CIFAR-10 tarball, below, is only where ../shared has it)."""
    import tarfile

    _jpeg_tree(tmp_path / "tree", per_class=3)
    with tarfile.open(tmp_path / "tree.tar.gz", "w:gz") as tar:
        for path in sorted((tmp_path / "tree").glob("*/*/*.jpg"), reverse=True):  # not in name order
            tar.add(path, arcname=str(path.relative_to(tmp_path / "tree")))
    root = bench("published").cifar10_tree(tmp_path / "tree.tar.gz", tmp_path / "out", per_class=2)
    listed = sorted(p.relative_to(root).as_posix() for p in root.glob("*/*/*.jpg"))
    assert listed == [f"{s}/{c}/{i:04d}.jpg" for s in ("test", "train") for c in ("cat", "dog") for i in (0, 1)]
    assert (root / "train/dog/0001.jpg").read_bytes() == (tmp_path / "tree/train/dog/0001.jpg").read_bytes()


@pytest.mark.skipif(not CIFAR_JPEG.is_file(), reason=f"no CIFAR-10 JPEG tarball at {CIFAR_JPEG}")
@pytest.mark.slow
def test_published_reads_the_cifar10_tarball(tmp_path):
    root = bench("published").cifar10_tree(CIFAR_JPEG, tmp_path, per_class=2)
    listed = sorted(p.relative_to(root).parts[:2] for p in root.glob("*/*/*.jpg"))
    assert len(listed) == 2 * 10 * 2 and {s for s, _ in listed} == {"train", "test"}


@pytest.mark.slow
def test_command_exit_times_both_arms(tmp_path):
    """benchmarks/command_exit.py: whole processes, a short run and one stopped by SIGTERM, in each arm."""
    out = tmp_path / "command_exit.json"
    bench("command_exit").main(["--tiny", "--trials", "1", "--store", str(tmp_path / "store.zarr"), "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert set(res["median"]) == {"freeze", "no-freeze"} and len(res["sigterm_to_exit"]["freeze"]) == 1
    assert all(v > 0 for arm in res["median"].values() for v in arm.values())
