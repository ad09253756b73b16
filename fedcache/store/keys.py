"""Entry keys: everything that changes the bytes of a cached feature array.

Two extractions share an entry only if their keys are equal; the entry id is a hash of
the canonical JSON of the key, so a changed weight, preprocessing step, augmentation
seed or extractor version always lands in a new entry and a stale one is never reused.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

# Bump whenever the extraction code changes the bytes it writes for the same inputs.
EXTRACTOR_VERSION = 2  # 2: 16-bit greyscale images are scaled to 8 bits, no longer clipped


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(obj: object, n: int = 16) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]


# A shard's entry (fedcache/flower/shard.py) holds other rows than the entry it was cut from, so its key differs: its
# dataset fingerprint is the source's with this tag and the shard's name after it.
SHARD_TAG = "|shard:"


def source_fingerprint(fingerprint: str) -> str:
    """The fingerprint of the images an entry's features were extracted from, a shard's entry's too."""
    return fingerprint.split(SHARD_TAG, 1)[0]


def noisy_name(dataset: str, noise) -> str | None:
    """The store name of ``dataset`` extracted with ``--image-noise KIND,SCALE,P`` (``noise``; None: not noisy):
    noisy features get their own dataset name, so they never replace the clean ones in a slot."""
    if not noise:
        return None
    kind, scale, p = noise
    return f"{dataset}-noise-{kind}-{float(scale):g}-{float(p):g}"


@dataclass(frozen=True)
class EntryKey:
    dataset: str
    dataset_fingerprint: str
    split: str
    domain: str
    backbone: str
    weights_hash: str
    preprocess: dict = field(hash=False)
    view: int = 0  # 0: the plain view; k >= 1: the k-th augmented view
    augmentation: dict | None = field(default=None, hash=False)
    dtype: str = "float16"
    extractor_version: int = EXTRACTOR_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def entry_id(self) -> str:
        return short_hash(self.to_dict())

    @property
    def slot(self) -> tuple:
        """What a reader asks for; several entries may fill the same slot over time."""
        return (self.dataset, self.split, self.domain, self.backbone, self.view)

    def label(self) -> str:
        view = f" view {self.view}" if self.view else ""
        return f"{self.dataset}/{self.split}/{self.domain} {self.backbone}{view}"


@dataclass(frozen=True)
class TextKey:
    backbone: str
    weights_hash: str
    classes: tuple[str, ...]
    templates: tuple[str, ...]
    template_set: str
    extractor_version: int = EXTRACTOR_VERSION

    def to_dict(self) -> dict:
        d = asdict(self)
        d["classes"] = list(self.classes)
        d["templates"] = list(self.templates)
        return d

    @property
    def entry_id(self) -> str:
        return short_hash(self.to_dict())
