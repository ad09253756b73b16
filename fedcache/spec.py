"""The run specification: one typed tree of every setting of a federated run.

``RunSpec`` has one section per concern: ``data`` (dataset, backbones, store), ``partition``
(``federate.partitions.PartitionSpec``), ``method`` (its name and its typed ``Params``), ``optim``
(``federate.optim_config.OptimConfig``, from a preset), ``head``, ``schedule`` (``federate.schedule.Schedule``)
and ``engine``. Each field is declared once, in its section, with its type, range, default and (for the
options) its flag and help; everything else is derived from the tree:

- the options of ``fedcache train``, ``grid``, ``partition`` and ``shard`` (``fedcache/cli/`` builds them from
  ``options()``), under one name each (``partition``, ``clients``, ``rounds``, ...), and the Python API's
  keyword arguments (``RunSpec.of(**options)`` takes the same names);
- ``--set key=value`` overrides of the method's, the optimizer's and the head's settings, and a grid's axes:
  ``route`` finds the field a key names, once, for every entry point, and ``fedcache.config.parse`` checks
  its value;
- a run's ``config.json`` (``to_dict`` / ``from_dict``, the tree as JSON) and the Flower run config
  (``to_flat``: ``section.field`` keys, plain values, the settings as ``key=value`` text; read back by
  ``fedcache.flower.config.FlowerRun``).

A value out of range fails when the spec is built, before any data is read, with a message naming the flag
or key, the value and the range. Importing this module imports no torch; building a spec imports the
method registry (the method's ``Settings``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fedcache.config import DEVICES, Checked, Choices, Opt, Option, PositiveInt, Range, fields_of, opt, options_of, parse
from fedcache.errors import ConfigError, UnknownOptionError
from fedcache.paths import STORE_HELP, check_name, default_store
from fedcache.wording import did_you_mean, named, set_flag, set_key, setting, swept, typed_as, write_setting
from fedcache.federate.optim_config import OPTIMIZER_PRESETS, OptimConfig
from fedcache.federate.partitions.core import PartitionSpec
from fedcache.federate.schedule import Schedule


def _heads() -> tuple[str, ...]:
    from fedcache.heads import HEADS

    return tuple(HEADS.names())


@dataclass(frozen=True)
class DataSpec(Checked):
    section = "data"

    dataset: str = opt(short="-d", axis=False, help="Dataset name in the store (see `fedcache store ls`).")
    backbones: tuple[str, ...] = opt(short="-b", aliases=("--backbone",), axis=False,
                                     help="One backbone, or several to fuse (concatenated).")
    store: Path = opt(factory=default_store, axis=False, help=STORE_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.dataset:
            raise ConfigError(f"{self.label('dataset')}: a value is required")
        if not self.backbones:
            raise ConfigError(f"{self.label('backbones')}: give at least one name")
        # The names a store can hold (a dataset's is a folder of it): any other was never extracted or imported.
        check_name(self.dataset, self.label("dataset"))
        for b in self.backbones:
            check_name(b, self.label("backbones"))
        twice = sorted({b for b in self.backbones if self.backbones.count(b) > 1})
        if twice:  # fused with itself, a backbone's features were concatenated twice: a doubled input, not a second view
            raise ConfigError(f"{self.label('backbones')}: {', '.join(twice)} named more than once; name each backbone "
                              "to fuse once")


@dataclass(frozen=True)
class MethodSpec(Checked):
    """The method and its settings: ``params`` is an instance of the method's ``Params`` (its defaults when
    left out), checked like every other section."""

    section = "method"

    name: str = opt(name="method", short="-m", axis=False, help="See `fedcache methods`.")
    params: Any = None

    def __post_init__(self) -> None:
        cls = method_class(self.name)  # an unknown name says what is close and what exists
        if self.params is None:
            object.__setattr__(self, "params", cls.Settings())
        elif type(self.params) is not cls.Settings:
            raise ConfigError(f"{self.name}'s settings are {cls.Settings.__name__}, not {type(self.params).__name__}")
        super().__post_init__()


@dataclass(frozen=True)
class HeadChoice(Checked):
    section = "head"

    # The help names the heads as text, so that reading it imports no torch; a test keeps it equal to the registry.
    name: Annotated[str, Choices(_heads)] | None = opt(None, name="head", help="linear, mlp, projection (default: the method's).")


@dataclass(frozen=True)
class EngineSpec(Checked):
    section = "engine"

    name: Literal["in-process", "flower-sim"] = opt(
        "in-process", name="engine", axis=False,
        help="in-process, or flower-sim (Flower's simulation engine; needs the flower extra).")
    batched: bool = opt(True, flag="--batch/--no-batch", help="Train the clients batched (--no-batch: one by one).")
    device: str = opt("auto", axis=False, help="Where the rounds run: auto (a GPU when there is one, said once), cpu, "
                                               "cuda, cuda:N or mps. The features, partitions and states stay there.")
    out: Path | None = opt(None, short="-o", axis=False, recorded=False,
                           help="Run directory: config.json, metrics.jsonl, checkpoints, summary.json. Left out, the "
                                "run writes nothing: it prints its result and cannot be resumed or reported.")
    resume: bool = opt(False, axis=False, recorded=False, help="Continue the run in --out from its last checkpoint.")
    overwrite: bool = opt(False, axis=False, recorded=False,
                          help="Replace the run in --out (a finished or diverged one) instead of refusing.")
    keep_checkpoints: Literal["last", "none", "all"] = opt(
        "last", axis=False, recorded=False,
        help="last: the latest checkpoint (what continuing an interrupted run needs); none: deleted when the run "
             "finishes; all: one per round.")
    track: tuple[str, ...] = opt((), axis=False, recorded=False,
                                 help="Also send metrics to: tensorboard, mlflow (comma-separated; pip install "
                                      "'fedcache[tensorboard]' / 'fedcache[mlflow]'); written under --track-dir.")
    track_dir: Path | None = opt(None, axis=False, recorded=False,
                                 help="Where trackers write (default: --out; a grid's cells use the grid's --out).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not re.fullmatch(DEVICES, self.device):
            raise ConfigError(f"{self.label('device')}={self.device!r}: must be auto, cpu, cuda, cuda:N or mps")


@dataclass(frozen=True)
class GridEngineSpec(Checked):
    """How ``fedcache grid`` runs its cells: not part of any run (each cell's result is the same either way)."""

    section = "grid"

    engine: Literal["batched", "processes"] = opt(
        "batched", axis=False, recorded=False,
        help="batched: cells of one method that share data, head, schedule and every setting not applied per cell "
             "train together as one stacked computation (cells of one partition and seed together first), each "
             "equal to its own run bit for bit (methods that cannot stack run as their own runs, transparently); "
             "processes: every cell in its own run (--jobs worker processes).")
    max_batch_cells: PositiveInt | None = opt(
        None, axis=False, recorded=False,
        help="Most cells trained together in one batch (default: as many as a quarter of the free memory holds).")


@dataclass(frozen=True)
class PruneSpec(Checked):
    """How a ``--select`` grid spends its rounds on the candidates: all in full, or successive halving
    (fedcache/grids/halving.py). Part of the grid (it decides which runs train how far), not of any run."""

    section = "prune"

    prune: Literal["none", "halving"] = opt(
        "none", axis=False,
        help="With --select: halving trains every candidate a few rounds, keeps the best 1/reduction-factor by mean "
             "validation score over seeds, continues those from their checkpoints, and so on until one is left "
             "(docs/tuning.md; a late bloomer can be cut: see there when to keep the full grid).")
    reduction_factor: Annotated[int, Range(2, None)] = opt(
        3, axis=False, help="--prune halving: each cut keeps the best 1/reduction-factor of a group's candidates.")
    min_rounds: PositiveInt | None = opt(
        None, axis=False,
        help="--prune halving: rounds before the first cut (default: the rounds / reduction-factor^cuts, so that "
             "the last cut comes at rounds / reduction-factor).")


SECTIONS: dict[str, type] = {"data": DataSpec, "partition": PartitionSpec, "method": MethodSpec, "optim": OptimConfig,
                             "head": HeadChoice, "schedule": Schedule, "engine": EngineSpec}
# Options of `fedcache grid` itself (not of a run), declared like the run's: the CLI and the grid read them here.
GRID_SECTIONS: dict[str, type] = {"grid": GridEngineSpec, "prune": PruneSpec}
# What ``--set`` overrides, and the prefixes that qualify a key (``optim.lr``; ``optimizer.`` and ``params.`` too).
SETTING_GROUPS = ("method", "optim", "head")
GROUP_ALIASES = {"optimizer": "optim", "params": "method"}


def method_class(name: str):
    from fedcache.federate.methods import METHODS

    return METHODS.get(name)


# ---- options: the fields the command line and the API name ------------------------------------
# ``--set key=value``: not a field of the tree but what overrides its method, optimizer and head settings.
SETTINGS = Option("method", "settings", tuple[str, ...], Opt(
    help="key=value for method / optimizer hyperparameters (repeatable; `fedcache methods NAME` lists a method's).",
    flag="--set", axis=False, recorded=False,
    sep=" ", repeatable=True), ())


def options(*sections: str) -> list[Option]:
    """The options of the given sections (all by default), in declaration order: the fields that have a flag,
    and ``--set`` with the method's."""
    out = []
    for sec in sections or tuple(SECTIONS):
        out += options_of({**SECTIONS, **GRID_SECTIONS}[sec], sec)
        if sec == "method":
            out.append(SETTINGS)
    return out


def grid_options() -> list[Option]:
    """The options of ``fedcache grid`` itself that the spec declares (engine, max_batch_cells, prune, ...)."""
    return options(*GRID_SECTIONS)


def is_option(name: str) -> bool:
    """Whether ``name`` is a run option (its name or its qualified key), not a ``--set`` setting."""
    return name.replace("-", "_") in _BY_NAME


def option(name: str) -> Option:
    """An option by its name (``clients``) or its qualified key (``partition.clients``)."""
    found = _BY_NAME.get(name.replace("-", "_"))
    if found is None:
        raise ConfigError(f"unknown option {name!r}{did_you_mean(name, sorted(_BY_NAME_ONLY))}; known: "
                          f"{', '.join(sorted(_BY_NAME_ONLY))}")
    return found


# ---- the tree -----------------------------------------------------------------------------------
class _ByOption:
    """``get``: an option's value in a spec's sections, by the option's name or qualified key."""

    def get(self, name: str) -> Any:
        o = option(name)
        return getattr(getattr(self, o.section), o.field)


@dataclass(frozen=True)
class RunSpec(_ByOption):
    data: DataSpec
    method: MethodSpec
    partition: PartitionSpec = field(default_factory=PartitionSpec)
    optim: OptimConfig = field(default_factory=OptimConfig)
    head: HeadChoice = field(default_factory=HeadChoice)
    schedule: Schedule = field(default_factory=Schedule)
    engine: EngineSpec = field(default_factory=EngineSpec)

    def __post_init__(self) -> None:
        if self.head.name is None:
            object.__setattr__(self, "head", HeadChoice(method_class(self.method.name).default_head))

    @classmethod
    def of(cls, **given: Any) -> "RunSpec":
        """A spec from option names (``dataset=..., partition="domain", rounds=5``), the API's and CLI's
        names, qualified keys (``schedule.rounds``) too, and ``settings``: ``--set`` pairs (a list of
        ``key=value``, or a dict). Text values are parsed."""
        return _build(None, given)

    def replace(self, **given: Any) -> "RunSpec":
        """A copy with the named options and settings changed (as ``of``). A new method starts from its own
        settings, optimizer preset and head."""
        return _build(self, given)

    def override(self, pairs: Mapping[str, Any]) -> "RunSpec":
        """A copy with ``key -> value`` overrides of run options and settings alike (a grid cell's axes)."""
        direct, settings, typed = {}, {}, {}
        for key, value in pairs.items():
            section, name = route(key, self.method.name, run_options=True)
            if is_option(f"{section}.{name}"):
                direct[f"{section}.{name}"] = value
            else:
                settings[f"{section}.{name}"] = value
                typed[f"{section}.{name}"] = key.replace("-", "_")
        with swept(), typed_as(typed):  # a bad setting is named as the sweep gave it (the sweep, in the Python API)
            return _build(self, {**direct, "settings": settings})

    def sections(self) -> dict[str, Any]:
        return {s: getattr(self, s) for s in SECTIONS}

    # ---- config.json ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The tree as JSON values, nested by section: what a run's config.json records (not where the run is
        written nor whether it was resumed)."""
        out: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        for o in options():
            if o.opt.recorded:
                out[o.section][o.field] = _plain(self.get(o.key), json=True, sep=o.opt.sep)
        out["method"]["params"] = _plain(dataclasses.asdict(self.method.params), json=True)
        out["optim"].update({k: _plain(v, json=True) for k, v in dataclasses.asdict(self.optim).items()})
        return out

    @classmethod
    def from_dict(cls, d: dict[str, dict[str, Any]]) -> "RunSpec":
        d = migrate(d)
        flat = {f"{s}.{k}": v for s, fields_ in d.items() if s in SECTIONS for k, v in fields_.items()
                if f"{s}.{k}" in _BY_KEY}
        spec = cls.of(**flat)
        params = _apply(spec.method.params, "method", {k: (f"method.{k}", v) for k, v in d["method"].get("params", {}).items()})
        optim = _apply(spec.optim, "optim", {k: (f"optim.{k}", v) for k, v in d.get("optim", {}).items() if k != "preset"})
        return dataclasses.replace(spec, method=MethodSpec(spec.method.name, params), optim=optim)

    def settings(self) -> list[str]:
        """The ``--set`` pairs that give this tree's method, optimizer and head settings from the method's
        defaults and the optimizer preset: each setting that differs, qualified."""
        return settings_of(self.method, self.optim)


@dataclass(frozen=True)
class DataPartition(_ByOption):
    """A RunSpec's sections that a partition is made of (its data, partition and seed), without the method: the
    methods' classes import torch (seconds), which `fedcache partition` needs none of (fedcache/partitioning.py)."""
    data: DataSpec
    partition: PartitionSpec = field(default_factory=PartitionSpec)
    schedule: Schedule = field(default_factory=Schedule)

    @classmethod
    def of(cls, **given: Any) -> "DataPartition":
        """As ``RunSpec.of``, of the data, partition and schedule options alone."""
        per = parse_options(given, ("data", "partition", "schedule"))
        return cls(**{s: SECTIONS[s](**values) for s, values in per.items()})


