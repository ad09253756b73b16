"""Export a dataset's features to one HDF5 or NPZ file (`fedcache store export`), in the layout an import reads
(fedcache/store/interchange.py).

The file is written beside its name and renamed: a failed export leaves no part of a file, and an older file of
that name as it was. A write that fails (a full disk, a quota, a file-size limit) is one error line.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from fedcache import disk, interrupts
from fedcache.errors import ConfigError, DiskFullError, StoreError
from fedcache.paths import refused_in
from fedcache.store.feature_store import FeatureTable
from fedcache.store.locks import exclusive_lock
from fedcache.wording import did_you_mean

GZIP_LEVEL = 4  # h5py's default gzip level, named so that the size estimate compresses as the writer does
WHAT, ADVICE = "the export", "free some space or choose another --out"


def export_tables(tables: dict[str, FeatureTable], path: Path, fmt: str, overwrite: bool = False) -> None:
    """Write the tables (split -> table) to ``path`` in ``fmt`` (h5 or npz): the whole file, or nothing of it. A file
    already there is replaced only with ``overwrite``."""
    fmt, path = check_format(fmt), Path(path)
    check_target(path, overwrite)  # first: the lock's file would be made in a folder that is not there
    # One export to a path at a time: two wrote one partial file together, the first renamed it into place (said
    # as its own, whatever it then held) and the second failed with "No such file or directory".
    with exclusive_lock(path.with_name(f".{path.name}.lock"), f"{path}", transient=True,
                        advice="wait for that export to finish, or choose another --out"):
        check_target(path, overwrite)  # again: one that finished while this export read the store made the file
        _write(tables, path, fmt)


def _write(tables: dict[str, FeatureTable], path: Path, fmt: str) -> None:
    arrays, meta = _arrays(tables), _meta(tables)
    need = estimate_size(arrays, fmt)
    disk.check_space(path, need, WHAT, ADVICE)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with disk.on_full_disk(path, WHAT, need, remove=[tmp], advice=ADVICE):
            _FORMATS[fmt].write(tmp, arrays, meta)
            os.replace(tmp, path)
    except DiskFullError:
        raise
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; choose another --out") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _arrays(tables: dict[str, FeatureTable]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for split, t in tables.items():
        arrays.update({f"{split}/features": t.features, f"{split}/labels": t.labels,
                       f"{split}/domains": t.domains.astype(np.int64), f"{split}/ids": t.ids})
    return arrays


def _meta(tables: dict[str, FeatureTable]) -> dict[str, str]:
    first = next(iter(tables.values()))
    return {"classes": json.dumps(list(first.class_names)), "domains": json.dumps(list(first.domain_names)),
            "random_weights": json.dumps(first.random_weights)}


def check_format(fmt: str) -> str:
    if fmt not in _FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(_FORMATS)}, got {fmt!r}{did_you_mean(fmt, _FORMATS)}")
    return fmt


def check_target(path: Path, overwrite: bool) -> None:
    """Refuse a ``path`` the export cannot write, or one it would replace unasked (before the store is read, which
    takes a while for a large dataset)."""
    path = Path(path)
    _check_writable(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists; pass --overwrite to replace it, or choose another --out")


def _check_writable(path: Path) -> None:
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"cannot write {path}: {parent} is a file, not a directory; choose another --out")
    if not parent.is_dir():
        raise ConfigError(f"cannot write {path}: the directory {parent} does not exist; create it or choose another --out")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"cannot write {path}: the directory {parent} is not writable; choose another --out")
    if problem := refused_in(parent, str(path)):
        raise ConfigError(f"cannot write {path}: {problem}; choose another --out")
    if path.is_dir():
        raise ConfigError(f"cannot write {path}: it is a directory; name a file (.h5 or .npz) with --out")


# ---- the size of the file, before writing it -----------------------------------------------------------------
SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 64 << 10


def estimate_size(arrays: dict[str, np.ndarray], fmt: str) -> int:
    """About the bytes the file takes: each array the writer compresses, compressed as a sample of its rows
    compresses (``SAMPLE_BLOCKS`` blocks spread over it, at the writer's zlib level). Features after a ReLU are
    mostly zeros and shrink 3x, CLIP's barely: taking them all as incompressible refused exports that fit."""
    return sum(disk.on_disk(_stored_size(a, _level(fmt, a))) for a in arrays.values()) + 4 * disk.BLOCK


def _level(fmt: str, arr: np.ndarray) -> int | None:
    """The zlib level the writer deflates ``arr`` at; None where it stores the bytes as they are."""
    return _FORMATS[fmt].level(arr)


def _npz_level(arr: np.ndarray) -> int:
    return zlib.Z_DEFAULT_COMPRESSION  # np.savez_compressed deflates every array at zlib's default level


def _h5_level(arr: np.ndarray) -> int | None:
    return GZIP_LEVEL if arr.ndim == 2 else None  # the features; labels, domains and ids are small


def _stored_size(arr: np.ndarray, level: int | None) -> int:
    if level is None or arr.nbytes == 0:
        return arr.nbytes
    rows = max(1, SAMPLE_BYTES // arr[:1].nbytes)
    starts = np.unique(np.linspace(0, max(len(arr) - rows, 0), min(SAMPLE_BLOCKS, -(-len(arr) // rows))).astype(int))
    blocks = [np.ascontiguousarray(arr[s:s + rows]) for s in starts]
    ratio = sum(len(zlib.compress(b, level)) for b in blocks) / sum(b.nbytes for b in blocks)
    return int(arr.nbytes * ratio)


# ---- the writers -------------------------------------------------------------------------------------------
def _write_npz(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    flat = {k.replace("/", "__"): v for k, v in arrays.items()}
    with open(path, "wb") as fh:  # a file object: numpy would append ".npz" to any other name
        np.savez_compressed(fh, **flat, **{k: np.array(v) for k, v in meta.items()})


SLAB = 64 << 20  # bytes of rows handed to HDF5 at once: after a failed write, at most about this much is held in memory


def _write_h5(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    import h5py

    with _Sink(path) as sink:
        with h5py.File(sink, "w") as f:
            for name, arr in arrays.items():
                _write_dataset(f, name, arr, sink)
            f.attrs.update(meta)
        sink.raise_kept()  # only now: HDF5 has let go of the file and of every dataset in it


def _write_dataset(f, name: str, arr: np.ndarray, sink: _Sink) -> None:
    level = _level("h5", arr)
    gzip = {"compression": "gzip", "compression_opts": level} if level is not None else {}
    ds = f.create_dataset(name, shape=arr.shape, dtype=arr.dtype, **gzip)
    # Whole rows of chunks at a time: a chunk cut between two writes would be read back to be finished.
    per_chunk = ds.chunks[0] if ds.chunks else 1
    step = max(1, SLAB // max(1, arr[:per_chunk].nbytes)) * per_chunk
    for lo in range(0, len(arr), step):
        if sink.stopped:
            return
        ds[lo:lo + step] = arr[lo:lo + step]


class _Sink:
    """The file h5py writes through (its file-object driver), which never lets one of HDF5's writes fail: HDF5 2.0
    takes the process down once one did (a segfault as it closes the file, or later, as the dataset is freed). The
    first error is kept, what HDF5 writes after it is held in memory (where a read finds it), the writer stops at
    its next block, and ``raise_kept`` raises the error once HDF5 has closed the file.

    For the same reason SIGINT and SIGTERM (Ctrl-C, a scheduler's kill) wait while it is open: their
    KeyboardInterrupt, raised inside one of these calls from HDF5, would be a failed write. The writer stops at its
    next block instead, and the signal is raised again once the file is closed."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, disk.FILE_MODE)
        self.pos = self.size = 0
        self.error: OSError | None = None
        self.held: list[tuple[int, bytes]] = []
        self.signals: list[int] = []
        self._holding = interrupts.held()

    def __enter__(self) -> _Sink:
        self.signals = self._holding.__enter__()
        return self

    def __exit__(self, kind, *exc) -> None:
        try:
            os.close(self.fd)
        finally:
            self._holding.__exit__(None, None, None)  # each held signal raised again, to its own handler
        if self.signals and kind is None:  # a handler that did not raise: the file is cut short all the same
            raise StoreError(f"the export was stopped by {signal.Signals(self.signals[0]).name} before it was "
                             "complete; run it again")

    @property
    def stopped(self) -> bool:
        return self.error is not None or bool(self.signals)

    @contextlib.contextmanager
    def _keeping(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            self.error = self.error or exc

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = offset + {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        if self.error is None:
            with self._keeping():
                os.lseek(self.fd, self.pos, os.SEEK_SET)
                disk.write_all(self.fd, data)
        if self.error is not None:
            self.held.append((self.pos, bytes(data)))
        self.pos += len(data)
        self.size = max(self.size, self.pos)
        return len(data)

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n < 0 else n
        got = b""
        with self._keeping():
            got = os.pread(self.fd, n, self.pos)
        buf = bytearray(got.ljust(n, b"\0"))
        for at, data in self.held:  # in the order written, a later write over an earlier one
            lo, hi = max(at, self.pos), min(at + len(data), self.pos + n)
            if lo < hi:
                buf[lo - self.pos:hi - self.pos] = data[lo - at:hi - at]
        self.pos += n
        return bytes(buf)

    def truncate(self, size: int) -> int:
        if self.error is None:
            with self._keeping():
                os.ftruncate(self.fd, size)
        self.size = size
        return size

    def flush(self) -> None:
        """Nothing to flush: every write went to the file descriptor (or is held)."""

    def raise_kept(self) -> None:
        if self.error is not None:
            raise self.error.with_traceback(None)


@dataclass(frozen=True)
class _Format:
    write: Callable[[Path, dict[str, np.ndarray], dict[str, str]], None]
    level: Callable[[np.ndarray], int | None]  # the zlib level an array is deflated at (None: stored as it is)


_FORMATS = {"h5": _Format(_write_h5, _h5_level), "npz": _Format(_write_npz, _npz_level)}  # --format's values
