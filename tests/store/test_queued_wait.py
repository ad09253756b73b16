"""`extract --wait` queued behind a writer that finishes the entry: it reports nothing extracted, and writes nothing."""
from __future__ import annotations

import threading
import time

import numpy as np

from fedcache.extract.runner import ExtractConfig, extract
from fedcache.store.feature_store import FeatureStore
from fedcache.store.keys import EntryKey
from fedcache.store.locks import exclusive_lock
from fedcache.store.writer import EntryWriter


def cfg(store, **kw) -> ExtractConfig:
    return ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=store, splits=("train",),
                         domains=["light"], batch_size=4, chunk_rows=8, workers=0, **kw)


def test_a_queued_extraction_that_processed_nothing_says_so(tmp_path):
    (first,) = extract(cfg(tmp_path / "ref.zarr"))
    ref = FeatureStore(tmp_path / "ref.zarr")
    info = ref.info(first.entry_id)
    arrays = {n: ref.root["entries"][info.entry_id][n][:] for n in ("features", "labels", "ids", "valid")}

    path = tmp_path / "s.zarr"
    FeatureStore(path)
    reports = []
    with exclusive_lock(path / ".locks" / f"{info.entry_id}.part0of1.lock", "the other writer"):
        queued = threading.Thread(target=lambda: reports.extend(extract(cfg(path, wait=60))))
        queued.start()
        while not (path / "entries" / info.entry_id / "zarr.json").exists():  # created, then queued on our lock
            time.sleep(0.05)
        time.sleep(0.5)
        # The writer holding the lock finishes every chunk meanwhile.
        fs = FeatureStore(path)
        w = EntryWriter(fs, EntryKey(**info.key), fs.root["entries"][info.entry_id])
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, *(arrays[n][lo:hi] for n in ("features", "labels", "ids", "valid")))
        assert w.finish()
        completed_at = fs.info(info.entry_id).completed_at
    queued.join()
    (report,) = reports
    assert report.status == "already complete" and report.rows == 0
    assert FeatureStore(path).info(info.entry_id).completed_at == completed_at  # not marked again
    np.testing.assert_array_equal(FeatureStore(path).read("test-toy", "train", "tiny-timm-random", domains=["light"]).features,
                                  arrays["features"].astype(np.float32))
