"""Reading an .h5 / .npz of your own embeddings, every field checked before anything is written.

Nothing is truncated, coerced or dropped: a field that does not hold exactly what the layout
(docs/store.md) asks for is refused with one ConfigError naming the file, the field and the fix.

The features are never copied whole: an uncompressed member of an .npz or a contiguous, uncompressed
HDF5 dataset is memory-mapped (its bytes stay in the page cache), any other is read once, and they are
checked block by block; the writer converts them to float32 chunk by chunk as it writes.
"""
from __future__ import annotations

import json
import logging
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcache.errors import ConfigError, InputNotFoundError

log = logging.getLogger(__name__)

FIELDS = ("features", "labels", "domains", "ids")
META = ("classes", "domains", "random_weights")
SPLIT_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_INT64_MAX = np.iinfo(np.int64).max


@dataclass
class Split:
    features: np.ndarray  # (N, D) real numbers, finite in float32 (possibly memory-mapped, read-only)
    labels: np.ndarray  # (N,) int64 in [0, len(classes))
    domains: np.ndarray  # (N,) int64 in [0, len(domain_names))
    ids: np.ndarray  # (N,) int64, unique within a domain


@dataclass
class Checked:
    splits: dict[str, Split]
    classes: list[str]
    domain_names: list[str]
    random_weights: bool


def read_checked(path: Path, split: str | None) -> Checked:
    """The file's splits and metadata, checked; ConfigError on anything it would have to guess or change."""
    path = Path(path)
    arrays, meta = _read(path)
    raw = _name_splits(_group_splits(arrays, path), split, path)
    splits = {name: _check_split(fields, f"{path}: {_where(name)}") for name, fields in raw.items()}
    widths = {s.features.shape[1] for s in splits.values()}
    if len(widths) > 1:
        raise ConfigError(f"{path}: the splits' features have different widths {sorted(widths)}; every split must come "
                          "from the same encoder (one width)")
    classes = _names(meta, "classes", path, 1 + max(int(s.labels.max()) for s in splits.values()))
    domains = _names(meta, "domains", path, 1 + max(int(s.domains.max()) for s in splits.values()), "domain")
    for name, s in splits.items():
        _in_range(s.labels, len(classes), f"{path}: {_where(name)}: labels", "'classes' lists only")
        _in_range(s.domains, len(domains), f"{path}: {_where(name)}: domains", "'domains' names only")
        _unique_ids(s, f"{path}: {_where(name)}")
    unknown = sorted(set(meta) - set(META))
    if unknown:  # other tools add their own attributes; said, not silently dropped
        log.warning("%s: ignoring attributes %s (fedcache reads %s)", path, unknown, ", ".join(META))
    return Checked(splits, classes, domains, _flag(meta, "random_weights", path))


# ---- files -------------------------------------------------------------------------------
def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    if path.is_dir():  # "no such file" said of a folder that is there
        raise ConfigError(f"{path} is a folder; give an .h5/.hdf5 or .npz file")
    if not path.is_file():
        raise InputNotFoundError(f"no such file: {path}")
    read = _READERS.get(path.suffix)
    if read is None:
        raise ConfigError(f"{path}: expected an .h5/.hdf5 or .npz file")
    if path.stat().st_size == 0:
        raise ConfigError(f"{path} is empty (0 bytes): write the file again (see docs/store.md for its layout)")
    try:
        return read(path)
    except ConfigError:
        raise
    except Exception as exc:  # h5py, zipfile and numpy raise many types for a damaged file
        raise ConfigError(f"{path} cannot be read ({type(exc).__name__}: {exc}); write the file again") from None


def _read_h5(path: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    import h5py

    if not h5py.is_hdf5(path):
        raise ConfigError(f"{path} is not an HDF5 file; write it with h5py (or save an .npz with numpy)")
    arrays: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, _h5_array(path, obj)) if isinstance(obj, h5py.Dataset) else None)
        meta = {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    # Names written as h5py writes a list of strings (an attribute f.attrs["classes"] = [...], or a dataset of
    # strings), as readily as the JSON string; a flat file's integer `domains` dataset stays its rows' domains.
    for k in NAME_LISTS:
        if k in meta and (names := _strings(np.asarray(meta[k]))) is not None:
            meta[k] = json.dumps(names)
        if k in arrays and (names := _strings(arrays[k])) is not None:
            if k in meta:
                raise ConfigError(f"{path}: {k!r} is both an attribute and a dataset; keep one of them")
            meta[k] = json.dumps(names)
            del arrays[k]
    return arrays, meta


def _strings(a: np.ndarray) -> list[str] | None:
    """A 1-D array of text (str, or bytes read back from HDF5) as a list of str; None for anything else."""
    if a.ndim != 1 or not (a.dtype.kind in "SU" or len(a) and all(isinstance(x, (bytes, str)) for x in a)):
        return None
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in a]


