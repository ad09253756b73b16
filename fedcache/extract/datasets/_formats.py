"""Readers for the official file formats (pickled CIFAR batches, idx, .mat, libsvm, split lists).

Each reader has the :data:`~fedcache.extract.datasets._common.Reader` signature: it gets the
dataset's folder, its table row (file names in ``row.params``) and the options, and returns the
samples per (split, domain). Array formats become uint8 :class:`ArraySource`s; image formats
become lazily decoded :class:`FileSource`s.
"""
from __future__ import annotations

import bz2
import gzip
import pickle
import struct
from pathlib import Path

import numpy as np

from fedcache.errors import ConfigError
from fedcache.extract.datasets._common import Loaded, StandardSet, file_samples, need
from fedcache.extract.datasets.base import DEFAULT_DOMAIN, ArraySource, DatasetOptions, Samples


def _loadmat(path, **kwargs):
    """scipy.io.loadmat, imported where a .mat file is read: importing it sets KMP_DUPLICATE_LIB_OK in os.environ
    (and warnings filters), which a library call must leave as its caller had them unless it needs them."""
    import scipy.io

    return scipy.io.loadmat(path, **kwargs)


def _array_samples(images: np.ndarray, labels: np.ndarray, name: str) -> Samples:
    return Samples(ArraySource(np.ascontiguousarray(images, dtype=np.uint8), name), labels)


def _by_split(samples: dict[str, Samples], classes: tuple[str, ...] | None = None) -> Loaded:
    return Loaded({(split, DEFAULT_DOMAIN): s for split, s in samples.items()}, classes)


# ---------------------------------------------------------------- CIFAR python batches


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles the official CIFAR python batches and nothing else.

    Our rule is never to unpickle data that crossed a network. The CIFAR "python version" is
    the official distribution format, downloaded by the user from the dataset's own site, so we
    read it, but only through this allow-list: plain containers plus numpy arrays, so a
    tampered file cannot name any other callable.
    """

    _RECONSTRUCT = np.zeros(1).__reduce__()[0]
    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }

    def find_class(self, module: str, name: str):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"CIFAR batch refers to {module}.{name}, which is not allowed") from None


def _cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as fh:
        batch = _CifarUnpickler(fh, encoding="bytes").load()
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    # Rows are the red, green and blue 32x32 planes one after the other.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return images, np.asarray(batch[label_key], dtype=np.int64)


def read_cifar(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """params: ``files`` {split: batch file names}, ``label_key`` (bytes)."""
    out = {}
    for split, names in row.params["files"].items():
        parts = [_cifar_batch(need(base / n), row.params["label_key"]) for n in names]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        out[split] = _array_samples(images, labels, f"{row.name}/{split}")
    return _by_split(out)


# ---------------------------------------------------------------- MNIST-style idx files


def read_idx_file(path: Path) -> np.ndarray:
    """An idx ubyte file (raw or .gz) as a uint8 array of the dimensions in its header."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ConfigError(f"{path} is not an unsigned-byte idx file (bad magic number)")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ConfigError(f"{path} is truncated: header says {dims}, found {body.size} bytes of data")
    return body.reshape(dims)


