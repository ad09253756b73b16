"""A real toy feature store and its per-client shards, shared by the Flower tests."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from fedcache.extract.runner import ExtractConfig, extract
from fedcache.training import TrainConfig

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # Flower would report usage over the network
pytest.importorskip("flwr")

BACKBONE = "tiny-timm-random"


@pytest.fixture(scope="package")
def flower_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("flower") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE, "tiny-clip-random"], store=path, workers=0))
    return path


def toy_config(store: Path, method: str = "fedavg", **kw) -> TrainConfig:
    base = dict(store=store, dataset="test-toy", backbones=[BACKBONE], method=method, partition="dirichlet",
                alpha=1.0, clients=3, rounds=3, seed=1, eval_every=3)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def assert_same_run(flower: dict, server_state: dict, inproc) -> None:
    """Flower and in-process runs agree: per-client and global accuracy, bytes, final server state."""
    s = inproc.summary
    assert flower["per_client_accuracy"] == pytest.approx(s["per_client_accuracy"], abs=1e-3)
    assert flower["mean_accuracy"] == pytest.approx(s["mean_accuracy"], abs=1e-3)
    if s["global_accuracy"] is None:
        assert flower["global_accuracy"] is None
    else:
        assert flower["global_accuracy"] == pytest.approx(s["global_accuracy"], abs=1e-3)
    assert (flower["bytes_up"], flower["bytes_down"], flower["rounds"]) == (s["bytes_up"], s["bytes_down"], s["rounds"])
    assert server_state.keys() == inproc.server.keys()
    for name, t in inproc.server.items():
        torch.testing.assert_close(server_state[name], t, rtol=1e-4, atol=1e-5, msg=f"server state {name!r}")