def _h5_array(path: Path, ds) -> np.ndarray:
    """A contiguous, unfiltered numeric dataset memory-mapped where it lies in the file; any other read."""
    offset = ds.id.get_offset() if ds.chunks is None and ds.size and ds.dtype.kind in "fiu" else None
    if offset is None or ds.dtype.byteorder not in "=|<":
        return ds[()]
    return np.memmap(path, ds.dtype, mode="r", offset=offset, shape=ds.shape)


NAME_LISTS = ("domains", "classes")  # file-level metadata that names things, one name per index


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{path} is not an .npz file (a zip archive); save it with numpy.savez")
    items = {}
    # allow_pickle=False: an .npz from elsewhere must never run code when read.
    with np.load(path, allow_pickle=False) as z, zipfile.ZipFile(path) as zf:
        for k in z.files:
            try:
                mapped = _npz_mapped(path, zf, k) if k == "features" or k.endswith("__features") else None
                items[k] = z[k] if mapped is None else mapped
            except ValueError as exc:
                raise ConfigError(f"{path}: array {k!r} cannot be read without unpickling ({exc}); save plain numeric "
                                  "arrays (and the names as JSON strings)") from None
    meta = {k: (str(v) if v.dtype.kind in "US" else v) for k, v in items.items() if v.ndim == 0}
    # Names saved as an array of strings (np.array(["photo", "sketch"])), as readily as the JSON string.
    meta.update({k: json.dumps(names) for k, v in items.items() if k in NAME_LISTS and (names := _strings(v)) is not None})
    arrays = {k.replace("__", "/"): v for k, v in items.items() if v.ndim > 0 and k not in meta}
    return arrays, meta


_READERS = {".h5": _read_h5, ".hdf5": _read_h5, ".npz": _read_npz}  # by the file's suffix