def read_idx(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """params: ``prefixes`` {split: file prefix}; raw or gzipped files both work."""
    out = {}
    for split, prefix in row.params["prefixes"].items():
        arrays = []
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            raw = base / f"{prefix}-{kind}"
            arrays.append(read_idx_file(need(raw, raw.with_name(raw.name + ".gz"))))
        out[split] = _array_samples(arrays[0], arrays[1].astype(np.int64), f"{row.name}/{split}")
    return _by_split(out)


# ---------------------------------------------------------------- SVHN-style .mat


def read_digits_mat(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """``X`` (H, W, 3, N) uint8 and ``y`` (N, 1) per split file, as SVHN and SynthDigits ship.

    params: ``files`` {split: file name}. SVHN writes the digit 0 as label 10.
    """
    out = {}
    for split, name in row.params["files"].items():
        mat = _loadmat(need(base / name))
        images = np.moveaxis(mat["X"], -1, 0)
        labels = np.asarray(mat["y"], dtype=np.int64).ravel()
        out[split] = _array_samples(images, np.where(labels == 10, 0, labels), f"{row.name}/{split}")
    return _by_split(out)


# ---------------------------------------------------------------- USPS libsvm


def _read_libsvm_digits(path: Path, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Lines ``label i:v ...`` with 1-based pixel indices and values in [-1, 1]; labels 1..10."""
    with bz2.open(path, "rt", encoding="ascii") as fh:
        # "label i:v i:v" -> [label, i, v, i, v]; np.fromstring parses a line in C (text mode).
        rows = [np.fromstring(line.replace(":", " "), sep=" ") for line in fh if line.strip()]
    pixels = np.zeros((len(rows), side * side), dtype=np.float32)
    labels = np.empty(len(rows), dtype=np.int64)
    for r, row in enumerate(rows):
        if len(row) % 2 != 1:
            raise ConfigError(f"{path}: line {r + 1} is not 'label index:value ...'")
        labels[r] = int(row[0]) - 1
        pixels[r, row[1::2].astype(np.int64) - 1] = row[2::2]
    images = np.clip(np.rint((pixels + 1.0) * 127.5), 0, 255).astype(np.uint8)
    return images.reshape(-1, side, side), labels


def read_usps(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """params: ``files`` {split: bz2 file name}."""
    out = {}
    for split, name in row.params["files"].items():
        images, labels = _read_libsvm_digits(need(base / name), 16)
        out[split] = _array_samples(images, labels, f"{row.name}/{split}")
    return _by_split(out)


# ---------------------------------------------------------------- image folders + split lists


def read_flowers(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """Flowers102: ``jpg/image_%05d.jpg``, labels 1..102 in imagelabels.mat, ids per split in setid.mat.

    params: ``splits`` {split: setid keys merged into it}.
    """
    images = need(base / "jpg")
    labels = _loadmat(need(base / "imagelabels.mat"), squeeze_me=True)["labels"]
    setid = _loadmat(need(base / "setid.mat"), squeeze_me=True)
    labels = np.atleast_1d(labels).astype(np.int64) - 1
    out = {}
    for split, keys in row.params["splits"].items():
        ids = np.sort(np.concatenate([np.atleast_1d(setid[k]).astype(np.int64) for k in keys]))
        paths = [images / f"image_{i:05d}.jpg" for i in ids]
        out[split] = file_samples(paths, labels[ids - 1])
    return _by_split(out)


def read_pets(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """Oxford-IIIT Pet: ``annotations/<list>.txt`` lines ``<image id> <class 1..37> <species> <breed>``.

    params: ``lists`` {split: list name}.
    """
    images = need(base / "images")
    out = {}
    for split, name in row.params["lists"].items():
        paths, labels = [], []
        with open(need(base / "annotations" / f"{name}.txt"), encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if parts and not parts[0].startswith("#"):
                    paths.append(images / f"{parts[0]}.jpg")
                    labels.append(int(parts[1]) - 1)
        out[split] = file_samples(paths, labels)
    return _by_split(out)


def read_dtd(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """DTD: ``labels/<split><partition>.txt`` lines ``<class>/<file>`` under ``images/``.

    params: ``lists`` {split: list names merged into it}, e.g. train = train1 + val1.
    """
    images = need(base / "images")
    index = {k: i for i, k in enumerate(row.keys)}
    out = {}
    for split, names in row.params["lists"].items():
        paths, labels = [], []
        for name in names:
            list_path = need(base / "labels" / f"{name}.txt")
            for rel in list_path.read_text(encoding="utf-8").split():
                cls = rel.split("/", 1)[0]
                if cls not in index:
                    raise ConfigError(f"{list_path}: {cls!r} is not a DTD class; expected one of {sorted(index)}")
                paths.append(images / rel)
                labels.append(index[cls])
        out[split] = file_samples(paths, labels)
    return _by_split(out)


def _cars_annotations(path: Path, images: Path) -> tuple[list[Path], list[int]]:
    annos = np.atleast_1d(_loadmat(path, squeeze_me=True)["annotations"])
    return [images / str(a["fname"]) for a in annos], [int(a["class"]) - 1 for a in annos]


def read_cars(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """Stanford Cars as torchvision lays it out; class names come from ``devkit/cars_meta.mat``."""
    devkit = base / "devkit"
    meta = _loadmat(need(devkit / "cars_meta.mat"), squeeze_me=True)
    classes = tuple(str(c).strip() for c in np.atleast_1d(meta["class_names"]))
    test_annos = need(base / "cars_test_annos_withlabels.mat", devkit / "cars_test_annos_withlabels.mat")
    train = _cars_annotations(need(devkit / "cars_train_annos.mat"), need(base / "cars_train"))
    test = _cars_annotations(test_annos, need(base / "cars_test"))
    return _by_split({"train": file_samples(*train), "test": file_samples(*test)}, classes)
