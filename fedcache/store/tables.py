"""What reading the store hands out: a table of features (``FeatureTable``) and, before its features are read,
its rows (``TableRows``), made of each entry's part (``EntryRows``)."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from fedcache.errors import StoreError
from fedcache.store import lookup
from fedcache.store.entries import EntryInfo, newest
from fedcache.store.keys import canonical_json
from fedcache.store.reading import EntryReader


@dataclass
class FeatureTable:
    """Features of one (dataset, split, backbone, view), all requested domains together."""

    features: np.ndarray  # (N, D) float32
    labels: np.ndarray  # (N,) int64
    ids: np.ndarray  # (N,) int64, unique within a domain
    domains: np.ndarray  # (N,) int16 index into domain_names
    domain_names: tuple[str, ...]
    class_names: tuple[str, ...]
    random_weights: bool
    entry_ids: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def dim(self) -> int:
        """The width of a row's features (as ``TableRows.dim``, which has no features to ask)."""
        return int(self.features.shape[1])


@dataclass
class EntryRows:
    """One entry's part of a table: its reader, which of its rows are valid, where they start in the table."""

    reader: EntryReader
    valid: np.ndarray
    offset: int
    labels: np.ndarray
    ids: np.ndarray
    domains: np.ndarray

    def close(self) -> None:
        self.reader.close()


class _Closable(Protocol):
    def close(self) -> None: ...


@contextlib.contextmanager
def closed_on_error(*opened: _Closable) -> Iterator[None]:
    """Close ``opened`` (entries' readers, rows) where the block raises (a damaged or missing entry): their files
    stayed open for as long as anything held the exception, a traceback kept by a caller or a log."""
    try:
        yield
    except BaseException:
        for o in opened:
            o.close()
        raise


@dataclass
class TableRows:
    """A table before its features are read (``FeatureStore.rows``): everything but them, checked."""

    parts: list[EntryRows]
    domain_names: tuple[str, ...]
    class_names: tuple[str, ...]
    random_weights: bool
    entry_ids: tuple[str, ...]
    dim: int

    def __len__(self) -> int:
        return sum(len(p.labels) for p in self.parts)

    def close(self) -> None:
        """Close the entries' files (reading the features closes them too): the table is not read after all."""
        for p in self.parts:
            p.reader.close()

    def _cat(self, name: str, dtype) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in self.parts]) if self.parts else np.zeros(0, dtype)

    @functools.cached_property
    def labels(self) -> np.ndarray:
        return self._cat("labels", np.int64)

    @functools.cached_property
    def ids(self) -> np.ndarray:
        return self._cat("ids", np.int64)

    @functools.cached_property
    def domains(self) -> np.ndarray:
        return self._cat("domains", np.int16)

    def table(self, features: np.ndarray, **replace) -> FeatureTable:
        fields = dict(features=features, labels=self.labels, ids=self.ids, domains=self.domains,
                      domain_names=self.domain_names, class_names=self.class_names,
                      random_weights=self.random_weights, entry_ids=self.entry_ids)
        return FeatureTable(**{**fields, **replace})



def _making(e: EntryInfo) -> dict:
    """What made an entry's features, by name: its weights (an import's: its file), dtype and preprocessing. Domains
    of one table must share it."""
    return {"weights": e.key["weights_hash"], "dtype": e.key["dtype"], **(e.key["preprocess"] or {})}


def check_consistent(entries: list[EntryInfo], path: Path) -> None:
    """Features of different domains are only comparable if made by the same weights and preprocessing, and an
    augmented view's by the same augmentation."""
    if len({canonical_json(_making(e)) for e in entries}) > 1:
        k, last = entries[0].key, newest(entries)
        # Made again as last asked for (the newest entry: its making, --dtype, --weights ...); imported features name
        # their file in weights_hash ("imported:<digest>"). An extraction's domains beside an older import's are
        # completed by the extraction.
        again = ("import the file again, whole (`fedcache store import FILE`)" if
                 str(last.key["weights_hash"]).startswith("imported:") else
                 f"re-run {lookup.made_as_said(path, last)}")
        raise StoreError(
            f"the domains of {k['dataset']}/{k['split']} for {k['backbone']} were made by different weights, preprocessing "
            f"or imported files ({_makings(entries)}){_differing(entries, last)}; {again} so that every domain is "
            "current"
        )
    if lookup.view_differences(entries):  # of one making, but other crops of some domains' images than of others
        raise lookup.views_mixed(path, entries)


def _differing(entries: list[EntryInfo], last: EntryInfo) -> str:
    """What the other makings differ in from the newest's, ": they differ in size: 48 in handwritten, 64 in svhn
    (the newest)": a refusal that named only the domains left the user to guess which option they had changed."""
    want, made = _making(last), {e.entry_id: _making(e) for e in entries}
    said = []
    for f in sorted({f for m in made.values() for f in m.keys() | want.keys() if m.get(f) != want.get(f)})[:3]:
        differ = [e for e in entries if made[e.entry_id].get(f) != want.get(f)]
        theirs = ", ".join(f"{_shown(made[e.entry_id].get(f))} in {e.key['domain']}" for e in differ[:3])
        said.append(f"{f}: {theirs}, {_shown(want.get(f))} in {last.key['domain']} (the newest)")
    return ": they differ in " + "; ".join(said) if said else ""


def _shown(value) -> str:
    return "none" if value is None else str(value)[:20]  # a hash (weights, an import's file) is told apart by its start


def _makings(entries: list[EntryInfo]) -> str:
    """Which domain came from which making, "a imported, b extracted": a mix refused names them, so the user knows
    which of their commands made which. Makings said alike (two imports, two extractions) add their entry's id."""
    groups: dict[str, list[EntryInfo]] = {}
    for e in entries:
        groups.setdefault(canonical_json(_making(e)), []).append(e)
    how = {g: "imported" if str(es[0].key["weights_hash"]).startswith("imported:") else "extracted"
           for g, es in groups.items()}
    alike = {h for h in how.values() if list(how.values()).count(h) > 1}
    return ", ".join(f"{','.join(e.key['domain'] for e in es)} {how[g]}"
                     + (f" ({','.join(e.entry_id for e in es)})" if how[g] in alike else "") for g, es in groups.items())
