"""Class-text embeddings of CLIP-style backbones, as the methods that need a text tower see them.

The store keeps one (T, C, D) array per template set, written at extraction. Methods get one
(C, D) anchor per class: the L2-normalised mean of the L2-normalised template embeddings (CLIP's
prompt ensembling). ``train.load_data`` attaches them to ``FederatedData.info``:
``info["text"]`` (the ``single`` set when there is one) and ``info["text_sets"]`` (every set); where a backbone with a
text tower has none stored, ``info["text_hint"]``: why, and the extraction that stores them; where the backbones have no
text at all, ``info["text_extract"]``: the extraction of a backbone with a text tower for the run's dataset and store.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.errors import ConfigError, EntryNotFoundError
from fedcache.extract.templates import TEMPLATE_SETS, text_key
from fedcache.federate.data import FederatedData
from fedcache.store import lookup
from fedcache.store.entries import SHARD_ATTR
from fedcache.store.feature_store import FeatureStore, FeatureTable
from fedcache.wording import Placeholder, named, pasted

SOURCE = Placeholder("STORE")  # a shard's hint: the store the shards were cut from
DATASET = Placeholder("DATASET")  # a dataset fedcache reads, where the run's is not one
TEXT_BACKBONE = "clip-rn50"  # the backbone with a text tower a run without text is pointed to
DEFAULT_SET = "single"  # "a photo of a {}.": FST-CBDG's (Algorithm 1) and PromptFL's template


def text_anchors(embeddings: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(T, C, D) per-template embeddings -> (C, D) unit anchors."""
    e = embeddings.float() if isinstance(embeddings, torch.Tensor) else torch.as_tensor(np.asarray(embeddings), dtype=torch.float32)
    if e.dim() == 2:
        e = e.unsqueeze(0)
    return F.normalize(F.normalize(e, dim=-1).mean(0), dim=-1)


def load_text_anchors(store: FeatureStore, backbone: str, classes, template_set: str = DEFAULT_SET,
                      weights_hash: str | None = None) -> torch.Tensor:
    """The (C, D) anchors of ``backbone``'s text tower for ``classes`` (of the weights ``weights_hash`` where
    stored); EntryNotFoundError if none were stored. A text entry this user may not read is said instead only where it
    may be the one an extraction of those weights wrote (another backbone's is not what a run lacks)."""
    wanted = [text_key(backbone, weights_hash, classes, template_set).entry_id] if weights_hash else None
    return text_anchors(store.read_text(backbone, list(classes), template_set, weights_hash, wanted))


def load_text_sets(store: FeatureStore, backbone: str, classes, weights_hash: str | None = None) -> dict[str, torch.Tensor]:
    """Every template set stored for ``backbone`` and ``classes`` ({} for a backbone without a text tower)."""
    sets = {}
    for name in TEMPLATE_SETS:
        try:
            sets[name] = load_text_anchors(store, backbone, classes, name, weights_hash)
        except EntryNotFoundError:
            continue
    return sets


def attach_text(data: FederatedData, store: FeatureStore, backbones: list[str], train: FeatureTable | None = None) -> FederatedData:
    """Put the text anchors into ``data.info`` when exactly one backbone is used and it has a text tower.

    Fused features (several backbones) get none: the text tower lives in one backbone's space only. Without text, the
    extraction of a backbone with a text tower (``info["text_extract"]``), for a method that needs text to name."""
    if len(backbones) == 1:
        # The text of the weights that made ``train``'s features: the store may hold another extraction's beside them.
        weights = store.info(train.entry_ids[0]).key.get("weights_hash") if train is not None and train.entry_ids else None
        sets = load_text_sets(store, backbones[0], data.class_names, weights)
        if sets:
            data.info["text_sets"] = sets
            data.info["text"] = sets.get(DEFAULT_SET, next(iter(sets.values())))
            return data
        if hint := _text_hint(store, backbones[0], train):
            data.info["text_hint"] = hint
            return data
    data.info["text_extract"] = _tower_extraction(store, train)
    return data


def _tower_extraction(store: FeatureStore, train: FeatureTable | None) -> str:
    """The extraction of a backbone with a text tower for ``train``'s dataset (as it was made: its --name, --domains)
    into this store, in backticks (without an entry to say it of, of a DATASET). A shard's: into the store it was cut
    from."""
    shard = SHARD_ATTR in store.root.attrs
    path = SOURCE if shard else store.path
    known = train is not None and bool(train.entry_ids)
    said = lookup.backbone_said(path, store.info(train.entry_ids[0]), TEXT_BACKBONE) if known else _extraction(path)
    return said + (f", {SOURCE} being the store the shards were cut from, then cut the shards again (`fedcache shard`)"
                   if shard else "")


