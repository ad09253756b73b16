"""``fedcache reproduce PRESET``: a paper's table as data (datasets, backbones, partitions, methods, rounds,
seeds, reported numbers), checked for what is missing, then extracted, run as grids and reported with the
paper's numbers beside fedcache's. The presets (and their data classes) are in ``fedcache/presets.py``.
"""
from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcache import disk
from fedcache.errors import ConfigError, FedcacheError
from fedcache.paths import GRID, check_outside, writable_dir
from fedcache.presets import PRESETS, Experiment, Preset
from fedcache.wording import count, did_you_mean

log = logging.getLogger(__name__)




# ---- what is missing ---------------------------------------------------------------------------
@dataclass
class Need:
    kind: str  # "dataset", "weights", "method"
    name: str
    ok: bool
    how: str = ""


def check(preset: Preset, store: Path, data_root: Path | None = None, weights: dict | None = None) -> list[Need]:
    """Every dataset, backbone and method the preset needs, and whether this machine has it; the store first."""
    from fedcache.federate.methods import METHODS

    weights = weights or {}
    _check_weights_named(preset, weights)
    needs: list[Need] = [_store_need(Path(store))]
    for m in sorted({m for e in preset.experiments for m in e.methods}):
        needs.append(Need("method", m, m in METHODS, "" if m in METHODS else "not registered in this fedcache version (`fedcache methods` lists what is)"))
    cached: dict[tuple[str, str], bool] = {}  # (store dataset, backbone): the store asked once each, not per experiment
    for e in preset.experiments:
        for b in e.backbones:
            if (e.store_dataset, b) not in cached:
                cached[e.store_dataset, b] = _cached(store, e, b)
        # What the run extracts (_to_extract): a backbone given --weights too, stored or not
        lacking = [b for b in e.backbones if b in weights or not cached[e.store_dataset, b]]
        for b in e.backbones:
            if not any(n.kind == "weights" and n.name == b for n in needs):
                needs.append(_weights_need(b, weights, cached[e.store_dataset, b]))
        if not any(n.kind == "dataset" and n.name == e.store_dataset for n in needs):
            needs.append(_dataset_need(e, lacking, data_root))
    return needs


def _check_weights_named(preset: Preset, weights: dict) -> None:
    """A checkpoint for a backbone the preset does not use would be dropped without a word: the run went on without
    it (a typo of the backbone meant is a known backbone's name as often as not: resnet18-imagenet)."""
    used = sorted({b for e in preset.experiments for b in e.backbones})
    for name in weights:
        if name not in used:
            raise ConfigError(f"--weights {name}=...: {preset.name} uses no backbone {name!r}{did_you_mean(name, used)}; "
                              f"its backbones: {', '.join(used)}")


def _store_need(store: Path) -> Need:
    """The store as the run opens it (or makes it): a file, or a folder of other files (a run's directory), was
    listed as a store lacking every feature, all ok, and the run then refused it."""
    from fedcache.store.feature_store import FeatureStore

    if not store.exists() or (store.is_dir() and not any(store.iterdir())):
        return Need("store", str(store), True, "made by the run")
    try:
        FeatureStore(store, create=False)
    except FedcacheError as exc:
        return Need("store", str(store), False, str(exc))
    return Need("store", str(store), True, "a feature store")


def _cached(store: Path, e: Experiment, backbone: str) -> bool:
    """Whether the store holds rows of ``e``'s train and test features of ``backbone`` as the preset's extraction
    makes them (:func:`_made_by_preset`): their entries found complete and their labels checked
    (``FeatureStore.rows``), not their features, which reading them all took of the check. Damaged features are found
    by the grid's read of them (their checksums), which says what replaces them."""
    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.tables import closed_on_error

    try:
        fs = FeatureStore(store, create=False)
        with fs.between_imports(e.store_dataset, [backbone]):  # both splits found together, as a run finds them
            infos = [fs.table_entries(e.store_dataset, s, backbone) for s in ("train", "test")]
        found = []
        for i in infos:
            with closed_on_error(*found):  # the train rows, where the test's are refused
                found.append(fs.entry_rows(i))
    except FedcacheError:
        return False
    for rows in found:
        rows.close()
    return all(len(rows) for rows in found) and all(_made_by_preset(e, backbone, i) for i in sum(infos, []))


