"""The run specification: every option of a federated run, declared once.

``RunSpec`` has one section per concern (data, partition, method, optim, head, schedule, engine); each
field carries its help text, its type (with its valid range, the types of ``federate/settings.py``),
its command-line flag and whether a grid may sweep it. Everything else is derived from it:

- the options of ``fedcache train``, ``grid``, ``partition`` and ``shard`` (``fedcache/cli/`` builds them from
  ``options()``), under one name each: the *option name* (``partition``, ``clients``, ``rounds``, ...);
- the Python API's keyword arguments (``RunSpec.of(**options)`` takes the same names);
- a run's ``config.json`` (``to_dict`` / ``from_dict``, nested by section);
- the Flower run config (``to_flat`` / ``from_flat``: ``section.field`` keys, plain values).

Numeric ranges are checked when a spec is built, before any data is read. Method, optimizer and head
hyperparameters (``--set``) stay in their own dataclasses (the method's ``Params``, ``OptimConfig``);
the method section holds the method's name and those ``key=value`` pairs, and
``federate.train.resolve(spec)`` builds the dataclasses from them (importing the methods, hence torch).
This module imports no torch.
"""
from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fedcache.errors import ConfigError
from fedcache.federate.settings import NonNegativeInt, Positive, PositiveInt, Range, fields_of

Share = Annotated[float, Range(0, 1, lo_open=True)]  # a share that must keep something: (0, 1]
Rate = Annotated[float, Range(0, 1)]  # [0, 1]


@dataclass(frozen=True)
class Opt:
    """How a field appears outside Python: its option name, flags, help and role in a grid."""

    help: str | Callable[[], str]  # a callable is asked when the help is shown (it reads a registry)
    name: str = ""  # option name (API keyword, CLI parameter); default: the field's name
    short: str = ""  # e.g. "-d"
    aliases: tuple[str, ...] = ()  # further long flags (--backbone for --backbones)
    flag: str = ""  # default: --<option name with dashes>; "--a/--no-a" for a switch
    axis: bool = True  # `fedcache grid` may sweep it (v1,v2,...)
    recorded: bool = True  # part of what a run is (config.json); False: where it is written, whether it continues
    sep: str = ","  # how a tuple is written as one string (CLI text, Flower config)
    repeatable: bool = False  # a tuple given as a repeated flag (--set a=1 --set b=2), not as one text


def opt(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **meta: Any) -> Any:
    return field(default=default, default_factory=factory, metadata={"opt": Opt(**meta)})


def default_store() -> Path:
    return Path(os.environ.get("FEDCACHE_STORE", "fedcache-store.zarr"))


def _preset_help() -> str:
    from fedcache.federate.optim_config import PRESETS, describe

    return ("Optimizer defaults: " + "; ".join(f"{n} ({describe(c)})" for n, c in PRESETS.items())
            + "; default: the method's (`fedcache methods`).")


def _schemes() -> tuple[str, ...]:
    from fedcache.federate.partitions import PARTITIONERS

    return tuple(PARTITIONERS.names())


def _presets() -> tuple[str, ...]:
    from fedcache.federate.optim_config import PRESETS

    return tuple(PRESETS)


# Options whose values are a registry's names: checked when a spec is built, not when the data is read.
_REGISTRY_CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {"partition.scheme": _schemes, "optim.preset": _presets}


class Section:
    """A group of fields; checks every value against its declared type and range when built."""

    def __post_init__(self) -> None:
        types = fields_of(type(self))
        for f in dataclasses.fields(self):
            _check(self, f, getattr(self, f.name), types[f.name])


@dataclass(frozen=True)
class DataSpec(Section):
    dataset: str = opt(short="-d", axis=False, help="Dataset name in the store (see `fedcache store ls`).")
    backbones: tuple[str, ...] = opt(short="-b", aliases=("--backbone",), axis=False,
                                     help="One backbone, or several to fuse (concatenated).")
    store: Path = opt(factory=default_store, axis=False, help="Feature store path (env FEDCACHE_STORE).")


