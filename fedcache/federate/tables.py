"""The store's tables as a run reads them: each split's entries found, several backbones fused side by side (rows
matched by sample), and the checks that train and test come from one source and one encoder. numpy only: a
partition is made of these rows' labels, domains and ids without loading torch (`fedcache partition`);
``data.FederatedData`` holds them as tensors for the engines."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from fedcache.errors import EntryNotFoundError, StoreError, UnknownFeaturesError
from fedcache.store import lookup
from fedcache.store.entries import EntryInfo
from fedcache.store.feature_store import FeatureStore, FeatureTable, TableRows
from fedcache.store.keys import canonical_json
from fedcache.store.tables import closed_on_error
from fedcache.wording import did_you_mean, named

SPLITS = ("train", "test")
_ID_BITS = 40  # sample ids stay below 2**40; the domain index goes above them


def sample_keys(table: FeatureTable | TableRows) -> np.ndarray:
    """One int64 per row identifying the sample across backbones: (domain, id)."""
    return (table.domains.astype(np.int64) << _ID_BITS) | table.ids


def load_splits(store: FeatureStore, dataset: str, backbones: list[str]) -> tuple[FeatureTable, FeatureTable]:
    """The fused (train, test) tables, their entries found while no import writes the pair
    (``FeatureStore.split_rows``)."""
    rows = split_rows(store, dataset, backbones)
    with closed_on_error(*(p for s in SPLITS for p in rows[s])):
        return tuple(load_fused(store, dataset, backbones, s, parts=rows[s]) for s in SPLITS)


def load_split_rows(store: FeatureStore, dataset: str, backbones: list[str]) -> tuple[TableRows, TableRows]:
    """:func:`load_splits` without the features: the fused (train, test) rows (``fused_rows``), for what needs only
    the labels, domains and ids of a table (a partition). The features are not read; reading them checks them."""
    rows = split_rows(store, dataset, backbones)
    with closed_on_error(*(p for s in SPLITS for p in rows[s])):
        return tuple(fused_rows(dataset, backbones, s, rows[s]) for s in SPLITS)


def split_rows(store: FeatureStore, dataset: str, backbones: list[str]) -> dict[str, list[TableRows]]:
    """``store.split_rows`` of the train and test splits. A dataset or backbone the store has never held is advised
    to be extracted only where fedcache can extract it: `-d digits5` was told to `fedcache extract --dataset
    digits5`, a dataset that does not exist."""
    try:
        return store.split_rows(dataset, SPLITS, backbones)
    except EntryNotFoundError as exc:
        raise unextractable(exc) or exc


def unextractable(exc: EntryNotFoundError) -> UnknownFeaturesError | None:
    """``exc`` said again for a name no registry of extract knows (unknown, or embeddings of one's own); None where
    the name can be extracted."""
    from fedcache.extract.backbones import BACKBONES
    from fedcache.extract.datasets import DATASETS

    if exc.missing is None:
        return None
    kind, name = exc.missing
    registry = {"dataset": DATASETS, "backbone": BACKBONES}[kind]
    if name in registry or name.partition(":")[0] in registry.prefixes():
        return None
    near = did_you_mean(name, registry.names(), n=3, cutoff=0.5)  # as Registry's own message picks them
    listing = "`fedcache datasets`" if kind == "dataset" else "`fedcache backbones`"
    return UnknownFeaturesError(f"{exc.found}; nor can fedcache extract them: it knows no {kind} {name!r}"
                              f"{near}; {listing} lists those it knows, and "
                              "`fedcache store import` adds embeddings of your own", exc.missing, exc.found)


def load_fused(store: FeatureStore, dataset: str, backbones: list[str], split: str, view: int = 0,
               alloc: Callable[[tuple[int, int]], np.ndarray] | None = None,
               parts: list[TableRows] | None = None) -> FeatureTable:
    """The features of several backbones side by side (FedPCL's fused encoder), aligned by sample.

    Each backbone's features are read straight into its columns of one (N, D1 + D2 + ...) float32 array,
    so the features are in memory once; ``alloc(shape)`` gives that array (default ``np.empty``; a grid
    passes a memory-mapped file). ``parts``: the backbones' rows, found already (``FeatureStore.split_rows``)."""
    parts = parts or [store.rows(dataset, split, b, view) for b in backbones]
    first = parts[0]
    if len(parts) == 1 and alloc is None:
        return first.table(store.features(first))
    with closed_on_error(*parts):
        keys = sample_keys(first)
        out = (alloc or (lambda shape: np.empty(shape, np.float32)))((len(first), sum(p.dim for p in parts)))
        col = 0
        for b, p in zip(backbones, parts):
            at = None if p is first else _align(first, p, keys, b, backbones[0], dataset, split)
            store.fill(p, out[:, col:col + p.dim], at)
            col += p.dim
    return first.table(out, random_weights=any(p.random_weights for p in parts),
                       entry_ids=sum((p.entry_ids for p in parts), ()))


def fused_rows(dataset: str, backbones: list[str], split: str, parts: list[TableRows]) -> TableRows:
    """What :func:`load_fused` of ``parts`` (each backbone's rows) returns but its features: the first backbone's
    rows (labels, ids, domains, read and checked), each other backbone's matched to them and checked as
    ``load_fused`` checks them, the width of the fused features. The entries' files are closed unread."""
    first = parts[0]
    try:
        keys = sample_keys(first)
        for b, p in zip(backbones[1:], parts[1:]):
            _align(first, p, keys, b, backbones[0], dataset, split)
    finally:
        for p in parts:
            p.close()
    return dataclasses.replace(first, random_weights=any(p.random_weights for p in parts),
                               entry_ids=sum((p.entry_ids for p in parts), ()), dim=sum(p.dim for p in parts))


def _align(first: TableRows, p: TableRows, keys: np.ndarray, backbone: str, first_backbone: str, dataset: str,
           split: str) -> np.ndarray | None:
    """``_destinations`` of a backbone's rows, after checking it holds the first's domains and classes."""
    where = f"the {split} features of {dataset} for {backbone}", f"those of {first_backbone}"
    at = _destinations(keys, keys_as_first(first, p, where), backbone, dataset, split)
    check_labels(first, p, at, where)
    return at


def keys_as_first(first: TableRows | FeatureTable, p: TableRows | FeatureTable, where: tuple[str, str]) -> np.ndarray:
    """A backbone's sample keys with its domains numbered as the first backbone's: features imported per
    backbone may list the same domains in another order (a row's domain index alone would pair a photo with a
    sketch)."""
    if p.domain_names == first.domain_names:
        return sample_keys(p)
    if sorted(p.domain_names) != sorted(first.domain_names):
        raise StoreError(f"{where[0]} have the domains {list(p.domain_names)} but {where[1]} have "
                         f"{list(first.domain_names)}: fused backbones need the same domains (import them under the same names)")
    renumber = np.array([first.domain_names.index(n) for n in p.domain_names], np.int64)
    return (renumber[p.domains] << _ID_BITS) | p.ids


def check_labels(first: TableRows, p: TableRows, at: np.ndarray | None, where: tuple[str, str]) -> None:
    """Every sample has one class whichever backbone's table says it (by class name): the fused table takes the
    first's labels."""
    if sorted(p.class_names) != sorted(first.class_names):
        raise StoreError(f"{where[0]} name the classes {list(p.class_names)[:8]} but {where[1]} "
                         f"{list(first.class_names)[:8]}: fused backbones need the same classes")
    renumber = np.array([first.class_names.index(n) for n in p.class_names], np.int64)
    mine = renumber[p.labels]
    if at is None:  # rows in the first's order
        differ = int(np.count_nonzero(mine != first.labels))
    else:  # a row the first lacks (at -1) has nothing to disagree with
        kept = at >= 0
        differ = int(np.count_nonzero(mine[kept] != first.labels[at[kept]]))
    if differ:
        raise StoreError(f"{differ} samples have another class in {where[0]} than in {where[1]}: fused backbones "
                         "must describe the same labelled samples")


def _destinations(want: np.ndarray, have: np.ndarray, backbone: str, dataset: str, split: str) -> np.ndarray | None:
    """Where each row of a backbone's table goes among the first backbone's rows (-1: nowhere); None when
    its rows are already in that order."""
    if len(have) == len(want) and np.array_equal(have, want):
        return None
    pos = row_positions(want, have, backbone, dataset, split)
    at = np.full(len(have), -1, np.int64)
    at[pos] = np.arange(len(want))
    return at


def load_views(store: FeatureStore, dataset: str, backbones: list[str], train: FeatureTable) -> np.ndarray | None:
    """The augmented training views (``extract --views K``) as (N, K, D), rows aligned with ``train``;
    None when the store has none. A view the store holds of some domains or fused backbones only is refused (what
    lacks it, and the extraction that completes it), not left out: a method then said it found fewer views, or
    none. So is an unfinished view (an `extract --views` interrupted or still running: ``IncompleteEntryError``,
    naming it and the command that finishes it), though the views before it are complete: a run on fewer views than
    were asked for would train on other data than the user's, without a word."""
    views, v = [], 1
    while True:
        try:
            table = load_fused(store, dataset, backbones, "train", v, parts=_view_rows(store, dataset, backbones, v))
        except EntryNotFoundError:
            check_whole_view(store, dataset, backbones, v)
            break
        views.append(table.features[row_positions(sample_keys(train), sample_keys(table), f"view {v}", dataset, "train")])
        v += 1
    return np.stack(views, 1) if views else None


def _view_rows(store: FeatureStore, dataset: str, backbones: list[str], view: int) -> list[TableRows]:
    """Each backbone's rows of training view ``view``, its entries checked to be made alike
    (:func:`check_views_alike`) before any is opened."""
    found = {b: store.table_entries(dataset, "train", b, view) for b in backbones}
    check_views_alike(store, found)
    parts: list[TableRows] = []
    for b in backbones:
        with closed_on_error(*parts):
            parts.append(store.entry_rows(found[b]))
    return parts


def check_views_alike(store: FeatureStore, found: dict[str, list[EntryInfo]]) -> None:
    """Raise where a domain's augmented view (``found``: each fused backbone's entries of it) was made with another
    recipe or seed for one backbone than for the first (``extract --views K --view-seed S`` of one of them): fused
    side by side, a row would join two different augmentations of its image. Names both, and the extraction that
    makes the view for the other backbone as for the first."""
    (_, first), *others = found.items()
    made = {e.key["domain"]: e for e in first}
    for e in (e for _, entries in others for e in entries):
        have = made.get(e.key["domain"])
        if have is not None and lookup.view_differences([have, e]):
            raise lookup.views_differ(store.path, store.entries(), have, e)


def check_whole_view(store: FeatureStore, dataset: str, backbones: list[str], view: int) -> None:
    """Raise where a backbone holds training view ``view`` of some domains only (``extract --views K --domains``),
    or holds it unfinished (an `extract --views` interrupted or still running, no domain of it complete yet): the
    domains that lack it, or the extraction that completes it (``FeatureStore.table_entries``). Or where a fused
    backbone holds none of the view another holds (``extract --views K`` run for one of them): the backbone that lacks
    it, and the extraction that makes it for it."""
    infos = store.entries()
    of_view = [e for e in infos if e.slot[:2] == (dataset, "train") and e.slot[4] == view]
    held = {e.slot[3]: e for e in of_view if not e.damaged}
    for b in (b for b in backbones if b in held):
        store.table_entries(dataset, "train", b, view)
    lacking = [b for b in backbones if b not in {e.slot[3] for e in of_view}]
    have = [held[b] for b in backbones if b in held]
    if have and lacking:
        like = store.table_entries(dataset, "train", lacking[0])[0]  # its features, as the views are to be made
        raise lookup.view_lacking(store.path, infos, have[0], like)


def row_positions(want: np.ndarray, have: np.ndarray, backbone: str, dataset: str, split: str) -> np.ndarray:
    order = np.argsort(have)
    pos = np.searchsorted(have, want, sorter=order)
    pos = np.clip(pos, 0, len(have) - 1)
    found = have[order[pos]] == want
    if not found.all():
        raise StoreError(
            f"{int((~found).sum())} {split} samples of {dataset} have features for the first backbone but not for "
            f"{backbone} (different bad images skipped?); re-extract so every backbone covers the same images"
        )
    return order[pos]


def check_same_source(train: FeatureTable | TableRows, test: FeatureTable | TableRows) -> None:
    """Train and test rows are scored by one model, so they need one width, one class list and one domain
    list. Each split's entries are checked when written, but two `store import`s of one dataset (one per
    split) can disagree: a model trained on 3 classes scored on test labels of 7 would be silently wrong."""
    where = f"entries {', '.join(train.entry_ids[:2])} (train) and {', '.join(test.entry_ids[:2])} (test)"
    fix = ("re-import (or re-extract) both splits from one encoder with the same 'classes' and 'domains', "
           f"or give the mismatched split another {named('--dataset', 'dataset')} name")
    if train.dim != test.dim:
        raise StoreError(f"the training features are {train.dim} wide but the test features "
                         f"{test.dim} ({where}): they come from different encoders; {fix}")
    for what, a, b in (("classes", train.class_names, test.class_names), ("domains", train.domain_names, test.domain_names)):
        if tuple(a) != tuple(b):
            raise StoreError(f"the training and test splits name different {what} (train: {list(a)[:8]}, test: "
                             f"{list(b)[:8]}; {where}); {fix}")
    for split, t in (("training", train), ("test", test)):
        if len(t) and (t.labels.min() < 0 or t.labels.max() >= len(t.class_names)):
            raise StoreError(f"the {split} labels run from {t.labels.min()} to {t.labels.max()} but the dataset names "
                             f"{len(t.class_names)} classes ({where}); {fix}")


def check_same_encoder(store: FeatureStore, train: FeatureTable | TableRows, test: FeatureTable | TableRows) -> None:
    """Train and test features of each backbone must come out of the same weights and preprocessing. Each split's
    domains are checked when read, the two splits never were: `extract --splits test --image-size 32` after a
    64-pixel extraction trained on one encoder's features and scored on another's (74% fell to 25%, silently).
    Imported features are compared when each came from a file of both splits (an import stopped between them
    left one file's training rows beside another's test rows); a file of one split may replace that split on
    purpose. Image noise is train-only."""
    infos = {split: [store.info(e) for e in t.entry_ids] for split, t in (("train", train), ("test", test))}
    for backbone in dict.fromkeys(i.key["backbone"] for i in infos["train"]):
        mine = {split: [i for i in found if i.key["backbone"] == backbone] for split, found in infos.items()}
        both = mine["train"] + mine["test"]
        if not mine["test"] or not _differ(mine["train"], mine["test"]):
            continue
        if any(_imported(i) for i in both):
            if all({"train", "test"} <= set(i.attrs.get("file_splits", ())) for i in both):
                raise StoreError(f"the training and test features of {backbone} come from different imported files "
                                 f"(entries {mine['train'][0].entry_id} (train) and {mine['test'][0].entry_id} (test)), "
                                 "though each file held both splits; import the one you mean again, whole")
            continue
        raise StoreError(
            f"the training and test features of {backbone} were extracted with different weights or preprocessing "
            f"(entries {mine['train'][0].entry_id} (train) and {mine['test'][0].entry_id} (test)); re-run the "
            "extraction of both splits with the same "
            + named("--weights, --image-size and --precision (`fedcache extract ... --splits train,test`)",
                    "weights, image_size and precision (fedcache.extract_features(..., splits=['train', 'test']))"))


def _imported(info) -> bool:
    return bool((info.key.get("preprocess") or {}).get("imported"))


# Not compared: noise is train-only by design, and the resize backend follows how a split's images are held
# (same-size arrays are resized per batch, other images one by one), which a dataset's two splits may differ in.
_SPLIT_OWN = ("noise", "backend")


def _differ(train: list, test: list) -> bool:
    def made_by(infos: list) -> set:
        return {(i.key["weights_hash"], canonical_json({n: v for n, v in (i.key.get("preprocess") or {}).items()
                                                        if n not in _SPLIT_OWN})) for i in infos}
    return made_by(train) != made_by(test)
