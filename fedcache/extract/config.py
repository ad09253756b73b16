"""The extract stage's settings: ``ExtractConfig`` and the ``DatasetOptions`` every dataset loader reads.

Each field is declared once, with its type, range, default and, as an option, its flag and help (``opt``);
`fedcache extract`'s options and ``fedcache.extract_features``' keywords are derived from these fields
(``options()``), and ``extract_config`` parses and checks their values, text or Python, the same way for both.
A message names a setting by its flag (``--batch-size=0: must be >= 1``), in a Python call by its keyword
(``batch_size=0``): extract writes no config.json whose keys a message could name. No torch here: `fedcache extract
--help` reads this module.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fedcache.config import (Checked, Choices, Fraction, NonNegative, NonNegativeInt, Option, PositiveInt, Range, Reader,
                             check_fields, opt, options_of)
from fedcache.errors import ConfigError, UnknownOptionError
from fedcache.paths import STORE_HELP, check_name, default_store
from fedcache.store.parts import Part


def _recipes() -> tuple[str, ...]:
    from fedcache.extract.transforms import AUGMENTATIONS  # here: it imports torch, which --help must not wait for

    return tuple(AUGMENTATIONS.names())


def _noise_kinds() -> tuple[str, ...]:
    from fedcache.noise import KINDS  # here: it imports torch

    return KINDS


def parse_weights(items: str | list[str]) -> dict[str, Path]:
    """``--weights NAME=PATH`` items (the flag is repeatable) as NAME -> PATH; a NAME no backbone has is refused
    here, with the names close to it, not ignored."""
    from fedcache.extract.backbones import BACKBONES  # here: it imports torch

    out: dict[str, Path] = {}
    for item in [items] if isinstance(items, str) else items:
        name, sep, path = str(item).partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"expected NAME=PATH (e.g. resnet18-quickdraw=ckpt/quickdraw.pth), got {item!r}")
        BACKBONES.get(name)
        out[name] = Path(path).expanduser()
    return out


@dataclass(frozen=True)
class DatasetOptions:
    """What the user may pass to any loader (most loaders use only some of it). Not checked when built: a loader
    called from Python checks what it reads; ``ExtractConfig`` checks every field, naming the flags."""

    data_root: Path | None = opt(None, help="Where the paper datasets live on disk.")
    path: Path | None = opt(None, help="Image folder root (for --dataset imagefolder).")
    download: bool = opt(False, help="Let torchvision download the dataset into --data-root.")
    seed: NonNegativeInt = opt(0, help="Dataset seed (embedded datasets, seeded splits).")
    test_fraction: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = opt(
        0.2, help="Share of each class a seeded split holds out for testing (imagefolder without train/ and test/).")


NoiseKind = Annotated[str, Choices(_noise_kinds)]


@dataclass
class ExtractConfig(Checked):
    # The help texts name the recipes and noise kinds as text, so that reading them imports no torch; a test keeps
    # them equal to the registries.
    dataset: str = opt(short="-d", help="Dataset name (see `fedcache datasets`).")
    backbones: tuple[str, ...] = opt(short="-b", aliases=("--backbone",),
                                     help="Comma-separated backbone names (see `fedcache backbones`).")
    store: Path = opt(factory=default_store, help=STORE_HELP)
    dataset_options: DatasetOptions = field(default_factory=DatasetOptions)  # its fields are options of their own
    splits: tuple[str, ...] = opt(("train", "test"), help="Splits to extract (train, test).")
    domains: tuple[str, ...] | None = opt(None, help="Only these domains (comma-separated).")
    device: str = opt("auto", help="auto (CUDA, else MPS, else the CPU), cpu, cuda, cuda:N or mps.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = opt(
        "auto", help="auto (bf16/fp16 on CUDA, fp32 on CPU and MPS), fp32, bf16, fp16 (not bf16 on MPS).")
    image_size: PositiveInt | None = opt(None, help="Input size in pixels, square (default: the dataset's, else the backbone's).")
    views: NonNegativeInt = opt(0, help="Also store K augmented views per training image.")
    view_recipe: Annotated[str, Choices(_recipes)] = opt(
        "simclr", help="Augmentation recipe for --views (simclr, simclr-noflip).")
    view_seed: NonNegativeInt = opt(0, help="Seed of the augmented views.")
    dtype: Literal["float16", "float32"] = opt("float16", help="Storage dtype: float16 or float32.")
    batch_size: PositiveInt = opt(64, help="Images per forward pass.")
    workers: NonNegativeInt | None = opt(None, help="DataLoader workers (default: chosen for the device).")
    weights: Annotated[dict[str, Path], Reader(parse_weights)] = opt(
        factory=dict, repeatable=True, help="NAME=PATH: load this backbone from a checkpoint (repeatable).")
    part: Annotated[Part, Reader(Part.parse)] = opt(
        factory=Part, help="i/n: extract the i-th of n disjoint slices (several GPUs or machines).")
    skip_bad_images: bool = opt(False, help="Skip undecodable images (counted, listed next to the entry).")
    wait: NonNegative = opt(0.0, help="Seconds to wait for another writer of the same entry.")
    random_init: bool = opt(False, help="Random weights (timing only; results are marked random).")
    chunk_rows: PositiveInt | None = opt(
        None, help="Rows per stored chunk, a multiple of --batch-size (default: about 4 MB of features). A new "
                   "entry's only: one begun keeps its own.")
    name: str | None = opt(None, help="Name of the dataset in the store (give each image folder its own).")
    image_noise: tuple[NoiseKind, NonNegative, Fraction] | None = opt(
        None, help="KIND,SCALE,P: training images only, encoded as (1-P)*x + noise of KIND (gaussian|laplace) and "
                   "SCALE (the std, or laplace's scale): FedPCL Table 15.")

    def __post_init__(self) -> None:
        # Python callers give lists where the command line gives comma lists (backbones=["a"]): both are tuples here.
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), list):
                setattr(self, f.name, tuple(getattr(self, f.name)))
        super().__post_init__()
        check_fields(self.dataset_options, lambda name: next(o.flag for o in options_of(DatasetOptions) if o.field == name))
        if not self.backbones:
            raise ConfigError(f"{self.label('backbones')} needs at least one name; see `fedcache backbones`")
        if self.name is not None:
            check_name(self.name, self.label("name"))  # the dataset's name in the store: one of its folders
        if self.chunk_rows is not None and self.chunk_rows % self.batch_size:  # before any work, naming the flags
            raise ConfigError(f"{self.label('chunk_rows')}={self.chunk_rows}: must be a multiple of "
                              f"{self.label('batch_size')} ({self.batch_size})")


def options() -> list[Option]:
    """extract's options in the order `--help` lists them: DatasetOptions' in the place of ``dataset_options``."""
    names = [f.name for f in dataclasses.fields(ExtractConfig)]
    own = options_of(ExtractConfig)
    before = [o for o in own if names.index(o.field) < names.index("dataset_options")]
    return before + options_of(DatasetOptions) + own[len(before):]


def extract_config(**given: Any) -> ExtractConfig:
    """An ExtractConfig from option names (``dataset``, ``backbones``, ``batch_size``, ``data_root``, ...), each
    value text (a flag's) or Python, parsed and checked against its field."""
    known = {o.name: o for o in options()}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise UnknownOptionError(unknown, known)
    missing = [o.flag for o in known.values() if o.required and given.get(o.name) is None]
    if missing:
        raise ConfigError(f"extract needs {' and '.join(missing)}")
    values = {known[name].field: known[name].parse(value) for name, value in given.items()}
    dataset = {f.name: values.pop(f.name) for f in dataclasses.fields(DatasetOptions) if f.name in values}
    return ExtractConfig(dataset_options=DatasetOptions(**dataset), **values)
