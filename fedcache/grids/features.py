"""The features a grid's cells share: written once as .npy files and memory-mapped by every worker, so the
page cache holds one copy however many cells and workers read them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedcache import disk
from fedcache.errors import ConfigError, DamagedFileError
from fedcache.grids.spec import GridSpec

WHAT = "the grid's shared features"

_AGAIN = "delete the folder {} and run the grid again, which writes the features again"

def write_features(spec: GridSpec) -> Path:
    """The fused train/test tables as .npy files (float32, row-major) plus their metadata, written once."""
    from fedcache.federate.tables import load_fused, split_rows
    from fedcache.store.feature_store import FeatureStore

    folder = spec.features_folder
    store = FeatureStore(spec.store, create=False)
    if (folder / "meta.json").exists():
        _check_same_entries(store, spec, disk.read_json(folder / "meta.json", _AGAIN.format(folder)))
        return folder
    rows = split_rows(store, spec.dataset, spec.backbones)
    need = features_bytes(rows)
    try:
        disk.check_space(folder / "train_features.npy", need, WHAT)  # before the features are read or a byte written
    except BaseException:
        for r in (r for parts in rows.values() for r in parts):
            r.close()
        raise
    folder.mkdir(parents=True, exist_ok=True)
    meta = {}
    with disk.on_full_disk(folder, WHAT, need, remove=[folder]):  # a part of them is of no use to any cell
        for split in ("train", "test"):
            t = load_fused(store, spec.dataset, spec.backbones, split, parts=rows[split])
            for name in ("features", "labels", "ids", "domains"):
                arr = getattr(t, name)
                _save(folder / f"{split}_{name}.npy", np.ascontiguousarray(arr, np.float32 if name == "features" else arr.dtype))
            meta[split] = {"domain_names": list(t.domain_names), "class_names": list(t.class_names),
                           "random_weights": bool(t.random_weights), "entry_ids": list(t.entry_ids)}
        disk.write_text(folder / "meta.json", json.dumps(meta), WHAT)  # last: its presence means the folder is complete
    return folder


def _save(path: Path, array: np.ndarray) -> None:
    """``np.save`` a block of rows at a time: a table over a store file's mapping does not stay mapped."""
    from fedcache.store import mapping

    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, np.lib.format.header_data_from_array_1_0(array))
        for block in mapping.blocks(array):
            fh.write(np.ascontiguousarray(block).data)


def features_bytes(rows: dict) -> int:
    """The bytes of the .npy files: per row the fused float32 features and its label, id and domain; from each
    split's rows per backbone (``FeatureStore.split_rows``: their row counts and widths), not their features."""
    total = disk.BLOCK  # meta.json
    for parts in rows.values():
        n, header = len(parts[0]), 128
        total += sum(disk.on_disk(header + n * size) for size in (4 * sum(p.dim for p in parts), 8, 8, 2))
    return total


def _check_same_entries(store, spec: GridSpec, meta: dict) -> None:
    """Finished cells were trained on the saved features: a re-extraction since then must not mix in. Compared with
    the entries a read takes now (``table_entries``), as the features were read, not with every entry ``find`` finds."""
    saved = {e for split in ("train", "test") for e in meta[split]["entry_ids"]}
    current = {e.entry_id for split in ("train", "test") for b in spec.backbones
               for e in store.table_entries(spec.dataset, split, b)}
    if saved != current:
        raise ConfigError(f"the store's features of {spec.dataset} changed since the grid in {spec.out} started "
                          f"(re-extracted?); run the grid with another {spec.names.to_change('out')}")


def read_features(folder: Path):
    """The shared tables, the features memory-mapped (``store.mapping.map_npy``): pages are shared between
    workers, a cell reads its rows without keeping the file mapped, and the arrays are read-only."""
    from fedcache.store import mapping
    from fedcache.store.feature_store import FeatureTable

    meta = disk.read_json(folder / "meta.json", _AGAIN.format(folder))
    tables = []
    for split in ("train", "test"):
        path = {n: folder / f"{split}_{n}.npy" for n in ("features", "labels", "ids", "domains")}
        arrays = {n: _array(p, mapping.map_npy if n == "features" else np.load, folder) for n, p in path.items()}
        if len({len(a) for a in arrays.values()}) > 1:  # each file whole, yet not of one table (one replaced by hand)
            rows = ", ".join(f"{path[n].name} {len(a)}" for n, a in arrays.items())
            raise DamagedFileError(folder, f"its {split} arrays differ in rows ({rows})", _AGAIN.format(folder))
        m = meta[split]
        tables.append(FeatureTable(**arrays, domain_names=tuple(m["domain_names"]), class_names=tuple(m["class_names"]),
                                   random_weights=m["random_weights"], entry_ids=tuple(m["entry_ids"])))
    return tuple(tables)


def _array(path: Path, load, folder: Path) -> np.ndarray:
    """One of the features' .npy files; one cut short (a crash as it was written, a full disk) or missing is one line
    naming it and the way on, where numpy's ValueError was a traceback on every run of the grid."""
    try:
        return load(path)
    except FileNotFoundError:
        raise DamagedFileError(path, "missing", _AGAIN.format(folder)) from None
    except ValueError as exc:
        raise DamagedFileError(path, f"cut short or not a .npy file ({exc})", _AGAIN.format(folder)) from None


_TABLES: dict[str, tuple] = {}  # per worker process: the memory-mapped features, opened once


def tables_of(folder: Path):
    """The grid's shared features, read once per process."""
    key = str(folder)
    if key not in _TABLES:
        _TABLES[key] = read_features(folder)
    return _TABLES[key]
