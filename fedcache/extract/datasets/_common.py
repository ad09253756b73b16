"""What the standard-format loaders share: one row type, one load path, folder and list readers.

A dataset in a standard on-disk format is one :class:`StandardSet` row: where it lives under
``--data-root``, which reader understands its files, its class names, and how to get it. The
registration, the missing-data error and the optional torchvision download are the same for
every row, so they live here once; the modules that register datasets are mostly tables.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from fedcache.errors import ConfigError, DataNotFoundError
from fedcache.wording import by_keyword, named
from fedcache.extract.datasets.base import (
    DATASETS,
    DEFAULT_DOMAIN,
    Dataset,
    DatasetOptions,
    DatasetSpec,
    FileSource,
    Samples,
    split_by_seed,
)

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)

Splits = dict[tuple[str, str], Samples]

# Words rather than numerals: the names end up in text prompts ("a photo of a {}.").
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


class MissingFiles(Exception):
    """Raised by readers; :func:`load_standard` turns it into a DataNotFoundError with the how-to."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        super().__init__(", ".join(str(p) for p in self.paths))


@dataclass(frozen=True)
class Loaded:
    """What a reader returns; ``classes`` only when the files themselves name the classes."""

    splits: Splits
    classes: tuple[str, ...] | None = None


Reader = Callable[[Path, "StandardSet", DatasetOptions], Loaded]

# The options a row's loader reads (``DatasetSpec.reads``): every row its folder and --download; a row without an
# official split (read_class_folders without ``split_dirs``) the seeded split's too.
IN_A_FOLDER = frozenset({"data_root", "download"})
SEEDED_SPLIT = IN_A_FOLDER | {"seed", "test_fraction"}


@dataclass(frozen=True)
class StandardSet:
    """One dataset in a standard on-disk format (a row of a module's table)."""

    name: str
    description: str
    reader: Reader
    dirs: tuple[str, ...]  # candidate folders under --data-root; the first that exists is read
    how_to_get: str
    classes: tuple[str, ...] = ()  # readable names in label order; empty if the files name them
    keys: tuple[str, ...] = ()  # on-disk class names (folders, list entries) in label order
    domains: tuple[str, ...] = (DEFAULT_DOMAIN,)
    source: str = "torchvision"
    download: Callable[[Path], None] | None = None  # fetches into --data-root (torchvision's layout)
    params: Mapping = field(default_factory=dict)  # reader-specific: file names, split folders...
    reads: frozenset[str] = IN_A_FOLDER  # SEEDED_SPLIT for a row its reader splits by --seed


def how_to_get(row: StandardSet, manual_only: bool = False, data_root: Path | None = None) -> str:
    """The row's how-to (written as a clause, lower case), as a sentence for users; ``data_root``: the folder
    the caller gave, which a Python API call's how-to names in its paths."""
    if row.download is not None and not manual_only:
        return (f"Pass {_download_named()} to fetch it with torchvision into {_data_root()}, or "
                f"{_said(row.how_to_get, data_root)}")
    return _said(row.how_to_get[:1].upper() + row.how_to_get[1:], data_root)


def _data_root() -> str:
    return named("--data-root", "data_root")


def _download_named() -> str:
    return named("--download", "download=True")


def _said(how: str, data_root: Path | None = None) -> str:
    """A row's how-to, whose folder is the command line's --data-root and its paths' ``<data-root>``: in a Python
    API call ``data_root``, and the paths under the folder it passed (a caller never typed ``--data-root``, so
    ``<data-root>`` is no name of theirs), or under ``data_root`` where it is not known."""
    if not by_keyword():
        return how
    where = str(data_root) if data_root is not None else "data_root"
    return how.replace("<data-root>", where).replace("--data-root", "data_root")