@dataclass(frozen=True)
class PartitionSpec(Section):
    # The help names the schemes without importing the partitions (zarr: a second at start-up); a test
    # keeps it equal to the registry, and values are checked against the registry itself.
    scheme: str = opt("iid", name="partition", help="iid, dirichlet, shards, domain, domain-dirichlet, class-disjoint.")
    clients: PositiveInt | None = opt(None, help="Number of clients (default: one per domain for domain partitions, else 10).")
    alpha: Positive | None = opt(None, help="Dirichlet concentration (dirichlet, domain-dirichlet; default 0.5).")
    shards: PositiveInt | None = opt(None, help="Shards per client (shards; default 2).")
    few_shot: PositiveInt | None = opt(None, help="N training samples per class per client.")
    class_budget: PositiveInt | None = opt(
        None, help="dirichlet, domain-dirichlet: spread only N x clients rows of each class by Dirichlet(alpha) over "
                   "all clients (about N per class per client; domain-dirichlet: each from its own domain), "
                   "FedPCL's protocol; default: every row.")
    subsample: Share = opt(1.0, help="Keep this fraction of each client's rows of each class (keeps its label mix).")
    clients_per_domain: PositiveInt | None = opt(None, help="Clients per domain (domain partitions; default: clients / domains).")
    classes_per_client: PositiveInt | None = opt(None, help="Classes per client (class-disjoint).")
    repeat_rate: Rate = opt(0.0, help="Share of extra classes from other clients (class-disjoint).")
    local_test: PositiveInt = opt(1000, help="Max local test samples per client.")
    local_test_mix: Literal["client", "uniform"] = opt(
        "client", help="client: a client's local test rows follow its (class, domain) mix; uniform: every class "
                       "alike, from the domains it holds (FedPCL's feature & label shift test sets).")


@dataclass(frozen=True)
class MethodSpec(Section):
    name: str = opt(name="method", short="-m", axis=False, help="See `fedcache methods`.")
    settings: tuple[str, ...] = opt((), flag="--set", axis=False, sep=" ", repeatable=True,
                                    help="key=value for method / optimizer hyperparameters (repeatable).")


@dataclass(frozen=True)
class OptimSpec(Section):
    preset: str | None = opt(None, help=_preset_help)


@dataclass(frozen=True)
class HeadSpec(Section):
    name: str | None = opt(None, name="head", help="linear or mlp (default: the method's).")


@dataclass(frozen=True)
class ScheduleSpec(Section):
    rounds: PositiveInt = opt(50, help="Federated rounds.")
    fraction: Share = opt(1.0, help="Fraction of clients sampled each round.")
    local_epochs: PositiveInt = opt(1, help="Local epochs per round (each client, each round).")
    batch_size: PositiveInt = opt(32, help="Local mini-batch size.")
    eval_every: PositiveInt = opt(1, help="Evaluate every k rounds (and after the last).")
    seed: NonNegativeInt = opt(0, axis=False, help="Seed of the partition, initialisation, sampling and batches.")
    # Spare training rows (no client trains on them, drawn with each client's class and domain mix)
    # instead of the test split: for choosing hyperparameters without touching the test set.
    validation: bool = opt(False, help="Score on spare training rows instead of the test split (for tuning).")


