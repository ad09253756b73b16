"""Per-chunk checksums: what a reader gets is what the writer wrote, or a named, damaged entry.

Each writer computes a checksum of every chunk of every row array as it writes it (of the bytes in
the array's stored dtype, before any compression) into the entry's ``chunk_crc32`` array; completion
copies them into the entry's attributes. A reader recomputes them over the bytes it reads, chunk by
chunk as each passes on its way into the caller's array, so a deleted chunk, a chunk copied from another
entry, a truncated or a corrupt one is detected and the entry named, at the cost of one checksum pass
over bytes already in the CPU's caches (docs/performance.md measures it); it needs no second
read and no second copy.

Format-2 entries use CRC-32C (Castagnoli, computed in hardware by ``google_crc32c``, a dependency of
Zarr v3) and say so in their ``checksum`` attribute; format-1 entries, which have no such attribute,
used zlib's CRC-32 and are still checked with it.
"""
from __future__ import annotations

import zlib
from typing import Callable, Mapping

import google_crc32c
import numpy as np

from fedcache.registry import Registry

ROW_ARRAYS = ("features", "labels", "ids", "valid")
CRC_ARRAY = "chunk_crc32"  # (n_chunks, len(ROW_ARRAYS)) uint32, written before a chunk's ``done`` flag
CRC_ATTR = "crc32"  # {array name: [checksum of chunk 0, 1, ...]}, written at completion
CHECKSUM_ATTR = "checksum"  # the algorithm of an entry's checksums; absent: FORMAT_1_CHECKSUM
FORMAT_1_CHECKSUM = "crc32"

# (bytes, start) -> checksum: ``start`` the checksum of the bytes before them (0: none), so that a chunk written a
# batch at a time gets the checksum of its whole bytes.
Checksum = Callable[..., int]
CHECKSUMS: Registry[Checksum] = Registry("checksum")
CHECKSUMS.add("crc32", zlib.crc32)


def _crc32c(data: bytes, start: int = 0) -> int:
    # google_crc32c takes bytes only (it refuses buffers that could change while it runs without the GIL).
    return google_crc32c.extend(start, data) if start else google_crc32c.value(data)


CHECKSUMS.add("crc32c", _crc32c)


def as_bytes(a: np.ndarray | bytes) -> bytes:
    return a if isinstance(a, bytes) else np.ascontiguousarray(a).tobytes()


def crc(a: np.ndarray | bytes, algorithm: str = FORMAT_1_CHECKSUM) -> int:
    return int(CHECKSUMS.get(algorithm)(as_bytes(a)))


def chunk_crcs(rows: Mapping[str, np.ndarray | bytes], algorithm: str = FORMAT_1_CHECKSUM,
               start: np.ndarray | None = None) -> np.ndarray:
    """The checksums of one chunk's rows of each array, in ROW_ARRAYS order; ``start``: those of the chunk's rows
    before them (its rows written so far)."""
    first = np.zeros(len(ROW_ARRAYS), np.uint32) if start is None else start
    checksum = CHECKSUMS.get(algorithm)
    return np.array([checksum(as_bytes(rows[name]), int(s)) for name, s in zip(ROW_ARRAYS, first)], dtype=np.uint32)


def as_attr(table: np.ndarray) -> dict[str, list[int]]:
    return {name: [int(v) for v in table[:, j]] for j, name in enumerate(ROW_ARRAYS)}


def expected_table(attrs: Mapping, n_chunks: int) -> tuple[dict[str, list[int]] | None, list[str]]:
    """The recorded checksums of a complete entry (None: written before checksums existed) and what is
    wrong with them ('features (no checksums for its 3 chunks)', ...)."""
    if CRC_ATTR not in attrs:
        return None, []
    table = attrs[CRC_ATTR]
    if not isinstance(table, Mapping):
        return None, ["the checksums themselves (unreadable)"]
    bad = [f"{name} (no checksums for its {n_chunks} chunks)" for name in ROW_ARRAYS
           if not isinstance(table.get(name), list) or len(table[name]) != n_chunks]
    return dict(table), bad
