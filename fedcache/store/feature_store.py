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
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import zarr

from fedcache import disk
from fedcache.errors import (ConfigError, DamagedEntryError, DiskFullError, EntryNotFoundError, IncompleteEntryError,
                             StoreError, StoreIsAFileError, StoreNotFoundError, UnknownEntryError,
                             UnreadableEntryError)
from fedcache.ownership import Holder
from fedcache.paths import (check_store_place, denied_problem, is_denied, owner, store_denied, unmade_store,
                            unreadable_store)
from fedcache.store import lookup
from fedcache.store.chunks import ChunkFiles, RawMeta
from fedcache.store.entries import (ENTRIES, ENTRY_FORMAT, FORMAT_ATTR, SHARD_ATTR, SLOT_FIELDS, STORE_FORMAT, TEXT,
                                    EntryInfo, newest, now_iso)
from fedcache.store.integrity import CRC_ATTR, ROW_ARRAYS
from fedcache.store.locks import exclusive_lock, import_lock, live_holders, shared_lock
from fedcache.store.parts import Part
from fedcache.store.reading import EntryReader, fill
from fedcache.store.removal import Removal
from fedcache.store.tables import EntryRows, FeatureTable, TableRows, check_consistent, closed_on_error
from fedcache.store.text import TextEmbeddings
from fedcache.wording import named, pasted

# Re-exported: the rest of fedcache (and its tests) import these from here.
__all__ = ["ENTRIES", "ENTRY_FORMAT", "FORMAT_ATTR", "SHARD_ATTR", "STORE_FORMAT", "TEXT", "EntryInfo", "FeatureStore",
           "FeatureTable", "TableRows", "import_lock", "now_iso"]

log = logging.getLogger(__name__)


def _group(e: EntryInfo) -> tuple:
    """The slot without its domain: what a reader asks for (``find``)."""
    dataset, split, _, backbone, view = e.slot
    return dataset, split, backbone, view


def _named_by(newest: EntryInfo, e: EntryInfo) -> bool:
    names = newest.attrs.get("domains")
    return not isinstance(names, list) or e.slot[2] in names


# What a store's folder holds (a damaged store may lack its zarr.json): its groups, and the partitions that
# fedcache/federate/partitions/storage.py writes beside them (PARTITIONS; a test holds the two equal).
STORE_NAMES = (ENTRIES, TEXT, "partitions", "reports", "zarr.json")


