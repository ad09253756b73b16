"""The Zarr v3 feature store: one group per entry, chunked along rows only.

Layout (see docs/store.md)::

    <store>/entries/<entry_id>/{features,labels,ids,valid,done,chunk_crc32}   + attrs (key, crc32, complete, ...)
    <store>/text/<entry_id>/embeddings                             + attrs (key, complete)
    <store>/.locks/                                                advisory write locks

An entry is readable only once its ``complete`` attribute is true; it is written last. Reading
checks every chunk against the checksums written with it as it reads it (fedcache/store/reading.py,
integrity.py): a damaged entry is named, never read as zeros, and never takes the rest of the store
down. Entries of format 2 keep each row array as one uncompressed file, which a table of one float32
entry memory-maps; format-1 entries (zstd, written before) are read through Zarr (docs/store.md).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import json
import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import zarr

from fedcache import disk
from fedcache.errors import (ConfigError, DamagedEntryError, DiskFullError, EntryNotFoundError, IncompleteEntryError,
                             StoreError)
from fedcache.paths import STORE_DENIED, denied_problem, is_denied, unreadable_store
from fedcache.store.integrity import CRC_ATTR, ROW_ARRAYS, crc
from fedcache.store.keys import TextKey, canonical_json
from fedcache.store.locks import exclusive_lock, shared_lock
from fedcache.store.reading import EntryReader, fill

log = logging.getLogger(__name__)

# 1: zstd-compressed chunks (Zarr's default codec), zlib CRC-32 checksums.
# 2: new entries uncompressed, CRC-32C checksums (docs/store.md says why); format-1 entries still read.
STORE_FORMAT = 2
ENTRY_FORMAT = STORE_FORMAT  # what new entries are written in
FORMAT_ATTR = "format"  # an entry's format; absent: 1
ENTRIES = "entries"
TEXT = "text"
REMOVING = ".removing"  # entries being deleted (``discard``), out of every reader's sight
SHARD_ATTR = "fedcache_shard"  # a root attribute: this store is one client's (or the server's) shard, `fedcache shard`
SLOT_FIELDS = ("dataset", "split", "domain", "backbone", "view")


@dataclass(frozen=True)
class EntryInfo:
    entry_id: str
    key: dict
    n_rows: int
    dim: int
    complete: bool
    completed_at: str | None
    attrs: dict
    damaged: str | None = None  # why its metadata cannot be read (then complete is False)

    @property
    def slot(self) -> tuple:
        k = self.key
        return tuple(k.get(f) for f in SLOT_FIELDS)

    def label(self) -> str:
        k = self.key
        if not k:
            return "key unreadable"
        return f"{k.get('dataset')}/{k.get('split')}/{k.get('domain')} {k.get('backbone')}"

    @property
    def random_weights(self) -> bool:
        return bool(self.attrs.get("random_weights", False))

    @property
    def format(self) -> int:
        return int(self.attrs.get(FORMAT_ATTR, 1))


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


@dataclass
class EntryRows:
    """One entry's part of a table: its reader, which of its rows are valid, where they start in the table."""

    reader: EntryReader
    valid: np.ndarray
    offset: int
    labels: np.ndarray
    ids: np.ndarray
    domains: np.ndarray


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


def _group(e: EntryInfo) -> tuple:
    """The slot without its domain: what a reader asks for (``find``)."""
    dataset, split, _, backbone, view = e.slot
    return dataset, split, backbone, view


def _named_by(newest: EntryInfo, e: EntryInfo) -> bool:
    names = newest.attrs.get("domains")
    return not isinstance(names, list) or e.slot[2] in names


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _check_consistent(entries: list[EntryInfo], path: Path) -> None:
    """Features of different domains are only comparable if made by the same weights and preprocessing."""
    made_by = {(e.key["weights_hash"], canonical_json(e.key["preprocess"]), e.key["dtype"]) for e in entries}
    if len(made_by) > 1:
        k = entries[0].key
        # Imported features name their file in weights_hash ("imported:<digest>"): two files' domains mixed.
        again = ("import the file again, whole (`fedcache store import FILE`)" if any(
            str(e.key["weights_hash"]).startswith("imported:") for e in entries) else
            f"re-run `fedcache extract --store {path} --dataset {k['dataset']} --backbones {k['backbone']}`")
        raise StoreError(
            f"the domains of {k['dataset']}/{k['split']} for {k['backbone']} were made by different weights, preprocessing "
            f"or imported files; {again} so that every domain is current"
        )


