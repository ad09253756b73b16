"""Two runs creating the same new partition at once: the store's lock makes the second wait, then reuse it."""
from __future__ import annotations

import threading
import time

import numpy as np
import zarr

from fedcache.federate.partitions import PartitionRequest, make_partition, save_partition
from fedcache.federate.partitions.storage import find_partition
from fedcache.store.feature_store import FeatureStore


def test_two_writers_of_the_same_new_partition(store_path, monkeypatch):
    labels, domains = np.arange(40) % 4, np.zeros(40, np.int64)
    keys = (domains, np.arange(40)), (np.zeros(8, np.int64), np.arange(8))
    request = PartitionRequest.of("iid", 2, min_size=1)
    partition = make_partition(request, labels, domains, labels[:8], domains[:8])
    FeatureStore(store_path)  # the store exists; the partition does not
    create = zarr.Group.create_group

    def slow_create(self, *args, **kwargs):
        time.sleep(0.3)  # both writers would have checked that the partition is missing by now
        return create(self, *args, **kwargs)

    monkeypatch.setattr(zarr.Group, "create_group", slow_create)
    results, errors = [], []

    def write() -> None:
        try:
            results.append(save_partition(FeatureStore(store_path), "ds", partition, *keys))
        except Exception as exc:  # noqa: BLE001 -- any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1 and len(results) == 2
    assert find_partition(FeatureStore(store_path), "ds", request, *keys) == partition
