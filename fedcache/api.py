"""The Python API: what the CLI does, as functions a notebook can call (docs/python-api.md).

    import fedcache
    fedcache.extract_features("digits5-offline", ["efficientnet-lite0"], store="feats.zarr")
    run = fedcache.train(store="feats.zarr", dataset="digits5-offline", backbones="efficientnet-lite0",
                         method="fedavg", partition="domain", clients=5, few_shot=10, rounds=20)
    run.summary["mean_accuracy"], run.metrics.to_records(), run.server   # summary, per-round, trained state
    table = fedcache.grid(store="feats.zarr", dataset="digits5-offline", backbones="efficientnet-lite0",
                          methods=["fedavg", "fedproto"], sweep={"alpha": [0.1, 1.0]}, seeds=[0, 1], out="grid")
    fedcache.report("grid")   # -> grid/report.html

Every function takes the same names as the CLI options (``settings`` as a dict, a ``key=value`` text or a list
of them; an option of several values as one value, a comma-separated text or a list) and reports progress
through an optional callback instead of drawing anything. ``help()`` and ``inspect.signature`` show every
option: the signatures are built from the declarations the CLI is built from (``fedcache/spec.py`` for train,
``ExtractConfig`` for extract), not written out a second time.
"""
from __future__ import annotations

import dataclasses
import functools
import html
import inspect
import os
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcache.errors import ConfigError, FedcacheError, UnknownOptionError
from fedcache.paths import denied_error, is_denied
from fedcache.progress import check_callback
from fedcache.table import Table
from fedcache.wording import count, keyword_names, named, typed_as


