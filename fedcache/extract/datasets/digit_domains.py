"""The digit datasets torchvision lacks (MNIST-M, SynthDigits) and Digit-5, which joins five as domains.

Formats, as the datasets are commonly distributed:

* MNIST-M (Ganin et al.): ``mnist_m/mnist_m_{train,test}/*.png`` with
  ``mnist_m_{train,test}_labels.txt`` lines ``<file name> <digit>``.
* SynthDigits (Ganin & Lempitsky's "SynNumbers"): ``synth_{train,test}_32x32.mat`` holding
  ``X`` (32, 32, 3, N) uint8 and ``y`` (N, 1), the same layout as SVHN's .mat files.

Digit-5 reuses the single-dataset loaders, so every format is read in one place only.
"""
from __future__ import annotations

from pathlib import Path

from fedcache.errors import DataNotFoundError
from fedcache.extract.datasets import _formats as fmt
from fedcache.extract.datasets._common import (
    DIGITS,
    IN_A_FOLDER,
    Loaded,
    StandardSet,
    file_samples,
    need,
    read_list_file,
    register,
)
from fedcache.extract.datasets.base import (
    DATASETS,
    DEFAULT_DOMAIN,
    SPLITS,
    Dataset,
    DatasetOptions,
    DatasetSpec,
)

DIGIT5_DOMAINS = ("mnist", "mnist-m", "svhn", "synthdigits", "usps")


def read_mnist_m(base: Path, row: StandardSet, options: DatasetOptions) -> Loaded:
    splits = {}
    for split in SPLITS:
        images = need(base / f"mnist_m_{split}")
        paths, _, labels = read_list_file(base / f"mnist_m_{split}_labels.txt", images)
        splits[(split, DEFAULT_DOMAIN)] = file_samples(paths, labels)
    return Loaded(splits)


TABLE = (
    StandardSet(
        name="mnist-m",
        description="MNIST-M: MNIST digits blended over colour photo patches (59k train, 9k test)",
        reader=read_mnist_m,
        dirs=("mnist_m", "mnist-m", "MNIST-M", "mnistm"),
        classes=DIGITS,
        source="folder",
        how_to_get="get the MNIST-M archive (Ganin et al., 'Domain-Adversarial Training of Neural Networks'; "
        "commonly distributed as mnist_m.tar.gz) and extract it into --data-root, giving <data-root>/mnist_m/"
        "{mnist_m_train/, mnist_m_test/, mnist_m_train_labels.txt, mnist_m_test_labels.txt}.",
    ),
    StandardSet(
        name="synthdigits",
        description="SynthDigits (SynNumbers): synthetic 32x32 digits rendered from Windows fonts",
        reader=fmt.read_digits_mat,
        dirs=("SynthDigits", "synthdigits", "synth_digits"),
        classes=DIGITS,
        source="folder",
        params={"files": {"train": "synth_train_32x32.mat", "test": "synth_test_32x32.mat"}},
        how_to_get="get SynNumbers (Ganin & Lempitsky 2015, linked from http://yaroslav.ganin.net/) and put "
        "synth_train_32x32.mat and synth_test_32x32.mat in <data-root>/SynthDigits/.",
    ),
)

for _row in TABLE:
    register(_row)


def load_digit5(options: DatasetOptions) -> Dataset:
    splits = {}
    for domain in DIGIT5_DOMAINS:
        try:
            part = DATASETS.get(domain).load(options)
        except DataNotFoundError as exc:
            raise DataNotFoundError(f"digit5 reads five datasets, one per domain; {exc}") from exc
        for split in SPLITS:
            splits[(split, domain)] = part.samples(split, DEFAULT_DOMAIN)
    return Dataset(name="digit5", classes=DIGITS, domains=DIGIT5_DOMAINS, splits=splits)


DATASETS.add(
    "digit5",
    DatasetSpec(
        name="digit5",
        description="Digit-5: MNIST, MNIST-M, SVHN, SynthDigits and USPS as five domains of one dataset",
        source="folder",
        load=load_digit5,
        classes=DIGITS,
        domains=DIGIT5_DOMAINS,
        reads=IN_A_FOLDER,  # what its domains' loaders read (not asked of them: most register after this module)
        how_to_get="Needs all of " + ", ".join(DIGIT5_DOMAINS) + " under the same --data-root; "
        "`fedcache datasets NAME` shows how to get each (--download fetches mnist, svhn and usps).",
    ),
)
