"""What a dataset is, to the extractor: per (split, domain), a list of images and labels.

A loader turns a :class:`DatasetSpec` plus :class:`DatasetOptions` into a
:class:`Dataset`. Images stay where they are (files on disk, or arrays in memory for
the embedded datasets); the extractor pulls them one by one through an
:class:`ImageSource`, so a dataset never has to fit in memory as tensors.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
from PIL import Image

from fedcache.errors import BadImageError, ConfigError
from fedcache.extract.config import DatasetOptions  # declared with extract's settings, whose options it holds
from fedcache.registry import Registry
from fedcache.wording import named

SPLITS = ("train", "test")
DEFAULT_DOMAIN = "all"


def skip_bad_images_named() -> str:
    """The option that skips bad images, as the caller names it: the flag, or the API's keyword."""
    return named("--skip-bad-images", "skip_bad_images=True")


class ImageSource(Protocol):
    """Random access to RGB images; ``describe`` names an image in error messages."""

    def __len__(self) -> int: ...

    def load(self, i: int) -> Image.Image: ...

    def describe(self, i: int) -> str: ...


class ArraySource:
    """Images held in a uint8 array of shape (N, H, W) or (N, H, W, 3)."""

    def __init__(self, images: np.ndarray, name: str) -> None:
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise ValueError(f"ArraySource needs uint8 (N,H,W[,3]) images, got {images.dtype} {images.shape}")
        self.images = images
        self.name = name

    # Every image has the same size, so resizing can happen per batch (see Preprocess.backend).
    uniform = True

    def __len__(self) -> int:
        return len(self.images)

    def load(self, i: int) -> Image.Image:
        return Image.fromarray(self.images[i]).convert("RGB")

    def load_array(self, i: int) -> np.ndarray:
        """The image as uint8 (H, W, 3), without a PIL round trip."""
        img = self.images[i]
        return np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img

    def describe(self, i: int) -> str:
        return f"{self.name}[{i}]"

    def fingerprint(self) -> str:
        return hashlib.sha256(np.ascontiguousarray(self.images).tobytes()).hexdigest()[:16]


_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def to_rgb(im: Image.Image) -> Image.Image:
    """RGB of any image PIL reads. 16-bit greyscale is scaled to 8 bits (v / 257, rounded, so 65535 -> 255)
    as PIL users expect, where ``convert`` would clip everything above 255 to white."""
    if im.mode in _SIXTEEN_BIT or (im.mode == "I" and im.format == "PNG"):  # older PIL opens 16-bit PNGs as "I"
        wide = np.asarray(im, dtype=np.uint32)
        return Image.fromarray(((np.clip(wide, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)).convert("RGB")
    return im.convert("RGB")


class FileSource:
    """Images stored as files (any format PIL reads)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, i: int) -> Image.Image:
        path = self.paths[i]
        try:
            with Image.open(path) as im:
                return to_rgb(im)
        except Exception as exc:  # PIL raises many types for a bad file
            raise BadImageError(
                f"cannot decode image {path}: {exc}. Remove or replace the file, "
                f"or pass {skip_bad_images_named()} to skip it and record it next to the entry"
            ) from exc

    def describe(self, i: int) -> str:
        return str(self.paths[i])

    def fingerprint(self) -> str:
        # Paths, sizes and mtimes: cheap, and changes whenever a file is replaced. Absolute paths: a folder is the
        # same images whichever directory names it, and however (`imgs`, `../imgs`, `/data/imgs`).
        h = hashlib.sha256()
        for p in self.paths:
            st = p.stat()
            # os.fsencode: a file name that is not valid UTF-8 hashes as the bytes it is on disk.
            h.update(os.fsencode(os.path.abspath(p)) + f"|{st.st_size}|{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:16]


@dataclass
class Samples:
    """The images of one (split, domain) with their labels; ids are stable row ids."""

    source: ImageSource
    labels: np.ndarray
    ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        if self.ids is None:
            self.ids = np.arange(len(self.labels), dtype=np.int64)
        self.ids = np.asarray(self.ids, dtype=np.int64)
        if not (len(self.source) == len(self.labels) == len(self.ids)):
            raise ValueError("source, labels and ids must have the same length")

    def __len__(self) -> int:
        return len(self.labels)

    def fingerprint(self) -> str:
        """Changes whenever the images, labels or ids change."""
        h = hashlib.sha256()
        fp = getattr(self.source, "fingerprint", None)
        h.update((fp() if fp else f"{type(self.source).__name__}:{len(self.source)}").encode())
        h.update(self.labels.tobytes())
        h.update(self.ids.tobytes())
        return h.hexdigest()[:16]


@dataclass
class Dataset:
    """A loaded dataset: class names, domain names, and the samples per (split, domain)."""

    name: str
    classes: tuple[str, ...]
    domains: tuple[str, ...]
    splits: dict[tuple[str, str], Samples]
    default_image_size: int | None = None

    def samples(self, split: str, domain: str) -> Samples:
        try:
            return self.splits[(split, domain)]
        except KeyError:
            have = sorted({s for s, _ in self.splits})
            raise ConfigError(
                f"dataset {self.name!r} has no split {split!r} for domain {domain!r}; "
                f"splits: {have}, domains: {list(self.domains)}"
            ) from None


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    source: str  # "embedded", "torchvision", "folder"
    load: Callable[[DatasetOptions], Dataset]
    classes: tuple[str, ...] = ()  # empty when only known after loading (imagefolder)
    domains: tuple[str, ...] = (DEFAULT_DOMAIN,)
    how_to_get: str = ""
    # The size its images are resized to when --image-size is not given (its Dataset's): what an extraction with the
    # defaults records, known without loading the images (``reproduce`` asks it of a store's entries).
    default_image_size: int | None = None
    # The DatasetOptions fields its loader reads; another one given changes nothing (``unread``). Every field unless
    # declared: a loader that does not say is never told it ignores one.
    reads: frozenset[str] = frozenset(f.name for f in fields(DatasetOptions))

    def unread(self, options: DatasetOptions) -> list[str]:
        """The fields of ``options`` given (not their defaults) that its loader does not read, in their order: an
        embedded dataset's ``data_root``. Accepted, since a script passes one --data-root to every dataset (`fedcache
        reproduce` does), and said by the command line, where a user typed them."""
        default = DatasetOptions()
        return [f.name for f in fields(options)
                if f.name not in self.reads and getattr(options, f.name) != getattr(default, f.name)]


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def split_by_seed(n: int, test_fraction: float, seed: int, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stratified, seeded train/test split of ``n`` rows (for data without a fixed split)."""
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        rng.shuffle(rows)
        k = max(1, int(round(len(rows) * test_fraction))) if len(rows) > 1 else 0
        test.append(rows[:k])
    test_idx = np.sort(np.concatenate(test)) if test else np.array([], dtype=np.int64)
    train_idx = np.setdiff1d(np.arange(n), test_idx)
    return train_idx, test_idx