class FeatureStore(TextEmbeddings, Removal):
    def __init__(self, path: str | Path, create: bool = True) -> None:
        self.path = Path(path)
        new = not self.path.exists()
        if new and not create:
            raise StoreNotFoundError(f"no feature store at {self.path}; create one with `fedcache extract {pasted('--store', self.path)} ...`")
        if self.path.exists() and not self.path.is_dir():
            raise StoreIsAFileError(f"{self.path} is a file, not a feature store (a store is a folder); give the store's folder "
                             f"as {named('--store', 'store')}, or a new folder's path to create one")
        self._refuse_a_users_folder(create)
        try:
            self.root = self._open_root(create)
        except DiskFullError:
            if new:  # half made, it is no store: the next command makes it again
                disk.discard([self.path])
            raise

    def _refuse_a_users_folder(self, create: bool) -> None:
        """A folder of other files (a data root, photos, given as --store by mistake) was made a store in place,
        its files left among the store's. What a store being made holds is not theirs: Zarr writes its zarr.json
        through a ``*.partial`` file beside it, and a file system's root has its lost+found."""
        if not self.path.is_dir() or (self.path / "zarr.json").exists():
            return
        theirs = sorted(p.name for p in self.path.iterdir() if not p.name.startswith(".") and p.name not in STORE_NAMES
                        and not p.name.endswith(".partial") and p.name != "lost+found")
        if theirs:
            shown = ", ".join(theirs[:3]) + (", ..." if len(theirs) > 3 else "")
            store = named("--store", "store")
            if not create:
                raise StoreNotFoundError(f"no feature store at {self.path} (a folder of other files: {shown}); give "
                                         f"the store's folder as {store}")
            raise StoreNotFoundError(f"{self.path} is a folder of other files ({shown}), not a feature store; give a "
                                     f"new folder's path (or a store's) as {store}")

    def _open_root(self, create: bool) -> zarr.Group:
        mode = "a" if create else "r+"
        try:
            root = zarr.open_group(store=str(self.path), mode=mode, zarr_format=3, use_consolidated=False)
        except Exception as exc:
            if disk.is_full(exc):
                raise disk.full_error(self.path / "zarr.json", "the feature store") from None
            if is_denied(exc):  # not "is not a fedcache feature store": it may well be one, or become one
                raise StoreError(self._denied(exc)) from None
            if isinstance(exc, OSError) and not self.path.exists():  # a folder no one can make there (/proc/x)
                raise StoreError(self._unmade(exc.strerror or str(exc))) from exc
            if not create and self.path.is_dir() and not any(self.path.iterdir()):  # Zarr said "No group found"
                raise StoreNotFoundError(f"no feature store at {self.path} (an empty folder); create one with "
                                         f"`fedcache extract {pasted('--store', self.path)} ...`") from None
            raise StoreError(f"{self.path} is not a fedcache feature store: {exc}") from exc
        fmt = root.attrs.get("fedcache_store")
        if fmt is None:
            self._refuse_a_group(root)
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

    def _refuse_a_group(self, root: zarr.Group) -> None:
        """A Zarr group without the store's mark is made a store only where it is no other's: a group of a store
        (its ``text``, ``entries`` or a partition's folder, given for the store) was marked and given groups of its
        own by a mere `store ls`, and the store then listed them as two partial text embedding sets."""
        check_store_place(self.path)
        if any(True for _ in root.members()) and ENTRIES not in root:
            raise StoreError(f"{self.path} is a Zarr group but not a fedcache feature store")

    def _denied(self, exc: OSError) -> str:
        """Opening (or making) the store refused: a new one in a folder this user cannot write in, another user's
        store it cannot read, one on a read-only mount."""
        read, problem = denied_problem(exc)
        if read:
            return unreadable_store(self.path, problem)
        if (self.path / "zarr.json").exists():
            return f"cannot open the feature store {self.path} ({problem}); {store_denied()}"
        return self._unmade(problem)

    def _unmade(self, problem: str) -> str:
        return unmade_store(self.path, problem)

    @property
    def locks_dir(self) -> Path:
        return self.path / ".locks"

    def create_lock(self, entry_id: str) -> Path:
        """The lock file of an entry's making, of every write of its attributes, and of its removal (each writer
        of a part holds that part's lock besides)."""
        return self.locks_dir / f"{entry_id}.create.lock"

    def writers(self, entry_id: str) -> dict[Part, Holder]:
        """Who is writing the entry now, by the part each writes: the running holders of its parts' locks, as their
        records say."""
        found = {}
        for path in sorted(self.locks_dir.glob(f"{entry_id}.part*.lock")):
            part = Part.of_lock(path.name)
            for holder in live_holders([path]) if part is not None else []:
                found[part] = holder
        return found

    def idle_parts(self, info: EntryInfo, writing: dict[Part, Holder]) -> list[Part]:
        """The parts of the partial entry ``info`` that no running writer (``writing``: :meth:`writers`) writes, of
        their count (the fewest, where they differ), which hold chunks not done: an interrupted writer's part, or one
        not started yet. Its own ``--part`` finishes one beside them (without, a writer would write theirs too), and
        the entry is complete only once it has; none where nothing writes the entry, or its flags cannot be read."""
        if not writing:
            return []
        try:
            flags = self._done_flags(info, self.root[ENTRIES][info.entry_id])
        except Exception:  # damaged or another user's: its status says so. Zarr and json raise many types
            return []
        if flags is None:
            return []
        busy = {c for part in writing for c in part.chunks(len(flags))}
        count = min(part.count for part in writing)
        parts = [Part(i, count) for i in range(count)]
        return [p for p in parts if not busy & set(p.chunks(len(flags))) and not flags[p.chunks(len(flags))].all()]

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
            if is_denied(exc):  # another user's entry, made under a strict umask: unreadable here, not damaged
                return EntryInfo(entry_id, self._salvaged_key(entry_id), 0, 0, False, None, {},
                                 damaged=denied_problem(exc)[1], denied=True, owner=owner(self.path / ENTRIES / entry_id))
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
            raise ConfigError(f"{entry_id!r} is not an entry id; list them with `fedcache store ls {pasted('--store', self.path)}`")
        ids = self.entry_ids()
        if entry_id not in ids:
            matches = [e for e in ids if e.startswith(entry_id)]
            if len(matches) != 1:
                many = f" (matches {len(matches)}: give more characters)" if matches else ""
                raise UnknownEntryError(f"no entry {entry_id!r} in {self.path}{many}; list them with "
                                         f"`fedcache store ls {pasted('--store', self.path)}`")
            entry_id = matches[0]
        return self._info(entry_id)

    def chunks_done(self, info: EntryInfo) -> tuple[int, int] | None:
        """(done, total) chunks of a partial entry, as its writer reads them when it resumes; (0, 0) before its flags
        were made (format 1: stopped, or still running, as it was created; a format-2 entry is marked so once they
        are); None where its flags' metadata is damaged or missing (its extraction cannot resume it, and replaces
        it); UnreadableEntryError where this user may not read them. Another OSError (EIO, EMFILE, a network file
        system's) says nothing of the entry and is raised: an entry another writer is filling must not be called
        damaged, and replaced, for it."""
        try:
            group = self.root[ENTRIES][info.entry_id]
            if info.format < 2 and "done" not in group:
                return 0, 0
            flags = self._done_flags(info, group)
        except OSError as exc:
            if is_denied(exc):  # another user's permissions on its flags: not damage
                raise self.refused(info, denied_problem(exc)[1], denied=True) from None
            if isinstance(exc, FileNotFoundError) and (self.path / ENTRIES / info.entry_id / "zarr.json").is_file():
                return None  # its flags' zarr.json is gone, the entry is not (removed whole, it would be too)
            raise
        except Exception:  # Zarr and json raise many types for damaged metadata
            return None
        return (int(flags.sum()), len(flags)) if flags is not None else None

    def _done_flags(self, info: EntryInfo, group: zarr.Group) -> np.ndarray | None:
        """The flags as the writer reads them (fedcache/store/writer.py): a format-2 entry's from their files, where
        a torn flag is one not set yet (written again), and None if they are not stored so; Zarr's for format 1."""
        if info.format < 2:
            return group["done"][:]
        meta = RawMeta.open(self.path / ENTRIES / info.entry_id / "done")
        return ChunkFiles(meta).read_all() if meta is not None else None

    def current(self, infos: Iterable[EntryInfo] | None = None) -> dict[tuple, EntryInfo]:
        """For each slot, the most recently completed entry (older ones are stale), while its domain is one of the
        domains the newest entry of its (dataset, split, backbone, view) names: importing a file of other domains
        under the same names supersedes the domains it lacks (they were read beside the new ones)."""
        best: dict[tuple, EntryInfo] = {}
        for e in infos if infos is not None else self.entries():
            if e.complete and (e.slot not in best or (e.completed_at or "") > (best[e.slot].completed_at or "")):
                best[e.slot] = e
        groups: dict[tuple, list[EntryInfo]] = {}
        for e in best.values():
            groups.setdefault(_group(e), []).append(e)
        last = {group: newest(infos) for group, infos in groups.items()}
        return {slot: e for slot, e in best.items() if _named_by(last[_group(e)], e)}

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
        hit = lookup.damaged_in(infos, (dataset, split, backbone, view), None if domains is None else set(domains))
        if hit:
            raise self.refused(hit, hit.damaged or "", hit.denied)
        misplaced = lookup.misplaced_in(self.path, infos, (dataset, split, backbone, view))
        if misplaced:
            raise misplaced
        if not found:
            raise lookup.nothing_found(self.path, infos, cur, (dataset, split, backbone, view))
        return found

    def read(self, dataset: str, split: str, backbone: str, view: int = 0, domains: Iterable[str] | None = None) -> FeatureTable:
        """The features of every requested domain as one float32 array (see :meth:`features`)."""
        rows = self.rows(dataset, split, backbone, view, domains)
        return rows.table(self.features(rows))

    def read_splits(self, dataset: str, splits: Iterable[str], backbone: str, view: int = 0) -> dict[str, FeatureTable]:
        """:meth:`read` of several splits, their entries found together (:meth:`split_rows`)."""
        found = self.split_rows(dataset, splits, [backbone], view)
        with closed_on_error(*(rows for rows, in found.values())):
            return {s: rows.table(self.features(rows)) for s, (rows,) in found.items()}

    def split_rows(self, dataset: str, splits: Iterable[str], backbones: Iterable[str], view: int = 0) -> dict[str, list[TableRows]]:
        """Per split, each backbone's :meth:`rows`, found under :meth:`between_imports`: an import writes its splits
        one after another, and finding them in its midst gave the new training split with the old test split. The
        features are read after (the entries found are complete, and an import writes new ones), so that an import
        waits on the finding alone."""
        backbones, splits = list(backbones), list(splits)
        found: list[TableRows] = []
        with self.between_imports(dataset, backbones):
            for s in splits:
                for b in backbones:
                    with closed_on_error(*found):  # the rows found so far: their files stayed open with the error
                        found.append(self.rows(dataset, s, b, view, with_splits=splits))
        n = len(backbones)
        return {s: found[i * n:(i + 1) * n] for i, s in enumerate(splits)}

    def features(self, rows: TableRows) -> np.ndarray:
        """The features of ``rows``: when they are exactly one entry's file (one domain, float32, every row
        valid), that file memory-mapped once each chunk is checked, so the table is the page cache shared by
        every process reading it; else a new float32 array filled a chunk at a time (:meth:`fill`)."""
        if len(rows.parts) == 1 and rows.parts[0].valid.all():
            reader = rows.parts[0].reader
            with closed_on_error(reader):
                mapped = reader.mapped("features", np.dtype(np.float32))
                self._raise_if_damaged(reader)
            if mapped is not None:
                reader.close()
                return mapped
        out = np.empty((len(rows), rows.dim), np.float32)
        self.fill(rows, out)
        return out

    def rows(self, dataset: str, split: str, backbone: str, view: int = 0, domains: Iterable[str] | None = None,
             with_splits: Iterable[str] = ()) -> TableRows:
        """What :meth:`read` returns except the features (labels, ids, domains, checked): what to allocate
        for them and how to :meth:`fill` them in. ``with_splits``: as :meth:`table_entries`'."""
        return self.entry_rows(self.table_entries(dataset, split, backbone, view, domains, with_splits))

    def table_entries(self, dataset: str, split: str, backbone: str, view: int = 0,
                      domains: Iterable[str] | None = None, with_splits: Iterable[str] = ()) -> list[EntryInfo]:
        """The entries :meth:`read` reads, in its row order: the current entry of each domain asked for (by default
        each domain the newest entry names, as :meth:`current` keeps them), of one making (``check_consistent``);
        metadata only. :meth:`find` may find more (a domain the entries do not name): what a read was made of is
        these. Not the first entry found's domains: an import of fewer domains beside an extraction's was read
        alone or refused by which domain's name sorted first. ``with_splits``: the splits read with this one (a run's
        train and test): where domains are missing, the extraction said makes what the store lacks of each."""
        domains = None if domains is None else list(domains)
        found = self.find(dataset, split, backbone, view, domains)
        wanted = list(domains) if domains is not None else list(newest(found).attrs["domains"])
        by_domain = {e.key["domain"]: e for e in found}
        missing = [d for d in wanted if d not in by_domain]
        if missing:
            infos = self.entries()
            raise lookup.missing_domains(self.path, infos, self.current(infos), found, (dataset, split, backbone, view),
                                         missing, list(with_splits))
        infos = [by_domain[d] for d in wanted]
        check_consistent(infos, self.path)
        return infos

    def entry_rows(self, infos: list[EntryInfo]) -> TableRows:
        """:meth:`rows` of the entries ``infos`` (:meth:`table_entries`): a reader that must read exactly the
        entries it found (and recorded) reads them so, not as found again."""
        domain_names = tuple(newest(infos).attrs["domains"]) if infos else ()  # as table_entries wanted them
        parts: list[EntryRows] = []
        offset = 0
        for info in infos:
            with closed_on_error(*parts):  # the entries read so far: their files stayed open with the error
                parts.append(self._entry_part(info, domain_names, offset))
            offset += len(parts[-1].labels)
        return TableRows(parts, domain_names, tuple(infos[0].attrs["classes"]) if infos else (),
                         any(e.random_weights for e in infos), tuple(e.entry_id for e in infos), infos[0].dim if infos else 0)

    def _entry_part(self, info: EntryInfo, domain_names: tuple[str, ...], offset: int) -> EntryRows:
        """One entry's labels, ids and valid rows, checked, its first row the table's ``offset``; its files are
        closed where it raises."""
        reader = self.reader(info)
        with closed_on_error(reader):
            valid = reader.column("valid")
            labels, ids = reader.column("labels"), reader.column("ids")
            self._raise_if_damaged(reader)
            domain = np.full(int(valid.sum()), domain_names.index(info.key["domain"]), np.int16)
        return EntryRows(reader, valid, offset, labels[valid], ids[valid], domain)

    def fill(self, rows: TableRows, out: np.ndarray, at: np.ndarray | None = None) -> None:
        """The features of ``rows`` into ``out`` (N, D): row i of the table into ``out[i]``, or into
        ``out[at[i]]`` (not at all where -1); ``out`` may be a column slice of a wider array."""
        try:
            fill([(p.reader, p.valid, p.offset) for p in rows.parts], out, at)
            for p in rows.parts:
                self._raise_if_damaged(p.reader)
        finally:
            rows.close()

    def reader(self, info: EntryInfo, check: bool = True) -> EntryReader:
        """The chunks of a complete entry, checked against its checksums as they are read."""
        if info.damaged:
            raise self.refused(info, info.damaged, info.denied)
        if not info.complete:
            raise IncompleteEntryError(f"entry {info.entry_id} is incomplete; re-run the extraction to finish it")
        if info.format < ENTRY_FORMAT:
            log.info("entry %s is stored in format %d (compressed, read through Zarr); `fedcache store upgrade "
                     "--store %s` rewrites it for reads at the speed of memory", info.entry_id, info.format, self.path)
        try:
            group = self.root[ENTRIES][info.entry_id]
        except Exception as exc:  # its zarr.json went missing since it was listed
            if is_denied(exc):
                raise self.refused(info, denied_problem(exc)[1], denied=True) from None
            raise self.damaged(info, f"its metadata cannot be read ({type(exc).__name__}: {exc})") from None
        reader = EntryReader(group, self.path / ENTRIES / info.entry_id, info, check)
        self._raise_if_damaged(reader)
        return reader

    def _raise_if_damaged(self, reader: EntryReader) -> None:
        if reader.problem:
            raise self.refused(reader.info, reader.problem, bool(reader.denied))

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

    def verify(self, info: EntryInfo, misplaced: dict[str, str] | None = None) -> tuple[str, str]:
        """(status, detail): ok, damaged, unreadable (by this user: not checked), partial (not finished: not
        checked) or unchecked (no checksums). ``misplaced``: ``lookup.misplaced_entries`` of the store's entries,
        where the caller verifies them all (made once, not once an entry)."""
        if info.damaged:
            return ("unreadable" if info.denied else "damaged"), info.damaged
        if not info.complete:
            return self._partial(info)
        try:
            reader = self.reader(info)
        except (DamagedEntryError, UnreadableEntryError) as exc:
            return ("unreadable" if isinstance(exc, UnreadableEntryError) else "damaged"), exc.problem
        reader.scan()
        reader.close()
        if reader.problem:
            return ("unreadable" if reader.denied else "damaged"), reader.problem
        misplaced = lookup.misplaced_entries(self.entries()) if misplaced is None else misplaced
        if info.entry_id in misplaced:
            return "damaged", misplaced[info.entry_id]
        if CRC_ATTR not in info.attrs:
            return "unchecked", "written by an older fedcache, without checksums: re-extract it to add them"
        return "ok", ""

    def _partial(self, info: EntryInfo) -> tuple[str, str]:
        """:meth:`verify` of an unfinished entry: not checked, but unreadable where this user may not read how far
        it got, and damaged where its writer could not (``store ls`` says so, and points here)."""
        try:
            done = self.chunks_done(info)
        except UnreadableEntryError as exc:
            return "unreadable", exc.problem
        if done is None:  # its extraction cannot resume it: re-running it replaces the entry, as a damaged one
            return "damaged", "not complete, and its done flags (which chunks were written) cannot be read"
        return "partial", ("not complete yet: resumed by re-running its extraction, unless one completed since "
                           "superseded it (`store ls` lists those as stale)")

    def sizes(self, info: EntryInfo) -> tuple[int, int]:
        """(bytes on disk, bytes in memory once read): its files, and its valid rows as float32 features
        plus their labels, ids and domain index (what :meth:`read` returns)."""
        folder = self.path / ENTRIES / info.entry_id
        disk = sum(_on_disk(p.stat()) for p in folder.rglob("*") if p.is_file())
        rows = int(info.attrs.get("n_valid", info.n_rows))
        return disk, rows * (4 * info.dim + 8 + 8 + 2)

    def refused(self, info: EntryInfo, problem: str, denied: bool = False) -> StoreError:
        """Why ``info`` cannot be read, as the error to raise: damaged, or (``denied``) not readable by this user,
        whose advice is a permission: re-creating or removing another user's entry would be wrong."""
        if denied:
            return UnreadableEntryError(unreadable_store(self.path, f"entry {info.entry_id} ({info.label()}): {problem}"),
                                        problem)
        return self.damaged(info, problem)

    def damaged(self, info: EntryInfo, problem: str) -> DamagedEntryError:
        return DamagedEntryError(
            f"entry {info.entry_id} ({info.label()}) in {self.path} is damaged: {problem}. Re-create it (re-running the "
            "`fedcache extract` or `fedcache store import` that made it replaces a damaged entry), or remove it with "
            f"`fedcache store rm {info.entry_id} {pasted('--store', self.path)}`; `fedcache store verify "
            f"{pasted('--store', self.path)}` checks every entry", problem)

    def stale(self) -> list[EntryInfo]:
        """Complete entries superseded by a newer one in the same slot (never read again), and partial ones that an
        entry completed since they were begun superseded (:meth:`superseded_partials`)."""
        infos = self.entries()
        current = self.current(infos)
        cur = {e.entry_id for e in current.values()}
        return [e for e in infos if e.complete and e.entry_id not in cur] + superseded_partials(infos, current)


def _on_disk(st: os.stat_result) -> int:
    """A file's bytes on the disk: a partial entry's rows file is sparse, its full length and mostly holes, so its
    length said the size of the finished entry. (Its length, not its blocks, where that is less: a small file's
    last block is not data.)"""
    blocks = getattr(st, "st_blocks", None)  # not on Windows
    return st.st_size if blocks is None else min(st.st_size, 512 * blocks)


def superseded_partials(infos: list[EntryInfo], current: dict[tuple, EntryInfo]) -> list[EntryInfo]:
    """Partial entries whose slot holds an entry completed after they were begun: an extraction of the same images
    with other options, or of images changed since (whose key the partial one's command no longer makes: it wrote
    that newer entry, and listed the partial one to be finished for good). Runs read the newer one; a partial one
    finished later would be read instead, as the last asked for, but one of changed images never can be."""
    return [e for e in infos if not e.complete and not e.damaged and e.slot in current
            and (current[e.slot].completed_at or "") > str(e.attrs.get("created_at") or "")]
