"""Image inputs PIL reads but a naive pipeline mangles: 16-bit greyscale PNGs, file names that are not UTF-8."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedcache.extract.datasets import DatasetOptions
from fedcache.extract.datasets.base import FileSource
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.store.feature_store import FeatureStore


def test_16_bit_greyscale_png_is_scaled_not_clipped(tmp_path):
    wide = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)  # 0 .. 65520
    wide[0, 0], wide[0, 1] = 0, 65535
    Image.fromarray(wide).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    rgb = np.asarray(FileSource([tmp_path / "g16.png"]).load(0))
    expected = np.round(wide / 257).astype(np.uint8)  # the 8-bit value whose 16-bit form (v * 257) is nearest
    assert rgb.shape == (64, 64, 3) and (rgb == expected[..., None]).all()
    assert rgb[0, 0, 0] == 0 and rgb[0, 1, 0] == 255 and len(np.unique(rgb)) == 256  # clipping left 17 values


def test_8_bit_images_are_unchanged(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "rgb.png")
    Image.fromarray(pixels[..., 0]).save(tmp_path / "l.png")
    np.testing.assert_array_equal(np.asarray(FileSource([tmp_path / "rgb.png"]).load(0)), pixels)
    np.testing.assert_array_equal(np.asarray(FileSource([tmp_path / "l.png"]).load(0))[..., 1], pixels[..., 0])


def bytes_named_tree(root: Path) -> None:
    """Two classes of images, one of them named with bytes that are not UTF-8 (latin-1 'café')."""
    for cls in ("a", "b"):
        for i in range(6):
            folder = root / cls
            folder.mkdir(parents=True, exist_ok=True)
            pixels = np.full((8, 8, 3), 20 * i + (100 if cls == "b" else 0), np.uint8)
            name = os.path.join(os.fsencode(folder), b"caf\xe9%d.png" % i) if i == 0 else str(folder / f"{i}.png")
            with open(name, "wb") as fh:
                Image.fromarray(pixels).save(fh, format="PNG")


def test_non_utf8_file_names_are_fingerprinted_and_extracted(tmp_path):
    try:
        bytes_named_tree(tmp_path / "imgs")
    except (OSError, UnicodeError):
        pytest.skip("this file system refuses file names that are not UTF-8")
    odd = [p for p in (tmp_path / "imgs" / "a").iterdir() if "caf" in p.name]
    assert odd and FileSource(odd).fingerprint() != FileSource([tmp_path / "imgs" / "a" / "1.png"]).fingerprint()
    store = tmp_path / "s.zarr"
    opts = DatasetOptions(path=tmp_path / "imgs")
    reports = extract(ExtractConfig(dataset="imagefolder", backbones=["tiny-timm-random"], store=store, batch_size=4,
                                    workers=0, dataset_options=opts))
    assert {r.status for r in reports} == {"extracted"}
    assert len(FeatureStore(store).read("imagefolder", "train", "tiny-timm-random")) > 0


def test_a_folder_named_from_another_directory_is_the_same_images(tmp_path, monkeypatch):
    """The fingerprint hashed the paths as spelled: `--path imgs` and the same folder as `--path /abs/imgs` (or from
    another directory) were other data, extracted again beside the first, and a resume from elsewhere began anew."""
    for cls in ("a", "b"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8), (30 * i, 100 if cls == "b" else 0, 0)).save(tmp_path / "imgs" / cls / f"{i}.png")
    store = tmp_path / "s.zarr"

    def run(path: Path) -> set[str]:
        return {r.status for r in extract(ExtractConfig(
            dataset="imagefolder", backbones=["tiny-timm-random"], store=store, batch_size=4, workers=0,
            dataset_options=DatasetOptions(path=path, test_fraction=0.5)))}

    monkeypatch.chdir(tmp_path)
    assert run(Path("imgs")) == {"extracted"}
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert run(tmp_path / "imgs") == run(Path("../imgs")) == {"already complete"}
    assert len(FeatureStore(store).entries()) == 2


def test_changed_images_or_labels_are_extracted_again_and_the_old_entries_go_stale(tmp_path):
    """The features of an image folder are keyed by its images and labels: a rewritten image or a file moved to
    another class makes new entries, which runs read; the ones before are stale, never read again."""
    train = tmp_path / "imgs" / "train"  # the tree's own split: no seeded split moves an image to test
    for split, cls in ((s, c) for s in ("train", "test") for c in ("a", "b")):
        (tmp_path / "imgs" / split / cls).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8), (30 * i, 100 if cls == "b" else 0, 0)).save(tmp_path / "imgs" / split / cls / f"{i}.png")
    store_path = tmp_path / "s.zarr"

    def run() -> tuple[set[str], np.ndarray, np.ndarray]:
        reports = extract(ExtractConfig(dataset="imagefolder", backbones=["tiny-timm-random"], store=store_path,
                                        batch_size=4, workers=0, splits=("train",),
                                        dataset_options=DatasetOptions(path=tmp_path / "imgs")))
        table = FeatureStore(store_path).read("imagefolder", "train", "tiny-timm-random")
        return {r.status for r in reports}, table.features, table.labels

    status, features, labels = run()
    assert status == {"extracted"} and run()[0] == {"already complete"}
    first = {e.entry_id for e in FeatureStore(store_path).entries()}
    changed = train / "a" / "1.png"
    Image.new("RGB", (8, 8), (250, 250, 250)).save(changed)
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))  # coarse clocks
    status, new_features, new_labels = run()
    assert status == {"extracted"} and not np.array_equal(new_features, features)
    np.testing.assert_array_equal(new_labels, labels)
    (train / "b" / "3.png").rename(train / "a" / "9.png")  # relabelled: b -> a
    status, _, moved_labels = run()
    assert status == {"extracted"} and np.bincount(moved_labels).tolist() == [5, 3]
    store = FeatureStore(store_path)
    assert len(store.entries()) == 3 and first <= {e.entry_id for e in store.stale()}
    assert len(store.stale()) == 2
