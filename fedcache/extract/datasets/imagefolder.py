"""``imagefolder``: any tree of images laid out by class (and optionally by domain).

Accepted layouts under ``--path ROOT`` (detected, not configured):

* ``ROOT/<class>/*`` or ``ROOT/<domain>/<class>/*``: no split on disk, so a seeded stratified
  train/test split per domain (``--test-fraction``, ``--seed``);
* the same below ``ROOT/train/`` and ``ROOT/test/``: that split is used as is.

A class folder holds its images directly (deeper subfolders are included too); a domain folder
holds only class folders. Class names are the folder names, sorted, so name folders the way
prompts should read them. Files without an image extension and hidden entries are ignored.
Images are decoded only when the extractor asks for them.
"""
from __future__ import annotations

from pathlib import Path

from fedcache.errors import ConfigError, DataNotFoundError
from fedcache.extract.datasets._common import (
    file_samples,
    has_images,
    image_files,
    is_image,
    seeded_split,
    subfolders,
)
from fedcache.extract.datasets.base import DATASETS, DEFAULT_DOMAIN, SPLITS, Dataset, DatasetOptions, DatasetSpec
from fedcache.wording import named

LAYOUTS = (
    "ROOT/<class>/<image>, ROOT/<domain>/<class>/<image>, or either of them below ROOT/train/ and ROOT/test/"
)

Listing = dict[str, list[Path]]  # class folder name -> its images


def _split_roots(root: Path) -> dict[str, Path] | None:
    """``{"train": ROOT/train, "test": ROOT/test}`` when the tree carries its own split."""
    present = [s for s in SPLITS if (root / s).is_dir()]
    if not present:
        return None
    if len(present) != len(SPLITS):
        (missing,) = set(SPLITS) - set(present)
        raise ConfigError(f"{root} has a {present[0]}/ folder but no {missing}/ folder; give both or neither")
    return {s: root / s for s in SPLITS}


def _has_domains(top: Path) -> bool:
    """True when ``top`` holds domain folders of class folders rather than class folders."""
    subs = [top / s for s in subfolders(top)]
    if any(has_images(s) for s in subs):
        return False
    if any(has_images(s / c) for s in subs for c in subfolders(s)):
        return True
    if any(e.is_file() and is_image(e.name) for e in top.iterdir()):
        raise ConfigError(f"{top} holds images directly; put them in one folder per class ({LAYOUTS})")
    raise DataNotFoundError(f"no images found under {top.resolve()}; expected {LAYOUTS}")


def _list_classes(folder: Path) -> Listing:
    listing = {c: image_files(folder / c) for c in subfolders(folder)}
    return {c: files for c, files in listing.items() if files}


def _scan(root: Path) -> tuple[dict[tuple[str, str], Listing], bool]:
    """Per (split folder or "", domain): the class listing; and whether the tree has its own split."""
    split_roots = _split_roots(root)
    tops = split_roots or {"": root}
    nested = {name: _has_domains(top) for name, top in tops.items()}
    if len(set(nested.values())) > 1:
        raise ConfigError(f"{root}: train/ and test/ must both have domain folders or both not ({LAYOUTS})")
    listings = {}
    for name, top in tops.items():
        for domain in subfolders(top) if nested[name] else [DEFAULT_DOMAIN]:
            folder = top / domain if nested[name] else top
            listing = _list_classes(folder)
            if not listing:
                raise DataNotFoundError(f"no images found in the class folders of {folder.resolve()}")
            listings[(name, domain)] = listing
    return listings, split_roots is not None


def _flatten(listing: Listing, index: dict[str, int]) -> tuple[list[Path], list[int]]:
    paths: list[Path] = []
    labels: list[int] = []
    for cls in sorted(listing):
        paths += listing[cls]
        labels += [index[cls]] * len(listing[cls])
    return paths, labels


def load_imagefolder(options: DatasetOptions) -> Dataset:
    if options.path is None:
        raise ConfigError(f"dataset 'imagefolder' needs {named('--path ROOT', 'path=ROOT')}, a folder laid out as {LAYOUTS}")
    root = Path(options.path).expanduser()
    if not root.is_dir():
        raise DataNotFoundError(f"imagefolder: {root.resolve()} is not a folder; expected {LAYOUTS}")
    listings, has_split = _scan(root)
    classes = tuple(sorted({c for listing in listings.values() for c in listing}))
    domains = tuple(sorted({d for _, d in listings}))
    index = {c: i for i, c in enumerate(classes)}
    splits = {}
    for (split_dir, domain), listing in listings.items():
        paths, labels = _flatten(listing, index)
        if has_split:
            splits[(split_dir, domain)] = file_samples(paths, labels)
        else:
            for split, samples in seeded_split(paths, labels, options).items():
                splits[(split, domain)] = samples
    missing = [f"{s}/{d}" for s in SPLITS for d in domains if (s, d) not in splits]
    if missing:
        raise ConfigError(f"{root}: every domain needs images in train/ and test/; missing {missing}")
    return Dataset(name="imagefolder", classes=classes, domains=domains, splits=splits)


DATASETS.add(
    "imagefolder",
    DatasetSpec(
        name="imagefolder",
        description="your own images, one folder per class (optionally per domain, optionally split)",
        source="folder",
        load=load_imagefolder,
        reads=frozenset({"path", "seed", "test_fraction"}),  # --path, not --data-root; a seeded split without train/
        how_to_get=f"Pass --path ROOT laid out as {LAYOUTS}; without train/ and test/ a seeded split "
        "(--test-fraction, --seed) is made per domain.",
    ),
)
