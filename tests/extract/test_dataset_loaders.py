"""Every standard-format loader, on a tiny fake copy of its on-disk format written here.

Each ``make_*`` writes the files a user would have under ``--data-root`` and returns the labels
expected per (split, domain), in row order. No network, no torchvision import.
"""
from __future__ import annotations

import bz2
import gzip
import os
import pickle
import re
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from fedcache.errors import ConfigError, DataNotFoundError
from fedcache.extract.datasets import DATASETS, DatasetOptions
from fedcache.extract.datasets._common import StandardSet, load_standard, read_class_folders, torchvision_download
from fedcache.extract.datasets._formats import _CifarUnpickler

ALL = "all"
Expected = dict[tuple[str, str], list[int]]


def write_image(path: Path, seed: int = 0, size: tuple[int, int] = (6, 5), mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode).save(path)


def rgb_images(n: int, side: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (n, side, side, 3), dtype=np.uint8)


# ---------------------------------------------------------------- array formats


def make_cifar(root: Path, folder: str, files: dict[str, list[str]], label_key: bytes) -> Expected:
    expected: Expected = {}
    for split, names in files.items():
        expected[(split, ALL)] = []
        for k, name in enumerate(names):
            images = rgb_images(3, 32, seed=k)
            labels = [k % 10, (k + 3) % 10, 9]
            # The official rows: the red, green and blue planes one after the other.
            data = images.transpose(0, 3, 1, 2).reshape(3, -1)
            (root / folder).mkdir(parents=True, exist_ok=True)
            with open(root / folder / name, "wb") as fh:
                pickle.dump({b"data": data, label_key: labels, b"filenames": [b"a", b"b", b"c"]}, fh)
            expected[(split, ALL)] += labels
    return expected


def make_cifar10(root: Path) -> Expected:
    files = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
    return make_cifar(root, "cifar-10-batches-py", files, b"labels")


def make_cifar100(root: Path) -> Expected:
    return make_cifar(root, "cifar-100-python", {"train": ["train"], "test": ["test"]}, b"fine_labels")


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    magic = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = magic + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


def make_idx(root: Path, folder: str) -> Expected:
    expected: Expected = {}
    # Train gzipped, test raw: torchvision leaves both around, a manual download only the .gz.
    for split, prefix, n, gz in (("train", "train", 5, True), ("test", "t10k", 3, False)):
        labels = np.arange(n) % 10
        images = np.random.default_rng(n).integers(0, 255, (n, 28, 28), dtype=np.uint8)
        write_idx(root / folder / f"{prefix}-images-idx3-ubyte", images, gz)
        write_idx(root / folder / f"{prefix}-labels-idx1-ubyte", labels, gz)
        expected[(split, ALL)] = labels.tolist()
    return expected


def make_digits_mat(root: Path, folder: str, names: dict[str, str]) -> Expected:
    expected: Expected = {}
    for k, (split, name) in enumerate(names.items()):
        y = np.array([[10], [1], [5], [10]][: 4 - k])  # SVHN stores the digit 0 as 10
        x = np.moveaxis(rgb_images(len(y), 32, seed=k), 0, -1)  # (32, 32, 3, N)
        (root / folder).mkdir(parents=True, exist_ok=True)
        scipy.io.savemat(root / folder / name, {"X": x, "y": y})
        expected[(split, ALL)] = [0 if v == 10 else int(v) for v in y.ravel()]
    return expected


def make_usps(root: Path) -> Expected:
    expected: Expected = {}
    for split, name, labels in (("train", "usps.bz2", [1, 10, 4]), ("test", "usps.t.bz2", [2, 3])):
        lines = []
        for r, label in enumerate(labels):
            values = np.linspace(-1, 1, 256) if r % 2 == 0 else -np.ones(256)
            lines.append(f"{label} " + " ".join(f"{i + 1}:{v:.6f}" for i, v in enumerate(values)))
        (root / "usps").mkdir(parents=True, exist_ok=True)
        with bz2.open(root / "usps" / name, "wt") as fh:
            fh.write("\n".join(lines) + "\n")
        expected[(split, ALL)] = [v - 1 for v in labels]
    return expected


# ---------------------------------------------------------------- image formats