@dataclass(frozen=True)
class EngineSpec(Section):
    name: Literal["in-process", "flower-sim"] = opt(
        "in-process", name="engine", axis=False,
        help="in-process, or flower-sim (Flower's simulation engine; needs the flower extra).")
    batched: bool = opt(True, flag="--batch/--no-batch", help="Train the clients batched (--no-batch: one by one).")
    out: Path | None = opt(None, short="-o", axis=False, recorded=False,
                           help="Run directory: config.json, metrics.jsonl, summary.json.")
    resume: bool = opt(False, axis=False, recorded=False, help="Continue the run in --out from its last checkpoint.")
    overwrite: bool = opt(False, axis=False, recorded=False,
                          help="Replace the run in --out (a finished or diverged one) instead of refusing.")
    keep_checkpoints: Literal["last", "none", "all"] = opt(
        "last", axis=False, recorded=False,
        help="last: the latest checkpoint (what --resume needs); none: deleted when the run finishes; all: one per round.")
    track: tuple[str, ...] = opt((), axis=False, recorded=False,
                                 help="Also send metrics to: tensorboard, mlflow (comma-separated; pip install "
                                      "'fedcache[tensorboard]' / 'fedcache[mlflow]'); written under --track-dir (a grid: under its --out).")
    track_dir: Path | None = opt(None, axis=False, recorded=False,
                                 help="Where trackers write (default: --out; a grid's cells use the grid's --out).")


@dataclass(frozen=True)
class GridEngineSpec(Section):
    """How ``fedcache grid`` runs its cells: not part of any run (each cell's result is the same either way)."""

    # batched is the default: on the maintained benchmark (benchmarks/grid_speed.py, docs/performance.md) it trained
    # 1.16x-1.35x the process engine's cells per minute in five runs on a 2-core CPU (stacks of 5 cells; about even,
    # 0.96x-1.00x, on the worked grid's stacks of two and three), with every cell bit-identical to its own run;
    # processes stays one flag away for the comparison.
    engine: Literal["batched", "processes"] = opt(
        "batched", axis=False, recorded=False,
        help="batched: cells of one method that share data, head, schedule and every setting not applied per cell "
             "train together as one stacked computation (cells of one partition and seed together first), each "
             "equal to its own run bit for bit "
             "(methods that cannot stack run as their own runs, transparently); processes: every cell in its own "
             "run (--jobs worker processes).")
    max_batch_cells: PositiveInt | None = opt(
        None, axis=False, recorded=False,
        help="Most cells trained together in one batch (default: as many as a quarter of the free memory holds).")


SECTIONS: dict[str, type[Section]] = {
    "data": DataSpec, "partition": PartitionSpec, "method": MethodSpec, "optim": OptimSpec, "head": HeadSpec,
    "schedule": ScheduleSpec, "engine": EngineSpec,
}


# Options of `fedcache grid` itself (not of a run), declared like the run's: the CLI and GridSpec read them here.
GRID_SECTIONS: dict[str, type[Section]] = {"grid": GridEngineSpec}


@dataclass(frozen=True)
class Option:
    """One field of the spec as the outside sees it."""

    section: str
    field: str
    type: Any  # with its Annotated range
    opt: Opt
    default: Any  # dataclasses.MISSING: required

    @property
    def name(self) -> str:
        return self.opt.name or self.field

    @property
    def key(self) -> str:
        return f"{self.section}.{self.field}"

    @property
    def flags(self) -> tuple[str, ...]:
        """The CLI's flags; a switch is ``--x/--no-x``."""
        long = self.opt.flag or "--" + self.name.replace("_", "-")
        if self.base is bool and "/" not in long:
            long = f"{long}/--no-{long[2:]}"
        return (long, *self.opt.aliases, *((self.opt.short,) if self.opt.short else ()))

    @property
    def flag(self) -> str:
        """The flag as error messages name it: ``--rounds``."""
        return self.flags[0].split("/")[0]

    @property
    def help(self) -> str:
        return self.opt.help() if callable(self.opt.help) else self.opt.help

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def base(self) -> Any:
        """The type without range and None: str, int, float, bool, Path, tuple."""
        return _base(self.type)

    def parse(self, value: Any) -> Any:
        """A value of this option from Python or text (CLI, grid axis, Flower config), type-checked."""
        return _coerce(self, value, self.type)


