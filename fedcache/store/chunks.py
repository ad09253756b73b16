"""The files of a format-2 entry's arrays, read and written directly.

Format 2 stores every array uncompressed (Zarr's ``bytes`` codec alone, little-endian). A row array
(features, labels, ids, valid) is one Zarr chunk spanning the whole array, so its file holds the rows
in order, exactly ``n_rows x row bytes``: a writer fills it a checksummed chunk of rows at a time with
``pwrite`` at the rows' offset (writers of disjoint parts share the file), a reader checks it a chunk at
a time with ``pread`` and then memory-maps it, so a table read from one entry is the page cache itself,
not a copy (:class:`RowFile`). The small per-chunk arrays (``done`` flags, checksums) keep one file per
chunk, each written atomically (:class:`ChunkFiles`). Zarr reads all of them as ordinary Zarr v3 arrays;
this module only leaves out Zarr's codec pipeline, whose per-chunk overhead and copies cost more than
the bytes themselves. An array with any other codec is read through Zarr.
"""
from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcache.disk import FILE_MODE
from fedcache.store import mapping

# What Zarr writes for ``compressors=None, filters=None``: one-byte types carry no endianness.
_RAW_CODECS = ([{"name": "bytes", "configuration": {"endian": "little"}}], [{"name": "bytes"}])
_DTYPES = ("bool", "uint8", "uint32", "int64", "float16", "float32")
_KEYS = {"name": "default", "configuration": {"separator": "/"}}


class ChunkError(Exception):
    """Rows whose bytes are missing or cannot be where they should be; the message says which."""


@dataclass(frozen=True)
class RawMeta:
    """An uncompressed array chunked along rows only (whole rows per chunk), as its zarr.json says."""

    path: Path
    shape: tuple[int, ...]
    chunk_rows: int  # rows per Zarr chunk (a RowFile's one chunk spans them all)
    dtype: np.dtype
    fill: object

    @classmethod
    def open(cls, path: Path) -> "RawMeta | None":
        """The array at ``path`` if its metadata says raw row chunks, else None (read it through Zarr)."""
        meta = json.loads((Path(path) / "zarr.json").read_text())
        grid = meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape")
        shape = tuple(meta.get("shape", ()))
        raw = (meta.get("codecs") in _RAW_CODECS and meta.get("data_type") in _DTYPES and grid is not None
               and len(grid) == len(shape) >= 1 and tuple(grid[1:]) == shape[1:] and meta.get("chunk_key_encoding") == _KEYS)
        return cls(Path(path), shape, int(grid[0]), np.dtype(meta["data_type"]), meta.get("fill_value")) if raw else None

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def chunk_path(self, c: int) -> Path:
        return self.path.joinpath("c", str(c), *("0" * (len(self.shape) - 1)))