def _made_by_preset(e: Experiment, backbone: str, info) -> bool:
    """Whether entry ``info`` is what the preset's extraction of ``backbone`` makes: an entry's slot is current
    whatever made it, and features of `extract --random-init`, another --dtype or --image-size, a `--weights`
    checkpoint or an import would train the paper's grid without a word. A checkpoint-only backbone's features
    come from a checkpoint whatever makes them: the one stored stands (``--weights`` extracts it again)."""
    from fedcache.extract.backbones import BACKBONES
    from fedcache.extract.datasets import DATASETS
    from fedcache.extract.sizes import image_size

    spec, k, opts = BACKBONES.get(backbone), info.key, e.extract
    size = image_size(opts.get("image_size"), DATASETS.get(e.dataset) if e.dataset in DATASETS else None, spec)
    pre = k.get("preprocess") or {}
    return (k.get("dtype", "float16") == opts.get("dtype", "float16") and pre.get("size") == size
            and not pre.get("imported") and info.random_weights == (spec.random_weights or bool(opts.get("random_init")))
            and (spec.weights == "user-checkpoint" or not info.attrs.get("weights_file")))


def _weights_need(backbone: str, weights: dict, cached: bool) -> Need:
    from fedcache.extract.backbones import BACKBONES

    if backbone not in BACKBONES:
        return Need("weights", backbone, False, "unknown backbone (`fedcache backbones` lists them)")
    spec = BACKBONES.get(backbone)
    if backbone in weights:  # extracted from it whatever the store holds (_to_extract): a path to nothing was "ok"
        path = Path(weights[backbone])
        if not path.is_file():
            return Need("weights", backbone, False, f"--weights {backbone}={path}: no such file")
        return Need("weights", backbone, True, f"extracted from {path}")
    if cached:
        return Need("weights", backbone, True, "features already in the store")
    if spec.weights == "user-checkpoint":
        return Need("weights", backbone, False, f"needs a checkpoint: {spec.weights_help}")  # the help says how to pass it
    if spec.weights in ("packaged", "random"):
        return Need("weights", backbone, True, "offline" if spec.weights != "random" else "random weights (timing only)")
    return Need("weights", backbone, True, f"downloaded on first use (needs a network): {spec.weights_help or spec.weights}")


def _dataset_need(e: Experiment, lacking: list[str], data_root: Path | None) -> Need:
    """The dataset ``e`` is extracted from, where the store lacks its features of the backbones ``lacking`` (or
    holds them made otherwise than the preset makes them): the line says which, which the run extracts."""
    from fedcache.extract.datasets import DATASETS, DatasetOptions

    if e.dataset not in DATASETS:
        return Need("dataset", e.dataset, False, "not a fedcache dataset")
    if not lacking:
        return Need("dataset", e.store_dataset, True, "features already in the store")
    spec = DATASETS.get(e.dataset)
    extracts = (f" (the run extracts its features of {', '.join(lacking)}: the store lacks them, holds them made "
                "otherwise than the preset makes them, or --weights gives their checkpoint)")
    if spec.source == "embedded":
        return Need("dataset", e.store_dataset, True, "generated offline" + extracts)
    try:
        spec.load(DatasetOptions(data_root=data_root))
    except FedcacheError as exc:
        return Need("dataset", e.store_dataset, False, spec.how_to_get or str(exc))
    return Need("dataset", e.store_dataset, True, f"found under {data_root}" + extracts)


# ---- running -------------------------------------------------------------------------------------
def plan_lines(preset: Preset) -> list[str]:
    """What a run would do, one line per grid."""
    lines = []
    for e in preset.experiments:
        n = int(np.prod([len(v) if isinstance(v, (list, tuple)) else 1 for v in e.sweep.values()] or [1]))
        fixed = ", ".join(f"{k}={v}" for k, v in e.sweep.items())
        lines.append(f"{e.key}: {e.dataset} x {'+'.join(e.backbones)}; {', '.join(e.methods)}; {fixed}; "
                     f"seeds {','.join(map(str, e.seeds))} -> {len(e.methods) * n * len(e.seeds)} runs")
    return lines