def settings_of(method: MethodSpec, optim: OptimConfig) -> list[str]:
    base_params, base_optim = type(method.params)(), OPTIMIZER_PRESETS.get(optim.preset, OptimConfig())
    pairs = [f"method.{k}={_text(v)}" for k, v in dataclasses.asdict(method.params).items()
             if getattr(base_params, k) != v]
    pairs += [f"optim.{k}={_text(v)}" for k, v in dataclasses.asdict(optim).items()
              if k != "preset" and getattr(base_optim, k) != v]
    return pairs


def to_flat(sections: dict[str, Any]) -> dict[str, str | int | float | bool]:
    """``section.field`` -> a plain value (str, int, float, bool): the Flower run config. ``None`` is
    written as "" and a tuple as one string (backbones comma-separated); the method's and optimizer's
    settings as ``method.settings``, space-separated ``key=value`` pairs."""
    flat = {o.key: _plain(getattr(sections[o.section], o.field), json=False, sep=o.opt.sep)
            for o in options(*sections) if o.opt.recorded}
    if "method" in sections and "optim" in sections:
        flat["method.settings"] = " ".join(settings_of(sections["method"], sections["optim"]))
    return flat


# ---- building the tree -----------------------------------------------------------------------------
def _build(base: RunSpec | None, given: dict[str, Any]) -> RunSpec:
    given = dict(given)
    settings = parse_pairs(given.pop("settings", None))
    per = parse_options(given, tuple(SECTIONS), required=base is None)
    method, optim, head = resolve_method(per.pop("method").get("name"), per.pop("optim").get("preset"),
                                         per.pop("head").get("name"), settings, base)
    if base is None:
        sections = {s: SECTIONS[s](**values) for s, values in per.items()}
    else:
        sections = {s: dataclasses.replace(getattr(base, s), **values) for s, values in per.items()}
    return RunSpec(method=method, optim=optim, head=head, **sections)


