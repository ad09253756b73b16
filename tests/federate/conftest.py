"""Small synthetic federated problems shared by the engine and method tests."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.federate.data import FederatedData


def synthetic(n_clients: int = 5, per_client: int = 60, n_classes: int = 10, dim: int = 32, seed: int = 0,
              spread: float = 1.0, sizes: list[int] | None = None) -> FederatedData:
    """Gaussian classes around random means; client k holds a contiguous block of rows."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)) * 2.0
    sizes = sizes or [per_client] * n_clients

    def draw(n):
        y = rng.integers(0, n_classes, n)
        return (means[y] + spread * rng.normal(size=(n, dim))).astype(np.float32), y

    xtr, ytr = draw(sum(sizes))
    xte, yte = draw(sum(sizes))
    bounds = np.cumsum([0] + sizes)
    rows = [np.arange(bounds[k], bounds[k + 1]) for k in range(len(sizes))]
    return FederatedData(torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xte), torch.from_numpy(yte),
                         rows, [r.copy() for r in rows], tuple(f"c{i}" for i in range(n_classes)))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These tests run many tiny tensor ops; one thread keeps them fast even when the cores are shared.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def data() -> FederatedData:
    return synthetic()


HELD = 6  # classes each client of ``skewed`` holds (label skew, so FedProto's clients miss some classes)


@pytest.fixture(scope="module")
def skewed():
    """5 clients, 10 classes, 32-d; client k holds classes k..k+5 (mod 10), about 70 rows each."""
    data = synthetic(per_client=120)
    for k in range(data.n_clients):
        held = (k + np.arange(HELD)) % data.n_classes
        data.client_train[k] = data.client_train[k][np.isin(data.y_train[data.client_train[k]].numpy(), held)]
        data.client_test[k] = data.client_test[k][np.isin(data.y_test[data.client_test[k]].numpy(), held)]
    # A stand-in text tower for clip-zs, clip-fc-centralized and fst-cbdg: unit class directions.
    data.info["text"] = F.normalize(F.one_hot(data.y_train).float().T @ F.normalize(data.x_train, dim=-1), dim=-1)
    # Two noisy "augmented views" per row for the self-supervised methods (flesd and its baselines).
    data.views = data.x_train[:, None] + 0.5 * torch.randn(len(data.x_train), 2, data.dim, generator=torch.Generator().manual_seed(5))
    return data