def make_flowers(root: Path) -> Expected:
    base = root / "flowers-102"
    labels = np.array([[3, 1, 102, 7, 7, 2]])  # 1-based, image ids 1..6
    for i in range(1, 7):
        write_image(base / "jpg" / f"image_{i:05d}.jpg", seed=i)
    scipy.io.savemat(base / "imagelabels.mat", {"labels": labels})
    setid = {"trnid": np.array([[4, 1]]), "valid": np.array([[2]]), "tstid": np.array([[3, 5, 6]])}
    scipy.io.savemat(base / "setid.mat", setid)  # train = trnid + valid, rows sorted by image id
    return {("train", ALL): [2, 0, 6], ("test", ALL): [101, 6, 1]}


def make_pets(root: Path) -> Expected:
    base = root / "oxford-iiit-pet"
    lists = {"trainval": [("Abyssinian_1", 1), ("yorkshire_terrier_9", 37)], "test": [("Bengal_3", 6)]}
    for name, rows in lists.items():
        (base / "annotations").mkdir(parents=True, exist_ok=True)
        text = "".join(f"{image} {cls} 1 1\n" for image, cls in rows)
        (base / "annotations" / f"{name}.txt").write_text(text)
        for image, _ in rows:
            write_image(base / "images" / f"{image}.jpg")
    return {("train", ALL): [0, 36], ("test", ALL): [5]}


def make_dtd(root: Path) -> Expected:
    base = root / "dtd" / "dtd"  # torchvision's layout; the plain archive is tested separately
    lists = {"train1": ["banded/banded_1.jpg"], "val1": ["zigzagged/zigzagged_2.jpg"], "test1": ["dotted/dotted_3.jpg"]}
    for name, rels in lists.items():
        (base / "labels").mkdir(parents=True, exist_ok=True)
        (base / "labels" / f"{name}.txt").write_text("\n".join(rels) + "\n")
        for rel in rels:
            write_image(base / "images" / rel)
    write_image(base / "images" / "banded" / "unlisted.jpg")  # in no list: must not appear
    return {("train", ALL): [0, 46], ("test", ALL): [10]}


def make_class_tree(base: Path, counts: dict[str, int], ext: str = ".jpg") -> None:
    for cls, n in counts.items():
        for i in range(n):
            write_image(base / cls / f"{i:04d}{ext}", seed=i)


def make_eurosat(root: Path) -> Expected:
    make_class_tree(root / "eurosat" / "2750", {"AnnualCrop": 5, "SeaLake": 5})
    return {("train", ALL): [0] * 4 + [9] * 4, ("test", ALL): [0, 9]}


def make_caltech101(root: Path) -> Expected:
    base = root / "caltech101" / "101_ObjectCategories"
    make_class_tree(base, {"BACKGROUND_Google": 3, "Faces": 5, "accordion": 5, "yin_yang": 5})
    return {("train", ALL): [0] * 4 + [4] * 4 + [100] * 4, ("test", ALL): [0, 4, 100]}


def make_stanford_cars(root: Path) -> Expected:
    base = root / "stanford_cars"
    dtype = [("bbox_x1", "O"), ("bbox_y1", "O"), ("class", "O"), ("fname", "O")]
    names = np.array(["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Audi TT RS Coupe 2012"], dtype=object)
    (base / "devkit").mkdir(parents=True)
    scipy.io.savemat(base / "devkit" / "cars_meta.mat", {"class_names": names})
    train = np.array([(1, 1, 3, "00001.jpg"), (1, 1, 1, "00002.jpg")], dtype=dtype)
    test = np.array([(1, 1, 2, "00001.jpg")], dtype=dtype)
    scipy.io.savemat(base / "devkit" / "cars_train_annos.mat", {"annotations": train})
    scipy.io.savemat(base / "cars_test_annos_withlabels.mat", {"annotations": test})
    for folder, rows in (("cars_train", train), ("cars_test", test)):
        for row in rows:
            write_image(base / folder / row["fname"])
    return {("train", ALL): [2, 0], ("test", ALL): [1]}


def make_cinic10(root: Path) -> Expected:
    base = root / "cinic-10"
    make_class_tree(base / "train", {"airplane": 2, "truck": 1}, ".png")
    make_class_tree(base / "valid", {"cat": 1}, ".png")
    make_class_tree(base / "test", {"truck": 2}, ".png")
    # train/ then valid/, each in class order
    return {("train", ALL): [0, 0, 9, 3], ("test", ALL): [9, 9]}