def _refusals_said(fn: Callable) -> Callable:
    """``fn``, whose refusals by the file system that fedcache does not check for first (an extraction into another
    user's store, a file on a read-only mount) raise :class:`~fedcache.errors.DeniedError` with the line the command
    line prints, instead of Python's "[Errno 13] Permission denied: '.../x.lock'", which names neither the store
    nor what to do. It is still an OSError of the same errno and file (a PermissionError where it was one)."""
    @functools.wraps(fn)
    def said(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FedcacheError:
            raise
        except OSError as exc:
            if not is_denied(exc):
                raise
            raise denied_error(exc) from exc
    return said


def _keywords_checked(hint: Callable[[str, Mapping], str] | None = None) -> Callable[[Callable], Callable]:
    """Decorates ``fn`` (no ``**options``), whose unknown keyword is refused as ``train``'s unknown option is (one
    error, :class:`~fedcache.errors.UnknownOptionError`), with the one it likely meant (``method``: did you mean
    ``methods``?), or with ``hint``'s advice where it has one (a grid's: where a run option goes,
    ``sweep={'rounds': ...}``): Python's TypeError named the keyword alone."""
    def decorate(fn: Callable) -> Callable:
        known = inspect.signature(fn).parameters

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            unknown = [k for k in kwargs if k not in known]
            if unknown:
                raise UnknownOptionError(unknown, known, (lambda k: hint(k, known)) if hint else None)
            return fn(*args, **kwargs)
        return checked
    return decorate


def _swept_hint(key: str, known: Mapping) -> str:
    """Where a run option or a method's setting given to ``grid`` goes (not an option the grid takes itself as a
    list: ``seed``, ``method``): its axes, ``sweep``, which also hold what ``train`` takes as ``settings``."""
    from fedcache.spec import is_option

    if key == "settings":
        return " (a grid's settings are its axes: sweep={'lr': value or [values], ...})"
    axis = f"one of the grid's axes: sweep={{{key!r}: value or [values]}}"
    if is_option(key):
        return "" if f"{key}s" in known else f" (a run option is {axis})"
    return f" (a method/optimizer setting is {axis})" if key in _setting_names() else ""


def _setting_names() -> set[str]:
    """Every method's settings and the optimizer's, by their short names (imports the methods: torch)."""
    from fedcache.federate.methods import METHODS
    from fedcache.spec import setting_fields

    return {name for m in METHODS.names() for group in setting_fields(m).values() for name in group}


def _keywords_named(fn: Callable) -> Callable:
    """``fn``, whose messages name the options by the keywords its caller passed (``rounds=0: must be >= 1``,
    ``settings['lrr']: unknown key``), not by the command line's flags (``--rounds``, ``--set``)."""
    @functools.wraps(fn)
    def named_so(*args: Any, **kwargs: Any) -> Any:
        with keyword_names():
            return fn(*args, **kwargs)
    return named_so


def _names(value: str | Iterable[str] | None, what: str = "backbones") -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    names = list(value) if isinstance(value, Iterable) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{what}={value!r}: give a name, comma-separated names (\"a,b\") or a list of names")
    return names


def _pairs(settings: dict[str, Any] | str | Iterable[str] | None) -> list[str]:
    """``settings`` as ``--set`` pairs. A text holds them space-separated, as ``--set``'s value does: listing it
    would make each character a pair."""
    if settings is None:
        return []
    if isinstance(settings, Mapping):
        _named_keys("settings", settings, "settings={'lr': 0.01}")
        return [f"{k}={_setting_text(k, v)}" for k, v in settings.items()]
    if isinstance(settings, str):
        return [pair for pair in _PAIR_GAP.split(settings.strip()) if pair]
    if isinstance(settings, Iterable):
        return list(settings)
    raise ConfigError(f"settings={settings!r}: expected a dict {{key: value}}, a 'key=value' text or a list of them, "
                      "e.g. settings={'lr': 0.01}")


# Spaces part a text's pairs, but not beside a comma: `--set` takes "betas=0.9, 0.99" as one pair and refuses
# "lr=0.01, mu=0.1" as two pairs in one, saying how to give them; split there, "lr=0.01," was called no number.
_PAIR_GAP = re.compile(r"(?<![,\s])\s+(?![,\s])")


def _named_keys(name: str, given: Mapping, example: str) -> None:
    """A dict of settings or axes keyed by something other than a name (``sweep={5: 1}``): said of the argument,
    where it failed deep inside as a text's method missing, or was taken for the setting '5'."""
    odd = [k for k in given if not isinstance(k, str)]
    if odd:
        raise ConfigError(f"{name}={{{odd[0]!r}: ...}}: {name}'s keys are names (text), e.g. {example}")


def _setting_text(key: str, value: Any) -> str:
    """A setting's Python value as ``--set`` spells it: a pair as ``0.9,0.99`` (``betas=(0.9, 0.99)`` read as the
    text ``(0.9`` was refused as no number), ``true`` for True. None, a dict or a set has no spelling there:
    refused here, in Python's words, since the parser would echo it as a text ("'None': expected a number")."""
    from fedcache.grids.spec import axis_text, one_value

    if value is None or not one_value(value):
        raise ConfigError(f"settings[{key!r}]={value!r}: give a number, a text, True/False or a pair of numbers; "
                          f"leave {key!r} out of settings for its default")
    if isinstance(value, (list, tuple)):
        return ",".join(axis_text(v) for v in value)
    return axis_text(value)


def _listed(value: Any) -> Any:
    """A grid field of one or more values (seeds, select, track) as ``grid_fields`` reads it: one value and a
    comma-separated text pass as they are (it splits the text); any other iterable (a tuple, a range) is listed
    here, since it would be taken for one value there."""
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        return list(value)
    return value


def _sweep_axes(sweep: Any) -> dict[str, list]:
    """``sweep`` as key -> its values; one value is an axis of one. A value of no axis (a dict, a set) is refused as
    a grid file's is, not echoed as its text (``"{'a': 1}": expected a finite number``)."""
    from fedcache.grids.spec import one_value

    example = "sweep={'rounds': 10, 'lr': [0.01, 0.1]}"
    if not isinstance(sweep, Mapping):
        raise ConfigError(f"sweep={sweep!r}: sweep is a dict {{key: value or list of values}}, e.g. {example}")
    _named_keys("sweep", sweep, example)
    axes = {k: v if isinstance(v, (list, tuple)) else [v] for k, v in sweep.items()}
    for key, values in axes.items():
        if not all(map(one_value, values)):
            raise ConfigError(f"sweep[{key!r}]={sweep[key]!r}: expected a value or a list of values (text, a number, "
                              "True/False or None; a list of lists for a setting that takes several numbers, as "
                              "sweep={'betas': [[0.9, 0.999]]})")
    return axes


@_keywords_named
@_refusals_said
def _extract_features(dataset: str, backbones: str | Iterable[str], store: str | Path | None = None,
                      progress: Callable | None = None, **options: Any):
    """Run each backbone once over the dataset and cache the embeddings; returns one report per entry.

    ``options`` are extract's settings under the CLI's names (fedcache/extract/config.py: splits, domains, device,
    image_size, views, dtype, data_root, path, download, seed, ...), a value as Python or as the flag's text.
    ``store``: default FEDCACHE_STORE, else fedcache-store.zarr, as for the CLI and ``train``.
    """
    from fedcache.extract.config import extract_config
    from fedcache.extract.runner import extract as run

    check_callback("progress", progress, "event")  # before the backbone loads and the store is made
    where = {} if store is None else {"store": store}
    return run(extract_config(dataset=dataset, backbones=backbones, **where, **options), progress)


@dataclass
class TrainResult:
    """One federated run: ``summary`` (final accuracy, fairness, bytes), ``history`` (one dict per evaluated
    round), and the trained state: ``server``, the global parameters as one model (a linear head's
    ``weight`` is (D, C) and ``bias`` (1, C): logits = x @ weight + bias; a method's entries with a row per client,
    such as fedpcl's prototype sets by ``local_ids``, stay as they are), and ``clients``, every client's
    personal parameters stacked along the first axis (client k is ``[k]``)."""

    summary: dict
    history: list[dict]
    server: dict
    clients: dict
    out: Path | None = None

    @property
    def metrics(self) -> Table:
        """Per-round metrics as a table (per-client accuracies left out; they are in ``history``)."""
        return Table([{k: v for k, v in line.items() if k != "per_client"} for line in self.history])

    def to_pandas(self):
        """The per-round metrics as a DataFrame (needs pandas: ``pip install 'fedcache[pandas]'``)."""
        return self.metrics.to_pandas()

    def __repr__(self) -> str:
        s = self.summary
        return (f"TrainResult({s['method']}: {s['mean_accuracy']:.2f}% mean over clients (std {s['std_accuracy']:.2f}), "
                f"{count(s['rounds'], 'round')}, {count(len(self.history), 'evaluation')})")

    def _repr_html_(self) -> str:
        """A notebook's view: the summary's headline figures, then the per-round metrics."""
        s = self.summary
        shown = {k: s.get(k) for k in ("method", "mean_accuracy", "std_accuracy", "global_accuracy", "worst10",
                                       "best10", "rounds", "bytes_up", "seconds") if s.get(k) is not None}
        where = f"<p>run directory: <code>{html.escape(str(self.out))}</code></p>" if self.out else ""
        return (f"<b>TrainResult</b>{where}" + Table([shown])._repr_html_()
                + "<p>per-round metrics (<code>.metrics</code>, <code>.to_pandas()</code>):</p>"
                + self.metrics._repr_html_())


def one_model(server: dict, by_client: tuple[str, ...] = ()) -> dict:
    """The server's state without the leading axis of size 1 that stacks it like the clients' states (the
    batched code runs the global model as K = 1 of K stacked models). Tensors without that axis (FedProto's
    per-class prototypes, say) and the entries ``by_client`` (a row per client, however many) are returned as
    they are."""
    return {k: t[0] if k not in by_client and getattr(t, "ndim", 0) >= 2 and t.shape[0] == 1 else t
            for k, t in server.items()}


@_keywords_named
@_refusals_said
def train(store: str | Path | None = None, dataset: str | None = None, backbones: str | Iterable[str] | None = None,
          method: str | None = None, settings: dict[str, Any] | str | Iterable[str] | None = None,
          on_round: Callable | None = None, **options: Any) -> TrainResult:
    """Federated rounds on cached features (``fedcache train``). ``dataset``, ``backbones`` and ``method`` are
    required; ``store``: default FEDCACHE_STORE, else fedcache-store.zarr, as for the CLI and ``extract_features``.
    The keyword options are the run options under the CLI's names (listed below); ``settings`` are the ``--set``
    pairs (method and optimizer hyperparameters): a dict ``{"lr": 0.01}``, a text ``"lr=0.01 mu=0.1"`` or a list
    ``["lr=0.01"]``. A value is Python or the flag's text (``rounds="10"``), checked (type and range) before any data
    is read."""
    from fedcache.federate.methods import METHODS
    from fedcache.training import check_not_a_cell, train as run
    from fedcache.spec import RunSpec, refuse_unread_options, typed_keys

    _refuse_settings_as_options(options)
    check_callback("on_round", on_round, "done", "total", "line")
    named_ = {"store": store, "dataset": dataset, "backbones": _names(backbones), "method": method}
    # None is left out: the store then defaults as the CLI's does, a missing dataset is named as one
    spec = RunSpec.of(**{k: v for k, v in named_.items() if v is not None}, settings=_pairs(settings), **options)
    refuse_unread_options(spec, _chosen(options))
    check_not_a_cell(spec.engine.out)
    if spec.engine.name != "in-process":
        raise ConfigError(f"fedcache.train() runs in-process; for engine={spec.engine.name!r} call "
                          "fedcache.flower.sim.train_flower_sim(spec) (in a child process) or `fedcache train --engine`")
    with typed_as(typed_keys(_pairs(settings), spec.method.name)):  # advice met in training names them as given
        r = run(spec, on_round)
    by_client = METHODS.get(spec.method.name).server_by_client
    return TrainResult(r.summary, r.history, one_model(r.server, by_client), dict(r.clients), spec.engine.out)


def _chosen(options: dict[str, Any]) -> list[str]:
    """The options a call chose: a value of None or an option's default is none (a wrapper passing every option,
    ``**vars(args)``, passes ``alpha=0.5`` with ``partition="iid"``); the CLI, which knows what was typed, counts a
    typed default too."""
    from fedcache.spec import is_option, option

    def default(key: str, value: Any) -> bool:
        o = option(key)
        return o.default is not dataclasses.MISSING and o.parse(value) == o.default

    return [k for k, v in options.items() if v is not None and not (is_option(k) and default(k, v))]


def _refuse_settings_as_options(options: dict[str, Any]) -> None:
    """``train(lr=0.1)``: the run options' check would call lr an unknown option and list the options, which do
    not have it, without a word of where it goes. Any method's setting counts: with a method that lacks it,
    ``settings`` then says which keys that method has."""
    from fedcache.spec import is_option

    known = _setting_names()
    misplaced = {k: v for k, v in options.items() if k in known and not is_option(k)}
    if misplaced:
        what = ("is a method/optimizer setting, not a run option; pass it" if len(misplaced) == 1
                else "are method/optimizer settings, not run options; pass them")
        pairs = ", ".join(f"{k!r}: {v!r}" for k, v in misplaced.items())
        raise ConfigError(f"fedcache.train(): {', '.join(misplaced)} {what} as settings={{{pairs}}}")


def grid_spec(config: str | Path | None = None, default_store: str | Path | None = None, **given: Any):
    """A GridSpec from an optional TOML file, overridden by the arguments that are not None; ``default_store``
    where neither gives a store (the command line's FEDCACHE_STORE)."""
    from fedcache.grids import GridSpec, load_toml
    from fedcache.grids.spec import Written, axis_text, check_file_axes, grid_fields, grid_flag, read_grid_file

    fields, written = read_grid_file(Path(config)) if config else ({}, Written())
    file_fields = dict(fields)
    from_file = {k.replace("-", "_"): v for k, v in fields.get("sweep", {}).items()}
    settings = given.pop("settings", None)
    sweep = given.pop("sweep", None)
    flags = given.pop("option_axes", None)  # the CLI's run-option flags: unambiguous by how they were given
    # Checked as a grid file's are, named by their flags: ``--jobs=0: must be >= 1``.
    fields.update(grid_fields({k: v for k, v in given.items() if v is not None}, grid_flag))
    fields["backbones"], fields["methods"] = _names(fields.get("backbones")), _names(fields.get("methods"), "methods")
    _check_names(fields, _grid_names(config, file_fields, given, {}, frozenset(), written))
    fields["sweep"], flagged = _merged_sweep(fields.get("sweep", {}), fields["methods"] or [], settings, sweep, flags)
    if not fields.get("store") and default_store:  # the CLI's FEDCACHE_STORE, below a file's store and --store
        fields["store"] = default_store
    missing = [k for k in ("store", "dataset", "backbones", "methods", "out") if not fields.get(k)]
    if missing:
        as_flags = ", ".join(map(grid_flag, missing))
        if config:
            empty = " (the file is empty)" if not load_toml(Path(config)) else ""
            raise ConfigError(f"grid file {config}{empty} gives no {', '.join(missing)}: add them at its top "
                              f"({missing[0]} = ...), or give {as_flags}")
        raise ConfigError(f"a grid needs {as_flags} ({named('as options', 'as arguments')} or in the TOML file)")
    spec = GridSpec(**fields, names=_grid_names(config, file_fields, given, fields["sweep"], flagged, written))
    spec.check_given()  # a user's grid only (its stages carry what it gave); before its file's axes load torch
    kept = [k for k, v in from_file.items() if spec.sweep.get(k) == [axis_text(x) for x in (v if isinstance(v, list) else [v])]]
    if kept:  # not overridden on the command line
        check_file_axes(spec, kept, Path(config))
    return spec


def _check_names(fields: dict, names) -> None:
    """A grid's methods and trackers, by name, as GridSpec checks them (``names``: its top-level keys' ``Names``):
    before ``_merged_sweep`` reads the methods' settings for the axes given (``--rounds 5``, ``--set``, ``[set]``),
    which imports them and torch (seconds)."""
    from fedcache.spec import check_method, check_trackers

    for m in fields["methods"] or []:
        try:
            check_method(m)
        except FedcacheError as exc:  # a grid file's unknown method: said of the file, as its other keys are
            raise type(exc)(names.where("methods") + str(exc)) from None
    if fields.get("prune", "none") == "none":  # a pruned grid takes no tracker at all: GridSpec says so first
        check_trackers(fields.get("track") or [], names.track_said())


def _grid_names(config: str | Path | None, file_fields: dict, given: dict, sweep: dict, flagged: frozenset[str],
                written):
    """Which of a grid's keys its file gave and the call did not replace (named as the file's keys in messages,
    with their values as ``written`` there), and every key given at all (a default value given on purpose is then
    told apart from one left out)."""
    from fedcache.grids.spec import Names, axis_key

    called = {k for k, v in given.items() if v is not None}
    filed = {k for k in file_fields if k != "sweep" and k not in called}
    filed |= {axis_key(k) for k, v in file_fields.get("sweep", {}).items() if sweep.get(k) is v}
    return Names(Path(config) if config else None, frozenset(filed),
                 frozenset(called | set(file_fields) | {axis_key(k) for k in sweep}), flagged, written)


def _merged_sweep(from_file: dict, methods: list[str], settings: Any, sweep: Any,
                  flags: Any) -> tuple[dict, frozenset[str]]:
    """The grid file's axes with the call's over them (``--set``, ``sweep=``, the run-option flags), and the keys of
    those the CLI's run-option flags gave (``--alpha`` beside perfedavg: ``partition.alpha``), so that messages name
    them by the flag, not as the ``--set`` no one typed. The call's key replaces the file's for the same setting
    under another name too (``optim.lr`` in the file, ``--set lr``), as under the same name: refused as one setting
    given twice, the command line could not override the file."""
    from fedcache.grids import option_axes
    from fedcache.grids.spec import setting_places
    from fedcache.spec import option, parse_axes

    given = parse_axes(list(settings)) if settings else {}
    if sweep is not None:
        given.update(_sweep_axes(sweep))
    axes: dict = {}
    if flags:
        for name, values in flags.items():  # each value as its cells check it (--rounds 0), before option_axes reads
            for value in values:            # the methods' settings, which imports them and torch (seconds)
                option(name).parse(value)
        axes = option_axes(flags, methods)
        twice = sorted(set(axes) & set(parse_axes(list(settings or []))))
        if twice:  # --set rounds=6 --rounds 3: one of them would be dropped without a word
            raise ConfigError(f"{twice[0]} is given both as --set {twice[0]}=... and as its own option; give it once")
        given.update(axes)
    taken = {place for key in given for place in setting_places(key, methods)}
    kept = {k: v for k, v in from_file.items() if k not in given and not setting_places(k, methods) & taken}
    return {**kept, **given}, frozenset(axes)


@_keywords_checked(hint=_swept_hint)
@_keywords_named
@_refusals_said
def grid(store: str | Path | None = None, dataset: str | None = None, backbones: str | Iterable[str] | None = None,
         methods: str | Iterable[str] | None = None, sweep: dict[str, Any] | None = None,
         seeds: int | str | Iterable[int] | None = None, out: str | Path | None = None, jobs: int | None = None,
         config: str | Path | None = None, on_cell: Callable | None = None, select: str | Iterable[str] | None = None,
         track: str | Iterable[str] | None = None, keep_checkpoints: str | None = None, engine: str | None = None,
         max_batch_cells: int | None = None, on_plan: Callable[[str], None] | None = None,
         device: str | None = None, prune: str | None = None, reduction_factor: int | None = None,
         min_rounds: int | None = None) -> Table:
    """The cartesian grid methods x sweep x seeds (``fedcache grid``); returns one row per run.

    ``backbones``, ``methods``, ``seeds``, ``select`` and ``track`` each take one value, a comma-separated text
    (``seeds="0,1"``) or a list. ``sweep`` is a dict that maps a key to its value or list of values: run options
    (alpha, partition, clients, rounds, ...; the names of ``fedcache.train``) or method/optimizer settings (lr, mu,
    ...). Finished cells in ``out`` are read back, not re-run.
    ``store``: default FEDCACHE_STORE, else fedcache-store.zarr (below a grid file's store), as for the CLI and
    ``extract_features``.
    ``select``: sweep keys chosen per method and setting on the validation split, then run once on the test
    split (the returned rows are the test runs). ``engine``: "batched" (cells trained together, the default)
    or "processes" (each cell its own run); ``max_batch_cells`` bounds a batch (fedcache/spec.py, GridEngineSpec);
    ``on_plan`` is told how the engine runs the cells (how it grouped them) before it starts. ``device``: where
    every cell's rounds run (auto, cpu, cuda, cuda:N, mps), as ``fedcache.train``'s. ``prune="halving"`` (with
    ``select``): successive halving cuts the candidates on validation (``reduction_factor``, default 3, and
    ``min_rounds``, the rounds before the first cut; docs/tuning.md). Swept values come back as numbers where
    they are numbers (``where(lr=0.01)``), as ``Table.from_csv`` reads them from results.csv.
    """
    from fedcache.grids import run_grid
    from fedcache.paths import default_store

    check_callback("on_cell", on_cell, "done", "total", "row")
    check_callback("on_plan", on_plan, "text")
    if config is not None:
        _a_path("config", config, "a grid file (TOML)")
    spec = grid_spec(config, default_store=default_store(), store=store, dataset=dataset, backbones=_listed(backbones), methods=_listed(methods),
                     sweep=sweep, seeds=_listed(seeds), out=out, jobs=jobs, select=_listed(select) or None,
                     track=_listed(track) or None,
                     keep_checkpoints=keep_checkpoints, engine=engine, max_batch_cells=max_batch_cells, device=device,
                     prune=prune, reduction_factor=reduction_factor, min_rounds=min_rounds)
    # The rows as the returned table has them: numbers where the axis values are numbers.
    told = (lambda done, total, row, _text: on_cell(done, total, Table([row]).parsed(spec.sweep)[0])) if on_cell else None
    return run_grid(spec, told, on_plan=on_plan).parsed(spec.sweep)


@_keywords_checked()
@_keywords_named
@_refusals_said
def report(run_or_grid: str | Path, out: str | Path | None = None) -> Path:
    """``fedcache report``: HTML (self-contained) and markdown for a run or grid directory; returns the HTML path."""
    from fedcache.reports import write_report

    _a_path("run_or_grid", run_or_grid, "a run's or grid's directory")
    if out is not None:
        _a_path("out", out, "the folder the report goes to")
    return write_report(Path(run_or_grid), Path(out) if out else None).html


def _a_path(name: str, value: Any, what: str) -> None:
    """A path argument given as something else is refused by its keyword, as the run options are (``out=5``)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name}={value!r}: expected a path (text), {what}")


# ---- signatures ----------------------------------------------------------------------------
# help() and inspect.signature show the real parameters, built from the declarations the CLI uses, so
# they cannot drift from what the functions accept (tests/test_api.py checks both).
def _keyword(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _fixed(fn: Callable, options: list[inspect.Parameter]) -> inspect.Signature:
    """``fn``'s own parameters (annotations resolved, not text) with ``**options`` replaced by ``options``."""
    hints = typing.get_type_hints(fn)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return inspect.Signature(own + options, return_annotation=hints.get("return", inspect.Signature.empty))


def _store_shown(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` with the store that ``store=None`` stands for as its default (FEDCACHE_STORE, else
    fedcache-store.zarr): the same in extract_features, train and grid."""
    from fedcache.paths import default_store

    return sig.replace(parameters=[p.replace(default=default_store()) if p.name == "store" else p
                                   for p in sig.parameters.values()])


def _train_signature() -> inspect.Signature:
    from fedcache.spec import SECTIONS, options

    taken = set(inspect.signature(train).parameters) | {"settings"}
    hints = {name: typing.get_type_hints(cls) for name, cls in SECTIONS.items()}  # without the range annotations
    return _store_shown(_fixed(train, [_keyword(o.name, None if o.required else o.default, hints[o.section][o.field])
                                       for o in options() if o.name not in taken]))


def _option_lines(rows: list[tuple[str, str]]) -> str:
    return "\n".join(f"    {name}: {text}" for name, text in rows)


def _train_doc() -> str:
    from fedcache.spec import options

    taken = set(inspect.signature(train).parameters)
    rows = [(o.name, o.opt.help if isinstance(o.opt.help, str) else "see `fedcache train --help`")
            for o in options() if o.name not in taken]
    return train.__doc__ + "\n\n    Options (fedcache/spec.py; the CLI's --options under the same names):\n" + _option_lines(rows)


train.__doc__ = _train_doc()
train.__signature__ = _train_signature()
grid.__signature__ = _store_shown(_fixed(grid, []))


def _with_extract_signature(fn: Callable) -> Callable:
    """extract's options are declared in fedcache/extract/config.py (its settings); reading them imports no torch,
    but they are read on first access of ``extract_features``, not on ``import fedcache``, which needs none."""
    from fedcache.extract.config import DatasetOptions, ExtractConfig, options

    hints = {**typing.get_type_hints(DatasetOptions), **typing.get_type_hints(ExtractConfig)}  # without ranges
    fn.__signature__ = _store_shown(_fixed(fn, [_keyword(o.name, o.default, hints[o.field]) for o in options()
                                                if o.name not in inspect.signature(fn).parameters]))
    fn.__name__ = fn.__qualname__ = "extract_features"
    return fn


def __getattr__(name: str) -> Any:
    if name == "extract_features":
        fn = globals()["extract_features"] = _with_extract_signature(_extract_features)
        return fn
    raise AttributeError(f"module 'fedcache.api' has no attribute {name!r}")
