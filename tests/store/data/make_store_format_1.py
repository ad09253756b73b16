"""Make the format-1 fixture store with fedcache as it is at commit 0c93000 (zstd chunks, zlib CRC-32)."""
import sys, shutil
from pathlib import Path
import numpy as np
from fedcache.store.feature_store import FeatureStore
from fedcache.store.interchange import import_file
from fedcache.store.keys import EntryKey, TextKey
from fedcache.store.writer import open_writer

out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
store = FeatureStore(out)
rng = np.random.default_rng(7)
# 1. imported float32 entries: two domains, train and test, several chunks (chunk rows follow the batch size 1: 2048)
npz = out.parent / "v1-import.npz"
n_tr, n_te, dim = 40, 12, 6
np.savez(npz, **{"train__features": rng.normal(size=(n_tr, dim)).astype(np.float32),
                 "train__labels": rng.integers(0, 3, n_tr), "train__domains": np.repeat([0, 1], n_tr // 2),
                 "test__features": rng.normal(size=(n_te, dim)).astype(np.float32),
                 "test__labels": rng.integers(0, 3, n_te), "test__domains": np.repeat([0, 1], n_te // 2),
                 "classes": np.array('["a", "b", "c"]'), "domains": np.array('["left", "right"]')})
import_file(store, npz, "imported", "enc")
npz.unlink()
# 2. an extracted-like float16 entry in chunks of 8 rows (last one short), two rows skipped as bad images
attrs = {"classes": ["a", "b", "c"], "domains": ["all"], "random_weights": True, "backbone_source": "test"}
key = EntryKey("extracted", "fp", "train", "all", "tiny", "w0", {"size": 16})
n = 21
feats = rng.normal(size=(n, dim)).astype(np.float32)
valid = np.ones(n, bool); valid[[3, 17]] = False
with open_writer(store, key, n, dim, 4, attrs, chunk_rows=8) as w:
    for c in w.pending():
        lo, hi = w.chunk_range(c)
        w.write_chunk(c, feats[lo:hi], np.arange(lo, hi) % 3, np.arange(lo, hi) + 100, valid[lo:hi])
    assert w.finish(["bad-3.png", "bad-17.png"])
# 3. a partial entry: 2 of 3 chunks written, then "interrupted"
key_p = EntryKey("extracted", "fp", "test", "all", "tiny", "w0", {"size": 16})
fp = rng.normal(size=(20, dim)).astype(np.float32)
with open_writer(store, key_p, 20, dim, 4, attrs, chunk_rows=8) as w:
    for c in w.pending()[:2]:
        lo, hi = w.chunk_range(c)
        w.write_chunk(c, fp[lo:hi], np.arange(lo, hi) % 3, np.arange(lo, hi), np.ones(hi - lo, bool))
    assert not w.finish([])
np.save(out.parent / "v1-partial-features.npy", fp)
np.save(out.parent / "v1-extracted-features.npy", feats)
# 4. a text entry
store.put_text(TextKey("tiny", "w0", ("a", "b", "c"), ("a photo of {}",), "single"), rng.normal(size=(1, 3, dim)).astype(np.float32), True)
shutil.rmtree(out / ".locks", ignore_errors=True)
print("made", out)