class FeatureStore:
    def __init__(self, path: str | Path, create: bool = True) -> None:
        self.path = Path(path)
        new = not self.path.exists()
        if new and not create:
            raise StoreError(f"no feature store at {self.path}; create one with `fedcache extract --store {self.path} ...`")
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path} is a file, not a feature store (a store is a folder); give the store's folder "
                             "as --store, or a new folder's path to create one")
        try:
            self.root = self._open_root(create)
        except DiskFullError:
            if new:  # half made, it is no store: the next command makes it again
                disk.discard([self.path])
            raise

    def _open_root(self, create: bool) -> zarr.Group:
        mode = "a" if create else "r+"
        try:
            root = zarr.open_group(store=str(self.path), mode=mode, zarr_format=3, use_consolidated=False)
        except Exception as exc:
            if disk.is_full(exc):
                raise disk.full_error(self.path / "zarr.json", "the feature store") from None
            if is_denied(exc):  # not "is not a fedcache feature store": it may well be one, or become one
                raise StoreError(self._denied(exc)) from None
            raise StoreError(f"{self.path} is not a fedcache feature store: {exc}") from exc
        fmt = root.attrs.get("fedcache_store")
        if fmt is None:
            if any(True for _ in root.members()) and ENTRIES not in root:
                raise StoreError(f"{self.path} is a Zarr group but not a fedcache feature store")
            with disk.on_full_disk(self.path / "zarr.json", "the feature store"):
                root.attrs.update({"fedcache_store": STORE_FORMAT})
        elif fmt > STORE_FORMAT:
            raise StoreError(f"{self.path} was written by a newer fedcache (store format {fmt}); upgrade fedcache")
        for name in (ENTRIES, TEXT):
            try:
                root.require_group(name)
            except Exception as exc:  # a damaged zarr.json of the group: json or Zarr errors
                meta = self.path / name / "zarr.json"
                if disk.is_full(exc):
                    raise disk.full_error(meta, "the feature store's metadata") from None
                if is_denied(exc):  # another user's unreadable group is no damage: deleting it would be wrong
                    raise StoreError(self._denied(exc)) from None
                raise StoreError(f"{self.path}: the metadata of its {name!r} group is damaged ({type(exc).__name__}: {exc}); "
                                 f"delete {meta} and fedcache writes it again") from None
        return root

    def _denied(self, exc: OSError) -> str:
        """Opening (or making) the store refused: a new one in a folder this user cannot write in, another user's
        store it cannot read, one on a read-only mount."""
        read, problem = denied_problem(exc)
        if read:
            return unreadable_store(self.path, problem)
        if (self.path / "zarr.json").exists():
            return f"cannot open the feature store {self.path} ({problem}); {STORE_DENIED}"
        return f"cannot make the feature store {self.path} ({problem}); give a --store (or FEDCACHE_STORE) in a folder you can write to"

    @property
    def locks_dir(self) -> Path:
        return self.path / ".locks"

    def lock(self, name: str, what: str, wait: float = 120.0, **advice: str):
        """An exclusive lock for writers of ``name`` (a context manager); others wait up to ``wait`` seconds."""
        return exclusive_lock(self.locks_dir / f"{name}.lock", what, wait=wait, **advice)

    @contextlib.contextmanager
    def between_imports(self, dataset: str, backbones: Iterable[str]) -> Iterator[None]:
        """No import under (dataset, backbone) writes meanwhile: an import writes its splits one after another,
        so a reader that found the new training split and then the old test split would train on one file and
        score on another. A running import is refused in one line naming it; imports wait for the block."""
        with contextlib.ExitStack() as held:
            for b in sorted(set(backbones)):
                held.enter_context(shared_lock(
                    self.locks_dir / f"{import_lock(dataset, b)}.lock", f"dataset {dataset!r}, backbone {b!r} of {self.path}",
                    advice="an import writes it: read it once the import has finished"))
            yield

    def bad_images_path(self, entry_id: str) -> Path:
        """The list of images an extraction skipped (outside the Zarr hierarchy, so Zarr ignores it)."""
        return self.path / "reports" / f"{entry_id}.bad-images.txt"

    # ---- listing -------------------------------------------------------------
    def entry_ids(self, kind: str = ENTRIES) -> list[str]:
        """Every entry directory, read from the file system: one whose metadata is damaged is still listed."""
        folder = self.path / kind
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []

    def entries(self) -> list[EntryInfo]:
        group = self.root[ENTRIES]
        infos = [self._info(eid, group) for eid in self.entry_ids()]
        return sorted(infos, key=lambda e: (tuple(str(x) for x in e.slot), e.completed_at or ""))

    def _info(self, entry_id: str, group: zarr.Group | None = None) -> EntryInfo:
        try:
            a = dict((group if group is not None else self.root[ENTRIES])[entry_id].attrs)
            key, n_rows, dim = a["key"], int(a["n_rows"]), int(a["dim"])
            if not isinstance(key, dict) or not set(SLOT_FIELDS) <= set(key):
                raise ValueError(f"its key is {key!r}")
        except Exception as exc:  # Zarr and json raise many types for a damaged zarr.json
            return EntryInfo(entry_id, self._salvaged_key(entry_id), 0, 0, False, None, {},
                             damaged=f"its metadata (zarr.json) cannot be read ({type(exc).__name__}: {exc})")
        return EntryInfo(entry_id, key, n_rows, dim, bool(a.get("complete", False)), a.get("completed_at"), a)

    def _salvaged_key(self, entry_id: str) -> dict:
        """The key kept beside the features (so a damaged entry still names its slot), or {}."""
        try:
            key = dict(zarr.open_array(store=str(self.path / ENTRIES / entry_id / "features"), mode="r").attrs["entry_key"])
            return key if set(SLOT_FIELDS) <= set(key) else {}
        except Exception:
            return {}

    def info(self, entry_id: str) -> EntryInfo:
        if not entry_id.strip() or "/" in entry_id:
            raise ConfigError(f"{entry_id!r} is not an entry id; list them with `fedcache store ls --store {self.path}`")
        ids = self.entry_ids()
        if entry_id not in ids:
            matches = [e for e in ids if e.startswith(entry_id)]
            if len(matches) != 1:
                many = f" (matches {len(matches)}: give more characters)" if matches else ""
                raise EntryNotFoundError(f"no entry {entry_id!r} in {self.path}{many}; list them with `fedcache store ls`")
            entry_id = matches[0]
        return self._info(entry_id)

    def chunks_done(self, info: EntryInfo) -> tuple[int, int] | None:
        """(done, total) chunks of a partial entry; (0, 0) before its flags were made (stopped, or still running,
        as it was created); None if they cannot be read."""
        try:
            group = self.root[ENTRIES][info.entry_id]
            if "done" not in group:
                return 0, 0
            flags = group["done"][:]
        except Exception:
            return None
        return int(flags.sum()), len(flags)

    def current(self, infos: Iterable[EntryInfo] | None = None) -> dict[tuple, EntryInfo]:
        """For each slot, the most recently completed entry (older ones are stale), while its domain is one of the
        domains the newest entry of its (dataset, split, backbone, view) names: importing a file of other domains
        under the same names supersedes the domains it lacks (they were read beside the new ones)."""
        best: dict[tuple, EntryInfo] = {}
        for e in infos if infos is not None else self.entries():
            if e.complete and (e.slot not in best or (e.completed_at or "") > (best[e.slot].completed_at or "")):
                best[e.slot] = e
        newest: dict[tuple, EntryInfo] = {}
        for e in best.values():
            group = _group(e)
            if group not in newest or (e.completed_at or "") > (newest[group].completed_at or ""):
                newest[group] = e
        return {slot: e for slot, e in best.items() if _named_by(newest[_group(e)], e)}

    def make_current(self, entry_id: str) -> bool:
        """Make a complete entry the one its slot reads, as a fresh write of it would; True if another had been.
        An import or extraction that finds its entry already complete asked for those features now: without this,
        importing file A, then B, then A again left B's features in every run."""
        infos = self.entries()
        mine = next(e for e in infos if e.entry_id == entry_id)
        if not mine.complete or mine.entry_id in {e.entry_id for e in self.current(infos).values()}:
            return False
        self.root[ENTRIES][entry_id].attrs.update({"completed_at": now_iso()})
        return True

    # ---- reading -------------------------------------------------------------
    def find(self, dataset: str, split: str, backbone: str, view: int = 0, domains: Iterable[str] | None = None) -> list[EntryInfo]:
        """The current complete entry of each domain for (dataset, split, backbone, view)."""
        infos = self.entries()
        cur = self.current(infos)
        found = [e for s, e in cur.items() if s[0] == dataset and s[1] == split and s[3] == backbone and s[4] == view]
        self._refuse_damaged(infos, (dataset, split, backbone, view), None if domains is None else set(domains))
        if not found:
            pending = [e for e in infos if e.slot[:2] == (dataset, split) and e.slot[3:] == (backbone, view)]
            if pending:
                raise IncompleteEntryError(
                    f"the {split} features of {dataset} for {backbone} are not complete yet "
                    f"(interrupted or still running); finish them with `{self._extract_hint(pending)}`"
                )
            raise self._not_found(cur, dataset, split, backbone)
        return found

    def _missing_domains(self, found: list[EntryInfo], slot: tuple, missing: list[str]) -> StoreError:
        """Domains of a table the store lacks: an extraction of them left unfinished is said as such, with the
        command that finishes it; else the extraction that makes them as the other domains were made (another
        --dtype or --image-size would make entries the table then refuses to mix)."""
        dataset, split, backbone, view = slot
        pending = [e for e in self.entries() if not e.complete and e.slot == (dataset, split, e.slot[2], backbone, view)
                   and e.slot[2] in missing]
        where = f"{split} features of {dataset}/{','.join(missing)} for {backbone}"
        if pending:
            return IncompleteEntryError(f"the {where} are not complete yet (interrupted or still running); finish them "
                                        f"with `{self._extract_hint(pending)}`")
        return EntryNotFoundError(f"the store has no {where}; run `{self._extract_hint(found[:1], missing)}`")

    def _extract_hint(self, pending: list[EntryInfo], domains: list[str] | None = None) -> str:
        """The extraction that finishes ``pending`` (or makes ``domains`` as ``pending`` were made): its store,
        dataset, backbone, and the options in its key that are not the defaults (another --dtype would write new
        entries instead of finishing these)."""
        k = pending[0].key
        if (k.get("preprocess") or {}).get("imported"):  # an import's entries: no extraction can make or finish them
            return f"fedcache store import FILE --store {self.path} --dataset {k['dataset']} --backbone {k['backbone']}"
        hint = f"fedcache extract --store {self.path} --dataset {k['dataset']} --backbones {k['backbone']}"
        hint += f" --splits {k['split']} --domains {','.join(sorted(domains or {e.key['domain'] for e in pending}))}"
        hint += f" --dtype {k['dtype']}" if k.get("dtype", "float16") != "float16" else ""
        size = (k.get("preprocess") or {}).get("size")
        return hint + (f" --image-size {size}" if size else "") + (" (and any other option it was started with)"
                                                                   if k.get("view") or k.get("augmentation") else "")

    def _not_found(self, cur: dict, dataset: str, split: str, backbone: str) -> EntryNotFoundError:
        """What the store lacks, and the likeliest way on: a close name it does hold (a typo), the split it lacks
        (an import of one split), or the extraction."""
        where = f"the store {self.path} has no {split} features of {dataset} for {backbone}"
        extract = f"; or extract them: `fedcache extract --store {self.path} --dataset {dataset} --backbones {backbone}`"
        datasets = sorted({s[0] for s in cur})
        if dataset not in datasets:
            found = where + _close(dataset, datasets, "datasets")
            return EntryNotFoundError(found + extract, ("dataset", dataset), found)
        backbones = sorted({s[3] for s in cur if s[0] == dataset})
        if backbone not in backbones:
            found = where + _close(backbone, backbones, f"backbones for {dataset}")
            return EntryNotFoundError(found + extract, ("backbone", backbone), found)
        splits = sorted({s[1] for s in cur if s[0] == dataset and s[3] == backbone})
        return EntryNotFoundError(
            where + f" (only {', '.join(splits)}): extract that split (`fedcache extract --store {self.path} --dataset "
            f"{dataset} --backbones {backbone} --splits {split}`), or import it if these are imported embeddings "
            f"(`fedcache store import FILE --store {self.path} --dataset {dataset} --backbone {backbone} --split {split}`)")

    def read(self, dataset: str, split: str, backbone: str, view: int = 0, domains: Iterable[str] | None = None) -> FeatureTable:
        """The features of every requested domain as one float32 array (see :meth:`features`)."""
        rows = self.rows(dataset, split, backbone, view, domains)
        return rows.table(self.features(rows))

    def read_splits(self, dataset: str, splits: Iterable[str], backbone: str, view: int = 0) -> dict[str, FeatureTable]:
        """:meth:`read` of several splits, their entries found together (:meth:`split_rows`)."""
        found = self.split_rows(dataset, splits, [backbone], view)
        return {s: rows.table(self.features(rows)) for s, (rows,) in found.items()}

    def split_rows(self, dataset: str, splits: Iterable[str], backbones: Iterable[str], view: int = 0) -> dict[str, list[TableRows]]:
        """Per split, each backbone's :meth:`rows`, found under :meth:`between_imports`: an import writes its splits
        one after another, and finding them in its midst gave the new training split with the old test split. The
        features are read after (the entries found are complete, and an import writes new ones), so that an import
        waits on the finding alone."""
        backbones = list(backbones)
        with self.between_imports(dataset, backbones):
            return {s: [self.rows(dataset, s, b, view) for b in backbones] for s in splits}

    def features(self, rows: TableRows) -> np.ndarray:
        """The features of ``rows``: when they are exactly one entry's file (one domain, float32, every row
        valid), that file memory-mapped once each chunk is checked, so the table is the page cache shared by
        every process reading it; else a new float32 array filled a chunk at a time (:meth:`fill`)."""
        if len(rows.parts) == 1 and rows.parts[0].valid.all():
            reader = rows.parts[0].reader
            mapped = reader.mapped("features", np.dtype(np.float32))
            self._raise_if_damaged(reader)
            if mapped is not None:
                reader.close()
                return mapped
        out = np.empty((len(rows), rows.dim), np.float32)
        self.fill(rows, out)
        return out

    def rows(self, dataset: str, split: str, backbone: str, view: int = 0, domains: Iterable[str] | None = None) -> TableRows:
        """What :meth:`read` returns except the features (labels, ids, domains, checked): what to allocate
        for them and how to :meth:`fill` them in."""
        domains = None if domains is None else list(domains)
        found = self.find(dataset, split, backbone, view, domains)
        domain_names = tuple(found[0].attrs["domains"])
        wanted = list(domains) if domains is not None else list(domain_names)
        by_domain = {e.key["domain"]: e for e in found}
        missing = [d for d in wanted if d not in by_domain]
        if missing:
            raise self._missing_domains(found, (dataset, split, backbone, view), missing)
        infos = [by_domain[d] for d in wanted]
        _check_consistent(infos, self.path)
        parts, offset = [], 0
        for info in infos:
            reader = self.reader(info)
            valid = reader.column("valid")
            labels, ids = reader.column("labels"), reader.column("ids")
            self._raise_if_damaged(reader)
            parts.append(EntryRows(reader, valid, offset, labels[valid], ids[valid],
                                   np.full(int(valid.sum()), domain_names.index(info.key["domain"]), np.int16)))
            offset += len(parts[-1].labels)
        return TableRows(parts, domain_names, tuple(found[0].attrs["classes"]), any(e.random_weights for e in infos),
                         tuple(e.entry_id for e in infos), infos[0].dim if infos else 0)

    def fill(self, rows: TableRows, out: np.ndarray, at: np.ndarray | None = None) -> None:
        """The features of ``rows`` into ``out`` (N, D): row i of the table into ``out[i]``, or into
        ``out[at[i]]`` (not at all where -1); ``out`` may be a column slice of a wider array."""
        fill([(p.reader, p.valid, p.offset) for p in rows.parts], out, at)
        for p in rows.parts:
            self._raise_if_damaged(p.reader)
            p.reader.close()

    def reader(self, info: EntryInfo, check: bool = True) -> EntryReader:
        """The chunks of a complete entry, checked against its checksums as they are read."""
        if info.damaged:
            raise self.damaged(info, info.damaged)
        if not info.complete:
            raise IncompleteEntryError(f"entry {info.entry_id} is incomplete; re-run the extraction to finish it")
        if info.format < ENTRY_FORMAT:
            log.info("entry %s is stored in format %d (compressed, read through Zarr); `fedcache store upgrade "
                     "--store %s` rewrites it for reads at the speed of memory", info.entry_id, info.format, self.path)
        try:
            group = self.root[ENTRIES][info.entry_id]
        except Exception as exc:  # its zarr.json went missing since it was listed
            raise self.damaged(info, f"its metadata cannot be read ({type(exc).__name__}: {exc})") from None
        reader = EntryReader(group, self.path / ENTRIES / info.entry_id, info, check)
        self._raise_if_damaged(reader)
        return reader

    def _raise_if_damaged(self, reader: EntryReader) -> None:
        if reader.problem:
            raise self.damaged(reader.info, reader.problem)

    # ---- integrity -------------------------------------------------------------
    def read_arrays(self, info: EntryInfo, verify: bool = True) -> dict[str, np.ndarray]:
        """The row arrays of a complete entry as stored (every row, valid or not), checked against their
        checksums (DamagedEntryError if not; ``verify=False``: not checked)."""
        reader = self.reader(info, check=verify)
        arrays = {name: reader.column(name) for name in ("labels", "ids", "valid")}
        arrays["features"] = np.empty((info.n_rows, info.dim), np.dtype(info.key.get("dtype", "float32")))
        fill([(reader, np.ones(info.n_rows, bool), 0)], arrays["features"])
        reader.close()
        self._raise_if_damaged(reader)
        return {name: arrays[name] for name in ROW_ARRAYS}

    def verify(self, info: EntryInfo) -> tuple[str, str]:
        """(status, detail): ok, damaged, partial (not finished: not checked) or unchecked (no checksums)."""
        if info.damaged:
            return "damaged", info.damaged
        if not info.complete:
            return "partial", "not complete yet: resumed by re-running its extraction"
        try:
            reader = self.reader(info)
        except DamagedEntryError as exc:
            return "damaged", exc.problem
        reader.scan()
        reader.close()
        if reader.problem:
            return "damaged", reader.problem
        if CRC_ATTR not in info.attrs:
            return "unchecked", "written by an older fedcache, without checksums: re-extract it to add them"
        return "ok", ""

    def sizes(self, info: EntryInfo) -> tuple[int, int]:
        """(bytes on disk, bytes in memory once read): its files, and its valid rows as float32 features
        plus their labels, ids and domain index (what :meth:`read` returns)."""
        folder = self.path / ENTRIES / info.entry_id
        disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        rows = int(info.attrs.get("n_valid", info.n_rows))
        return disk, rows * (4 * info.dim + 8 + 8 + 2)

    def damaged(self, info: EntryInfo, problem: str) -> DamagedEntryError:
        return DamagedEntryError(
            f"entry {info.entry_id} ({info.label()}) in {self.path} is damaged: {problem}. Re-create it (re-running the "
            "`fedcache extract` or `fedcache store import` that made it replaces a damaged entry), or remove it with "
            f"`fedcache store rm {info.entry_id} --store {self.path}`; `fedcache store verify` checks every entry", problem)

    def _refuse_damaged(self, infos: list[EntryInfo], want: tuple, domains: set | None) -> None:
        """A damaged entry that may fill a slot asked for (or whose slot is unknown) stops the read."""
        dataset, split, backbone, view = want

        def may_fill(e: EntryInfo) -> bool:
            s = e.slot
            return s[:2] == (dataset, split) and s[3:] == (backbone, view) and (domains is None or s[2] in domains)

        hit = [e for e in infos if e.damaged and (not e.key or may_fill(e))]
        if hit:
            raise self.damaged(hit[0], hit[0].damaged or "")

    # ---- text embeddings -------------------------------------------------------
    def put_text(self, key: TextKey, embeddings: np.ndarray, random_weights: bool) -> str:
        """Store per-template class-text embeddings (T, C, D); written whole, then marked complete."""
        group = self.root[TEXT]
        eid = key.entry_id
        folder = self.path / TEXT / eid
        shutil.rmtree(folder, ignore_errors=True)
        emb = np.asarray(embeddings, dtype=np.float32)
        what = f"the text embeddings of {key.backbone} in"
        disk.check_space(folder, emb.nbytes, what)
        with disk.on_full_disk(folder, what, emb.nbytes, remove=[folder]):  # a text entry is written whole or not at all
            g = group.create_group(eid)
            g.create_array("embeddings", data=emb)
            g.attrs.update({"key": key.to_dict(), "random_weights": random_weights, CRC_ATTR: crc(emb)})
            g.attrs.update({"complete": True, "completed_at": now_iso()})
        return eid

    def has_text(self, key: TextKey) -> bool:
        """True if the text entry is complete and intact (a damaged one is written again)."""
        try:
            self._text(key.entry_id)
        except StoreError:
            return False
        return True

    def _text(self, entry_id: str) -> np.ndarray:
        where = f"text entry {entry_id} in {self.path}"
        try:
            g = self.root[TEXT][entry_id]
            a = dict(g.attrs)
            if not a.get("complete"):
                raise IncompleteEntryError(f"{where} is not complete")
            emb = g["embeddings"][:]
        except StoreError:
            raise
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        else:
            if CRC_ATTR not in a or crc(emb) == a[CRC_ATTR]:
                return emb
            problem = "its embeddings do not hold what was written"
        raise DamagedEntryError(f"{where} is damaged ({problem}); re-run `fedcache extract` for its backbone, which "
                                "writes it again", problem)

    def verify_text(self, entry_id: str) -> tuple[str, str]:
        """(status, detail) of a text entry, as :meth:`verify`."""
        try:
            self._text(entry_id)
        except IncompleteEntryError:
            return "partial", "not complete: written again by the next extraction of its backbone"
        except DamagedEntryError as exc:
            return "damaged", exc.problem
        return "ok", ""

    def text_entries(self) -> list[tuple[str, dict]]:
        """(entry id, attributes) of every readable text entry; damaged ones are left out (`store verify` names them)."""
        out = []
        for eid in self.entry_ids(TEXT):
            try:
                out.append((eid, dict(self.root[TEXT][eid].attrs)))
            except Exception:
                log.warning("text entry %s in %s is damaged; `fedcache store verify` names it", eid, self.path)
        return out

    def read_text(self, backbone: str, classes: Iterable[str], template_set: str = "single",
                  weights_hash: str | None = None) -> np.ndarray:
        """Class-text embeddings (T, C, D) of the newest complete text entry matching the request; of the weights
        ``weights_hash`` (those of the image features they go with) where the store has them."""
        best = self._newest_text(backbone, list(classes), template_set, weights_hash)
        if best is None:
            raise EntryNotFoundError(
                f"no '{template_set}' text embeddings for {backbone} and these classes; "
                f"run `fedcache extract --backbones {backbone}` on the dataset (only CLIP-style backbones have them)"
            )
        return self._text(best)

    def _newest_text(self, backbone: str, classes: list[str], template_set: str, weights_hash: str | None = None) -> str | None:
        found = []
        for eid, a in self.text_entries():
            k = a.get("key", {})
            if a.get("complete") and k.get("backbone") == backbone and k.get("classes") == classes and k.get("template_set") == template_set:
                found.append((a["completed_at"], k.get("weights_hash") == weights_hash, eid))
        same = [f for f in found if f[1]]
        return max(same or found)[2] if found else None

    # ---- removal ---------------------------------------------------------------
    def remove(self, entry_id: str) -> EntryInfo:
        info = self.info(entry_id)
        with self._no_writer(info):
            self.discard(info.entry_id)
        return info

    @contextlib.contextmanager
    def _no_writer(self, info: EntryInfo) -> Iterator[None]:
        """Hold the locks an extraction or import of the entry takes: removed under a running writer, the entry came
        back as files without metadata, which stopped every read of the store as a damaged entry of unknown slot."""
        with contextlib.ExitStack() as held:
            # The create lock first, then the part locks found while holding it: a writer takes its part lock before
            # it lets the create lock go, so none can start writing between the look and the removal.
            what, advice = f"entry {info.entry_id} ({info.label()})", "let it finish (or stop it), then remove the entry"
            held.enter_context(exclusive_lock(self.locks_dir / f"{info.entry_id}.create.lock", what, advice=advice))
            for path in sorted(self.locks_dir.glob(f"{info.entry_id}.part*.lock")):
                held.enter_context(exclusive_lock(path, what, advice=advice))
            yield

    def discard(self, entry_id: str, kind: str = ENTRIES) -> None:
        # Deleted in place, an entry went file by file in directory order: stopped midway (Ctrl-C, kill), it was
        # left without its rows while its zarr.json still said complete. One rename out of its folder takes it from
        # every reader at once; the files are deleted after, and what a stopped removal left, by the next one.
        # Renamed straight to a name of its own: a folder made first to rename into was empty for a moment, and a
        # concurrent removal's sweep below deleted it, so this rename failed (FileNotFoundError).
        trash = self.path / REMOVING
        trash.mkdir(exist_ok=True)
        os.rename(self.path / kind / entry_id, trash / f"{entry_id}.{secrets.token_hex(8)}")
        self.bad_images_path(entry_id).unlink(missing_ok=True)
        for left in trash.iterdir():
            shutil.rmtree(left, ignore_errors=True)  # another process's removal may be deleting it too

    def stale(self) -> list[EntryInfo]:
        """Complete entries superseded by a newer one in the same slot (never read again)."""
        infos = self.entries()
        cur = {e.entry_id for e in self.current(infos).values()}
        return [e for e in infos if e.complete and e.entry_id not in cur]


def _close(name: str, names: list[str], what: str) -> str:
    """ "; did you mean 'x'? It holds: ..." """
    import difflib

    near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    listed = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return (f"; did you mean {near[0]!r}?" if near else "") + f" (its {what}: {listed or 'none'})"


def import_lock(dataset: str, backbone: str) -> str:
    """The lock's name for imports under (dataset, backbone): hashed, since the names may hold dots (``a.b``/``c``
    and ``a``/``b.c`` joined alike) and two long ones exceed a file name's 255 bytes."""
    return "import." + hashlib.sha256(json.dumps([dataset, backbone]).encode()).hexdigest()[:16]