def parse_options(given: dict[str, Any], names: tuple[str, ...], required: bool = True) -> dict[str, dict[str, Any]]:
    """Option names or qualified keys -> each section's parsed values; an unknown or doubled option, or a
    missing required one, is an error."""
    known = {k for k, o in _BY_NAME.items() if o.section in names and o is not SETTINGS}
    unknown = sorted(k for k in given if k.replace("-", "_") not in known)
    if unknown:
        raise UnknownOptionError(unknown, [o.name for o in options(*names)], _of_the_process)
    per: dict[str, dict[str, Any]] = {s: {} for s in names}
    for key, value in given.items():
        o = option(key)
        if o.field in per[o.section]:
            raise ConfigError(f"option {o.name} is given twice (as {key} and {o.key}); keep one")
        per[o.section][o.field] = o.parse(value)
    missing = [o for o in options(*names) if required and o.required and o.field not in per[o.section]]
    if missing:
        raise ConfigError(f"a run needs {', '.join(o.flag for o in missing)}")
    return per


def resolve_method(name: str | None, preset: str | None, head: str | None, settings: dict[str, str],
                   base: Any = None) -> tuple[MethodSpec, OptimConfig, HeadChoice]:
    """The method, optimizer and head sections: ``base``'s (a RunSpec or FlowerRun; a new method starts from
    its own defaults, preset and head), with the preset and head given, and the ``--set`` settings applied."""
    name = name or (base.method.name if base is not None else "")
    if not name:
        raise ConfigError(f"{MethodSpec.label('name')}: a value is required; `fedcache methods` lists them")
    fresh = base is None or name != base.method.name
    cls = method_class(name)
    preset = preset or (cls.default_preset if fresh else base.optim.preset)
    optim = base.optim if not fresh and preset == base.optim.preset else OPTIMIZER_PRESETS[preset]
    params = cls.Settings() if fresh else base.method.params
    given_head, head = head, head or (None if fresh else base.head.name)
    routed = _route_settings(settings, name)
    with typed_as({f"{g}.{f}": key for g, fs in routed.items() for f, (key, _) in fs.items()}):
        _refuse_two_heads(given_head, routed["head"])
        if routed["optim"] and not cls.uses_optimizer:
            raise ConfigError(f"{name} trains nothing with an optimizer; remove "
                              + ", ".join(setting(f"optim.{k}") for k in routed["optim"]))
        params, optim = _apply(params, "method", routed["method"]), _apply(optim, "optim", routed["optim"])
        _refuse_unused(routed["method"], params, "method", name)
        _refuse_unused(routed["optim"], optim, "optim", f"the {optim.optimizer} optimizer (preset {preset})")
        # parsed here, so that a wrong head is named as set (--set head.head=mlpp), not as the option --head
        head = _apply(HeadChoice(head), "head", routed["head"]).name
    if head:
        from fedcache.federate.methods.base import check_head  # loaded already: the method's module imports it

        check_head(cls, name, head)  # when the spec is made: a grid checks every cell's before the first trains
    return MethodSpec(name, params), optim, HeadChoice(head or cls.default_head)