def options(*sections: str) -> list[Option]:
    """The options of the given sections (all by default), in declaration order."""
    out = []
    for sec in sections or tuple(SECTIONS):
        cls = {**SECTIONS, **GRID_SECTIONS}[sec]
        types = fields_of(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out.append(Option(sec, f.name, types[f.name], f.metadata["opt"], default))
    return out


def grid_options() -> list[Option]:
    """The options of ``fedcache grid`` itself that the spec declares (engine, max_batch_cells)."""
    return options(*GRID_SECTIONS)


def is_option(name: str) -> bool:
    """Whether ``name`` is a run option (its name or its qualified key), not a ``--set`` setting."""
    return name.replace("-", "_") in _BY_NAME


def option(name: str) -> Option:
    """An option by its name (``clients``) or its qualified key (``partition.clients``)."""
    found = _BY_NAME.get(name.replace("-", "_"))
    if found is None:
        raise ConfigError(f"unknown option {name!r}; known: {', '.join(sorted(_BY_NAME_ONLY))}")
    return found


@dataclass(frozen=True)
class RunSpec:
    data: DataSpec
    method: MethodSpec
    partition: PartitionSpec = field(default_factory=PartitionSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    head: HeadSpec = field(default_factory=HeadSpec)
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)

    @classmethod
    def of(cls, **given: Any) -> "RunSpec":
        """A spec from option names (``dataset=..., partition="domain", rounds=5``), the API's and CLI's
        names; qualified keys (``schedule.rounds``) are accepted too. Text values are parsed."""
        return cls(**build_sections(given, tuple(SECTIONS)))

    def replace(self, **given: Any) -> "RunSpec":
        """A copy with the named options changed (option names or qualified keys, as ``of``)."""
        return RunSpec(**build_sections(given, tuple(SECTIONS), base=self.sections()))

    def sections(self) -> dict[str, Section]:
        return {s: getattr(self, s) for s in SECTIONS}

    def get(self, name: str) -> Any:
        o = option(name)
        return getattr(getattr(self, o.section), o.field)

    # ---- config.json -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The spec as JSON values, nested by section; what a run's config.json records (not where
        the run is written nor whether it was resumed)."""
        out: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        for o in options():
            if o.opt.recorded:
                out[o.section][o.field] = _plain(self.get(o.key), json=True, sep=o.opt.sep)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, dict[str, Any]]) -> "RunSpec":
        return cls.of(**{f"{s}.{k}": v for s, fields_ in d.items() for k, v in fields_.items()})

    # ---- Flower run config -----------------------------------------------------------------
    def to_flat(self) -> dict[str, str | int | float | bool]:
        """``section.field`` -> a plain value (str, int, float, bool), as a Flower run config holds them."""
        return to_flat(self.sections())

    @classmethod
    def from_flat(cls, flat: dict[str, Any], base: "RunSpec") -> "RunSpec":
        """``base`` with the ``section.field`` values of ``flat`` (other keys are the caller's)."""
        return base.replace(**{k: v for k, v in flat.items() if k in _BY_KEY})


def build_sections(given: dict[str, Any], names: tuple[str, ...], base: dict[str, Section] | None = None
                   ) -> dict[str, Section]:
    """The sections ``names`` from option names or qualified keys (text parsed, every value checked), over
    ``base``'s values; an option of another section, or an unknown one, is an error."""
    known = {k for k, o in _BY_NAME.items() if o.section in names}
    unknown = sorted(k for k in given if k.replace("-", "_") not in known)
    if unknown:
        names_ = sorted(o.name for o in options(*names))
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(names_)}")
    per: dict[str, dict[str, Any]] = {s: {} for s in names}
    for key, value in given.items():
        o = option(key)
        if o.field in per[o.section]:
            raise ConfigError(f"option {o.name} is given twice (as {key} and {o.key}); keep one")
        per[o.section][o.field] = o.parse(value)
    missing = [o for o in options(*names) if o.required and o.field not in per[o.section] and base is None]
    if missing:
        raise ConfigError(f"a run needs {', '.join(o.flag for o in missing)}")
    if base is not None:
        return {s: dataclasses.replace(base[s], **per[s]) for s in names}
    return {s: SECTIONS[s](**per[s]) for s in names}