def register(row: StandardSet) -> None:
    DATASETS.add(
        row.name,
        DatasetSpec(
            name=row.name,
            description=row.description,
            source=row.source,
            load=functools.partial(load_standard, row),
            classes=row.classes,
            domains=row.domains,
            how_to_get=how_to_get(row),
            reads=row.reads,
        ),
    )


def require_data_root(row: StandardSet, options: DatasetOptions) -> Path:
    if options.data_root is None:
        fetch = f" (with {_download_named()} to fetch it there)" if row.download else ""
        raise ConfigError(f"dataset {row.name!r} is read from a data folder: pass {named('--data-root DIR', 'data_root=DIR')}"
                          f"{fetch}")
    root = Path(options.data_root).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{named('--data-root', 'data_root')} {root.resolve()} is a file, not a folder: give the folder "
                          f"that holds {row.dirs[0]}/{_archive(root)} (`fedcache datasets {row.name}` says how to get it)")
    return root


ARCHIVES = (".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z")


def _archive(path: Path) -> str:
    """An archive given as the data folder: what to do with it first, said beside the folder to give."""
    return f", the folder {path.name} is extracted into" if path.suffix.lower() in ARCHIVES else ""


def load_standard(row: StandardSet, options: DatasetOptions) -> Dataset:
    data_root = require_data_root(row, options)
    try:
        loaded = _read(row, data_root, options)
    except MissingFiles as missing:
        if not (options.download and row.download):
            raise _not_found(row, missing, options) from None
        _download(row, data_root)
        try:
            loaded = _read(row, data_root, options)
        except MissingFiles as still:
            raise _not_found(row, still, options) from None
    classes = loaded.classes if loaded.classes is not None else row.classes
    return Dataset(name=row.name, classes=tuple(classes), domains=row.domains, splits=loaded.splits)


def _download(row: StandardSet, data_root: Path) -> None:
    log.info("downloading %s into %s", row.name, data_root)
    try:
        row.download(data_root)
    except Exception as exc:  # torchvision raises RuntimeError, URLError, OSError... for one cause
        raise DataNotFoundError(
            f"downloading dataset {row.name!r} into {data_root.resolve()} failed: {exc}. "
            f"{how_to_get(row, manual_only=True, data_root=data_root)}"
        ) from exc


def _read(row: StandardSet, data_root: Path, options: DatasetOptions) -> Loaded:
    candidates = [data_root / d for d in row.dirs]
    base = next((c for c in candidates if c.is_dir()), None)
    if base is None:
        raise MissingFiles(candidates)
    return row.reader(base, row, options)


def _not_found(row: StandardSet, missing: MissingFiles, options: DatasetOptions) -> DataNotFoundError:
    where = " or ".join(str(p.resolve()) for p in missing.paths)
    how = how_to_get(row, data_root=require_data_root(row, options))
    if options.download and row.download is None:
        how = f"{_download_named()} is not available for {row.name!r}. {how}"
    return DataNotFoundError(f"dataset {row.name!r} not found: expected {where}. {how}")


def need(*alternatives: Path) -> Path:
    """The first of ``alternatives`` that exists (e.g. a raw file or its .gz)."""
    for p in alternatives:
        if p.exists():
            return p
    raise MissingFiles(alternatives)


def torchvision_download(class_name: str, *calls: Mapping, subdir: str = "") -> Callable[[Path], None]:
    """A downloader: ``torchvision.datasets.<class_name>(root=<data-root>/<subdir>, download=True, **kw)``
    once per kwargs set (e.g. once for train, once for test)."""

    def download(data_root: Path) -> None:
        import torchvision.datasets  # only when downloading: importing it is slow

        cls = getattr(torchvision.datasets, class_name)
        for kwargs in calls or ({},):
            cls(root=str(data_root / subdir), download=True, **kwargs)

    return download