def _text_hint(store: FeatureStore, backbone: str, train: FeatureTable | None) -> str:
    """Why a backbone with a text tower has no class-text embeddings stored for ``train``'s classes, and the
    extraction that stores them ("" for a backbone without one). Extracted features (their text entries removed): the
    extraction that made them, which finds them complete and stores the text. A shard's (which holds the text its
    store held when it was cut): that extraction into the store it was cut from, then the sharding again."""
    from fedcache.extract.backbones import has_text_tower  # the registry only: no model library is imported

    # Every fedavg run on a backbone without text comes here: nothing on this path builds a model (has_text_tower).
    if train is None or not train.entry_ids:
        return ""
    first = store.info(train.entry_ids[0])
    if not has_text_tower(backbone, first.attrs.get("backbone_source")):
        return ""
    infos = [first] + [store.info(e) for e in train.entry_ids[1:]]
    shard = SHARD_ATTR in store.root.attrs
    path = SOURCE if shard else store.path  # a shard does not record its store's path: the user knows it
    none = (f"the {'shard' if shard else 'store'} holds no class-text embeddings of {backbone} for the classes of "
            f"{infos[0].key['dataset']}")
    if (infos[0].key.get("preprocess") or {}).get("imported"):
        hint = f"{none}: its features were imported, and an import stores none; {_imported_hint(path, backbone, infos[0])}"
    else:
        hint = (f"{none} (removed, or never extracted); extract them with {lookup.extract_said(path, infos)}, "
                "which finds the features complete and stores the text")
    return hint + (f", {SOURCE} being the store the shards were cut from; then cut the shards again (`fedcache shard`)"
                   if shard else "")


def _extraction(path: Path | Placeholder = SOURCE) -> str:
    """The extraction of a backbone with a text tower into the store at ``path``, of a DATASET, in backticks."""
    return f"`fedcache extract {pasted('--store', path, '--dataset', DATASET, '--backbones', TEXT_BACKBONE)}`"


def _imported_hint(path: Path | Placeholder, backbone: str, entry) -> str:
    """An extraction that stores ``backbone``'s text for an imported entry's classes: of a dataset of those classes,
    under another --name (its features would otherwise be current in the imported ones' place)."""
    # Imported here: the datasets' registry costs a run about 0.3 s (PIL, scipy), a Flower ClientApp each message
    from fedcache.extract.datasets import DATASETS

    dataset = entry.key["dataset"]
    known = dataset in DATASETS
    command = (f"fedcache extract {pasted('--store', path, '--dataset', dataset if known else DATASET)} "
               f"{pasted('--name', f'{dataset}-text', '--backbones', backbone)} --splits test")
    return (f"extract them with `{command}`" + ("" if known else ", DATASET one that fedcache reads with these classes")
            + " (--name keeps the features it extracts apart from the imported ones)")


def text_from_info(data: FederatedData, method: str, template_set: str | None = None,
                   without: dict[str, str] | None = None) -> torch.Tensor:
    """The (C, D) unit text anchors a method asked for, or a ConfigError that says how to get them. ``without``: the
    method's settings with which it runs without text (fst-cbdg's anchors=prototypes), said as the other way on."""
    sets = data.info.get("text_sets") or {}
    if template_set is not None and sets:
        if template_set not in sets:
            raise ConfigError(f"{method}: no '{template_set}' text embeddings were extracted (have: {', '.join(sets)})")
        anchors = sets[template_set]
    elif data.info.get("text") is not None:
        anchors = data.info["text"]
    elif data.info.get("text_hint"):  # a backbone with a text tower, whose embeddings the store lacks
        raise ConfigError(f"{method} needs class-text embeddings: {data.info['text_hint']}")
    else:
        extraction = data.info.get("text_extract") or _extraction()  # features of no store: its user names it
        raise ConfigError(
            f"{method} needs a backbone with a text tower, e.g. {TEXT_BACKBONE}; extract it with {extraction} "
            "(features and class-text embeddings are stored together) and train on that one backbone (fused "
            f"backbones carry no text){_without_text(method, without)}"
        )
    anchors = text_anchors(anchors)
    if anchors.shape != (data.n_classes, data.dim):
        raise ConfigError(f"{method}: text embeddings are {tuple(anchors.shape)} but the features need "
                          f"({data.n_classes}, {data.dim}); use the backbone the text was extracted with")
    return anchors


def _without_text(method: str, without: dict[str, str] | None) -> str:
    """"; or run it without text: --set anchors=prototypes" (in an API call ``settings={...}``), or "" for a method that
    needs text whatever its settings."""
    if not without:
        return ""
    flags = " ".join(f"--set {k}={v}" for k, v in without.items())
    return f"; or run {method} without text: {named(flags, f'settings={without!r}')}"
