"""A tiny store (test-toy through a random-init timm backbone) shared by the grid, report and API tests."""
from __future__ import annotations

from pathlib import Path

import pytest

BACKBONE = "tiny-timm-random"


@pytest.fixture(scope="session")
def toy_store(tmp_path_factory) -> Path:
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("workflow") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE], store=path, workers=0))
    return path


@pytest.fixture(scope="session")
def toy_grid(toy_store, tmp_path_factory) -> Path:
    """A finished 2 methods x 2 alphas x 2 seeds grid, run in one process."""
    from fedcache.api import grid

    out = tmp_path_factory.mktemp("workflow") / "grid"
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedproto"],
         sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out)
    return out