def readable(keys: Sequence[str], renames: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Class names for prompts: ``ice_cream`` -> ``ice cream``, unless ``renames`` says better."""
    renames = renames or {}
    return tuple(renames.get(k, k.replace("_", " ")) for k in keys)


# ---------------------------------------------------------------- listing files


def is_image(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def image_files(folder: Path) -> list[Path]:
    """Every image below ``folder`` (hidden entries skipped), in a sorted, stable order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath) / f for f in sorted(filenames) if is_image(f))
    return found


def subfolders(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def has_images(folder: Path) -> bool:
    return any(e.is_file() and is_image(e.name) for e in os.scandir(folder))


# ---------------------------------------------------------------- samples and splits


def file_samples(paths: Sequence[Path], labels: Sequence[int], ids: np.ndarray | None = None) -> Samples:
    return Samples(FileSource(paths), np.asarray(labels, dtype=np.int64), ids)


def seeded_split(paths: Sequence[Path], labels: Sequence[int], options: DatasetOptions) -> dict[str, Samples]:
    """Train/test for data that ships without a split; ids are rows of the full sorted listing."""
    labels = np.asarray(labels, dtype=np.int64)
    train, test = split_by_seed(len(labels), options.test_fraction, options.seed, labels)
    return {
        split: file_samples([paths[i] for i in rows], labels[rows], rows)
        for split, rows in (("train", train), ("test", test))
    }


def class_folder_listing(folder: Path, keys: Sequence[str], ignore: Iterable[str] = ()) -> tuple[list[Path], list[int]]:
    """Images of ``folder/<key>/...`` labelled by the key's index; other folders are logged and skipped."""
    index = {k: i for i, k in enumerate(keys)}
    ignore = set(ignore)
    skipped = [d for d in subfolders(folder) if d not in index and d not in ignore]
    if skipped:
        log.warning("%s: ignoring folders that are not classes of this dataset: %s", folder, skipped)
    paths: list[Path] = []
    labels: list[int] = []
    for key in keys:
        if (folder / key).is_dir():
            found = image_files(folder / key)
            paths.extend(found)
            labels.extend([index[key]] * len(found))
    return paths, labels


def read_class_folders(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """``base[/<split dir>][/<domain>]/<class>/*``; without ``split_dirs`` a seeded split.

    ``params``: ``split_dirs`` maps train/test to the folders merged into it (e.g. CINIC-10's
    ``train`` + ``valid``), ``ignore`` lists folders that are not classes. A domain's folder is
    named like the domain.
    """
    split_dirs: Mapping[str, Sequence[str]] | None = row.params.get("split_dirs")
    ignore = row.params.get("ignore", ())
    splits: Splits = {}
    for domain in row.domains:
        sub = "" if domain == DEFAULT_DOMAIN else domain
        if split_dirs is None:
            per_split = seeded_split(*_merged_listing([base / sub], row.keys, ignore), options)
        else:
            per_split = {
                split: file_samples(*_merged_listing([base / d / sub for d in dirs], row.keys, ignore))
                for split, dirs in split_dirs.items()
            }
        splits.update({(split, domain): samples for split, samples in per_split.items()})
    return Loaded(splits)


def _merged_listing(folders: Sequence[Path], keys: Sequence[str], ignore: Iterable[str]) -> tuple[list, list]:
    paths: list[Path] = []
    labels: list[int] = []
    for folder in folders:
        p, lab = class_folder_listing(need(folder), keys, ignore)
        paths += p
        labels += lab
    if not paths:
        raise MissingFiles([folders[0] / "<class>" / "<image>"])
    return paths, labels


def read_list_file(list_path: Path, image_base: Path) -> tuple[list[Path], list[str], list[int]]:
    """A ``<relative path> <label>`` list (MNIST-M, DomainNet): paths, the raw relative paths, labels."""
    paths, rel, labels = [], [], []
    with open(need(list_path), encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise ConfigError(f"{list_path}:{n}: expected '<image path> <label>', got {line.strip()!r}")
            rel.append(parts[0])
            paths.append(image_base / parts[0])
            labels.append(int(parts[1]))
    return paths, rel, labels
