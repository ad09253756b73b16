"""Resolving user-facing names into loaded datasets and backbones."""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from fedcache.errors import ConfigError
from fedcache.extract.backbones import BACKBONES, LOADERS, LoadedBackbone, LoadRequest
from fedcache.extract.backbones.base import seeded_init
from fedcache.extract.datasets import DATASETS, Dataset, DatasetOptions
from fedcache.wording import named

log = logging.getLogger(__name__)


def load_dataset(name: str, options: DatasetOptions) -> Dataset:
    return DATASETS.get(name).load(options)


def load_backbone(name: str, checkpoint: Path | None = None, random_init: bool = False) -> LoadedBackbone:
    """Load a backbone; ``random_init`` keeps its architecture but not its weights (benchmarks, tests)."""
    spec = BACKBONES.get(name)
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            raise ConfigError(f"{named(f'--weights {name}={checkpoint}', f'weights={{{name!r}: {str(checkpoint)!r}}}')}: "
                              "no such file")
        spec = replace(spec, weights=f"checkpoint {Path(checkpoint).name}", random_weights=False)
    elif random_init:
        spec = replace(spec, weights="random", random_weights=True)
    # Seeded and forked: random weights are the same on every load (their hash keys the store), and building a
    # model draws from torch's generator, which is the caller's, not ours to move.
    with seeded_init(0):
        loaded = LOADERS.get(spec.source)(LoadRequest(spec, Path(checkpoint) if checkpoint else None))
    loaded.image_encoder.eval().requires_grad_(False)
    if not loaded.embed_dim:
        loaded.embed_dim = spec.embed_dim
    return loaded