def _refuse_two_heads(given: str | None, routed: dict[str, tuple[str, Any]]) -> None:
    """The head given as an option and as a setting: the setting won without a word (--head linear --set
    head=mlp trained mlp)."""
    if given and "name" in routed and str(routed["name"][1]) != given:
        raise ConfigError(f"{option('head').given(given)} and {setting('head.name')}={routed['name'][1]} name two "
                          "heads; give the head once")


def _apply(obj: Any, group: str, values: dict[str, tuple[str, Any]]) -> Any:
    """``obj`` (the settings ``group``) with each field set to its value, parsed: ``values`` maps field -> (the key
    as given, value)."""
    types = fields_of(type(obj))
    parsed = {k: parse(setting(f"{group}.{k}"), v, types[k], verbatim=True) for k, (key, v) in values.items()}
    return dataclasses.replace(obj, **parsed) if parsed else obj


def parse_pairs(settings: Any) -> dict[str, str]:
    """``--set`` pairs as key -> value: a list of ``key=value`` texts, or a dict."""
    if not settings:
        return {}
    if isinstance(settings, Mapping):
        return {str(k).replace("-", "_"): v for k, v in settings.items()}
    if isinstance(settings, str):
        settings = settings.split()
    out: dict[str, str] = {}
    for item in settings:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            example = named("--set lr=0.01", "settings={'lr': 0.01}")
            raise ConfigError(f"{set_flag()} expects key=value (e.g. {example}), got {item!r}")
        key = key.strip().replace("-", "_")
        if key in out:
            raise ConfigError(f"{set_flag()} {key} is given twice ({out[key]!r} and {value.strip()!r}); keep one")
        _one_pair(key, value.strip())
        out[key] = value.strip()
    return out


