"""Undecodable images: a clear error naming the file, or skipped, counted and listed."""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedcache.errors import BadImageError
from fedcache.extract.datasets import DatasetOptions
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.store.feature_store import FeatureStore


def image_folder(root: Path) -> Path:
    """An image folder at ``root`` with one undecodable image among its training images."""
    for split in ("train", "test"):
        for c, colour in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (20, 20), colour).save(d / f"{i}.png")
    (root / "train" / "dog" / "broken.png").write_bytes(b"\x89PNG not really")
    return root


@pytest.fixture
def folder(tmp_path):
    return image_folder(tmp_path / "imgs")


def run(store, folder, progress=None, **kw):
    return extract(ExtractConfig(dataset="imagefolder", backbones=["tiny-timm-random"], store=store,
                                 dataset_options=DatasetOptions(path=folder), batch_size=2, workers=0, **kw), progress)


def test_bad_image_error_names_the_file(store_path, folder):
    with pytest.raises(BadImageError, match=r"broken\.png.*--skip-bad-images"):
        run(store_path, folder)


def test_skip_bad_images_counts_and_lists_them(store_path, folder):
    reports = run(store_path, folder, skip_bad_images=True)
    assert sum(len(r.bad_images) for r in reports) == 1
    store = FeatureStore(store_path)
    train = store.read("imagefolder", "train", "tiny-timm-random")
    assert len(train) == 6 and np.isfinite(train.features).all()  # the bad row is not served
    entry = next(e for e in store.entries() if e.key["split"] == "train")
    assert entry.attrs["n_bad_images"] == 1
    listing = store.bad_images_path(entry.entry_id).read_text()
    assert "broken.png" in listing
    # The listing file beside the entry does not confuse the store.
    assert len(FeatureStore(store_path).entries()) == 2


def test_name_gives_a_folder_its_own_store_name(store_path, folder):
    run(store_path, folder, skip_bad_images=True, name="my-pets", splits=("test",))
    table = FeatureStore(store_path).read("my-pets", "test", "tiny-timm-random")
    assert len(table) == 6 and table.class_names == ("cat", "dog")


def test_a_resumed_extraction_lists_the_bad_images_of_the_rows_it_kept(store_path, folder):
    """The list was written from the names the finishing run met: rows kept from an interrupted run were counted in
    n_bad_images but their bad images never listed, and a domain smaller than a chunk keeps every batch it wrote.
    The finishing run's report (the command's "N bad images skipped") counted only those it met: none."""
    (folder / "train" / "dog" / "broken.png").rename(folder / "train" / "cat" / "0a-broken.png")  # row 1 of 7
    seen = {"batches": 0}

    def interrupt(event):
        if event.kind == "advance":
            seen["batches"] += 1
            if seen["batches"] == 2:  # rows 0..3 of the train entry written and kept
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(store_path, folder, skip_bad_images=True, progress=interrupt)
    reports = run(store_path, folder, skip_bad_images=True)
    store = FeatureStore(store_path)
    entry = next(e for e in store.entries() if e.key["split"] == "train")
    train = next(r for r in reports if r.entry_id == entry.entry_id)
    listed = [str(folder / "train" / "cat" / "0a-broken.png")]
    assert entry.attrs["n_bad_images"] == 1
    assert store.bad_images_path(entry.entry_id).read_text().splitlines() == listed
    # This run met no bad image: its report lists the entry's, of the rows it kept (it counted none, nor its summary).
    assert train.rows == 7 - 4 and train.bad_images == listed


def test_a_bad_image_decoded_in_a_loader_worker_is_one_line_naming_the_keyword(store_path, folder):
    """Decoded in a DataLoader worker process, a bad image is said in the caller's process (torch would re-raise a
    worker's error as "Caught BadImageError in DataLoader worker process 0." and its traceback), and in a Python
    call as the keyword, not the command line's --skip-bad-images."""
    import fedcache

    with pytest.raises(BadImageError) as err:
        fedcache.extract_features("imagefolder", "tiny-timm-random", store=store_path, path=folder, batch_size=2,
                                  workers=2)
    said = str(err.value)
    assert "\n" not in said and "worker" not in said and " --" not in said, said
    assert "broken.png" in said and "pass skip_bad_images=True to skip bad images" in said, said
