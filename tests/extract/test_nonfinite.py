"""Non-finite features never reach the store: a clear error naming the images."""
import numpy as np
import pytest
import zarr
from PIL import Image

from fedcache.errors import NonFiniteFeaturesError
from fedcache.extract import runner
from fedcache.extract.datasets import DatasetOptions
from fedcache.extract.loading import load_dataset
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.store.feature_store import FeatureStore


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "imgs"
    for split in ("train", "test"):
        for c, colour in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (20, 20), tuple(v + 5 * i for v in colour)).save(d / f"{i}.png")
    return root


def config(store, folder, **kw):
    return ExtractConfig(dataset="imagefolder", backbones=["tiny-timm-random"], store=store,
                         dataset_options=DatasetOptions(path=folder), splits=("train",), batch_size=2, chunk_rows=4,
                         workers=0, **kw)


def poison(monkeypatch, folder, names, value=np.nan):
    """The backbone's output becomes ``value`` for the training images named."""
    ds = load_dataset("imagefolder", DatasetOptions(path=folder))
    samples = ds.samples("train", ds.domains[0])
    targets = [samples.ids[i] for i in range(len(samples)) if samples.source.describe(i).endswith(tuple(names))]
    assert len(targets) == len(names)
    real = runner._forward

    def forward(bb, plan, pre, x, ids, domain_index):
        out = real(bb, plan, pre, x, ids, domain_index)
        out[np.isin(ids, targets)] = value
        return out

    monkeypatch.setattr(runner, "_forward", forward)


def entry_group(store_path):
    g = zarr.open_group(str(store_path), mode="r")
    (eid, e), = list(g["entries"].groups())
    return e


def test_nan_features_are_refused_naming_the_image(store_path, folder, monkeypatch):
    poison(monkeypatch, folder, ["dog/2.png"])
    with pytest.raises(NonFiniteFeaturesError, match=r"1 image\(s\): \S*dog/2\.png; the backbone's output is NaN/inf"):
        extract(config(store_path, folder))
    e = entry_group(store_path)
    assert not e.attrs.get("complete")
    assert np.isfinite(e["features"][:]).all()  # the poisoned chunk was never written
    assert not e["done"][:].all()


def test_every_bad_image_is_counted_and_the_first_ones_named(store_path, folder, monkeypatch):
    poison(monkeypatch, folder, ["cat/0.png", "cat/1.png"], value=np.inf)
    with pytest.raises(NonFiniteFeaturesError, match=r"2 image\(s\): \S*cat/0\.png, \S*cat/1\.png"):
        extract(config(store_path, folder))


def test_float16_overflow_is_refused_and_float32_stores_it(store_path, folder, monkeypatch, tmp_path):
    poison(monkeypatch, folder, ["cat/3.png"], value=1e6)  # finite in float32, inf in float16
    with pytest.raises(NonFiniteFeaturesError, match=r"cat/3\.png.*float16.*--dtype float32"):
        extract(config(store_path, folder))
    extract(config(tmp_path / "f32.zarr", folder, dtype="float32"))
    t = FeatureStore(tmp_path / "f32.zarr").read("imagefolder", "train", "tiny-timm-random")
    assert np.isfinite(t.features).all() and (t.features == 1e6).all(1).sum() == 1
