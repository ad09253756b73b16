"""Where the cached rows came from, for methods that go back to the backbone or the images.

Prompt learning (promptfl, tpfl, atpfl) reloads the CLIP that produced the features to run its text
tower, and tpfl's ``visual=pixel`` re-reads the images. ``train.load_data`` attaches this to
``FederatedData.info["source"]``: the store entry keys of the features and, per row of ``x_train``
and ``x_test``, the (domain, sample id) that identifies the image.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData
from fedcache.store.feature_store import FeatureStore, FeatureTable


@dataclass(frozen=True)
class RowSource:
    domains: np.ndarray  # (N,) index into domain_names
    ids: np.ndarray  # (N,) sample ids within a domain
    keys: tuple[dict, ...]  # entry keys of the rows' features (one per domain)


@dataclass(frozen=True)
class FeatureSource:
    domain_names: tuple[str, ...]
    train: RowSource
    test: RowSource  # the rows of x_test (spare training rows under --validation)
    store: Path | None = None  # the feature store they were read from

    def keys(self) -> tuple[dict, ...]:
        return self.train.keys + self.test.keys

    def backbone(self, method: str) -> tuple[str, str]:
        """(backbone name, weights hash) of the features; one backbone only."""
        found = {(k["backbone"], k["weights_hash"]) for k in self.keys()}
        if len(found) != 1:
            raise ConfigError(f"{method} runs the backbone's own towers, so it needs features of exactly one "
                              f"backbone and one set of weights; these come from {sorted(found)}")
        return next(iter(found))


def _rows(store: FeatureStore, table: FeatureTable) -> RowSource:
    return RowSource(table.domains.copy(), table.ids.copy(), tuple(store.info(e).key for e in table.entry_ids))


def attach_source(data: FederatedData, store: FeatureStore, train: FeatureTable, test: FeatureTable) -> FederatedData:
    data.info["source"] = FeatureSource(tuple(train.domain_names), _rows(store, train), _rows(store, test), store.path)
    return data


def source_from_info(data: FederatedData, method: str) -> FeatureSource:
    src = data.info.get("source")
    if src is None:
        raise ConfigError(f"{method} needs to know which store entries the features came from; "
                          "run it through `fedcache train` (train.load_data attaches them)")
    return src