_ANOTHER_PAIR = re.compile(r"[\s,]+([A-Za-z_][\w.-]*)=")  # "0.1 momentum=0.5"
_PLAIN = re.compile(r"[\w.+-]+(\s*,\s*[\w.+-]+)*")  # a number, a word, or a comma list of them


def _one_pair(key: str, value: str) -> None:
    """Refuses a value that holds more pairs (``--set "lr=0.1 momentum=0.5"``), which was read as a bad ``lr``:
    each pair is given on its own. Only where what comes before the next ``key=`` is a plain value (or an axis's
    values): a path or a text may hold ``, seed=0`` (``weights=/runs/lr=0.1,seed=0/head.pt``)."""
    found = _ANOTHER_PAIR.search(value)
    if not found or not _PLAIN.fullmatch(value[:found.start()]):
        return
    pairs = [f"{key}={value[:found.start()]}"] + [p for p in re.split(r"[\s,]+(?=[A-Za-z_][\w.-]*=)", value[found.start():]) if p]
    pairs = [p.strip(" ,") for p in pairs]
    each = named(" ".join(f"--set {p}" for p in pairs), f"settings={pairs!r}")
    raise ConfigError(f"{set_key(key)}={value!r} holds {len(pairs)} pairs; give each its own: {each}")


def typed_keys(settings: Any, method: str) -> dict[str, str]:
    """Each ``--set`` key of ``settings`` (as ``parse_pairs`` reads them) by the full name of what it sets for
    ``method`` (``optim.lr`` -> ``lr``): for ``wording.typed_as`` while the run they made trains."""
    return {".".join(route(k, method)): k for k in parse_pairs(settings)}


