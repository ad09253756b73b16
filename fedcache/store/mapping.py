"""Gathering rows of a memory-mapped feature file without keeping the file mapped.

A table read from one entry is its file memory-mapped (``chunks.OpenRows.mapped``). Reading a row through
the mapping maps the page-cache folio that holds it, and on current kernels a folio of a file read in
large pieces is 2 MB: a round that reads 1% of the rows at random leaves nearly every folio of the file
mapped, and the process's RSS counts all of them, though no byte was copied. ``gather`` copies the rows it
is asked for a region of the file at a time and unmaps each region once copied (``MADV_DONTNEED``: the
pages stay in the page cache, only this process's page-table entries go), so a gather leaves at most its
last region and the folios around it mapped. Other reads (indexing the array itself) map pages as before.
Arrays that are not such a mapping are indexed as they are.

Unmapping a copy-on-write page would drop what was written into it, so registered arrays are read-only.
"""
from __future__ import annotations

import mmap
import weakref
from typing import Iterator

import numpy as np

REGION_BYTES = 32 << 20  # what a gather maps at once: a few page-cache folios, a small share of any table
_FOLIO_BYTES = 2 << 20  # the largest page-cache folio: a row near a region's end can map the folio after it

# start address -> (the mapping, its length). Weak: the arrays over a mapping keep it alive, this does not.
_MAPPED: dict[int, tuple[weakref.ref, int]] = {}


def register(mm: mmap.mmap, array: np.ndarray) -> np.ndarray:
    """Remember that ``array`` (over ``mm``) is a file mapping, so ``gather`` can unmap what it read."""
    if len(mm):
        start = np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
        _MAPPED[start] = (weakref.ref(mm, lambda _: _MAPPED.pop(start, None)), len(mm))
    array.flags.writeable = False
    return array


def map_npy(path) -> np.ndarray:
    """The array of a ``.npy`` file over its memory mapping, registered and read-only; a Fortran-ordered array is
    ``np.load``'s ``mmap_mode="c"`` one, not registered (a gather of its rows would not be rows of the file)."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        if version not in ((1, 0), (2, 0)):  # 3.0: structured dtypes with unicode names, never features
            return np.load(path, mmap_mode="c")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(fh)
        offset = fh.tell()
        count = int(np.prod(shape, dtype=np.int64))
        if fortran or not count:
            return np.load(path, mmap_mode="c") if count else np.zeros(shape, dtype)
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    return register(mm, np.frombuffer(mm, dtype, count, offset).reshape(shape))


def _mapping(array: np.ndarray) -> tuple[mmap.mmap, int] | None:
    """The registered mapping ``array`` lies in and the array's offset in it, else None."""
    return _mapping_at(array.__array_interface__["data"][0], array.nbytes) if array.flags.c_contiguous else None


def _mapping_at(at: int, nbytes: int) -> tuple[mmap.mmap, int] | None:
    for start, (ref, length) in _MAPPED.copy().items():
        mm = ref()
        if mm is not None and start <= at and at + nbytes <= start + length:
            return mm, at - start
    return None


def is_mapped(array: np.ndarray) -> bool:
    return _mapping(array) is not None


def holds(address: int, nbytes: int) -> bool:
    """Whether the ``nbytes`` at ``address`` (a tensor's ``data_ptr()``, say) lie in a registered mapping."""
    return _mapping_at(address, nbytes) is not None


def gather(array: np.ndarray, rows: np.ndarray, region_bytes: int = REGION_BYTES) -> np.ndarray:
    """``array[rows]``; over a registered mapping and for ascending ``rows`` within the array, read a region
    at a time, each region's pages unmapped once its rows are copied."""
    found = _mapping(array)
    rows = np.asarray(rows)
    if (found is None or not len(rows) or rows.ndim != 1 or rows.dtype.kind not in "iu" or rows[0] < 0
            or rows[-1] >= len(array) or (np.diff(rows) < 0).any()):
        return array[rows]
    mm, offset = found
    row_bytes = array.strides[0]
    out = np.empty((len(rows), *array.shape[1:]), array.dtype)
    per = max(1, region_bytes // row_bytes)
    edges = np.searchsorted(rows, np.arange(0, array.shape[0] + per, per))
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi > lo:
            out[lo:hi] = array[rows[lo:hi]]
            _unmap(mm, offset + int(rows[lo]) * row_bytes, offset + (int(rows[hi - 1]) + 1) * row_bytes)
    return out


def blocks(array: np.ndarray, region_bytes: int = REGION_BYTES) -> Iterator[np.ndarray]:
    """``array``'s rows in order, a region at a time; over a registered mapping each block is a copy, and its
    region is unmapped once copied (for writing a whole table out without keeping it mapped)."""
    found = _mapping(array)
    per = max(1, region_bytes // max(1, array.strides[0]))
    for lo in range(0, len(array), per):
        block = array[lo: lo + per]
        if found is not None:
            block = block.copy()
            mm, offset = found
            _unmap(mm, offset + lo * array.strides[0], offset + (lo + len(block)) * array.strides[0])
        yield block


def _unmap(mm: mmap.mmap, lo: int, hi: int) -> None:
    """Drop this process's mapping of bytes [lo, hi) and of the folios around them (the file is untouched)."""
    lo = max(0, (lo - _FOLIO_BYTES) // mmap.PAGESIZE * mmap.PAGESIZE)
    hi = min(len(mm), hi + _FOLIO_BYTES)
    if hi > lo and hasattr(mm, "madvise"):  # not on Windows: the rows stay mapped there
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
