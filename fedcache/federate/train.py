"""``fedcache train`` as a function: store -> fused features -> partition -> method -> round loop -> files."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedcache import __version__
from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData, check_same_source, load_fused, load_views
from fedcache.federate.divergence import DivergedError
from fedcache.federate.checkpoints import CHECKPOINT, METRICS
from fedcache.federate.driver import SUMMARY, RoundCallback, RunConfig, RunResult
from fedcache.federate.loop import run
from fedcache.federate.methods import METHODS, Method, MethodContext
from fedcache.federate.optim import PRESETS, OptimConfig
from fedcache.federate.partitions import PartitionRequest, find_partition, local_test_sets, make_partition, save_partition
from fedcache.federate.partitions.storage import keys_hash, table_keys
from fedcache.federate.settings import build, parse_pairs, refuse_unused, split_settings
from fedcache.federate.source import attach_source
from fedcache.federate.text import attach_text
from fedcache.paths import writable_dir
from fedcache.spec import RunSpec, ScheduleSpec
from fedcache.store.feature_store import FeatureStore, FeatureTable

log = logging.getLogger(__name__)

Tables = tuple[FeatureTable, FeatureTable]  # fused (train, test) features


# The flat keyword form of a run specification (``TrainConfig(dataset=..., method=..., rounds=5)``), kept
# for scripts written against it: every option is declared once, in fedcache/spec.py.
TrainConfig = RunSpec.of


@dataclass(frozen=True)
class HeadChoice:
    head: str = ""


@dataclass(frozen=True)
class Resolved:
    method_cls: type[Method]
    params: object
    optim: OptimConfig
    head: str
    preset: str


def resolve_settings(method: str, settings: list[str], preset: str | None = None, head: str | None = None) -> Resolved:
    """The method class, its parameters, the optimizer and the head from ``--set`` pairs; no data read.

    The one place ``--set`` is interpreted: ``fedcache train``, grids, the Python API and both Flower apps
    call it, so a setting means the same thing on every engine.
    """
    method_cls = METHODS.get(method)
    preset = preset or method_cls.default_preset
    if preset not in PRESETS:
        raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    groups = {"method": method_cls.Params, "optim": OptimConfig, "head": HeadChoice}
    routed = split_settings(parse_pairs(settings), groups)
    if routed["optim"] and not method_cls.uses_optimizer:
        raise ConfigError(f"{method} trains nothing with an optimizer; remove --set "
                          + ", ".join(f"optim.{k}" for k in routed["optim"]))
    params = build(method_cls.Params, routed["method"])
    optim = build(OptimConfig, routed["optim"], base=PRESETS[preset])
    refuse_unused(routed["method"], params, "method", method)
    refuse_unused(routed["optim"], optim, "optim", f"the {optim.optimizer} optimizer (preset {preset})")
    return Resolved(method_cls, params, optim, routed["head"].get("head") or head or method_cls.default_head, preset)


def resolve(spec: RunSpec) -> Resolved:
    """The method class, its parameters, the optimizer and the head of a spec's method, optim and head
    sections (a RunSpec, or a Flower run, which has them too): every ``--set`` checked, no data read."""
    return resolve_settings(spec.method.name, list(spec.method.settings), spec.optim.preset, spec.head.name)


def instantiate(r: Resolved, data: FederatedData, s: ScheduleSpec) -> Method:
    """The method on ``data``, as every engine builds it."""
    return r.method_cls(MethodContext(data, r.head, r.optim, s.local_epochs, s.batch_size, s.seed, s.rounds), r.params)


def check_out(spec: RunSpec) -> None:
    """Where the run writes, checked before any work: writable, and not silently replacing another run."""
    e = spec.engine
    if e.resume and e.overwrite:
        raise ConfigError("--resume continues the run in --out and --overwrite replaces it; give one of them")
    if e.track:
        _check_trackers(spec)
    if e.out is None:
        return
    writable_dir(e.out, "--out")
    if not e.resume and not e.overwrite and (Path(e.out) / METRICS).exists():
        raise ConfigError(f"{e.out} already holds a run; pass --resume to continue it, --overwrite to replace it, "
                          "or choose another --out")


RUN_FILES = ("config.json", METRICS, SUMMARY, CHECKPOINT, "checkpoint-round*.pt")


def _clear_run(out: Path) -> None:
    """--overwrite: the files of the run in ``out`` (nothing else in the directory)."""
    for pattern in RUN_FILES:
        for path in Path(out).glob(pattern):
            path.unlink()


def _check_trackers(spec: RunSpec) -> None:
    from fedcache.trackers import known_trackers

    unknown = [t for t in spec.engine.track if t not in known_trackers()]
    if unknown:
        raise ConfigError(f"--track {','.join(unknown)}: unknown tracker; known: {', '.join(known_trackers())}")
    where = spec.engine.track_dir or spec.engine.out
    if where is None:
        raise ConfigError("--track needs --out or --track-dir: the directory the trackers write into")
    writable_dir(where, "--track-dir" if spec.engine.track_dir else "--out")


def prepare(spec: RunSpec, tables: Tables | None = None) -> tuple[Method, dict]:
    """Everything before the first round: data, partition, method; returns the resolved config too."""
    r = resolve(spec)
    warn_unused_options(spec, r)
    data, part_info = load_data(spec, tables, views=r.method_cls.uses_views)
    method = instantiate(r, data, spec.schedule)
    return method, _resolved(spec, method, r, part_info, data)


def warn_unused_options(spec: RunSpec, r: Resolved) -> None:
    """Run options a method without an optimizer never reads are said, not dropped. A warning, not an
    error: a grid (e.g. FST-CBDG's, with clip-zs beside the trained methods) applies them to every method."""
    if r.method_cls.uses_optimizer:
        return
    s, defaults = spec.schedule, type(spec.schedule)()
    unused = [f"--{k.replace('_', '-')} {getattr(s, k)}" for k in ("local_epochs", "batch_size")
              if getattr(s, k) != getattr(defaults, k)]
    unused += [f"--preset {spec.optim.preset}"] if spec.optim.preset else []
    if unused:
        log.warning("%s trains nothing with an optimizer: %s not used", spec.method.name, ", ".join(unused))


def load_data(spec: RunSpec, tables: Tables | None = None, views: bool = False) -> tuple[FederatedData, dict]:
    """``tables``: the fused (train, test) features already in memory (a grid shares one memory-mapped copy)."""
    d, validation = spec.data, spec.schedule.validation
    store = FeatureStore(d.store, create=False)
    train_t, test_t = tables or (load_fused(store, d.dataset, list(d.backbones), s) for s in ("train", "test"))
    check_same_source(train_t, test_t)  # before a partition is made of them
    request = partition_request(spec, len(train_t.domain_names))
    keys = (table_keys(train_t), table_keys(test_t))
    data_hash = keys_hash(*keys)  # once: each use sorts every key
    partition = find_partition(store, d.dataset, request, *keys, data_hash=data_hash)
    if partition is None:
        partition = make_partition(request, train_t.labels, train_t.domains, test_t.labels, test_t.domains)
    pid = save_partition(store, d.dataset, partition, *keys, data_hash=data_hash)
    info = {"partition_id": pid, "request": request.to_dict(), "effective": request.effective(len(train_t.domain_names)),
            "entries": list(train_t.entry_ids + test_t.entry_ids),
            "scored_on": "validation (spare training rows)" if validation else "test split"}
    if validation:
        data = FederatedData.from_tables(train_t, train_t, partition.train, validation_sets(partition, train_t, spec))
    else:
        data = FederatedData.from_tables(train_t, test_t, partition.train, partition.test)
    data = attach_source(data, store, train_t, train_t if validation else test_t)
    if views:  # augmented views (extract --views K), kept in the store's dtype: float16 halves the memory
        aug = load_views(store, d.dataset, list(d.backbones), train_t)
        data.views = None if aug is None else torch.from_numpy(aug)
    return attach_text(data, store, list(d.backbones)), info


DEFAULT_CLIENTS = 10
DOMAIN_SCHEMES = ("domain", "domain-dirichlet")


def partition_request(spec: RunSpec, n_domains: int) -> PartitionRequest:
    """The partition ``spec`` asks for; without ``clients``, the count follows from the data: one client
    per domain (``clients_per_domain`` each) for domain partitions, DEFAULT_CLIENTS otherwise."""
    p = spec.partition
    clients = p.clients
    if clients is None:
        clients = n_domains * (p.clients_per_domain or 1) if p.scheme in DOMAIN_SCHEMES else DEFAULT_CLIENTS
    return PartitionRequest(
        scheme=p.scheme, n_clients=clients, seed=spec.schedule.seed, alpha=p.alpha, shards=p.shards,
        clients_per_domain=p.clients_per_domain, few_shot=p.few_shot, subsample=p.subsample,
        classes_per_client=p.classes_per_client, repeat_rate=p.repeat_rate, local_test=p.local_test,
        class_budget=p.class_budget, local_test_mix=p.local_test_mix,
    )


def validation_sets(partition, train_t, spec: RunSpec) -> list[np.ndarray]:
    """Per client, training rows nobody trains on, with the client's (class, domain) mix."""
    spare = np.setdiff1d(np.arange(len(train_t)), np.concatenate(partition.train))
    if not len(spare):
        raise ConfigError("scoring on validation (--validation, or grid --select) needs training rows that no client trains "
                          "on: add --subsample 0.8 (each client trains on 80% of its rows; the rest are spare) or --few-shot N")
    rng = np.random.default_rng(np.random.SeedSequence([spec.schedule.seed, 7]))
    picked = local_test_sets(partition.train, train_t.labels, train_t.domains, train_t.labels[spare],
                             train_t.domains[spare], spec.partition.local_test, rng, spec.partition.local_test_mix)
    empty = [k for k, rows in enumerate(picked) if not len(rows)]
    if empty:
        raise ConfigError(f"--validation: clients {empty} have no spare training rows of their classes; "
                          "use a smaller --subsample or --few-shot")
    return [spare[rows] for rows in picked]


def _resolved(spec: RunSpec, method: Method, r: Resolved, part_info: dict, data: FederatedData) -> dict:
    """config.json: the spec as given (``RunSpec.from_dict(config["spec"])`` gives it back), what it
    resolved to (the method's parameters, the optimizer, the head), the partition and the data."""
    return {
        "fedcache_version": __version__,
        "spec": spec.to_dict(),
        "resolved": {"method_params": dataclasses.asdict(r.params), "optimizer": dataclasses.asdict(r.optim),
                     "head": method.ctx.head, "preset": r.preset},
        "partition": part_info,
        "data": {"dim": data.dim, "classes": list(data.class_names), "domains": list(data.domain_names),
                 "client_train_sizes": data.sizes().tolist(), "client_test_sizes": [len(r) for r in data.client_test],
                 "random_weights": data.random_weights},
    }


def train(spec: RunSpec, on_round: RoundCallback | None = None, tables: Tables | None = None,
          run_name: str | None = None) -> RunResult:
    """One run. ``run_name`` names it for trackers (default: its --out directory's name)."""
    check_out(spec)
    method, resolved = prepare(spec, tables)
    e, s = spec.engine, spec.schedule
    if e.out is not None:
        if e.overwrite:
            _clear_run(e.out)
        _prepare_out(spec, resolved)
    trackers = _open_trackers(spec, resolved, run_name)
    cfg = RunConfig(s.rounds, s.fraction, s.eval_every, e.batched, e.out, e.resume, e.keep_checkpoints)
    t0 = time.perf_counter()
    try:
        result = run(method, cfg, _tracked(on_round, trackers), {"partition_id": resolved["partition"]["partition_id"]})
    except BaseException as exc:
        for t in trackers:
            t.fail()
        if isinstance(exc, DivergedError) and e.out is not None:
            # --resume would replay the same rounds into the same NaN: say how to start this --out again.
            raise DivergedError(f"{exc}. The run in {e.out} stopped there: start it again with the change and "
                                "--overwrite, or choose another --out") from None
        raise
    log.info("%s finished in %.2fs", method.name, time.perf_counter() - t0)
    for t in trackers:
        t.close(result.summary)
    return result


def _open_trackers(spec: RunSpec, resolved: dict, run_name: str | None) -> list:
    if not spec.engine.track:
        return []
    from fedcache.trackers import open_trackers

    name = run_name or (Path(spec.engine.out).name if spec.engine.out else spec.method.name)
    settings = {"spec": resolved["spec"], **resolved["resolved"]}
    return open_trackers(list(spec.engine.track), Path(spec.engine.track_dir or spec.engine.out), name, settings)


def _tracked(on_round: RoundCallback | None, trackers: list) -> RoundCallback | None:
    if not trackers:
        return on_round

    def callback(done: int, total: int, line: dict | None) -> None:
        if line is not None:
            for t in trackers:
                t.log(line["round"], line)
        if on_round:
            on_round(done, total, line)

    return callback


def _prepare_out(spec: RunSpec, resolved: dict) -> None:
    out = Path(spec.engine.out)
    path = out / "config.json"
    if spec.engine.resume:
        if not path.exists():
            raise ConfigError(f"--resume: {out} has no config.json; start the run without --resume")
        saved = json.loads(path.read_text())
        if not _holds(json.loads(json.dumps(resolved)), saved):
            differ = _differences(saved.get("spec", {}), resolved["spec"])
            raise ConfigError(f"--resume: the options differ from the run in {out}"
                              + (f" ({', '.join(differ)})" if differ else "")
                              + "; use the same options, --overwrite to replace the run, or a new --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(resolved, indent=2) + "\n")


def _holds(mine, saved) -> bool:
    """Whether this run's config.json agrees with the saved one on everything the saved one records. A key
    that a later fedcache adds (a record such as ``partition.effective``, or a setting whose default is the
    old behaviour) must not make every run started before it unresumable; a changed value still does."""
    if isinstance(saved, dict) and isinstance(mine, dict):
        return all(k in mine and _holds(mine[k], v) for k, v in saved.items())
    return mine == saved


def _differences(saved: dict, mine: dict) -> list[str]:
    """The ``section.field`` keys whose values differ between two spec dicts."""
    saved, mine = json.loads(json.dumps(saved)), json.loads(json.dumps(mine))
    return [f"{s}.{k}" for s in mine for k in mine[s] if saved.get(s, {}).get(k, object()) != mine[s][k]]
