"""Multi-domain benchmarks of the feature-shift papers: Office-Caltech-10 and DomainNet.

* Office-Caltech-10: ``office_caltech_10/{amazon,caltech,dslr,webcam}/<class>/*`` (the layout
  FedBN and FedPCL distribute); no official split, so a seeded stratified split per domain.
* DomainNet: the official ``<domain>/<class>/*.jpg`` folders with the official
  ``<domain>_train.txt`` / ``<domain>_test.txt`` lists (``<domain>/<class>/<file> <label>``).
  The full set's 345 class names come from those lists (ordered by their label column).
* DomainNet-10: the ten-class subset FedBN introduced and FedPCL reuses (its head has 10
  outputs); the paper does not list the classes, its code does.
"""
from __future__ import annotations

from pathlib import Path

from fedcache.errors import ConfigError
from fedcache.extract.datasets._common import (
    SEEDED_SPLIT,
    Loaded,
    StandardSet,
    file_samples,
    need,
    read_class_folders,
    read_list_file,
    readable,
    register,
)
from fedcache.extract.datasets.base import SPLITS, DatasetOptions

OFFICE_CALTECH10 = "back_pack bike calculator headphones keyboard laptop_computer monitor mouse mug projector".split()
OFFICE_NAMES = {"back_pack": "backpack", "laptop_computer": "laptop", "mouse": "computer mouse"}

DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
DOMAINNET10 = "bird feather headphones ice_cream teapot tiger whale windmill wine_glass zebra".split()

_DOMAINNET_HOW = (
    "from http://ai.bu.edu/M3SDA/ download the six domain archives ({archives}) and their "
    "<domain>_train.txt / <domain>_test.txt lists, and extract everything into <data-root>/domainnet/, "
    "giving <data-root>/domainnet/clipart/<class>/*.jpg and <data-root>/domainnet/clipart_train.txt."
).format(archives=", ".join(f"{d}.zip" for d in DOMAINNET_DOMAINS))


def _domain_list(base: Path, domain: str, split: str) -> tuple[list[Path], list[str], list[int]]:
    need(base / domain)
    list_path = base / f"{domain}_{split}.txt"
    paths, rel, labels = read_list_file(list_path, base)
    keys = [r.split("/")[1] if r.count("/") == 2 else "" for r in rel]
    if "" in keys:
        bad = rel[keys.index("")]
        raise ConfigError(f"{list_path}: entry {bad!r} is not <domain>/<class>/<file>")
    return paths, keys, labels


def _official_classes(lists: dict, source: Path) -> tuple[str, ...]:
    """Class folder names ordered by the lists' label column; the lists must agree with themselves."""
    by_label: dict[int, str] = {}
    for _, keys, labels in lists.values():
        for key, label in zip(keys, labels):
            if by_label.setdefault(label, key) != key:
                raise ConfigError(f"{source}: label {label} is used for both {by_label[label]!r} and {key!r}")
    if sorted(by_label) != list(range(len(by_label))):
        raise ConfigError(f"{source}: the list files' labels are not 0..{len(by_label) - 1} without gaps")
    return tuple(by_label[i] for i in range(len(by_label)))


def read_domainnet(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    """With ``row.keys`` only those classes, relabelled in that order; else every class."""
    lists = {(s, d): _domain_list(base, d, s) for d in row.domains for s in SPLITS}
    keys = row.keys or _official_classes(lists, base)
    index = {k: i for i, k in enumerate(keys)}
    splits = {}
    for (split, domain), (paths, found, _) in lists.items():
        rows = [i for i, k in enumerate(found) if k in index]
        splits[(split, domain)] = file_samples([paths[i] for i in rows], [index[found[i]] for i in rows])
    return Loaded(splits, None if row.keys else readable(keys))


TABLE = (
    StandardSet(
        name="office-caltech10",
        description="Office-Caltech-10: the 10 classes Office-31 shares with Caltech-256, 4 domains (seeded split)",
        reader=read_class_folders,
        dirs=("office_caltech_10", "office-caltech10", "office_caltech10", "OfficeCaltech10"),
        keys=tuple(OFFICE_CALTECH10),
        classes=readable(OFFICE_CALTECH10, OFFICE_NAMES),
        domains=("amazon", "caltech", "dslr", "webcam"),
        source="folder",
        reads=SEEDED_SPLIT,
        how_to_get="get the Office-Caltech-10 images (Gong et al., CVPR 2012; e.g. the office_caltech_10 "
        "archive FedBN distributes) so that <data-root>/office_caltech_10/{amazon,caltech,dslr,webcam}/<class>/* "
        "exists, with class folders " + ", ".join(OFFICE_CALTECH10) + ".",
    ),
    StandardSet(
        name="domainnet",
        description="DomainNet: 0.6M images of 345 classes in 6 domains (official split; names from the lists)",
        reader=read_domainnet,
        dirs=("domainnet", "DomainNet"),
        domains=DOMAINNET_DOMAINS,
        source="folder",
        how_to_get=_DOMAINNET_HOW,
    ),
    StandardSet(
        name="domainnet-10",
        description="DomainNet-10: the 10-class DomainNet subset of FedBN / FedPCL, 6 domains (official split)",
        reader=read_domainnet,
        dirs=("domainnet", "DomainNet"),
        keys=tuple(DOMAINNET10),
        classes=readable(DOMAINNET10),
        domains=DOMAINNET_DOMAINS,
        source="folder",
        how_to_get=_DOMAINNET_HOW + " The full DomainNet is read and filtered to " + ", ".join(DOMAINNET10) + ".",
    ),
)

for _row in TABLE:
    register(_row)
