"""``fedcache train`` as a function: store -> fused features -> partition -> method -> round loop -> files."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedcache import __version__
from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData, load_fused, load_views
from fedcache.federate.loop import METRICS, RoundCallback, RunConfig, RunResult, run
from fedcache.federate.methods import METHODS, Method, MethodContext
from fedcache.federate.optim import PRESETS, OptimConfig
from fedcache.federate.partitions import PartitionRequest, find_partition, local_test_sets, make_partition, save_partition
from fedcache.federate.partitions.storage import table_keys
from fedcache.federate.settings import build, parse_pairs, refuse_unused, split_settings
from fedcache.federate.source import attach_source
from fedcache.federate.text import attach_text
from fedcache.store.feature_store import FeatureStore, FeatureTable

log = logging.getLogger(__name__)

Tables = tuple[FeatureTable, FeatureTable]  # fused (train, test) features


@dataclass
class TrainConfig:
    store: Path
    dataset: str
    backbones: list[str]
    method: str
    partition: str = "iid"
    clients: int | None = None  # default: one client per domain for domain partitions, else DEFAULT_CLIENTS
    alpha: float | None = None
    shards: int | None = None
    few_shot: int | None = None
    subsample: float = 1.0
    clients_per_domain: int | None = None
    classes_per_client: int | None = None
    repeat_rate: float = 0.0
    local_test: int = 1000
    fraction: float = 1.0
    rounds: int = 50
    local_epochs: int = 1
    batch_size: int = 32
    seed: int = 0
    preset: str | None = None  # optimizer preset; default: the method's (fedpcl or fst-cbdg)
    head: str | None = None
    settings: list[str] = field(default_factory=list)
    eval_every: int = 1
    # Score on spare training rows (rows no client trains on, drawn with each client's class and
    # domain mix) instead of the test split: for choosing hyperparameters without touching the test set.
    validation: bool = False
    batched: bool = True
    out: Path | None = None
    resume: bool = False


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


def resolve(cfg: TrainConfig) -> tuple[type[Method], object, OptimConfig, str]:
    """The method class, its parameters, the optimizer and the head: every ``--set`` checked, no data read."""
    r = resolve_settings(cfg.method, cfg.settings, cfg.preset, cfg.head)
    return r.method_cls, r.params, r.optim, r.head


def check_out(cfg: TrainConfig) -> None:
    """A new run may not overwrite a finished or interrupted one."""
    if cfg.out is not None and not cfg.resume and (Path(cfg.out) / METRICS).exists():
        raise ConfigError(f"{cfg.out} already holds a run; pass --resume to continue it or choose another --out")


def prepare(cfg: TrainConfig, tables: Tables | None = None) -> tuple[Method, dict]:
    """Everything before the first round: data, partition, method; returns the resolved config too."""
    method_cls, params, optim, head = resolve(cfg)
    data, part_info = load_data(cfg, tables, views=method_cls.uses_views)
    ctx = MethodContext(data, head, optim, cfg.local_epochs, cfg.batch_size, cfg.seed, cfg.rounds)
    method = method_cls(ctx, params)
    resolved = _resolved(cfg, method, params, optim, part_info, data)
    return method, resolved


def load_data(cfg: TrainConfig, tables: Tables | None = None, views: bool = False) -> tuple[FederatedData, dict]:
    """``tables``: the fused (train, test) features already in memory (a grid shares one memory-mapped copy)."""
    store = FeatureStore(cfg.store, create=False)
    train_t, test_t = tables or (load_fused(store, cfg.dataset, cfg.backbones, s) for s in ("train", "test"))
    request = partition_request(cfg, len(train_t.domain_names))
    keys = (table_keys(train_t), table_keys(test_t))
    partition = find_partition(store, cfg.dataset, request, *keys)
    if partition is None:
        partition = make_partition(request, train_t.labels, train_t.domains, test_t.labels, test_t.domains)
    pid = save_partition(store, cfg.dataset, partition, *keys)
    info = {"partition_id": pid, "request": request.to_dict(), "entries": list(train_t.entry_ids + test_t.entry_ids),
            "scored_on": "validation (spare training rows)" if cfg.validation else "test split"}
    if cfg.validation:
        data = FederatedData.from_tables(train_t, train_t, partition.train, validation_sets(partition, train_t, cfg))
    else:
        data = FederatedData.from_tables(train_t, test_t, partition.train, partition.test)
    data = attach_source(data, store, train_t, train_t if cfg.validation else test_t)
    if views:  # augmented views (extract --views K), kept in the store's dtype: float16 halves the memory
        aug = load_views(store, cfg.dataset, cfg.backbones, train_t)
        data.views = None if aug is None else torch.from_numpy(aug)
    return attach_text(data, store, cfg.backbones), info


DEFAULT_CLIENTS = 10
DOMAIN_SCHEMES = ("domain", "domain-dirichlet")


def partition_request(cfg: TrainConfig, n_domains: int) -> PartitionRequest:
    """The partition ``cfg`` asks for; without ``clients``, the count follows from the data: one client
    per domain (``clients_per_domain`` each) for domain partitions, DEFAULT_CLIENTS otherwise."""
    clients = cfg.clients
    if clients is None:
        clients = n_domains * (cfg.clients_per_domain or 1) if cfg.partition in DOMAIN_SCHEMES else DEFAULT_CLIENTS
    return PartitionRequest(
        scheme=cfg.partition, n_clients=clients, seed=cfg.seed, alpha=cfg.alpha, shards=cfg.shards,
        clients_per_domain=cfg.clients_per_domain, few_shot=cfg.few_shot, subsample=cfg.subsample,
        classes_per_client=cfg.classes_per_client, repeat_rate=cfg.repeat_rate, local_test=cfg.local_test,
    )


def validation_sets(partition, train_t, cfg: TrainConfig) -> list[np.ndarray]:
    """Per client, training rows nobody trains on, with the client's (class, domain) mix."""
    spare = np.setdiff1d(np.arange(len(train_t)), np.concatenate(partition.train))
    if not len(spare):
        raise ConfigError("--validation needs training rows that no client trains on; use --few-shot N or fewer clients' data")
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 7]))
    picked = local_test_sets(partition.train, train_t.labels, train_t.domains, train_t.labels[spare],
                             train_t.domains[spare], cfg.local_test, rng)
    empty = [k for k, rows in enumerate(picked) if not len(rows)]
    if empty:
        raise ConfigError(f"--validation: clients {empty} have no spare training rows of their classes; use a smaller --few-shot")
    return [spare[rows] for rows in picked]