def make_mnist_m(root: Path) -> Expected:
    expected: Expected = {}
    for split, labels in (("train", [3, 0, 9]), ("test", [7])):
        base = root / "mnist_m"
        names = [f"{i:08d}.png" for i in range(len(labels))]
        for name in names:
            write_image(base / f"mnist_m_{split}" / name, size=(28, 28))
        text = "".join(f"{n} {lab}\n" for n, lab in zip(names, labels))
        (base / f"mnist_m_{split}_labels.txt").write_text(text)
        expected[(split, ALL)] = labels
    return expected


def make_office(root: Path) -> Expected:
    expected: Expected = {}
    for domain in ("amazon", "caltech", "dslr", "webcam"):
        make_class_tree(root / "office_caltech_10" / domain, {"back_pack": 5, "mouse": 5, "projector": 5})
        expected[("train", domain)] = [0] * 4 + [7] * 4 + [9] * 4
        expected[("test", domain)] = [0, 7, 9]
    return expected


DOMAINNET_CLASSES = ("aircraft_carrier", "bird", "zebra")  # official labels 0, 1, 2 in these lists


def make_domainnet(root: Path) -> Expected:
    base = root / "domainnet"
    expected: Expected = {}
    for domain in ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"):
        for split, keys in (("train", [2, 0, 1, 1]), ("test", [1, 2])):
            rels = [f"{domain}/{DOMAINNET_CLASSES[k]}/{domain}_{split}_{i}.jpg" for i, k in enumerate(keys)]
            for rel in rels:
                write_image(base / rel)
            (base / f"{domain}_{split}.txt").write_text("".join(f"{r} {k}\n" for r, k in zip(rels, keys)))
            expected[(split, domain)] = keys
    return expected


def make_domainnet10(root: Path) -> Expected:
    full = make_domainnet(root)
    ten = {1: 0, 2: 9}  # bird and zebra among the ten; aircraft_carrier is not
    return {key: [ten[k] for k in labels if k in ten] for key, labels in full.items()}


def make_digit5(root: Path) -> Expected:
    parts = {
        "mnist": make_idx(root, "MNIST/raw"),
        "mnist-m": make_mnist_m(root),
        "svhn": make_svhn(root),
        "synthdigits": make_synth(root),
        "usps": make_usps(root),
    }
    return {(split, domain): labels for domain, exp in parts.items() for (split, _), labels in exp.items()}


def make_svhn(root: Path) -> Expected:
    return make_digits_mat(root, "svhn", {"train": "train_32x32.mat", "test": "test_32x32.mat"})


def make_synth(root: Path) -> Expected:
    return make_digits_mat(root, "SynthDigits", {"train": "synth_train_32x32.mat", "test": "synth_test_32x32.mat"})


CASES = {
    "cifar10": make_cifar10,
    "cifar100": make_cifar100,
    "mnist": lambda r: make_idx(r, "MNIST/raw"),
    "fashion-mnist": lambda r: make_idx(r, "FashionMNIST/raw"),
    "svhn": make_svhn,
    "usps": make_usps,
    "flowers102": make_flowers,
    "oxford-pets": make_pets,
    "dtd": make_dtd,
    "eurosat": make_eurosat,
    "stanford-cars": make_stanford_cars,
    "caltech101": make_caltech101,
    "cinic10": make_cinic10,
    "mnist-m": make_mnist_m,
    "synthdigits": make_synth,
    "digit5": make_digit5,
    "office-caltech10": make_office,
    "domainnet": make_domainnet,
    "domainnet-10": make_domainnet10,
}

EXPECTED_CLASSES = {
    "stanford-cars": ("AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Audi TT RS Coupe 2012"),
    "domainnet": ("aircraft carrier", "bird", "zebra"),
}


# ---------------------------------------------------------------- the shared checks


