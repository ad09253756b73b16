"""The Python API: what the CLI does, as functions a notebook can call (docs/python-api.md).

    import fedcache
    fedcache.extract_features("digits5-offline", ["efficientnet-lite0"], store="feats.zarr")
    run = fedcache.train(store="feats.zarr", dataset="digits5-offline", backbones="efficientnet-lite0",
                         method="fedavg", partition="domain", clients=5, few_shot=10, rounds=20)
    run.summary["mean_accuracy"], run.metrics.to_records(), run.server   # summary, per-round, trained state
    table = fedcache.grid(store="feats.zarr", dataset="digits5-offline", backbones="efficientnet-lite0",
                          methods=["fedavg", "fedproto"], sweep={"alpha": [0.1, 1.0]}, seeds=[0, 1], out="grid")
    fedcache.report("grid")   # -> grid/report.html

Every function takes the same names as the CLI options (with ``settings`` as a dict or ``key=value`` list)
and reports progress through an optional callback instead of drawing anything.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcache.errors import ConfigError
from fedcache.table import Table


def _names(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def _pairs(settings: dict[str, Any] | Iterable[str] | None) -> list[str]:
    if not settings:
        return []
    if isinstance(settings, dict):
        return [f"{k}={v}" for k, v in settings.items()]
    return list(settings)


def extract_features(dataset: str, backbones: str | Iterable[str], store: str | Path = "fedcache-store.zarr",
            progress: Callable | None = None, **options: Any):
    """Run each backbone once over the dataset and cache the embeddings; returns one report per entry.

    ``options`` are ExtractConfig fields (splits, domains, device, image_size, views, dtype, ...), and the
    dataset options ``data_root``, ``path``, ``download``, ``seed``.
    """
    from fedcache.extract.datasets import DatasetOptions
    from fedcache.extract.runner import ExtractConfig
    from fedcache.extract.runner import extract as run

    ds_fields = {f.name for f in dataclasses.fields(DatasetOptions)}
    ds_opts = DatasetOptions(**{k: options.pop(k) for k in list(options) if k in ds_fields})
    _check_keys(ExtractConfig, options, "extract")
    if "splits" in options:
        options["splits"] = tuple(_names(options["splits"]))
    cfg = ExtractConfig(dataset=dataset, backbones=_names(backbones), store=Path(store), dataset_options=ds_opts, **options)
    return run(cfg, progress)


@dataclass
class TrainResult:
    """One federated run: ``summary`` (final accuracy, fairness, bytes), ``history`` (one dict per evaluated
    round), and the trained state (``server``: the global parameters; ``clients``: every client's personal
    parameters stacked along the first axis)."""

    summary: dict
    history: list[dict]
    server: dict
    clients: dict
    out: Path | None = None

    @property
    def metrics(self) -> Table:
        """Per-round metrics as a table (per-client accuracies left out; they are in ``history``)."""
        return Table([{k: v for k, v in line.items() if k != "per_client"} for line in self.history])

    def __repr__(self) -> str:
        s = self.summary
        return (f"TrainResult({s['method']}: {s['mean_accuracy']:.2f} ({s['std_accuracy']:.2f})% over clients, "
                f"{s['rounds']} rounds, {len(self.history)} evaluations)")


def train(store: str | Path, dataset: str, backbones: str | Iterable[str], method: str,
          settings: dict[str, Any] | Iterable[str] | None = None, on_round: Callable | None = None,
          **options: Any) -> TrainResult:
    """Federated rounds on cached features (``fedcache train``). ``options`` are the run options under
    the CLI's names (fedcache/spec.py): partition, clients, alpha, few_shot, rounds, seed, out, resume, ...;
    ``settings`` are the ``--set`` pairs. Values are checked (type and range) before any data is read."""
    from fedcache.federate.train import train as run
    from fedcache.spec import RunSpec

    spec = RunSpec.of(store=store, dataset=dataset, backbones=_names(backbones), method=method,
                      settings=_pairs(settings), **options)
    if spec.engine.name != "in-process":
        raise ConfigError(f"fedcache.train() runs in-process; for engine={spec.engine.name!r} call "
                          "fedcache.flower.sim.train_flower_sim(spec) or `fedcache train --engine`")
    r = run(spec, on_round)
    return TrainResult(r.summary, r.history, r.server, r.clients, spec.engine.out)


def grid_spec(config: str | Path | None = None, **given: Any):
    """A GridSpec from an optional TOML file, overridden by the arguments that are not None."""
    from fedcache.sweep import GridSpec, load_toml, parse_sweep

    fields = load_toml(Path(config)) if config else {}
    settings = given.pop("settings", None)
    sweep = given.pop("sweep", None)
    fields.update({k: v for k, v in given.items() if v is not None})
    if settings:
        fields["sweep"] = {**fields.get("sweep", {}), **parse_sweep(list(settings))}
    if sweep:
        fields["sweep"] = {**fields.get("sweep", {}), **{k: v if isinstance(v, (list, tuple)) else [v] for k, v in sweep.items()}}
    fields["backbones"], fields["methods"] = _names(fields.get("backbones")), _names(fields.get("methods"))
    missing = [k for k in ("store", "dataset", "backbones", "methods", "out") if not fields.get(k)]
    if missing:
        flags = {"methods": "--method", "backbones": "--backbones"}
        raise ConfigError(f"a grid needs {', '.join(flags.get(k, '--' + k) for k in missing)} (as options or in the TOML file)")
    return GridSpec(**fields)


def grid(store: str | Path | None = None, dataset: str | None = None, backbones: str | Iterable[str] | None = None,
         methods: str | Iterable[str] | None = None, sweep: dict[str, Any] | None = None,
         seeds: Iterable[int] | None = None, out: str | Path | None = None, jobs: int | None = None,
         config: str | Path | None = None, on_cell: Callable | None = None, select: Iterable[str] | None = None,
         track: Iterable[str] | None = None, keep_checkpoints: str | None = None, engine: str | None = None,
         max_batch_cells: int | None = None, on_plan: Callable[[str], None] | None = None) -> Table:
    """The cartesian grid methods x sweep x seeds (``fedcache grid``); returns one row per run.

    ``sweep`` maps a key to its values: run options (alpha, partition, clients, rounds, ...; the names of
    ``fedcache.train``) or method/optimizer settings (lr, mu, ...). Finished cells in ``out`` are read back, not re-run.
    ``select``: sweep keys chosen per method and setting on the validation split, then run once on the test
    split (the returned rows are the test runs). ``engine``: "batched" (cells trained together, the default)
    or "processes" (each cell its own run); ``max_batch_cells`` bounds a batch (fedcache/spec.py, GridEngineSpec);
    ``on_plan`` is told how the engine runs the cells (how it grouped them) before it starts.
    """
    from fedcache.sweep import run_grid

    spec = grid_spec(config, store=store, dataset=dataset, backbones=backbones, methods=methods, sweep=sweep,
                     seeds=list(seeds) if seeds is not None else None, out=out, jobs=jobs,
                     select=list(select) if select else None, track=list(track) if track else None,
                     keep_checkpoints=keep_checkpoints, engine=engine, max_batch_cells=max_batch_cells)
    return run_grid(spec, on_cell, on_plan=on_plan)


def report(run_or_grid: str | Path, out: str | Path | None = None) -> Path:
    """``fedcache report``: HTML (self-contained) and markdown for a run or grid directory; returns the HTML path."""
    from fedcache.reports import write_report

    return write_report(Path(run_or_grid), Path(out) if out else None).html


def _check_keys(cls: type, options: dict, what: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"fedcache.{what}(): unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
