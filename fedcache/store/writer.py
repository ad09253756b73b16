"""Writing one entry chunk by chunk, resumably, by one or several disjoint writers.

The arrays are allocated at full size up front; a writer fills row-chunks in order, a batch of rows at a
time, and flags each chunk in ``done`` only after all of its rows of all of its arrays are written (a flag's
file is written atomically, a temporary file renamed over it). A re-run skips flagged chunks. Of a chunk not
flagged, a format-2 writer keeps the rows it wrote: after each batch it records how many (and their checksums)
in a small file beside the flags, and a re-run that finds those rows' bytes still matching them continues
after them, so an interrupted extraction redoes at most a batch, however large its chunks (a chunk is the
unit of checksums and reads, about 4 MB; a small domain is one chunk). ``complete`` is set last, by whichever
writer sees every chunk flagged (once, under the entry's create lock); readers refuse the entry until then. Each
chunk's checksums are computed from the rows as written (fedcache/store/integrity.py), so damage done to a chunk at
any time after its writer wrote it is detected; an existing entry found damaged is replaced.

New entries are written in format 2 (fedcache/store/chunks.py): each row array one uncompressed file,
a chunk of rows written at its offset with one ``pwrite`` (writers of disjoint parts share the file),
CRC-32C checksums. An entry begun in format 1 (zstd through Zarr, CRC-32) by an older fedcache is
resumed in format 1, so its chunks stay alike; `fedcache store upgrade` rewrites it once complete.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import zarr

from fedcache import disk
from fedcache.errors import EntryLockedError, StoreError
from fedcache.store.chunks import ChunkError, ChunkFiles, RawMeta, RowFile, write_atomic
from fedcache.store.feature_store import (ENTRIES, ENTRY_FORMAT, FORMAT_ATTR, STORE_FORMAT, EntryInfo, FeatureStore,
                                          now_iso)
from fedcache.store.integrity import (CHECKSUM_ATTR, CRC_ARRAY, CRC_ATTR, FORMAT_1_CHECKSUM, ROW_ARRAYS, as_attr,
                                      chunk_crcs)
from fedcache.store.keys import EntryKey
from fedcache.store.locks import exclusive_lock
from fedcache.store.parts import Part
from fedcache.wording import named, pasted

log = logging.getLogger(__name__)


@dataclass
class _Begun:
    """A chunk being written: the row its next rows start at, and the checksums of its rows before it."""

    next: int
    crcs: np.ndarray  # uint32, in ROW_ARRAYS order
    unkept: int = 0  # its rows this writer wrote that an interruption would not keep (format 1): counted once done


TARGET_CHUNK_BYTES = 4 * 1024 * 1024


def chunk_rows_for(dim: int, itemsize: int, batch_size: int, target: int = TARGET_CHUNK_BYTES) -> int:
    """Rows per chunk: about ``target`` bytes, and a whole number of batches so that a
    resumed run sees exactly the same batches (and so writes the same bits)."""
    rows = max(1, target // max(1, dim * itemsize))
    return max(batch_size, rows // batch_size * batch_size)


class EntryWriter:
    """Writes the chunks of one entry; ``folder``: where its group lies (default: the store's entries)."""

    def __init__(self, store: FeatureStore, key: EntryKey, group: zarr.Group, folder: Path | None = None,
                 locked: bool = False) -> None:
        self.store, self.key, self.group = store, key, group
        self.locked = locked  # the caller holds the entry's create lock (store upgrade writes a copy under it)
        a = group.attrs
        self.n_rows, self.dim, self.chunk_rows = int(a["n_rows"]), int(a["dim"]), int(a["chunk_rows"])
        self.batch_size = int(a["batch_size"])
        self.checksum = a.get(CHECKSUM_ATTR, FORMAT_1_CHECKSUM)
        self.replaced: str | None = None  # why an existing entry of this key was found damaged and replaced
        self.begun: dict[int, _Begun] = {}  # chunks this writer has rows of (or found rows of kept), not yet done
        self.bad_images: list[str] = []  # once :meth:`finish` completes the entry: its bad images, as listed
        self.rows_written = self.chunks_written = 0  # by this writer, kept (a full disk says what is left)
        folder = folder if folder is not None else store.path / ENTRIES / key.entry_id
        # A complete entry's flags and chunk checksums are not opened: its checksums are its attributes, and reads
        # never look at them (a complete entry whose done/zarr.json went missing is intact, and is found complete).
        self.files = None if self.complete else (
            _Files(folder, key, store.path) if int(a.get(FORMAT_ATTR, 1)) >= 2 else _ThroughZarr(group))

    @property
    def n_chunks(self) -> int:
        # As allocated by _create_entry: an empty entry (a shard's domain with no rows) has one empty chunk.
        return max(1, -(-self.n_rows // self.chunk_rows))

    @property
    def complete(self) -> bool:
        return bool(self.group.attrs.get("complete", False))

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.chunk_rows, min(self.n_rows, (c + 1) * self.chunk_rows)

    def pending(self, part: Part = Part()) -> list[int]:
        if self.files is None:  # complete
            return []
        done = self.files.all("done")
        return [c for c in part.chunks(self.n_chunks) if not done[c]]

    def resume_row(self, c: int) -> int:
        """The first row of pending chunk ``c`` still to write: past the rows of it an interrupted writer kept."""
        return self._begun(c).next

    def rows_to_write(self, chunks: list[int]) -> int:
        """The rows of pending ``chunks`` still to write: of a chunk partly kept, those after its kept rows."""
        return sum(self.chunk_range(c)[1] - self.resume_row(c) for c in chunks)

    def _begun(self, c: int) -> _Begun:
        if c not in self.begun:
            lo, hi = self.chunk_range(c)
            kept = self.files.kept(c, lo, hi, self.batch_size, self.checksum)
            self.begun[c] = kept or _Begun(lo, np.zeros(len(ROW_ARRAYS), np.uint32))
        return self.begun[c]

    def write_chunk(self, c: int, features: np.ndarray, labels: np.ndarray, ids: np.ndarray, valid: np.ndarray) -> None:
        """All the rows of chunk ``c`` (whatever was kept of it is written again)."""
        lo, hi = self.chunk_range(c)
        if len(features) != hi - lo:
            raise StoreError(f"chunk {c} of {self.key.label()} needs {hi - lo} rows, got {len(features)}")
        self.begun[c] = _Begun(lo, np.zeros(len(ROW_ARRAYS), np.uint32))
        self.write_rows(c, lo, features, labels, ids, valid)

    def write_rows(self, c: int, lo: int, features: np.ndarray, labels: np.ndarray, ids: np.ndarray,
                   valid: np.ndarray) -> bool:
        """Rows from ``lo`` of chunk ``c``, where its rows written so far end (:meth:`resume_row`); True once they
        finish the chunk, which is then flagged done. Format 2 keeps rows of an unfinished chunk for a re-run."""
        begun, (first, hi) = self._begun(c), self.chunk_range(c)
        if lo != begun.next or lo + len(features) > hi:
            raise StoreError(f"chunk {c} of {self.key.label()} continues at row {begun.next} (it ends at {hi}), "
                             f"not with rows {lo}..{lo + len(features)}")
        given = {"features": features, "labels": labels, "ids": ids, "valid": valid}
        written = {name: self.files.write(name, c, lo, lo + len(features), given[name]) for name in ROW_ARRAYS}
        begun.crcs, begun.next = chunk_crcs(written, self.checksum, begun.crcs), lo + len(features)
        if begun.next < hi:
            if self.files.keep(c, begun.next - first, begun.crcs):
                self.rows_written += len(features)
            else:
                begun.unkept += len(features)
            return False
        self.files.write_small(CRC_ARRAY, c, begun.crcs[None])
        self.files.write_small("done", c, np.ones(1, bool))  # only now is the chunk counted
        self.rows_written += len(features) + begun.unkept
        self.chunks_written += 1
        self.files.forget(c)
        del self.begun[c]
        return True

    def finish(self, describe: Callable[[int], str] | None = None) -> bool:
        """Mark the entry complete if every chunk is done (by any writer); True if so. ``describe(i)`` names row
        ``i``'s image: given, the rows not valid (bad images skipped, by this run or the one it resumed, by any
        writer) are listed in the store's reports, the file's list made whole before the entry is complete, and
        kept in ``bad_images``."""
        if self.complete:
            self.store.make_current(self.key.entry_id)
            return True
        if not bool(np.all(self.files.all("done"))):
            return False
        with contextlib.nullcontext() if self.locked else exclusive_lock(
                self.store.create_lock(self.key.entry_id), f"entry {self.key.label()}", wait=30.0):
            # Read again under the lock: the writer of another part may have completed the entry since this one
            # opened it, or recorded how it was given to write (RESUMED_WITH); attributes read before would be
            # written back over theirs.
            self.group = zarr.open_group(store=self.group.store, path=self.group.path, mode="r+", zarr_format=3)
            valid = self.files.all("valid")
            if describe is not None:
                self._list_bad_images(valid, describe)
            if not self.complete:  # completed by another writer: its completed_at stays (it orders a slot's entries)
                self._complete(valid)
        return True

    def _complete(self, valid: np.ndarray) -> None:
        crcs = as_attr(self.files.all(CRC_ARRAY))
        n_valid = int(np.count_nonzero(valid))
        self.group.attrs.update({"n_valid": n_valid, "n_bad_images": self.n_rows - n_valid, CRC_ATTR: crcs})
        self.files.sweep()
        self.group.attrs.update({"complete": True, "completed_at": now_iso()})

    def _list_bad_images(self, valid: np.ndarray, describe: Callable[[int], str]) -> None:
        # From the rows, not from the names a run met: a resumed run never sees the bad images of the rows it kept.
        names = self.bad_images = [describe(int(i)) for i in np.flatnonzero(~valid)]
        path = self.store.bad_images_path(self.key.entry_id)
        if not names:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # surrogateescape: a file name that is not valid UTF-8 is listed as the bytes it is on disk.
        write_atomic(path, "".join(f"{n}\n" for n in names).encode("utf-8", "surrogateescape"))


class _Files:
    """Format 2: each row array one file written a chunk of rows at a time, the flags and checksums one
    small file per chunk (fedcache/store/chunks.py)."""

    def __init__(self, folder: Path, key: EntryKey, store: Path) -> None:
        metas = {name: RawMeta.open(folder / name) for name in (*ROW_ARRAYS, CRC_ARRAY, "done")}
        broken = [name for name, m in metas.items() if m is None]
        if broken:
            raise StoreError(f"entry {key.entry_id} ({key.label()}) says format 2 but its {', '.join(broken)} are "
                             f"not stored uncompressed; remove it with `fedcache store rm {key.entry_id} "
                             f"{pasted('--store', store)}`")
        self.rows = {name: RowFile(metas[name]) for name in ROW_ARRAYS}
        self.small = {name: ChunkFiles(metas[name]) for name in (CRC_ARRAY, "done")}

    def write(self, name: str, c: int, lo: int, hi: int, rows: np.ndarray) -> bytes:
        """The rows as written (in the stored dtype), to checksum."""
        return self.rows[name].write(lo, rows)

    def write_small(self, name: str, c: int, rows: np.ndarray) -> None:
        self.small[name].write(c, rows)

    def _kept_path(self, c: int) -> Path:
        # Beside the flags' chunk folder, a dot file: Zarr takes it for no chunk of the flags.
        return self.small["done"].meta.path / f".rows_kept.{c}"

    def keep(self, c: int, n: int, crcs: np.ndarray) -> bool:
        """Record that the first ``n`` rows of chunk ``c`` are written, with their checksums (atomically): kept."""
        write_atomic(self._kept_path(c), np.concatenate([[n], crcs.astype(np.int64)]).astype("<i8").tobytes())
        return True

    def forget(self, c: int) -> None:
        self._kept_path(c).unlink(missing_ok=True)

    def sweep(self) -> None:
        """Remove what a killed writer left of no use once every chunk is done: records of kept rows and the
        temporary files of atomic writes (write_atomic's ``.<name>.<pid>.partial``)."""
        done = self.small["done"].meta.path
        for left in (*done.glob(".rows_kept.*"), *done.parent.rglob(".*.partial")):
            left.unlink(missing_ok=True)

    def kept(self, c: int, lo: int, hi: int, batch_size: int, checksum: str) -> _Begun | None:
        """The rows of chunk ``c`` an interrupted writer recorded, if their bytes still match their checksums and
        end on a batch (so a re-run computes the same batches); else None: the chunk is written from its start."""
        try:
            raw = self._kept_path(c).read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != 8 * (1 + len(ROW_ARRAYS)):
            return None  # torn (written atomically, but a copy or a full disk may cut it), or of another fedcache
        saved = np.frombuffer(raw, "<i8")
        if not 0 < saved[0] < hi - lo or saved[0] % batch_size:
            return None  # not of this entry's chunks
        n = int(saved[0])
        try:
            rows = {name: self._read(name, lo, lo + n) for name in ROW_ARRAYS}
        except ChunkError:
            return None
        crcs = chunk_crcs(rows, checksum)
        return _Begun(lo + n, crcs) if np.array_equal(crcs, saved[1:]) else None

    def _read(self, name: str, lo: int, hi: int) -> bytes:
        opened = self.rows[name].open()
        try:
            return opened.read(lo, hi)
        finally:
            opened.close()

    def all(self, name: str) -> np.ndarray:
        if name in self.small:
            return self.small[name].read_all()
        opened = self.rows[name].open()
        try:
            n = self.rows[name].meta.shape[0]
            return opened.array(opened.read(0, n), 0, n) if n else np.zeros(0, self.rows[name].meta.dtype)
        finally:
            opened.close()


class _ThroughZarr:
    """Format 1: through Zarr, with the array's own codecs (an entry an older fedcache began)."""

    def __init__(self, group: zarr.Group) -> None:
        self.group = group

    def write(self, name: str, c: int, lo: int, hi: int, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows).astype(self.group[name].dtype, copy=False)
        self.group[name][lo:hi] = rows
        return rows

    def write_small(self, name: str, c: int, rows: np.ndarray) -> None:
        self.group[name][c:c + 1] = rows

    # An older fedcache's format resumes by whole chunks: rows of an unfinished chunk are not kept.
    def keep(self, c: int, n: int, crcs: np.ndarray) -> bool:
        return False

    def forget(self, c: int) -> None:
        pass

    def sweep(self) -> None:
        pass

    def kept(self, c: int, lo: int, hi: int, batch_size: int, checksum: str) -> None:
        return None

    def all(self, name: str) -> np.ndarray:
        return self.group[name][:]


def rows_written(store: FeatureStore, info: EntryInfo) -> int:
    """The rows of a partial entry its extraction will not compute again: those of its done chunks and those kept of
    the others, as its writer finds them when it resumes (kept rows whose bytes no longer match their checksums, or
    of format 1, are not counted). ``store ls`` says them; a chunk count said 0 of a domain of one chunk."""
    writer = EntryWriter(store, EntryKey(**info.key), store.root[ENTRIES][info.entry_id],
                         store.path / ENTRIES / info.entry_id)
    return info.n_rows - writer.rows_to_write(writer.pending())


def _create_entry(store: FeatureStore, key: EntryKey, n_rows: int, dim: int, batch_size: int, attrs: dict,
                  chunk_rows: int | None, entry_format: int = ENTRY_FORMAT, parent: zarr.Group | None = None) -> zarr.Group:
    """A new, empty entry in ``parent`` (default: the store's entries)."""
    dtype = np.dtype(key.dtype)
    if chunk_rows is None:
        chunk_rows = chunk_rows_for(dim, dtype.itemsize, batch_size)
    elif chunk_rows % batch_size:
        raise StoreError(f"chunk rows ({chunk_rows}) must be a multiple of the batch size ({batch_size})")
    n_chunks = max(1, -(-n_rows // chunk_rows))
    if entry_format >= 2 and store.root.attrs.get("fedcache_store", 1) < STORE_FORMAT:
        store.root.attrs.update({"fedcache_store": STORE_FORMAT})  # an older fedcache must not misread it
    meta = {"n_rows": n_rows, "dim": dim, "chunk_rows": chunk_rows, "batch_size": batch_size, "created_at": now_iso()}
    # Born with its key and sizes: a group without them is a damaged entry of unknown slot, which stops every read
    # of the store (and which `store verify --repair` removes) for as long as the arrays take to make.
    g = (parent if parent is not None else store.root[ENTRIES]).create_group(
        key.entry_id, attributes={"key": key.to_dict(), **meta, "complete": False})
    _create_arrays(g, key, n_rows, dim, dtype, chunk_rows, n_chunks, entry_format)
    if entry_format >= 2:
        meta |= {FORMAT_ATTR: entry_format, CHECKSUM_ATTR: "crc32c"}
    # A copied entry's attributes must not bring its checksums or its format.
    given = {n: v for n, v in attrs.items() if n not in (CRC_ATTR, FORMAT_ATTR, CHECKSUM_ATTR)}
    # key and sizes first, ``complete`` last: a reader never sees a half-described entry as usable.
    g.attrs.update({"key": key.to_dict(), **meta, **given, "complete": False})
    return g


def _create_arrays(g: zarr.Group, key: EntryKey, n_rows: int, dim: int, dtype: np.dtype, chunk_rows: int,
                   n_chunks: int, entry_format: int) -> None:
    """The entry's empty arrays: the row arrays, the chunks' done flags and their checksums."""
    # Format 2 stores every array uncompressed (docs/store.md: float features barely compress) and each row
    # array as one file (one Zarr chunk of every row), which a reader memory-maps; format 1 took Zarr's
    # default codec and chunks of chunk_rows, and is written only to resume an entry an older fedcache began.
    codec = {"compressors": None, "filters": None} if entry_format >= 2 else {}
    rows = (max(1, n_rows),) if entry_format >= 2 else (chunk_rows,)
    # The key is kept beside the features too, so an entry whose own metadata is lost still names its slot.
    g.create_array("features", shape=(n_rows, dim), chunks=(rows[0], dim), dtype=dtype, fill_value=0,
                   attributes={"entry_key": key.to_dict()}, **codec)
    g.create_array("labels", shape=(n_rows,), chunks=rows, dtype="int64", fill_value=-1, **codec)
    g.create_array("ids", shape=(n_rows,), chunks=rows, dtype="int64", fill_value=-1, **codec)
    g.create_array("valid", shape=(n_rows,), chunks=rows, dtype="bool", fill_value=False, **codec)
    g.create_array("done", shape=(n_chunks,), chunks=(1,), dtype="bool", fill_value=False, **codec)
    g.create_array(CRC_ARRAY, shape=(n_chunks, len(ROW_ARRAYS)), chunks=(1, len(ROW_ARRAYS)), dtype="uint32",
                   fill_value=0, **codec)
    if entry_format >= 2:  # the row files at full size: Zarr reads a partial entry as it did in format 1
        for name in ROW_ARRAYS:
            RowFile(RawMeta.open(Path(g.store.root) / g.path / name)).allocate()


def _discard_if_damaged(store: FeatureStore, key: EntryKey) -> str | None:
    """Remove the existing entry of ``key`` if it cannot be trusted (so it is written again); return why."""
    if not (store.path / ENTRIES / key.entry_id).is_dir():
        return None
    info = store.info(key.entry_id)
    status, why = store.verify(info)
    if status == "unreadable":  # another user's permissions: not damage to replace, nor complete to this user
        raise store.refused(info, why, denied=True)
    if status == "partial" and CRC_ARRAY not in store.root[ENTRIES][key.entry_id]:
        status, why = "damaged", "it has no checksums: interrupted while it was being made, or started by an older fedcache"
    if status != "damaged":
        return None
    log.warning("entry %s (%s) is damaged (%s); writing it again", key.entry_id, key.label(), why)
    store.discard(key.entry_id)
    return why


@contextlib.contextmanager
def open_writer(
    store: FeatureStore, key: EntryKey, n_rows: int, dim: int, batch_size: int, attrs: dict, part: Part = Part(),
    wait: float = 0.0, chunk_rows: int | None = None, entry_format: int = ENTRY_FORMAT,
) -> Iterator[EntryWriter]:
    """Create (or reopen) the entry for ``key`` and hold the lock of this writer's part. On a full disk the
    entry's finished chunks stay (it is resumed), after its space is checked: a new entry's whole size before it
    is made, a resumed one's rows still to write (of its pending chunks, less the rows kept) before they are."""
    folder = store.path / ENTRIES / key.entry_id
    what = f"the entry {key.entry_id} ({key.label()}) in"
    create = store.create_lock(key.entry_id)
    lock = store.locks_dir / part.lock_name(key.entry_id)
    part_what = f"entry {key.label()} (part {part.index}/{part.count})"
    with contextlib.ExitStack() as held:
        with exclusive_lock(create, f"entry {key.label()}", wait=max(wait, 30.0)):
            replaced = _discard_if_damaged(store, key)
            group = _made_or_opened(store, key, n_rows, dim, batch_size, attrs, chunk_rows, entry_format, folder, what)
            # Taken before the create lock goes: `store rm` holds that lock while it looks for writers' part locks.
            queued = not _entered(held, lock, part_what)
        if queued:  # another writer of this part runs: wait for it (--wait) without blocking other parts' writers
            held.enter_context(exclusive_lock(lock, part_what, wait=wait))
            with exclusive_lock(create, f"entry {key.label()}", wait=max(wait, 30.0)):
                if key.entry_id not in store.root[ENTRIES]:
                    again = named("run the command again", "run the same call again")  # extract_features(wait=...)
                    raise StoreError(f"entry {key.entry_id} ({key.label()}) was removed while this writer waited for "
                                     f"the one before it; {again}")
        writer = EntryWriter(store, key, group)
        if writer.n_rows != n_rows or writer.dim != dim:
            raise StoreError(
                f"entry {key.entry_id} ({key.label()}) exists with {writer.n_rows}x{writer.dim} rows, "
                f"expected {n_rows}x{dim}; remove it with `fedcache store rm {key.entry_id} "
                f"{pasted('--store', store.path)}`"
            )
        # Opened again: while this writer queued (--wait), the one before it may have finished the entry.
        fresh = EntryWriter(store, key, store.root[ENTRIES][key.entry_id])
        fresh.replaced = replaced
        pending = fresh.pending(part)
        rows, itemsize = fresh.rows_to_write(pending), np.dtype(key.dtype).itemsize
        need = entry_bytes(rows, 0, dim, itemsize, len(pending))
        if pending:
            disk.check_space(folder, need, what, resumed())

        def left() -> int | None:  # the disk filled after some batches (another process's files): what is still to write
            if not fresh.rows_written:
                return None
            return entry_bytes(rows - fresh.rows_written, 0, dim, itemsize, len(pending) - fresh.chunks_written)

        with disk.on_full_disk(folder, what, need, advice=resumed(), left=left):
            yield fresh


def _made_or_opened(store, key, n_rows, dim, batch_size, attrs, chunk_rows, entry_format, folder, what):
    """The entry's group, made (its whole size checked first) if it does not exist yet."""
    entries = store.root[ENTRIES]
    if key.entry_id in entries:
        return _resumed(entries[key.entry_id], attrs)
    itemsize = np.dtype(key.dtype).itemsize
    rows_per_chunk = chunk_rows or chunk_rows_for(dim, itemsize, batch_size)
    need = entry_bytes(n_rows, n_rows, dim, itemsize, max(1, -(-n_rows // rows_per_chunk)))
    disk.check_space(folder, need, what)
    with disk.on_full_disk(folder, what, need, remove=[folder]):  # half made, it is of no use
        return _create_entry(store, key, n_rows, dim, batch_size, attrs, chunk_rows, entry_format)


# What a writer that resumes an entry records of how it was given to write, though another writer made the entry: a
# run stopped at a bad image is resumed by one given --skip-bad-images, and the command that finishes the entry (or
# extracts another backbone of its images) must say it too, or it stops at that image again. Written under the
# entry's create lock, as a new entry's attributes are, so that writers of other parts do not write over them.
RESUMED_WITH = ("skip_bad_images",)


def _resumed(group: zarr.Group, attrs: dict) -> zarr.Group:
    """The entry's group, with what ``attrs`` say of ``RESUMED_WITH`` recorded where the entry lacks it (a complete
    entry is left as it is: there is nothing left to write, and it may be another user's)."""
    new = {n: attrs[n] for n in RESUMED_WITH if attrs.get(n) and not group.attrs.get(n)}
    if new and not group.attrs.get("complete", False):
        group.attrs.update(new)
    return group


def _entered(held: contextlib.ExitStack, lock: Path, what: str) -> bool:
    """Whether ``lock`` was free, and is now held in ``held``."""
    try:
        held.enter_context(exclusive_lock(lock, what, wait=0.0))
    except EntryLockedError:
        return False
    return True


def resumed() -> str:
    """A full disk's advice to an extraction: its batches are kept (named for its caller: a command, or a call)."""
    return disk.again(kept="the batches written so far are kept, and it continues after them")


BLOCK = 4096  # a small file takes a block of the file system


def entry_bytes(rows: int, new_rows: int, dim: int, itemsize: int, chunks: int) -> int:
    """About what writing ``rows`` of an entry takes on disk: their features and valid flags (the files are sparse
    until written), a new entry's ``new_rows`` labels and ids (written whole when it is made) and its metadata,
    and per chunk its flag and checksum files."""
    return rows * (dim * itemsize + 1) + new_rows * 16 + chunks * 2 * BLOCK + (8 * BLOCK if new_rows else 0)