def parse_axes(items: Iterable[str]) -> dict[str, list[str]]:
    """A grid's ``--set key=v1,v2`` axes: ``["lr=1e-3,1e-2", "alpha=0.1"]`` -> ``{"lr": ["1e-3", "1e-2"], ...}``."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=v1,v2,... (e.g. --set lr=1e-3,1e-2), got {item!r}")
        parts = [v.strip() for v in split_values(values)]
        if values.strip() and not all(parts):  # "1e-3,,1e-2": a value left out by mistake, not dropped in silence
            raise ConfigError(f"--set {item}: an empty value between commas; write {key.strip()}=v1,v2")
        _one_pair(key.strip(), values.strip())
        name = key.strip().replace("-", "_")
        if name in out:  # the last would win without a word
            raise ConfigError(f"--set {key.strip()} is given twice; give its values once: --set {key.strip()}=v1,v2")
        out[name] = [v for v in parts if v]
    return out


def split_values(text: str) -> list[str]:
    """An axis's values split at its commas, but not inside brackets: one value of a tuple setting is written whole,
    ``betas=(0.9,0.999),(0.5,0.999)`` being two values of Adam's betas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([") - (ch in ")]")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


# ---- which field a key names -------------------------------------------------------------------------
def setting_fields(method: str) -> dict[str, dict[str, Any]]:
    """The ``--set`` groups of ``method``: field name -> type, per group (method, optim, head). The preset is
    an option (``--preset``), not a setting; the head is both (``--head mlp`` or ``--set head=mlp``)."""
    optim = {k: t for k, t in fields_of(OptimConfig).items() if k != "preset"}
    return {"method": fields_of(method_class(method).Settings), "optim": optim, "head": {"head": fields_of(HeadChoice)["name"]}}