def reproduce(preset: Preset, store: Path, out: Path, data_root: Path | None = None, weights: dict | None = None,
              jobs: int = 1, progress: Callable | None = None, on_cell: Callable | None = None) -> Path:
    """Extract what is missing, run every grid, write paper.json and the report; returns the report's path.
    ``on_cell(key, done, total, row)``: a cell of the grid ``key`` (its experiment's) is done."""
    from fedcache.api import extract_features, grid, report

    check_out(out, store)
    missing = [n for n in check(preset, store, data_root, weights) if not n.ok]
    if missing:
        raise ConfigError(f"{preset.name} cannot run here: " + "; ".join(f"{n.kind} {n.name}: {n.how}" for n in missing)
                          + f". `fedcache reproduce {preset.name} --dry-run` lists everything it needs")
    tables = {}
    for e in preset.experiments:
        todo = _to_extract(e, store, weights or {})
        if todo:
            extract_features(e.dataset, todo, store=store, progress=progress, data_root=data_root,
                             weights={b: Path(p) for b, p in (weights or {}).items() if b in todo}, **e.extract)
        tables[e.key] = grid(store=store, dataset=e.store_dataset, backbones=list(e.backbones), methods=list(e.methods),
                             sweep=dict(e.sweep), seeds=list(e.seeds), out=Path(out) / e.key, jobs=jobs,
                             on_cell=functools.partial(on_cell, e.key) if on_cell else None)
    write_paper_json(preset, tables, Path(out))
    return report(out)


def check_out(out: Path | str, store: Path | str) -> Path:
    """``--out`` as the run writes it, checked before anything is extracted: its first grid refused one inside a
    feature store after the extraction (minutes to hours in; the store the run makes too), and a dry run said nothing
    of it. Each experiment's grid is a folder of it, so it cannot be a grid's directory itself."""
    out = writable_dir(out, "--out")
    check_outside(out)
    where, inside = Path(out).resolve(), Path(store).resolve()
    if where == inside or inside in where.parents:
        raise ConfigError(f"--out {out} is inside the feature store {store}; choose a directory outside it")
    if (out / GRID).is_file():
        raise ConfigError(f"--out {out} is a grid's directory; a reproduction writes a grid in a folder of its own for "
                          "each experiment: choose another --out")
    return out


def _to_extract(e: Experiment, store: Path, weights: dict) -> list[str]:
    """The backbones of ``e`` to extract: those whose features the store lacks, or holds made otherwise than the
    preset makes them (``_cached``), and those given a
    checkpoint (``--weights``: its features, which the store may not hold yet). An extraction loads every backbone
    it is given, stored or not: seconds to minutes each, and offline an error where the weights are absent."""
    return [b for b in e.backbones if b in weights or not _cached(store, e, b)]


def write_paper_json(preset: Preset, tables: dict, out: Path) -> Path:
    rows = []
    for p in preset.paper:
        table = tables.get(p.experiment)
        mine = table.where(method=p.method).to_records() if table is not None else []
        mine = [r for r in mine if all(str(r.get(k)) == str(v) for k, v in p.where.items())]
        # A metric a method does not report (min-local has no global model) is "not available", not a crash.
        values = [r[p.metric] for r in mine if r.get(p.metric) is not None]
        value = float(np.mean(values)) if values else None
        rows.append({"what": p.what, "paper": p.value, "fedcache": value,
                     "note": f"{p.method}, mean of {count(len(mine), 'run')}" if mine else f"{p.method}: not run"})
    doc = {"title": preset.title, "text": preset.notes, "rows": rows}
    path = out / "paper.json"
    disk.write_text(path, json.dumps(doc, indent=2) + "\n", "the paper's numbers")
    return path


def get(name: str) -> Preset:
    return PRESETS.get(name)


def names() -> list[str]:
    return PRESETS.names()