@pytest.mark.parametrize("name", sorted(CASES))
def test_loader_reads_its_format(name: str, tmp_path: Path) -> None:
    expected = CASES[name](tmp_path)
    spec = DATASETS.get(name)
    ds = spec.load(DatasetOptions(data_root=tmp_path, seed=0, test_fraction=0.2))

    assert ds.name == name
    assert ds.classes == EXPECTED_CLASSES.get(name, spec.classes)
    assert ds.domains == spec.domains
    assert set(ds.splits) == set(expected)
    for key, labels in expected.items():
        samples = ds.samples(*key)
        got = samples.labels.tolist()
        assert got == labels, key  # listing order, also inside a seeded split
        assert len(np.unique(samples.ids)) == len(samples)
        for i in (0, len(samples) - 1):
            image = samples.source.load(i)
            assert isinstance(image, Image.Image) and image.mode == "RGB"
        assert max(got) < len(ds.classes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_loader_reads_the_options_its_spec_says_it_reads(name: str, tmp_path: Path) -> None:
    """``DatasetSpec.reads`` is what `fedcache extract` tells a user an option they typed is ignored by: a row that
    splits by --seed without declaring it would be told its --seed is ignored; one declaring it, never told."""
    CASES[name](tmp_path)
    spec = DATASETS.get(name)

    def split(**given) -> dict:
        return {k: s.fingerprint() for k, s in spec.load(DatasetOptions(data_root=tmp_path, **given)).splits.items()}

    assert (split(seed=0, test_fraction=0.2) != split(seed=1, test_fraction=0.5)) == ("seed" in spec.reads)
    assert ("seed" in spec.reads) == ("test_fraction" in spec.reads)
    assert {"data_root", "download"} <= spec.reads and "path" not in spec.reads


def test_a_dataset_says_which_given_options_it_does_not_read() -> None:
    """The embedded digits5-offline reads no folder: a --data-root given to it was accepted and ignored without a word."""
    given = DatasetOptions(data_root=Path("/data"), download=True, seed=3)
    assert DATASETS.get("digits5-offline").unread(given) == ["data_root", "download"]
    assert DATASETS.get("imagefolder").unread(given) == ["data_root", "download"]  # --path is its folder
    assert DATASETS.get("cifar10").unread(given) == ["seed"]  # an official split
    assert DATASETS.get("digits5-offline").unread(DatasetOptions()) == []  # the defaults are no one's choice


def test_every_spec_lists_classes_and_how_to_get() -> None:
    for name in CASES:
        spec = DATASETS.get(name)
        assert spec.source in ("torchvision", "folder")
        assert spec.how_to_get
        if name not in EXPECTED_CLASSES:
            assert spec.classes and len(set(spec.classes)) == len(spec.classes), name
            assert all("_" not in c for c in spec.classes), name  # readable, prompt-ready
    sizes = {"cifar100": 100, "flowers102": 102, "oxford-pets": 37, "dtd": 47, "caltech101": 101, "domainnet-10": 10}
    for name, n in sizes.items():
        assert len(DATASETS.get(name).classes) == n
    assert DATASETS.get("digit5").domains == ("mnist", "mnist-m", "svhn", "synthdigits", "usps")
    assert "wine glass" in DATASETS.get("domainnet-10").classes


@pytest.mark.parametrize("name", sorted(CASES))
def test_missing_data_says_where_and_how(name: str, tmp_path: Path) -> None:
    root = tmp_path / "nothing-here"
    spec = DATASETS.get(name)
    with pytest.raises(DataNotFoundError) as err:
        spec.load(DatasetOptions(data_root=root))
    message = str(err.value)
    assert str(root.resolve()) in message
    first = DATASETS.get("mnist") if name == "digit5" else spec
    assert first.how_to_get in message


def test_missing_single_file_is_named(tmp_path: Path) -> None:
    make_cifar10(tmp_path)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(DataNotFoundError, match="data_batch_3") as err:
        DATASETS.get("cifar10").load(DatasetOptions(data_root=tmp_path))
    assert "--download" in str(err.value) and "cifar-10-python.tar.gz" in str(err.value)


def test_digit5_names_the_missing_domain(tmp_path: Path) -> None:
    make_digit5(tmp_path)
    (tmp_path / "SynthDigits" / "synth_test_32x32.mat").unlink()
    with pytest.raises(DataNotFoundError, match="synthdigits") as err:
        DATASETS.get("digit5").load(DatasetOptions(data_root=tmp_path))
    assert "synth_test_32x32.mat" in str(err.value)


def test_no_data_root_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--data-root"):
        DATASETS.get("mnist").load(DatasetOptions())


def test_no_data_root_mentions_download_only_where_it_works() -> None:
    with pytest.raises(ConfigError, match=r"--data-root DIR \(with --download to fetch it there\)"):
        DATASETS.get("cifar10").load(DatasetOptions())
    with pytest.raises(ConfigError, match=r"--data-root DIR$"):  # no downloader to offer
        DATASETS.get("domainnet").load(DatasetOptions())


@pytest.mark.parametrize("name, archive", [("afile", False), ("cifar-10-python.tar.gz", True)])
def test_a_data_root_that_is_a_file_is_said_to_be_one_not_missing(name: str, archive: bool, tmp_path: Path) -> None:
    file = tmp_path / name
    file.write_bytes(b"")
    with pytest.raises(ConfigError) as err:  # not DataNotFoundError's "not found: expected <file>/cifar-10-batches-py"
        DATASETS.get("cifar10").load(DatasetOptions(data_root=file))
    said = str(err.value)
    assert said.startswith(f"--data-root {file} is a file, not a folder: give the folder that holds cifar-10-batches-py/")
    assert ("extracted into" in said) is archive and "not found" not in said


# ---------------------------------------------------------------- format details


def test_cifar_pixels_keep_their_channel_order(tmp_path: Path) -> None:
    make_cifar10(tmp_path)
    ds = DATASETS.get("cifar10").load(DatasetOptions(data_root=tmp_path))
    test = ds.samples("test", ALL)
    assert np.array_equal(np.asarray(test.source.load(1)), rgb_images(3, 32, seed=0)[1])
    assert len(ds.samples("train", ALL)) == 15


def test_cifar_unpickler_refuses_anything_but_arrays(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "data_batch"
    path.write_bytes(pickle.dumps({b"data": Evil()}))
    with open(path, "rb") as fh, pytest.raises(pickle.UnpicklingError, match="not allowed"):
        _CifarUnpickler(fh, encoding="bytes").load()


def test_idx_and_mat_arrays_are_exact(tmp_path: Path) -> None:
    make_idx(tmp_path, "MNIST/raw")
    make_svhn(tmp_path)
    mnist = DATASETS.get("mnist").load(DatasetOptions(data_root=tmp_path)).samples("test", ALL)
    raw = np.random.default_rng(3).integers(0, 255, (3, 28, 28), dtype=np.uint8)
    assert np.array_equal(np.asarray(mnist.source.load(2))[..., 0], raw[2])
    svhn = DATASETS.get("svhn").load(DatasetOptions(data_root=tmp_path)).samples("train", ALL)
    assert np.array_equal(np.asarray(svhn.source.load(3)), rgb_images(4, 32, seed=0)[3])


def test_idx_rejects_a_bad_magic_number(tmp_path: Path) -> None:
    make_idx(tmp_path, "MNIST/raw")
    (tmp_path / "MNIST/raw/t10k-images-idx3-ubyte").write_bytes(b"\x08\x03\x00\x00garbage")
    with pytest.raises(ConfigError, match="magic"):
        DATASETS.get("mnist").load(DatasetOptions(data_root=tmp_path))


def test_usps_pixels_span_0_to_255(tmp_path: Path) -> None:
    make_usps(tmp_path)
    train = DATASETS.get("usps").load(DatasetOptions(data_root=tmp_path)).samples("train", ALL)
    ramp, dark = np.asarray(train.source.load(0))[..., 0], np.asarray(train.source.load(1))
    assert ramp.shape == (16, 16) and ramp[0, 0] == 0 and ramp[-1, -1] == 255
    assert dark.max() == 0


def test_dtd_reads_the_plain_archive_layout_too(tmp_path: Path) -> None:
    make_dtd(tmp_path)
    os.rename(tmp_path / "dtd" / "dtd", tmp_path / "plain")
    os.rmdir(tmp_path / "dtd")
    os.rename(tmp_path / "plain", tmp_path / "dtd")
    ds = DATASETS.get("dtd").load(DatasetOptions(data_root=tmp_path))
    assert ds.samples("train", ALL).labels.tolist() == [0, 46]


def test_seeded_split_is_deterministic_and_covers_every_image(tmp_path: Path) -> None:
    make_class_tree(tmp_path / "eurosat" / "2750", {"Forest": 10, "River": 7})
    load = DATASETS.get("eurosat").load
    a = load(DatasetOptions(data_root=tmp_path, seed=1, test_fraction=0.3))
    b = load(DatasetOptions(data_root=tmp_path, seed=1, test_fraction=0.3))
    c = load(DatasetOptions(data_root=tmp_path, seed=2, test_fraction=0.3))
    ids = {s: a.samples(s, ALL).ids.tolist() for s in ("train", "test")}
    assert ids["test"] == b.samples("test", ALL).ids.tolist()
    assert sorted(ids["train"] + ids["test"]) == list(range(17))
    assert np.bincount(a.samples("test", ALL).labels).tolist()[1:] == [3, 0, 0, 0, 0, 0, 0, 2]
    assert ids["test"] != c.samples("test", ALL).ids.tolist()


def test_stray_folders_in_a_fixed_class_tree_are_skipped(tmp_path: Path) -> None:
    make_class_tree(tmp_path / "eurosat" / "2750", {"Forest": 5, "NotAClass": 5, ".cache": 2})
    ds = DATASETS.get("eurosat").load(DatasetOptions(data_root=tmp_path))
    assert set(ds.samples("train", ALL).labels.tolist()) == {1}


# ---------------------------------------------------------------- --download


def test_download_runs_once_when_data_is_missing(tmp_path: Path) -> None:
    calls = []

    def fake_download(data_root: Path) -> None:
        calls.append(data_root)
        make_class_tree(data_root / "fake", {"a": 2, "b": 2})

    row = StandardSet(
        name="fake", description="", reader=read_class_folders, dirs=("fake",), keys=("a", "b"),
        classes=("a", "b"), download=fake_download, how_to_get="get it.",
    )
    with pytest.raises(DataNotFoundError, match="--download"):
        load_standard(row, DatasetOptions(data_root=tmp_path))
    assert calls == []
    ds = load_standard(row, DatasetOptions(data_root=tmp_path, download=True))
    assert calls == [tmp_path] and len(ds.samples("test", ALL)) == 2
    load_standard(row, DatasetOptions(data_root=tmp_path, download=True))
    assert len(calls) == 1


def test_torchvision_download_calls_the_dataset_class(tmp_path: Path, monkeypatch) -> None:
    seen = []

    class FakeSVHN:
        def __init__(self, root: str, download: bool, split: str) -> None:
            seen.append((root, download, split))

    datasets = types.ModuleType("torchvision.datasets")
    datasets.SVHN = FakeSVHN
    package = types.ModuleType("torchvision")
    package.datasets = datasets
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets)
    torchvision_download("SVHN", {"split": "train"}, {"split": "test"}, subdir="svhn")(tmp_path)
    assert seen == [(str(tmp_path / "svhn"), True, "train"), (str(tmp_path / "svhn"), True, "test")]


def test_download_flag_on_a_dataset_without_downloader_says_so(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="--download is not available") as err:
        DATASETS.get("mnist-m").load(DatasetOptions(data_root=tmp_path, download=True))
    assert "mnist_m_train_labels.txt" in str(err.value)


def test_a_failed_download_is_a_data_error_with_the_manual_route(tmp_path: Path) -> None:
    def offline(data_root: Path) -> None:
        raise RuntimeError("Name or service not known")

    row = StandardSet(
        name="fake", description="", reader=read_class_folders, dirs=("fake",), keys=("a",),
        classes=("a",), download=offline, how_to_get="download fake.zip from the fake site.",
    )
    with pytest.raises(DataNotFoundError, match="Name or service not known") as err:
        load_standard(row, DatasetOptions(data_root=tmp_path, download=True))
    assert "Download fake.zip from the fake site." in str(err.value)


def test_domainnet_lists_must_name_domain_class_file(tmp_path: Path) -> None:
    make_domainnet(tmp_path)
    (tmp_path / "domainnet" / "real_test.txt").write_text("real/bird.jpg 1\n")
    with pytest.raises(ConfigError, match="<domain>/<class>/<file>"):
        DATASETS.get("domainnet").load(DatasetOptions(data_root=tmp_path))


def test_domainnet_labels_must_agree_with_class_folders(tmp_path: Path) -> None:
    make_domainnet(tmp_path)
    (tmp_path / "domainnet" / "real_test.txt").write_text("real/zebra/real_test_1.jpg 1\n")
    with pytest.raises(ConfigError, match="label 1"):
        DATASETS.get("domainnet").load(DatasetOptions(data_root=tmp_path))


def test_class_folders_without_images_are_missing_data(tmp_path: Path) -> None:
    (tmp_path / "eurosat" / "2750" / "Forest").mkdir(parents=True)
    (tmp_path / "eurosat" / "2750" / "Forest" / "notes.txt").write_text("x")
    with pytest.raises(DataNotFoundError, match=re.escape(str(tmp_path.resolve() / "eurosat" / "2750"))):
        DATASETS.get("eurosat").load(DatasetOptions(data_root=tmp_path))


def test_cinic10_needs_its_valid_folder(tmp_path: Path) -> None:
    make_cinic10(tmp_path)
    for path in sorted((tmp_path / "cinic-10" / "valid").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (tmp_path / "cinic-10" / "valid").rmdir()
    with pytest.raises(DataNotFoundError, match="valid"):
        DATASETS.get("cinic10").load(DatasetOptions(data_root=tmp_path))