def route(key: str, method: str, run_options: bool = False) -> tuple[str, str]:
    """``(section, field)`` that ``key`` names for ``method``: a qualified key (``optim.lr``, ``partition.alpha``)
    or a short one that exactly one owner has. ``run_options``: a grid axis, which may also name a run option;
    a short key that is both a run option and a setting must then be qualified (routing it by guess would
    leave the other at its default)."""
    key = key.replace("-", "_")
    groups = setting_fields(method)
    with swept() if run_options else contextlib.nullcontext():
        said = set_key(key)  # a grid's axes are the API's sweep; a grid file's, its [set]
    prefix, dot, name = key.partition(".")
    if dot:
        section = GROUP_ALIASES.get(prefix, prefix)
        if section == "head" and name in ("head", "name"):
            return "head", "name"
        if section in groups and name in groups[section]:
            return section, name
        if run_options and is_option(key):
            return option(key).section, option(key).field
        if section in groups or (run_options and section in SECTIONS):
            raise ConfigError(f"{said}: unknown key; {section} has no setting {name!r}. Known keys -- "
                              f"{_listing(groups, run_options)}")
        raise ConfigError(f"{said}: unknown prefix {prefix!r}; use one of "
                          + ", ".join(g + "." for g in dict.fromkeys((*SETTING_GROUPS, *(SECTIONS if run_options else ())))))
    owners = [g for g, fs in groups.items() if key in fs]
    if key == "head":
        return "head", "name"
    if run_options and is_option(key):
        if owners:
            o = option(key)
            with swept():
                ways = write_setting(o.key, f"{owners[0]}.{key}")
            raise ConfigError(f"{said} is ambiguous: it is the run option {o.key} and a setting of {method} "
                              f"({owners[0]}.{key}); write {ways}")
        return option(key).section, option(key).field
    if len(owners) > 1:
        with swept() if run_options else contextlib.nullcontext():
            ways = write_setting(*(f"{g}.{key}" for g in owners))
        raise ConfigError(f"{said} is ambiguous: both {' and '.join(owners)} have a {key!r} setting; write {ways}")
    if not owners:
        hint = _of_the_process(key) or _near(key, groups, run_options) or _elsewhere(key, method)
        raise ConfigError(f"{said}: unknown key{hint}. Known keys -- {_listing(groups, run_options)}")
    return owners[0], key


# The command's options that are no run's nor grid's: how its process runs, which no setting can change.
COMMAND_ONLY = {"threads": "the torch threads of the fedcache command's process: give --threads N on its command line"}


def _of_the_process(key: str) -> str:
    """ " (...)" where ``key`` is the command's own option: its near setting (head, for threads) was no help."""
    if key not in COMMAND_ONLY:
        return ""
    return named(f" ({key} is {COMMAND_ONLY[key]})",
                 f" ({key}: the library changes nothing process-wide; call torch.set_num_threads(N) yourself)")


def _elsewhere(key: str, method: str) -> str:
    """ " (a setting of fedprox, fedprox-ssl; fedavg has none)": a key right for another method (fedprox's mu with
    -m fedavg) is no typo, and the list of fedavg's keys alone did not say where it belongs."""
    from fedcache.federate.methods import METHODS

    owners = [m for m in METHODS.names() if m != method and key in fields_of(method_class(m).Settings)]
    if not owners:
        return ""
    listed = ", ".join(owners[:4]) + (", ..." if len(owners) > 4 else "")
    return f" (a setting of {listed}; {method} has no {key})"


def _route_settings(settings: dict[str, str], method: str) -> dict[str, dict[str, tuple[str, Any]]]:
    """Each ``--set`` key's group and field: group -> field -> (the key as given, its value)."""
    routed: dict[str, dict[str, tuple[str, Any]]] = {g: {} for g in SETTING_GROUPS}
    for key, value in settings.items():
        group, name = route(key, method)
        if name in routed[group]:
            raise ConfigError(f"{set_flag()} {group}.{name} is given twice (as {key} and another spelling); keep one")
        routed[group][name] = (key, value)
    return routed


def _near(key: str, groups: dict[str, dict[str, Any]], run_options: bool) -> str:
    """ " (did you mean 'lr'?)" for a typo of a setting (or of a run option, where a key may name one)."""
    known = [f for fs in groups.values() for f in fs] + (sorted(_BY_NAME_ONLY) if run_options else [])
    return did_you_mean(key, known)


def _listing(groups: dict[str, dict[str, Any]], run_options: bool) -> str:
    text = "; ".join(f"{g}: {', '.join(fs) or '-'}" for g, fs in groups.items())
    return text + (f"; and the run options ({named('`fedcache train -h`', 'help(fedcache.train)')})" if run_options else "")


