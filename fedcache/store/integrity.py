"""Per-chunk checksums: what a reader gets is what the writer wrote, or a named, damaged entry.

Each writer computes a CRC-32 of every chunk of every row array as it writes it (of the bytes in
the array's stored dtype, before compression) into the entry's ``chunk_crc32`` array; completion
copies them into the entry's attributes. A reader recomputes them over what it decoded, so a deleted
chunk (Zarr reads it as fill values), a chunk copied from another entry or a corrupt one (a Zstd error,
or bytes that decode to other values) is detected, and the entry named. Checksumming what was decoded
costs one CRC pass over memory already read (docs/performance.md measures it); it needs no
second read of the files.
"""
from __future__ import annotations

import zlib
from typing import Mapping

import numpy as np

ROW_ARRAYS = ("features", "labels", "ids", "valid")
CRC_ARRAY = "chunk_crc32"  # (n_chunks, len(ROW_ARRAYS)) uint32, written before a chunk's ``done`` flag
CRC_ATTR = "crc32"  # {array name: [crc of chunk 0, 1, ...]}, written at completion


def crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1))


def chunk_crcs(rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """The checksums of one chunk's rows of each array, in ROW_ARRAYS order."""
    return np.array([crc(rows[name]) for name in ROW_ARRAYS], dtype=np.uint32)


def as_attr(table: np.ndarray) -> dict[str, list[int]]:
    return {name: [int(v) for v in table[:, j]] for j, name in enumerate(ROW_ARRAYS)}


def mismatches(arrays: Mapping[str, np.ndarray], expected: Mapping[str, list[int]], chunk_rows: int) -> list[str]:
    """'array chunk c' for every chunk whose decoded bytes do not have the recorded checksum."""
    if not isinstance(expected, Mapping):
        return ["the checksums themselves (unreadable)"]
    bad = []
    for name in ROW_ARRAYS:
        want = expected.get(name)
        a = arrays[name]
        n_chunks = max(1, -(-len(a) // chunk_rows))
        if not isinstance(want, list) or len(want) != n_chunks:
            bad.append(f"{name} (no checksums for its {n_chunks} chunks)")
            continue
        bad += [f"{name} chunk {c}" for c in range(n_chunks) if crc(a[c * chunk_rows:(c + 1) * chunk_rows]) != want[c]]
    return bad