class RowFile:
    """A row array stored as one file (one Zarr chunk spanning every row)."""

    def __init__(self, meta: RawMeta) -> None:
        if meta.chunk_rows < meta.shape[0]:
            raise ValueError(f"{meta.path} is chunked by {meta.chunk_rows} rows, not stored as one file")
        self.meta = meta
        self.path = meta.chunk_path(0)
        self.n_bytes = meta.shape[0] * meta.row_bytes

    def allocate(self) -> None:
        """The file at full size, every row the fill value, as Zarr reads rows never written: a partial entry
        reads through Zarr as it did in format 1. Zeros cost nothing (a sparse file); labels' and ids' -1 are
        written, 8 bytes a row."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as fh:
            fill = np.full(min(self.meta.shape[0], 1 << 16), self.meta.fill, self.meta.dtype).tobytes()
            if fill.strip(b"\0"):
                for _ in range(self.n_bytes // len(fill)):
                    fh.write(fill)
                fh.write(fill[: self.n_bytes % len(fill)])
            fh.truncate(self.n_bytes)

    def write(self, lo: int, rows: np.ndarray) -> bytes:
        """Write ``rows`` (converted to the stored dtype) from row ``lo``; returns their bytes, to checksum."""
        m = self.meta
        data = np.ascontiguousarray(rows, dtype=m.dtype).tobytes()
        if len(data) != len(rows) * m.row_bytes or lo * m.row_bytes + len(data) > self.n_bytes:
            raise ValueError(f"rows {lo}..{lo + len(rows)} of shape {np.shape(rows)} do not fit {m.path} {m.shape}")
        if not data:
            return data
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
        except FileNotFoundError:  # the first rows written make the folder
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
        try:
            view, offset = memoryview(data), lo * m.row_bytes
            while view:  # pwrite may write less than asked (a signal, a full disk raises)
                done = os.pwrite(fd, view, offset)
                view, offset = view[done:], offset + done
        finally:
            os.close(fd)
        return data

    def open(self) -> "OpenRows":
        """The file, checked for size (ChunkError naming what is wrong)."""
        return OpenRows(self)


class OpenRows:
    """A RowFile opened for reading: rows as bytes (``pread``), or the whole array memory-mapped."""

    def __init__(self, rows: RowFile) -> None:
        self.rows, self.meta = rows, rows.meta
        self.fd: int | None = None  # for close() when the open below raises (a file this user may not read)
        try:
            self.fd = os.open(rows.path, os.O_RDONLY)
        except FileNotFoundError:
            self.fd, self.size = None, 0
        else:
            self.size = os.fstat(self.fd).st_size

    @property
    def problem(self) -> str | None:
        """What is wrong with the file as a whole (missing, longer than its rows), else None."""
        if self.fd is None and self.rows.n_bytes:
            return f"its file {self.rows.path} is missing"
        if self.size > self.rows.n_bytes:
            return f"its file holds {self.size} bytes, more than its {self.meta.shape[0]} rows (replaced?)"
        return None

    def read(self, lo: int, hi: int) -> bytes:
        """The bytes of rows [lo, hi) (ChunkError when the file ends before them)."""
        rb = self.meta.row_bytes
        if self.fd is None or hi * rb > self.size:
            raise ChunkError(f"missing: the file ends at byte {self.size}, before row {hi}")
        data = os.pread(self.fd, (hi - lo) * rb, lo * rb)
        if len(data) != (hi - lo) * rb:
            raise ChunkError(f"missing: a short read at row {lo}")
        return data

    def array(self, data: bytes, lo: int, hi: int) -> np.ndarray:
        return np.frombuffer(data, self.meta.dtype).reshape((hi - lo, *self.meta.shape[1:]))

    def mapped(self) -> np.ndarray:
        """The whole array over the page cache, read-only and registered (``store.mapping``): pages are shared
        with every process mapping the file, and training reads rows out of it without keeping it mapped."""
        if not self.rows.n_bytes:
            return np.zeros(self.meta.shape, self.meta.dtype)
        mm = mmap.mmap(self.fd, self.rows.n_bytes, access=mmap.ACCESS_COPY)
        return mapping.register(mm, np.frombuffer(mm, self.meta.dtype).reshape(self.meta.shape))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.close()


class ChunkFiles:
    """A small array with one file per chunk (``done`` flags, checksums), each written atomically."""

    def __init__(self, meta: RawMeta) -> None:
        self.meta = meta

    def rows(self, c: int) -> tuple[int, int]:
        return c * self.meta.chunk_rows, min(self.meta.shape[0], (c + 1) * self.meta.chunk_rows)

    def read_all(self) -> np.ndarray:
        """Every chunk; a chunk never written reads as the fill value (a flag not yet set)."""
        m = self.meta
        out = np.full(m.shape, m.fill, m.dtype)
        for c in range(-(-m.shape[0] // m.chunk_rows)):
            try:
                data = m.chunk_path(c).read_bytes()
            except FileNotFoundError:
                continue
            if len(data) == m.chunk_rows * m.row_bytes:  # else torn: as if never written (a flag is set again)
                lo, hi = self.rows(c)
                out[lo:hi] = np.frombuffer(data, m.dtype).reshape((m.chunk_rows, *m.shape[1:]))[: hi - lo]
        return out

    def write(self, c: int, rows: np.ndarray) -> None:
        m = self.meta
        lo, hi = self.rows(c)
        full = np.full((m.chunk_rows, *m.shape[1:]), m.fill, m.dtype)  # an edge chunk is stored whole, as Zarr does
        full[: hi - lo] = rows
        write_atomic(m.chunk_path(c), full.tobytes())


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        try:
            fh = open(tmp, "wb", buffering=0)
        except FileNotFoundError:  # the chunk's first write: its folder is made then (a mkdir per chunk costs more)
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(tmp, "wb", buffering=0)
        with fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