def _refuse_unused(given: dict[str, str], obj: Any, group: str, owner: str) -> None:
    """A key the user set that ``obj`` (with its other values) would not use is an error, never silence; it is
    named as its user gave it (inside ``typed_as``): ``--set betas``, not the ``optim.betas`` they never typed.
    ``obj.ignored()``, where a dataclass defines it, maps field -> why it is unused in this configuration."""
    ignored = obj.ignored() if hasattr(obj, "ignored") else {}
    bad = [f"{setting(f'{group}.{k}')} ({ignored[k]})" for k in given if k in ignored]
    if bad:
        raise ConfigError(f"{owner} does not use {'; '.join(bad)}: remove the setting or change what makes it unused")


def refuse_unread_options(spec: RunSpec | DataPartition, given: Iterable[str]) -> None:
    """A partition option the user gave (``given``: the option names or keys given, not those left at their
    defaults) that the run's scheme does not read is refused, as a grid's axis over it is: ``--alpha 0.3`` with
    the iid scheme warned once, when the partition was first made, and a re-run that found it stored trained the
    same IID split without a word."""
    from fedcache.federate.partitions.core import readers

    if isinstance(spec, RunSpec) and spec.engine.resume:  # the run's config.json decides: recorded, the option resumes
        return
    scheme = spec.partition.scheme
    for name in given:
        o = option(name) if is_option(name) else None
        if o is None or o.section != "partition" or scheme in readers(o.field):
            continue
        schemes = named(" or ".join(readers(o.field)), " or ".join(map(repr, readers(o.field))))
        raise ConfigError(f"{o.given(spec.get(o.key))}: the partition scheme {scheme} ignores {o.name}, so the run "
                          f"would be the same without it; drop {o.flag}, or use a scheme that reads it "
                          f"({option('partition').flag}{named(' ', '=')}{schemes})")


def check_trackers(names: Iterable[str], said: Callable[[list[str]], str] | None = None) -> None:
    """``--track``'s names, each a tracker's (fedcache/trackers; importing them imports no torch). The unknown ones
    are named by ``said`` (a grid file's ``track = ["zz"]``), else as the option was given."""
    from fedcache.trackers import known_trackers

    unknown = [t for t in names if t not in known_trackers()]
    if unknown:  # the unknown ones alone, quoted as a Python caller writes them: track='zz', track=['a', 'zz']
        named = said(unknown) if said else option("track").given(unknown[0] if len(unknown) == 1 else unknown)
        raise ConfigError(f"{named}: unknown tracker; known: {', '.join(known_trackers())}")


def check_method(name: str) -> None:
    """Raise as ``method_class`` does for a name that no method has, importing no method (they import torch)."""
    from fedcache.federate.methods import METHODS

    METHODS.check(name)


# ---- config.json of earlier fedcache versions ---------------------------------------------------------
def migrate(d: dict) -> dict:
    """A ``spec`` of a config.json written before the tree held typed settings (``method.settings`` pairs,
    ``optim.preset`` / ``head.name`` left unset, the resolved values beside the spec) in today's layout.
    ``resolved`` is that config.json's top-level ``resolved`` entry, passed inside ``d`` under that key."""
    if "settings" not in d.get("method", {}):
        return d
    d = {s: dict(v) for s, v in d.items()}
    resolved = d.pop("resolved", None) or {}
    d["method"].pop("settings", None)
    if resolved:
        d["method"]["params"] = resolved.get("method_params", {})
        d["optim"] = {"preset": resolved.get("preset"), **resolved.get("optimizer", {})}
        d["head"] = {"name": resolved.get("head")}
    return d


def migrate_config(config: dict) -> dict:
    """A whole config.json in today's layout (see ``migrate``)."""
    if "resolved" not in config:
        return config
    config = dict(config)
    config["spec"] = migrate({**config["spec"], "resolved": config.pop("resolved")})
    return config


# ---- values --------------------------------------------------------------------------------------
def _plain(value: Any, json: bool, sep: str = ",") -> Any:
    if isinstance(value, tuple):
        return [_plain(v, json) for v in value] if json else sep.join(map(str, value))
    if isinstance(value, dict):
        return {k: _plain(v, json) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    if value is None and not json:
        return ""
    return value


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


_BY_NAME_ONLY = {o.name: o for o in options() if o is not SETTINGS}
_BY_KEY = {o.key: o for o in options() if o is not SETTINGS}
_BY_NAME = {**_BY_NAME_ONLY, **_BY_KEY}