def to_flat(sections: dict[str, Section]) -> dict[str, str | int | float | bool]:
    """``section.field`` -> a plain value (str, int, float, bool): the Flower run config. ``None`` is
    written as "" and a tuple as one string (backbones comma-, settings space-separated)."""
    return {o.key: _plain(getattr(sections[o.section], o.field), json=False, sep=o.opt.sep)
            for o in options(*sections) if o.opt.recorded}


# ---- values --------------------------------------------------------------------------------
_UNIONS = (typing.Union, types.UnionType)


def _base(typ: Any) -> Any:
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is Annotated:
        return _base(args[0])
    if origin in _UNIONS:
        return _base(next(a for a in args if a is not type(None)))
    if origin is Literal:
        return str
    return tuple if origin is tuple else typ


def _optional(typ: Any) -> bool:
    return typing.get_origin(typ) in _UNIONS and type(None) in typing.get_args(typ)


def _coerce(o: Option, value: Any, typ: Any) -> Any:
    shown = f"{o.flag} ({o.key})={value!r}"
    if value is None or (_optional(typ) and isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        if _optional(typ):
            return None
        raise ConfigError(f"{shown}: a value is required")
    base = o.base
    try:
        if base is tuple:
            items = value.split(o.opt.sep) if isinstance(value, str) else list(value)
            return tuple(str(v).strip() for v in items if str(v).strip())
        if base is bool:
            return _bool(value)
        if base in (int, float) and isinstance(value, bool):
            raise ValueError
        if base is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return base(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{shown}: expected {getattr(base, '__name__', base)}") from None


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        if text not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError
        return text in ("true", "1", "yes")
    if isinstance(value, (bool, int)) and value in (0, 1):
        return bool(value)
    raise ValueError


def _check(section: Section, f: dataclasses.Field, value: Any, typ: Any) -> None:
    o = Option(_SECTION_NAMES[type(section)], f.name, typ, f.metadata["opt"], f.default)
    shown = f"{o.flag} ({o.key})={value!r}"
    if value is None:
        if not _optional(typ):
            raise ConfigError(f"{o.flag} ({o.key}): a value is required")
        return
    base = o.base
    if base is tuple:
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{shown}: expected a tuple of strings (RunSpec.of converts lists and text)")
        if o.required and not value:
            raise ConfigError(f"{o.flag} ({o.key}): give at least one name")
        return
    if base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, base) and not (base is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{shown}: expected {'a finite number' if base is float else base.__name__}")
    if o.required and value == "":
        raise ConfigError(f"{o.flag} ({o.key}): a value is required")
    choices = _choices(typ) or (_REGISTRY_CHOICES[o.key]() if o.key in _REGISTRY_CHOICES else ())
    if choices and value not in choices:
        raise ConfigError(f"{shown}: must be one of {', '.join(choices)}")
    rng = _range(typ)
    if rng is not None and not rng.contains(value):
        raise ConfigError(f"{shown}: must be {rng}")


def _range(typ: Any) -> Range | None:
    for t in (typ, *typing.get_args(typ)):
        if typing.get_origin(t) is Annotated:
            return next((a for a in typing.get_args(t)[1:] if isinstance(a, Range)), None)
    return None


def _choices(typ: Any) -> tuple[str, ...]:
    for t in (typ, *typing.get_args(typ)):
        if typing.get_origin(t) is Literal:
            return typing.get_args(t)
    return ()


def _plain(value: Any, json: bool, sep: str) -> Any:
    if isinstance(value, tuple):
        return list(value) if json else sep.join(value)
    if isinstance(value, Path):
        return str(value)
    if value is None and not json:
        return ""
    return value


_SECTION_NAMES = {cls: name for name, cls in {**SECTIONS, **GRID_SECTIONS}.items()}
_BY_NAME_ONLY = {o.name: o for o in options()}
_BY_KEY = {o.key: o for o in options()}
_BY_NAME = {**_BY_NAME_ONLY, **_BY_KEY}