def _npz_mapped(path: Path, zf: zipfile.ZipFile, key: str) -> np.ndarray | None:
    """An uncompressed member (``np.savez``) memory-mapped where it lies in the zip file; None otherwise.

    The member's .npy bytes start after its local file header: 30 fixed bytes, then the name and the
    extra field, whose lengths are the header's last two 16-bit fields."""
    info = zf.getinfo(f"{key}.npy")
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        return None
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
        if header[:4] != b"PK\x03\x04":
            return None
        fh.seek(info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little"))
        try:
            read = _NPY_HEADERS.get(np.lib.format.read_magic(fh))
            shape, fortran, dtype = read(fh) if read else (None, True, np.dtype(object))
        except ValueError:  # not a plain .npy: numpy's own reader says what is wrong
            return None
        if fortran or dtype.kind not in "fiu" or not shape or not all(shape):
            return None
        return np.memmap(path, dtype, mode="r", offset=fh.tell(), shape=shape)


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _group_splits(arrays: dict[str, np.ndarray], path: Path) -> dict[str, dict[str, np.ndarray]]:
    if not arrays:
        raise ConfigError(f"{path} holds no arrays; it needs 'features' (N, D) and 'labels' (N,) (see docs/store.md)")
    splits: dict[str, dict[str, np.ndarray]] = {}
    for name, arr in arrays.items():
        split, _, field = name.rpartition("/")
        if field not in FIELDS or (split and not SPLIT_NAME.fullmatch(split)):
            raise ConfigError(f"{path}: unknown array {name!r}; a split holds only {', '.join(FIELDS)} "
                              "(as SPLIT/FIELD, e.g. train/features, or flat)")
        splits.setdefault(split, {})[field] = arr
    for split, fields in splits.items():
        if "features" not in fields or "labels" not in fields:
            raise ConfigError(f"{path}: {_where(split)} needs 'features' (N, D) and 'labels' (N,) arrays; "
                              f"found {sorted(fields)}")
    return splits


def _name_splits(splits: dict, split: str | None, path: Path) -> dict:
    if "" not in splits:
        if split is not None:
            raise ConfigError(f"{path} names its splits ({', '.join(splits)}); --split is only for a file with flat "
                              "arrays: leave it out")
        return splits
    if len(splits) > 1:
        raise ConfigError(f"{path} mixes flat arrays with splits ({', '.join(s for s in splits if s)}); "
                          "put every array in a split (train/features, ...) or use flat arrays only")
    if split is None:
        raise ConfigError(f"{path} has flat arrays without a split name; pass --split train or --split test")
    if not SPLIT_NAME.fullmatch(split):
        raise ConfigError(f"--split {split!r}: use a plain name such as train or test")
    return {split: splits[""]}


def _where(split: str) -> str:
    return f"split {split!r}" if split else "the file"


# ---- fields ------------------------------------------------------------------------------
def _check_split(fields: dict[str, np.ndarray], where: str) -> Split:
    feats = _features(fields["features"], where)
    n = len(feats)
    labels = _integers(fields["labels"], n, f"{where}: labels")
    domains = _integers(fields["domains"], n, f"{where}: domains") if "domains" in fields else np.zeros(n, np.int64)
    ids = _integers(fields["ids"], n, f"{where}: ids", signed=True) if "ids" in fields else np.arange(n, dtype=np.int64)
    return Split(feats, labels, domains, ids)


CHECK_BLOCK_ROWS = 8192


def _features(a: np.ndarray, where: str) -> np.ndarray:
    """``a`` itself, once every value is known to be finite in float32 (checked a block of rows at a time,
    so that no copy of the whole array is made)."""
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ConfigError(f"{where}: features must be (N, D) with N >= 1 rows and D >= 1 columns, got shape {a.shape}")
    if a.dtype.kind not in "fiu":
        raise ConfigError(f"{where}: features must be real numbers (float or int), got {a.dtype}; "
                          "complex, boolean, string or object arrays are not features")
    for lo in range(0, len(a), CHECK_BLOCK_ROWS):
        block = a[lo:lo + CHECK_BLOCK_ROWS]
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing cast is what is checked for
            f32 = block.astype(np.float32, copy=False)
        finite = np.isfinite(f32)
        if not finite.all():
            r = int(np.flatnonzero(~finite.all(1))[0])
            value = block[r][~finite[r]][0]
            why = "NaN or infinite" if not np.isfinite(value) else "beyond the float32 range (|x| > 3.4e38) the store keeps"
            raise ConfigError(f"{where}: features hold values {why} (row {lo + r}: {value.item()!r}); the store keeps "
                              "finite float32: fix or rescale them")
    return a


def _integers(a: np.ndarray, n: int, where: str, signed: bool = False) -> np.ndarray:
    if a.ndim != 1:
        hint = " (save it as a 1-D array: a.ravel())" if a.ndim == 2 and a.shape[1:] == (1,) else ""
        raise ConfigError(f"{where} must be a 1-D array (N,), got shape {a.shape}{hint}")
    if len(a) != n:
        raise ConfigError(f"{where} has {len(a)} values for {n} feature rows; give exactly one per row")
    if a.dtype.kind not in "iuf":
        raise ConfigError(f"{where} must be integers, got {a.dtype}")
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.round(a))
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ConfigError(f"{where} must be whole numbers, got {a[r].item()!r} at row {r}; give integer values")
    low = -_INT64_MAX if signed else 0
    if len(a) and (a.min() < low or a.max() > _INT64_MAX):
        r = int(np.argmin(a) if a.min() < low else np.argmax(a))
        need = "within the int64 range" if signed else "non-negative (and within int64)"
        raise ConfigError(f"{where} must be {need}, got {a[r].item()!r} at row {r}")
    return a.astype(np.int64)


def _in_range(values: np.ndarray, n: int, where: str, names: str) -> None:
    if values.max() >= n:
        r = int(np.argmax(values))
        raise ConfigError(f"{where}: {values[r]} at row {r}, but {names} {n}; give a name for every index "
                          "or fix the indices")


def _unique_ids(s: Split, where: str) -> None:
    keys = np.unique(np.stack([s.domains, s.ids]), axis=1)
    if keys.shape[1] != len(s.ids):
        raise ConfigError(f"{where}: ids repeat within a domain ({len(s.ids) - keys.shape[1]} duplicates); "
                          "each row needs its own id (or leave 'ids' out: rows are numbered)")


# ---- metadata ----------------------------------------------------------------------------
def _json(meta: dict, name: str, path: Path):
    text = meta[name]
    if not isinstance(text, str):
        raise ConfigError(f"{path}: attribute {name!r} must be a JSON string, got {type(text).__name__} {text!r}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: attribute {name!r} is not valid JSON ({exc.msg}): {text[:60]!r}") from None


def _names(meta: dict, name: str, path: Path, needed: int, prefix: str = "") -> list[str]:
    if name not in meta:
        if prefix:
            return ["all"] if needed == 1 else [f"{prefix}{d}" for d in range(needed)]
        return [str(c) for c in range(needed)]
    names = _json(meta, name, path)
    if not isinstance(names, list) or not names or not all(isinstance(x, str) and x for x in names):
        raise ConfigError(f"{path}: attribute {name!r} must be a JSON list of non-empty names, got {meta[name][:60]!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: attribute {name!r} repeats a name; each name must be unique")
    return names


def _flag(meta: dict, name: str, path: Path) -> bool:
    if name not in meta:
        return False
    value = _json(meta, name, path)
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: attribute {name!r} must be JSON true or false, got {meta[name]!r}")
    return value