def _resolved(cfg: TrainConfig, method: Method, params, optim: OptimConfig, part_info: dict, data: FederatedData) -> dict:
    return {
        "fedcache_version": __version__,
        "train": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "resume")},
        "method": method.name, "method_params": dataclasses.asdict(params), "head": method.ctx.head,
        "preset": cfg.preset or type(method).default_preset,
        "optimizer": dataclasses.asdict(optim), "partition": part_info,
        "data": {"dim": data.dim, "classes": list(data.class_names), "domains": list(data.domain_names),
                 "client_train_sizes": data.sizes().tolist(), "client_test_sizes": [len(r) for r in data.client_test],
                 "random_weights": data.random_weights},
    }


def train(cfg: TrainConfig, on_round: RoundCallback | None = None, tables: Tables | None = None) -> RunResult:
    check_out(cfg)
    method, resolved = prepare(cfg, tables)
    if cfg.out is not None:
        _prepare_out(cfg, resolved)
    t0 = time.perf_counter()
    result = run(method, RunConfig(cfg.rounds, cfg.fraction, cfg.eval_every, cfg.batched, cfg.out, cfg.resume), on_round)
    log.info("%s finished in %.2fs", method.name, time.perf_counter() - t0)
    result.summary["partition_id"] = resolved["partition"]["partition_id"]
    if cfg.out is not None:
        (cfg.out / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    return result


def _prepare_out(cfg: TrainConfig, resolved: dict) -> None:
    out = Path(cfg.out)
    path = out / "config.json"
    if cfg.resume:
        if not path.exists():
            raise ConfigError(f"--resume: {out} has no config.json; start the run without --resume")
        saved = json.loads(path.read_text())
        if saved != json.loads(json.dumps(resolved)):
            raise ConfigError(f"--resume: the options differ from the run in {out}; use the same options or a new --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(resolved, indent=2) + "\n")
