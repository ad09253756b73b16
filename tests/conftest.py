"""Shared fixtures: a tiny in-memory dataset registered for tests, offline settings, and a tiny store and grid."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

# No test may reach a network: make hub libraries fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# pytest-xdist's workers have COLUMNS=80 (one process has none: the CLI's console is then 160 wide). One width
# everywhere, so a message wrapped at a temporary path's length cannot split the words a test looks for.
os.environ["COLUMNS"] = "160"


def pytest_configure(config) -> None:
    """One torch thread in each of pytest-xdist's workers: the workers already keep every core busy, and torch's
    default (a thread per core in each) made a toy backbone's forward pass 12x slower (0.11 s against 0.009 s
    for four 32x32 images on two busy cores). A test of thread counts sets its own; a fedcache command a test
    starts as a subprocess chooses its own as it does for a user. FEDCACHE_TEST_DEFAULT_THREADS=1 keeps torch's
    default (to compare the two)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("FEDCACHE_TEST_DEFAULT_THREADS"):
        import torch

        torch.set_num_threads(1)


from fedcache.extract.datasets import DATASETS, Dataset, DatasetSpec, Samples  # noqa: E402
from fedcache.extract.datasets.base import ArraySource  # noqa: E402

TOY = "test-toy"
TOY_CLASSES = ("red", "green", "blue")
TOY_DOMAINS = ("light", "dark")
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _toy_images(n_per_class: int, brightness: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), n_per_class)
    images = (rng.random((len(labels), 16, 16, 3)) * 60).astype(np.float32)
    images[np.arange(len(labels)), 4:12, 4:12, labels] += 180 * brightness
    return np.clip(images, 0, 255).astype(np.uint8), labels


def _load_toy(options) -> Dataset:
    splits = {}
    for d, (dom, bright) in enumerate(zip(TOY_DOMAINS, (1.0, 0.5))):
        for s, (split, n) in enumerate((("train", 10), ("test", 4))):
            images, labels = _toy_images(n, bright, seed=options.seed * 100 + d * 10 + s)
            splits[(split, dom)] = Samples(ArraySource(images, f"{TOY}/{split}/{dom}"), labels)
    return Dataset(TOY, TOY_CLASSES, TOY_DOMAINS, splits, default_image_size=32)


if TOY not in DATASETS:
    DATASETS.add(TOY, DatasetSpec(TOY, "tiny coloured squares, for tests", "embedded", _load_toy, TOY_CLASSES, TOY_DOMAINS))


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store.zarr"


# A tiny store (test-toy through a random-init timm backbone) and a finished grid on it, shared by the grid,
# report, API and train tests.
BACKBONE = "tiny-timm-random"


@pytest.fixture(scope="session")
def toy_store(tmp_path_factory) -> Path:
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("toy") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE], store=path, workers=0))
    return path


@pytest.fixture(scope="session")
def toy_grid(toy_store, tmp_path_factory) -> Path:
    """A finished 2 methods x 2 alphas x 2 seeds grid, run in one process."""
    from fedcache.api import grid

    out = tmp_path_factory.mktemp("toy") / "grid"
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedproto"],
         sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out)
    return out


# ---- faults (issue 33): a small real file system, a faked full disk --------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size="4m")``: a directory on a tmpfs of that size, unmounted after the test; skips where this
    process cannot mount one (not root)."""
    from tests.faults import mount_tmpfs, unmount

    mounted = []

    def make(size: str = "4m") -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        mount_tmpfs(where, size)
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        unmount(where)


@pytest.fixture
def fake_disk(monkeypatch):
    """``fake_disk(root, free)``: writes below ``root`` fail as on a full disk once ``free`` bytes are written."""
    from tests.faults import FakeDisk

    return lambda root, free: FakeDisk(monkeypatch, root, free)


# The real tmpfs runs with the slow tests (make test-slow, which CI runs too): the faked disk covers the same code
# in the default run, in a third of the time.
@pytest.fixture(params=[pytest.param("tmpfs", marks=pytest.mark.slow), "faked"])
def tight_disk(request, tmp_path, monkeypatch):
    """A directory with little free space (tests/faults.py TightDisk): a real tmpfs where this process can mount
    one (else that case skips), and the faked full disk everywhere."""
    from tests.faults import TightDisk, can_mount

    if request.param == "tmpfs" and not can_mount():
        pytest.skip("a small file system needs root to mount a tmpfs (the faked full disk covers the same code)")
    disk = TightDisk(tmp_path / "disk", monkeypatch, real=request.param == "tmpfs")
    yield disk
    disk.close()


def open_files() -> dict[str, str]:
    """This process's open file descriptors and what each is (Linux: /proc/self/fd)."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return out
