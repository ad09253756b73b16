"""Reading one entry chunk by chunk, each chunk checked against its recorded checksum as it passes.

A reader never holds an entry twice. Format-2 row arrays are single files (fedcache/store/chunks.py):
each chunk's bytes are read with ``pread`` and checksummed, then either copied into their rows of the
caller's array (``fill``) or, when the table is exactly the file (one entry, float32, every row valid),
the file is memory-mapped and *is* the table (``mapped``): the features stay in the page cache, shared
by every process reading them. Format-1 arrays (zstd chunks) are read through Zarr, a block of chunks
per call. A damaged chunk (missing, truncated, replaced, corrupt) is noted with its name and the read
goes on, so that one error names every damaged chunk of the entry (``problem``). A file this user may not
read (another user's permissions) is no damage: it is noted apart (``denied``), and said as such.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import zarr

from fedcache.paths import denied_problem, is_denied
from fedcache.store.chunks import ChunkError, OpenRows, RawMeta, RowFile
from fedcache.store.integrity import CHECKSUM_ATTR, CHECKSUMS, FORMAT_1_CHECKSUM, ROW_ARRAYS, as_bytes, expected_table

ZARR_BLOCK_BYTES = 64 * 1024 * 1024  # decoded bytes per Zarr call when reading format-1 chunks
SHOWN = 6  # damaged chunks named in one message


class _ZarrChunks:
    """Chunks of an array read through Zarr (any codec), a block of chunks per call to amortise its overhead."""

    def __init__(self, array: zarr.Array, chunk_rows: int) -> None:
        self.array, self.chunk_rows = array, chunk_rows
        row_bytes = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize
        self.per_block = max(1, ZARR_BLOCK_BYTES // max(1, chunk_rows * row_bytes))
        self._block: tuple[int, np.ndarray | None] = (-1, None)

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        c = lo // self.chunk_rows
        b, span = c // self.per_block, self.per_block * self.chunk_rows
        if self._block[0] != b:
            self._block = (b, None)
            try:
                self._block = (b, self.array[b * span:(b + 1) * span])
            except Exception:  # a corrupt chunk in the block: read them one by one to name it
                pass
        block = self._block[1]
        if block is None:
            try:
                rows = self.array[lo:hi]
            except Exception as exc:  # Zstd, Zarr or json errors of one chunk
                if is_denied(exc):  # a chunk file this user may not read is not damaged (EntryReader.denied)
                    raise
                raise ChunkError(f"cannot be decoded ({type(exc).__name__}: {exc})") from None
        else:
            rows = block[lo - b * span:hi - b * span]
        return rows, rows


class _FileRows:
    """A format-2 row array: its one file, read a chunk of rows at a time."""

    def __init__(self, opened: OpenRows) -> None:
        self.opened = opened

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, bytes]:
        data = self.opened.read(lo, hi)
        return self.opened.array(data, lo, hi), data


class EntryReader:
    """The chunks of one complete entry, checked as they are read (``check=False``: not checked)."""

    def __init__(self, group: zarr.Group, path: Path, info, check: bool = True) -> None:
        self.group, self.path, self.info = group, Path(path), info
        self.chunk_rows = int(info.attrs.get("chunk_rows", 1))
        self.n_chunks = max(1, -(-info.n_rows // self.chunk_rows))
        self.checksum = CHECKSUMS.get(info.attrs.get(CHECKSUM_ATTR, FORMAT_1_CHECKSUM))
        self.expected, self.bad = expected_table(info.attrs, self.n_chunks) if check else (None, [])
        self.unreadable: str | None = None  # an array whose metadata or file as a whole cannot be read
        self.denied: str | None = None  # a file this user may not read (another user's permissions): no damage
        self._sources: dict[str, _FileRows | _ZarrChunks | None] = {}

    @property
    def problem(self) -> str | None:
        """What is wrong with what was read so far, in one line (None: nothing)."""
        if self.denied:
            return self.denied
        if self.unreadable or not self.bad:
            return self.unreadable
        shown = ", ".join(self.bad[:SHOWN]) + (f" and {len(self.bad) - SHOWN} more" if len(self.bad) > SHOWN else "")
        return f"{shown} do not hold what was written (a chunk file deleted, truncated, replaced or corrupted)"

    def close(self) -> None:
        for s in self._sources.values():
            if isinstance(s, _FileRows):
                s.opened.close()

    # ---- arrays ------------------------------------------------------------------------------
    def source(self, name: str) -> _FileRows | _ZarrChunks | None:
        """The array ``name``; None (and ``unreadable`` says why) when its metadata or its file cannot be read."""
        if name not in self._sources:
            try:
                self._sources[name] = self._open(name)
            except Exception as exc:  # a damaged or deleted zarr.json or file: json, Zarr or OS errors
                self._sources[name] = None
                if not self._refused(exc):
                    self.unreadable = self.unreadable or f"its {name} cannot be read ({type(exc).__name__}: {exc})"
        return self._sources[name]

    def _refused(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a permission this user lacks (then noted in ``denied``), not damage."""
        if is_denied(exc):
            self.denied = self.denied or denied_problem(exc)[1]
        return is_denied(exc)

    def _open(self, name: str) -> _FileRows | _ZarrChunks:
        meta = RawMeta.open(self.path / name)
        if meta is not None and meta.chunk_rows < meta.shape[0]:
            meta = None  # uncompressed but in several chunks: Zarr reads it
        array = None if meta is not None else self.group[name]
        shape = tuple(meta.shape if meta is not None else array.shape)
        want = (self.info.n_rows, self.info.dim) if name == "features" else (self.info.n_rows,)
        if shape != want:
            raise ValueError(f"its shape is {shape}, not {want}")
        if meta is None:
            return _ZarrChunks(array, self.chunk_rows)
        opened = RowFile(meta).open()
        if opened.problem:
            opened.close()
            raise ValueError(opened.problem)
        return _FileRows(opened)

    # ---- chunks ------------------------------------------------------------------------------
    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.chunk_rows, min(self.info.n_rows, (c + 1) * self.chunk_rows)

    def chunk(self, name: str, c: int) -> np.ndarray | None:
        """The rows of chunk ``c`` of ``name`` (read-only), or None when it is damaged (then noted)."""
        lo, hi = self.chunk_range(c)
        source = self.source(name)
        if source is None:
            return None
        try:
            rows, data = source.read(lo, hi) if hi > lo else (None, b"")
        except ChunkError as exc:
            self.bad.append(f"{name} chunk {c} ({exc})")
            return None
        except OSError as exc:  # a format-1 chunk file this user may not read
            if not self._refused(exc):
                raise
            return None
        if self.expected is not None and int(self.checksum(as_bytes(data))) != self.expected[name][c]:
            self.bad.append(f"{name} chunk {c}")
            return None
        return rows

    def column(self, name: str) -> np.ndarray:
        """A whole small array (labels, ids, valid); a damaged chunk reads as zeros (and is noted)."""
        dtype = {"labels": np.int64, "ids": np.int64, "valid": bool}[name]
        out = np.zeros(self.info.n_rows, dtype)
        for c in range(self.n_chunks):
            rows = self.chunk(name, c)
            if rows is not None:
                lo, hi = self.chunk_range(c)
                out[lo:hi] = rows
        return out

    def scan(self, names: tuple[str, ...] = ROW_ARRAYS) -> None:
        """Check every chunk of the arrays without keeping them (``store verify``)."""
        for name in names:
            for c in range(self.n_chunks):
                self.chunk(name, c)

    def mapped(self, name: str, dtype: np.dtype) -> np.ndarray | None:
        """The whole array over the page cache, once every chunk is checked; None when it is not one file
        of ``dtype`` (a format-1 array, float16 features) or is damaged."""
        source = self.source(name)
        if not isinstance(source, _FileRows) or source.opened.meta.dtype != dtype:
            return None
        self.scan((name,))
        return None if self.problem else source.opened.mapped()

    def feature_chunks(self, valid: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(first valid row of the chunk among the entry's valid rows, its valid rows), damaged chunks left out."""
        start = 0
        for c in range(self.n_chunks):
            lo, hi = self.chunk_range(c)
            keep = valid[lo:hi]
            n = int(np.count_nonzero(keep))
            rows = self.chunk("features", c) if hi > lo else None
            if rows is not None and n:
                yield start, rows if n == hi - lo else rows[keep]
            start += n


def fill(readers: list[tuple[EntryReader, np.ndarray, int]], out: np.ndarray, at: np.ndarray | None = None) -> None:
    """Each entry's valid feature rows into ``out``: the entry's valid row ``i`` (its ``offset`` + i among
    the table's rows) goes to ``out[offset + i]``, or to ``out[at[offset + i]]`` (skipped where -1).
    Stops after an entry with a damaged chunk (its reader's ``problem`` says which)."""
    for reader, valid, offset in readers:
        for start, rows in reader.feature_chunks(valid):
            lo = offset + start
            hi = lo + len(rows)
            if at is None:
                out[lo:hi] = rows
                continue
            dest = at[lo:hi]
            if dest[0] >= 0 and dest[-1] - dest[0] == hi - lo - 1 and np.array_equal(dest, np.arange(dest[0], dest[0] + hi - lo)):
                out[dest[0]:dest[0] + hi - lo] = rows  # rows in the same order: a block copy
            else:
                keep = dest >= 0
                out[dest[keep]] = rows[keep]
        if reader.problem:
            return
