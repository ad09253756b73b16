"""Cached features as the federated engine sees them: fused over backbones (``tables``), as tensors."""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from fedcache.federate.local import gather_rows
from fedcache.federate.partitions.core import compact_rows
from fedcache.federate.tables import check_same_source
from fedcache.store.feature_store import FeatureTable


@dataclass
class FederatedData:
    """Train/test tensors plus, per client, the rows it holds (train) and its local test rows."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    client_train: list[np.ndarray]
    client_test: list[np.ndarray]
    class_names: tuple[str, ...]
    domain_names: tuple[str, ...] = ("all",)
    train_domains: np.ndarray | None = None
    random_weights: bool = False
    info: dict = field(default_factory=dict)
    # (N_train, K, D) augmented views of the training rows, for self-supervised methods; None if not loaded
    views: torch.Tensor | None = None
    # The rows of the test table the global model is scored on (None: all). Scored on validation, the test table
    # is the training table, and only its spare rows (no client trains on them) make a held-out score.
    global_rows: np.ndarray | None = None
    _scored: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def scored_test(self) -> torch.Tensor:
        """The test rows the global model is scored on: ``x_test``, or its ``global_rows``, copied once (a region
        of a mapped file at a time). Scoring the whole of a validation run's test table, the training table, cost
        several times its rounds at a million rows, for the few rows that count."""
        if self.global_rows is None:
            return self.x_test
        if self._scored is None:
            self._scored = gather_rows(self.x_test, torch.from_numpy(self.global_rows).to(self.x_test.device))
        return self._scored

    def global_correct(self, logits: torch.Tensor) -> torch.Tensor:
        """Per scored row (``scored_test``), whether ``logits`` (one row per scored row) name its class."""
        y = self.y_test if self.global_rows is None else self.y_test[torch.from_numpy(self.global_rows).to(self.y_test.device)]
        return logits.argmax(1) == y

    def test_correct(self, logits: torch.Tensor) -> np.ndarray:
        """Per row of the test table, whether the global model's ``logits`` (on ``scored_test``) name its class.
        Rows not scored read as wrong: no client's test rows are among them (a validation run's are spare rows)."""
        hit = self.global_correct(logits).cpu().numpy()
        if self.global_rows is None:
            return hit
        full = np.zeros(len(self.y_test), bool)
        full[self.global_rows] = hit
        return full

    def train_features(self, idx: torch.Tensor) -> torch.Tensor:
        """``x_train[idx]``, read so that a memory-mapped store file does not stay mapped (``local.gather_rows``)."""
        return gather_rows(self.x_train, idx)

    def rows_of(self, split: str, clients: list[int],
                width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K, n_max, D) features, (K, n_max) labels and mask of the clients' ``split`` rows, padded (to ``width``
        rows, at least the longest client's)."""
        from fedcache.federate.prototypes import padded_rows

        if split == "train":
            idx, mask = padded_rows([self.client_train[k] for k in clients], width)
            return self.train_features(idx), self.y_train[idx], mask
        idx, mask = padded_rows([self.client_test[k] for k in clients], width)
        return self.test_features(idx), self.y_test[idx], mask

    def test_features(self, idx: torch.Tensor) -> torch.Tensor:
        """``x_test[idx]`` for clients' test rows (``idx`` as ``padded_rows`` pads it; a padding row, masked,
        may read another row). Scored on validation, they are read from the scored rows' copy (``scored_test``):
        through the training table's mapping, a few rows of each client would map the whole file."""
        if self.global_rows is None:
            return self.x_test[idx]
        at = np.searchsorted(self.global_rows, idx.cpu().numpy())
        return self.scored_test()[torch.from_numpy(at).to(idx.device)]

    @property
    def n_clients(self) -> int:
        return len(self.client_train)

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def dim(self) -> int:
        return int(self.x_train.shape[1])

    def sizes(self) -> np.ndarray:
        return np.array([len(r) for r in self.client_train])

    def to(self, device: torch.device) -> "FederatedData":
        """The same data with its tensors (features, labels, views, class-text embeddings) on ``device``."""
        move = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
        tensors = {n: move(getattr(self, n)) for n in ("x_train", "y_train", "x_test", "y_test", "views")}
        return dataclasses.replace(self, **tensors, info={k: move(v) for k, v in self.info.items()})

    @classmethod
    def from_tables(cls, train: FeatureTable, test: FeatureTable, client_train, client_test, **info) -> "FederatedData":
        check_same_source(train, test)
        return cls(
            x_train=features_tensor(train.features),
            y_train=torch.from_numpy(train.labels.astype(np.int64)),
            x_test=features_tensor(test.features),
            y_test=torch.from_numpy(test.labels.astype(np.int64)),
            client_train=compact_rows(client_train), client_test=compact_rows(client_test),
            class_names=train.class_names, domain_names=train.domain_names, train_domains=train.domains,
            random_weights=train.random_weights or test.random_weights, info=info,
        )


def features_tensor(features: np.ndarray) -> torch.Tensor:
    """Float32 features as a tensor over the same memory. A memory-mapped table is read-only
    (``store.mapping``), and nothing writes into a run's features: torch's warning about it says nothing."""
    array = np.ascontiguousarray(features, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(array)
