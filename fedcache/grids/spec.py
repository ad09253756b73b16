"""A grid's specification: methods x axes x seeds, its cells, and the TOML file that may hold it.

Layout of a grid directory::

    grid.json                 the spec, so a re-run can check it is the same grid
    features/                 the fused features, written once as .npy and memory-mapped by every worker
    cells/<cell>/             one run directory per cell (as ``fedcache train --out`` writes one), plus cell.json;
                              summary.json is written last, so its presence marks a finished cell
    batches/<id>/             a stack of cells while it trains (the batched engine): its checkpoint
    validation/, test/        a --select grid's two stages, each a grid directory (with --prune halving, a
                              validation cell cut at a rung keeps its checkpoint and rungs.json, no summary.json)
    results.csv, table.md     one row per cell; mean (std) over seeds per method and setting
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import json
import numbers
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcache.config import DEVICES, PositiveInt, parse
from fedcache.errors import ConfigError, FedcacheError
from fedcache.federate.schedule import Schedule
from fedcache.paths import GRID, RESULTS, not_a_file, writable_dir
from fedcache.spec import (COMMAND_ONLY, GRID_SECTIONS, SECTIONS, GridEngineSpec, PruneSpec, RunSpec, check_method, check_trackers,
                           grid_options, is_option, option, options, route)
from fedcache.wording import (LONGEST_KEY, by_keyword, did_you_mean, filed, in_grid_file, named, shown_key, swept,
                              toml_key, typed_as)

CELL_NAME_MAX = 200  # characters of a cell's folder name (a file system holds 255 bytes; the rest is spare)
CELLS, FEATURES, BATCHES, TABLE, SPEC = "cells", "features", "batches", "table.md", GRID
VALIDATION, TEST = "validation", "test"  # a --select grid's two stages, each a grid directory
# Two grids compared in one report: a report reads a folder of links to them (reports/runs.py).
_TOGETHER = "to report both together, link them into one folder: ln -s, then fedcache report that folder"
# Run options a grid fixes itself (one value for the whole grid, or its own axis: methods, seeds).
_RESERVED = tuple(o.name for o in options() if not o.opt.axis)


def _reserved_advice() -> str:
    """Where a grid takes the run options it fixes itself, said as the caller gives them."""
    if by_keyword():
        return f"give methods with methods=, seeds with seeds=; {', '.join(_RESERVED)} cannot be swept"
    return ("give methods with --method, seeds with --seeds (in a grid file: methods = [...], seeds = [...] at the "
            f"top, as out, engine and device); {', '.join(_RESERVED)} cannot be swept with --set")


GRID_FLAGS = {"methods": "--method", "keep_checkpoints": "--keep-checkpoints"}


def grid_flag(key: str) -> str:
    """A grid field as messages name it: its flag, and for the options the spec declares its key too, as a run's."""
    declared = {o.name: o.label for o in grid_options()}
    return declared.get(key) or _flag(key)


def _toml(value: Any) -> str:
    """A value as a grid file spells it: ``["lr"]``, ``"halving"``, ``2``, ``0.1``, ``true``."""
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_toml(v) for v in value)}]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) or value in ("true", "false"):
        return str(value)
    try:  # an axis value is text: 0.1 as written, not "0.1"
        float(value)
        return str(value)
    except ValueError:
        return json.dumps(str(value))


def _flag(key: str) -> str:
    """A grid key's flag (``--method``), or in a Python API call the keyword (``methods``)."""
    return named(GRID_FLAGS.get(key, "--" + key.replace("_", "-")), key)


def _as_written(value: Any) -> str:
    """A grid file's value in TOML's spelling, as the file wrote it: ``seeds = ""`` is ``""`` (not the ``[]`` it
    became), ``[1, 1.0]`` (not ``[1, 1]``), text quoted."""
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_as_written(v) for v in value)}]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):  # an inline table, {a = 1}
        return "{" + ", ".join(f"{toml_key(k)} = {_as_written(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (datetime.date, datetime.time)):  # TOML's own values, unquoted: 1979-05-27
        return value.isoformat()
    return str(value) if isinstance(value, (int, float)) else json.dumps(str(value))


def _written_items(value: Any, axis: bool) -> list[str]:
    """The items of a grid file's value as it wrote each (``1.0``, ``1e-3``): a top-level text is split at commas
    and its blank items dropped as ``grid_fields`` does; an axis's text is one value (``betas = "0.9,0.999"``)."""
    if isinstance(value, str) and not axis:
        return [v.strip() for v in value.split(",") if v.strip()]
    listed = value if isinstance(value, list) else [value]
    return [axis_text(v) if isinstance(v, (bool, list)) else str(v).strip() for v in listed]


@dataclass(frozen=True)
class Written:
    """A grid file's values as it wrote them, before they were typed, split and spelled as the command line spells
    them: what its messages echo, where they name a value the user wrote."""
    top: dict = field(default_factory=dict)
    axes: dict = field(default_factory=dict)  # [set], by ``axis_key``: the top's engine is another key

    @classmethod
    def of_file(cls, raw: dict) -> Written:
        axes = _dotted(raw["set"]) if isinstance(raw.get("set"), dict) else {}
        return cls({k: v for k, v in raw.items() if k != "set"}, {axis_key(k): v for k, v in axes.items()})


@dataclass(frozen=True)
class Names:
    """How a grid's messages name what it was given: a key that a grid file gave as the file's key (the file named
    at the message's start), one the command line gave as its flag; advice on what to add is spelled for the file
    when the grid has one, since that is where its user writes."""
    file: Path | None = None
    in_file: frozenset[str] = frozenset()  # top-level keys and [set] axes the file gave (the call did not replace)
    given: frozenset[str] | None = None  # every key the file or the call gave; None: not known (a GridSpec in Python)
    flags: frozenset[str] = frozenset()  # axes the command line gave by their option's flag (--alpha: partition.alpha)
    written: Written = field(default_factory=Written, compare=False)

    @classmethod
    def of_file(cls, path: Path, fields: dict, written: Written | None = None) -> Names:
        keys = frozenset(fields) | frozenset(fields.get("sweep", {}))
        return cls(Path(path), keys, keys, written=written or Written())

    def items(self, key: str, values: list[str], axis: bool = False) -> list[str]:
        """``values`` (texts, as the grid keeps them) as the file wrote them, where it gave ``key`` with those
        values: ``1.0`` and ``1`` (said to be one value), not ``1`` twice."""
        given = self._written(key, axis)
        if given is None:
            return values
        items = _written_items(given, axis)
        return items if len(items) == len(values) else values

    def _written(self, key: str, axis: bool) -> Any:
        """What the file wrote for ``key`` (an axis: under [set]), where the call did not replace it; else None."""
        if not self._filed(key):
            return None
        return self.written.axes.get(axis_key(key)) if axis else self.written.top.get(key)

    def _filed(self, key: str) -> bool:
        return self.file is not None and key in self.in_file

    def _spelled_as_file(self, key: str) -> bool:
        called = self.given is not None and key in self.given and key not in self.in_file
        return self.file is not None and not called

    def track_said(self) -> Callable[[list[str]], str] | None:
        """How ``check_trackers`` names unknown trackers a grid file gave (``grid file g.toml: track="zz"``); None
        where the call gave them (``--track zz``). One alone is named as a text, as the call's are."""
        if not self._filed("track"):
            return None
        return lambda unknown: self.lead("track", unknown[0] if len(unknown) == 1 else unknown, whole=False)

    def where(self, *keys: str) -> str:
        """``grid file g.toml: `` when the file gave one of ``keys``."""
        return f"grid file {self.file}: " if any(self._filed(k) for k in keys) else ""

    def key(self, key: str) -> str:
        """A grid key inside a sentence: ``select`` or ``--select``."""
        return key if self._spelled_as_file(key) else _flag(key)

    def to_change(self, key: str) -> str:
        """A key the user is asked to change, where it was given: ``out in grid file g.toml``, else ``--out``
        (``out`` in a Python call), which the command line can give beside a file that left it out."""
        return f"{key} in grid file {self.file}" if self._filed(key) else _flag(key)

    def lead(self, key: str, value: Any, whole: bool = True) -> str:
        """A message's start, naming a grid key and its value as given: ``grid file g.toml: select = ["mu"]``, the
        file's value as the file wrote it (``whole``: ``value`` is all of it, not the part at fault)."""
        if self._filed(key):
            written = self._written(key, axis=False) if whole else None
            return f"grid file {self.file}: {key}={_toml(value) if written is None else _as_written(written)}"
        if isinstance(value, (list, tuple)):
            return f"{_flag(key)}={named(','.join(map(str, value)) or '[]', repr(list(value)))}"
        return named(f"{_flag(key)} {value}", f"{key}={value!r}")

    def axis(self, key: str, values: list | None = None) -> str:
        """An axis at a message's start: ``grid file g.toml's [set] alpha=[0.1, 1]`` or ``--set alpha=0.1,1``."""
        if self._filed(key):
            return in_grid_file(self.file, key) + (f"={self._axis_values(key, values)}" if values is not None else "")
        if by_keyword():  # fedcache.grid(sweep={...})
            return f"sweep[{key!r}]" + (f"={_as_python(values)}" if values is not None else "")
        # an option's own flag (--alpha 0.1,1), but a switch's takes no values: --set validation=true,false; a
        # qualified key by its flag only where the flag gave it (option_axes), not where --set partition.alpha did
        flagged = "." not in key or key in self.flags
        if is_option(key) and flagged and option(key).name not in _RESERVED and option(key).base is not bool:
            return option(key).flag + (f" {','.join(map(str, values))}" if values is not None else "")
        return f"--set {key}" + (f"={','.join(map(str, values))}" if values is not None else "")

    def _axis_values(self, key: str, values: list) -> str:
        """An axis's values as its file wrote them (``[1.0, 1]``), where they are the ones named (a grid's stage
        runs some of them)."""
        given = self._written(key, axis=True)
        same = given is not None and [axis_text(v) for v in (given if isinstance(given, list) else [given])] == values
        return _as_written(given) if same else _toml(values)

    def add(self, key: str, value: Any) -> str:
        """Advice to give a grid key: ``prune = "halving"`` (at the file's top) or ``--prune halving`` (also with a file,
        where the command line gave the key: its value there overrides the file's)."""
        if self._spelled_as_file(key):
            return f"{key} = {_toml(value)}"
        return named(f"{_flag(key)} {','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}",
                     f"{key}={value!r}")

    def new_out(self) -> str:
        """Advice to run a grid again elsewhere: ``a new directory (--out DIR)``, ``(out='DIR')``, ``(out = "DIR")``."""
        return f"a new directory ({self.add('out', 'DIR')})"

    def add_axis(self, key: str, values: list, either: bool = False) -> str:
        """Advice to give an axis: ``lr = ["1e-3", "1e-2"] under [set]`` or ``--set lr=1e-3,1e-2``; ``either``:
        one of ``values``, each alternative whole where its user pastes it (a TOML line, a Python dict):
        ``partition = "dirichlet" or partition = "domain-dirichlet" under [set]``,
        ``sweep={'partition': 'dirichlet'} or sweep={'partition': 'domain-dirichlet'}``."""
        if self.file:
            return " or ".join(f"{toml_key(key)} = {_toml(v)}" for v in (values if either else [values])) + " under [set]"
        if by_keyword():
            return " or ".join(f"sweep={{{key!r}: {v!r}}}" for v in (values if either else [values]))
        listed = (" or " if either else ",").join(map(str, values))
        return f"{option(key).flag} {listed}" if is_option(key) else f"--set {key}={listed}"

    @contextlib.contextmanager
    def swept(self, axes: Iterable[str], methods: Iterable[str]) -> Iterator[None]:
        """Messages raised inside (a cell's, of one of ``methods``) name the grid's ``axes`` as its caller gave
        them: a sweep's (``sweep['optim.lr']``, ``--set lr``), the file's with the file (``grid file g.toml's [set]
        lr``)."""
        in_file, methods = [k for k in axes if self._filed(k)], list(methods)
        swept_ = file_keys([k for k in axes if k not in in_file], methods)
        with swept(self.file, file_keys(in_file, methods)), typed_as(swept_):
            yield

    def was_given(self, key: str, is_default: bool) -> bool:
        """Whether the user gave ``key``; where that is not known, whether it differs from its default."""
        return key in self.given if self.given is not None else not is_default


def check_lists(fields: dict[str, Any], names: Names) -> None:
    """A grid's lists and axes: none empty, none giving a value twice (its cells made twice, counted twice in a
    table's mean and standard deviation), no axis over an option the grid fixes itself; said in ``names``."""
    for key in ("methods", "backbones", "seeds", "select"):
        if key in fields:
            if not fields[key] and key != "select":
                raise ConfigError(f"{names.lead(key, [])}: give at least one")
            texts = [str(v) for v in fields[key]]
            _check_once(names.lead(key, fields[key]), texts, names.items(key, texts))
    for key, given in fields.get("sweep", {}).items():
        if is_option(key) and option(key).name in _RESERVED:
            raise ConfigError(f"{names.axis(key)}: not an axis; {_reserved_advice()}")
        values = given if isinstance(given, (list, tuple)) else [given]
        if not values:
            raise ConfigError(f"{names.axis(key)}=[]: give a value or a list of values")
        texts = [axis_text(v) for v in values]
        _check_once(names.axis(key, texts), texts, names.items(key, texts, axis=True))


def axis_key(key: str) -> str:
    """An axis's name as a grid keeps it: ``local-epochs`` and `` local_epochs`` are ``local_epochs``."""
    return key.strip().replace("-", "_")


def _as_python(values: list) -> str:
    """An axis's values as a Python call gave them, near enough: ``[0.1, 1]``, not the texts it keeps (``['0.1', '1']``)."""
    def one(v: Any) -> str:
        if v in ("true", "false"):
            return str(v == "true")
        try:
            float(v)
            return str(v)
        except (TypeError, ValueError):
            return repr(v)
    return "[" + ", ".join(map(one, values)) + "]"


def axis_text(value: Any) -> str:
    """One axis value as the command line spells it, whatever gave it (a grid file's TOML value, the API's
    Python value): ``true``/``false``, not ``True``; ``2``, not ``2.0`` (an integral number is an integer for
    ``rounds`` as on the command line, and names one cell folder with ``--alpha 0.1,1``'s ``1``); a list as
    ``(0.9,0.999)``, one value of a tuple setting; text stripped."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):  # one value of a tuple setting (a grid file's [[0.9, 0.999]]), written whole
        return "(" + ",".join(axis_text(v) for v in value) + ")"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value).strip()


@dataclass
class GridSpec:
    store: Path
    dataset: str
    backbones: list[str]
    methods: list[str]
    out: Path
    seeds: list[int] = field(default_factory=lambda: [Schedule().seed])
    # key -> values. A key that is a run option (alpha, partition, clients, rounds, ...; fedcache/spec.py)
    # sets that option; any other key is a method / optimizer setting (lr, mu, ...), as with ``train --set``.
    sweep: dict[str, list[str]] = field(default_factory=dict)
    jobs: int = 1
    # Axes whose values are chosen on validation (spare training rows), then run once on the test split.
    select: list[str] = field(default_factory=list)
    # How each cell runs, not what it computes (left out of the grid's identity, like jobs).
    track: list[str] = field(default_factory=list)
    keep_checkpoints: str = "last"
    device: str = "auto"  # where every cell's rounds run (engine.device); recorded, since a GPU rounds otherwise
    engine: str = GridEngineSpec.engine  # fedcache/spec.py declares these (GridEngineSpec, PruneSpec)
    max_batch_cells: int | None = None
    prune: str = PruneSpec.prune
    reduction_factor: int = PruneSpec.reduction_factor
    min_rounds: int | None = None
    # Where the shared features are (default: out/features). Both stages of a --select grid read its own.
    features: Path | None = None
    # How messages name what the user gave (a grid file's keys or flags), and what was given at all.
    names: Names = field(default_factory=Names, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.store, self.out = Path(self.store), writable_dir(self.out, self.names.key("out"))
        self.seeds = [option("seed").parse(s) for s in self.seeds]  # 'a' is a clear error, not a ValueError
        # Padding ("0.1 " in a file) would name a column and a cell folder, and make a second value of one.
        self.sweep = {axis_key(k): [axis_text(v) for v in (vs if isinstance(vs, (list, tuple)) else [vs])]
                      for k, vs in self.sweep.items()}
        check_lists(vars(self), self.names)
        for m in self.methods:  # by name, importing no method (they import torch)
            try:
                check_method(m)
            except FedcacheError as exc:  # a grid file's unknown method: said of the file, as its other keys are
                raise type(exc)(self.names.where("methods") + str(exc)) from None
        if self.jobs < 1:
            raise ConfigError(f"{self.names.lead('jobs', self.jobs)}: must be >= 1")
        if not re.fullmatch(DEVICES, self.device):  # a cell's check named the command line's flag, after torch loaded
            raise ConfigError(f"{self.names.lead('device', self.device)}: must be auto, cpu, cuda, cuda:N or mps")
        self._check_select()
        for o in grid_options():
            setattr(self, o.field, o.parse(getattr(self, o.field)))
        for section in GRID_SECTIONS.values():  # checks them
            section(**{f.name: getattr(self, f.name) for f in dataclasses.fields(section)})
        self._check_engine()
        self._check_pruning()  # before the trackers' names: with --prune, no tracker at all
        # The checks above need no torch; those below read the methods' settings where an axis needs them, which
        # imports the methods and torch (seconds): a grid's bad option or file is refused before that wait.
        self._check_partition_axes()
        self._check_setting_axes()
        self._check_one_name_per_setting()
        check_trackers(self.track, self.names.track_said())

    def _check_select(self) -> None:
        """Said now, not after the cells it tunes on (or the first cell to track) have run."""
        n, given = self.names, list(self.select)
        lead = n.lead("select", given)  # as the user wrote it: a short name may stand for a qualified axis
        self.select = [_axis_named(k, self.sweep, lead, n) for k in self.select]
        _check_once(lead, self.select)  # and the corrected one refused as another grid
        example = f"e.g. {n.add_axis('lr', ['1e-3', '1e-2'])} and {n.add('select', ['lr'])}"
        unknown = [k for k in self.select if k not in self.sweep]
        if unknown:
            axes = [k for k, vs in self.sweep.items() if len(vs) > 1]  # a key given one value is fixed, not an axis
            # --set lrr=... --select lr: the axis, not the selection, may hold the typo
            typo = next(((a, u) for u in unknown for a in axes if did_you_mean(a, [u])), None)
            asked = f"; is the axis {typo[0]} a typo of {typo[1]}?" if typo else ""
            raise ConfigError(f"{lead}: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not an axis of this "
                              f"grid (axes: {', '.join(axes) or 'none'}{asked}); give the values to choose from as "
                              f"an axis, {example}")
        single = [k for k in self.select if len(self.sweep[k]) == 1]
        if single:  # a validation stage with nothing to choose would double the grid's work for no choice
            k = single[0]
            raise ConfigError(f"{lead}: {k} has one value ({self.sweep[k][0]}), so there is nothing to choose; give "
                              f"the values to choose from ({n.add_axis(k, ['v1', 'v2'])}) or drop {n.key('select')}")

    def _check_setting_axes(self) -> None:
        """An axis over a method setting that some methods of the grid lack (fedprox's mu in a grid with fedavg)
        was refused from the first cell of such a method, as an unknown key of it, not saying which method."""
        own = None
        for key in self.sweep:
            group, _, name = key.rpartition(".")
            if group not in ("", "method") or (not group and is_option(key)):
                continue
            own = self._settings_of_methods() if own is None else own
            # A short key may be any group's (optim.momentum too): owned where the method has it in any group.
            owners = [m for m in self.methods if any(name in fs for g, fs in own[m].items() if not group or g == group)]
            unknown = _unknown_to_all(key, self.methods) if not owners and len(self.methods) > 1 else None
            if unknown:
                raise unknown
            if owners and len(owners) < len(self.methods):
                others = [m for m in self.methods if m not in owners]
                verb = "Sweep" if len(self.sweep[key]) > 1 else "Set"  # a fixed value is refused too
                raise ConfigError(f"{self.names.axis(key)}: a setting of {', '.join(owners)} only; {', '.join(others)} "
                                  f"{'has' if len(others) == 1 else 'have'} no {name}. {verb} it in a grid of "
                                  f"{', '.join(owners)} ({self.names.add('methods', owners)}), and the others in a grid "
                                  f"of their own ({_TOGETHER})")

    def _settings_of_methods(self) -> dict:
        """Each method's ``--set`` groups (``spec.setting_fields``)."""
        from fedcache.spec import setting_fields

        return {m: setting_fields(m) for m in self.methods}

    def _check_one_name_per_setting(self) -> None:
        """``lr`` and ``optim.lr`` (two --set, say) are one setting: two axes over it labelled every cell with one
        and trained it with the other."""
        if len(self.sweep) < 2:  # one key names no setting twice, and where it lands is read from the methods (torch)
            return
        seen: dict[tuple, str] = {}
        for key in self.sweep:
            for m, where in setting_places(key, self.methods):
                if (m, where) in seen:
                    both = [seen[m, where], key]
                    if set(both) & self.names.flags:  # --head beside --set head: head.name was never typed
                        both = [self.names.axis(k) if k in self.names.flags or self.names.where(k) else f"--set {k}"
                                for k in both]
                    raise ConfigError(f"{self.names.where(*both)}{both[0]} and {both[1]} name the same setting of {m} "
                                      f"({'.'.join(where)}); give it once, under one name")
                seen[m, where] = key

    def _check_partition_axes(self) -> None:
        """An axis over a partition option that every scheme of the grid ignores makes cells that are one cell
        under several names: a table would show a comparison that is not one. One value is refused as ``train``
        refuses it (spec.refuse_unread_options): the grid would say it ran with alpha 0.3, and ran IID."""
        from fedcache.federate.partitions.core import COMMON_OPTIONS, PARTITIONERS, readers as schemes_reading

        own = None
        scheme_key = next((k for k in self.sweep if is_option(k) and option(k).key == "partition.scheme"), None)
        schemes = self.sweep[scheme_key] if scheme_key else [option("partition").default]
        for key, values in self.sweep.items():
            o = option(key) if is_option(key) else None
            if o is None or o.section != "partition" or o.field in COMMON_OPTIONS | {"scheme"}:
                continue
            if len(values) < 2 and (self.out / SPEC).exists():  # a grid started with it is continued as it was made
                continue
            own = self._settings_of_methods() if own is None else own
            if "." not in key and any(key in fs for groups in own.values() for fs in groups.values()):
                continue  # also a method's setting (perfedavg's alpha): the cells say the key is ambiguous
            known = [s for s in schemes if s in PARTITIONERS.names()]  # an unknown scheme is named when its cell is made
            readers = schemes_reading(o.field)
            if known and readers and not set(known) & set(readers):  # no reader at all: every scheme's (clients)
                same = ("each value would train the same cells; drop the axis, or sweep it" if len(values) > 1 else
                        "the cells would be the same without it; drop it, or use it")
                raise ConfigError(
                    f"{self.names.axis(key, values)}: the partition scheme {', '.join(known)} ignores "
                    f"{o.name}, so {same} with a scheme that reads it "
                    f"({self.names.add_axis(scheme_key or 'partition', readers, either=True)})")

    def check_given(self) -> None:
        """What a user's grid may not give, though the grids made from it (a --select grid's stages) carry it:
        --reduction-factor and --min-rounds without --prune are unused, yet part of the grid's identity, so
        dropping them later would be refused as another grid."""
        if self.prune != "none":
            return
        n = self.names
        given = [k for k in ("reduction_factor", "min_rounds")
                 if n.was_given(k, getattr(self, k) == getattr(PruneSpec, k))]
        if given and not self._recorded_as_given():
            named = " and ".join(n.key(k) for k in given)
            raise ConfigError(f"{n.where(*given)}{named} set{'s' * (len(given) == 1)} how successive halving cuts; add "
                              f"{n.add('prune', 'halving')} (with {n.key('select')}), or leave "
                              f"{'them' if len(given) > 1 else 'it'} out")

    def _recorded_as_given(self) -> bool:
        """A grid an older fedcache started with them: resumed as it was made (it would be refused either way)."""
        try:
            saved = json.loads((self.out / SPEC).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(saved, dict) and (saved.get("reduction_factor"), saved.get("min_rounds")) == (
            self.reduction_factor, self.min_rounds)

    def _check_engine(self) -> None:
        """A batch bound with the processes engine would be taken and never read: said, as an unused halving
        option is."""
        if self.engine != "processes" or self.max_batch_cells is None:
            return
        n = self.names
        raise ConfigError(f"{n.where('max_batch_cells', 'engine')}{n.key('max_batch_cells')} bounds the batched "
                          f"engine's batches, and {n.lead('engine', self.engine).removeprefix(n.where('engine'))} "
                          f"trains each cell as its own run; leave it out, or use {n.add('engine', 'batched')}")

    def _check_pruning(self) -> None:
        if self.prune == "none":
            return
        n, prune = self.names, self.names.lead("prune", self.prune)
        if not self.select:
            raise ConfigError(f"{prune} cuts the candidates of {n.key('select')}; name the axes to choose, e.g. "
                              f"{n.add_axis('lr', ['1e-3', '1e-2'])} and {n.add('select', ['lr'])}")
        if any(option(k).name == "rounds" for k in self.select if is_option(k)):
            raise ConfigError(f"{prune} gives the candidates rounds itself; it cannot select rounds "
                              f"({n.lead('select', self.select)})")
        if self.track:
            raise ConfigError(f"{prune} with {n.key('track')}: a tracker's run of a candidate cut early would stay "
                              f"open; track the plain {n.key('select')} grid, or leave out {n.key('track')}")
        self._check_first_cut()

    def _check_first_cut(self) -> None:
        """--min-rounds at or past every cell's last round leaves halving no cut to make: the whole grid trained in
        full, which the plan's "run in full" said only once the command had started."""
        if self.min_rounds is None:
            return
        o = option("rounds")
        given = next((vs for k, vs in self.sweep.items() if is_option(k) and option(k).name == "rounds"), None)
        try:
            longest = max(o.parse(v) for v in given) if given else o.default
        except FedcacheError:  # a value that is no number of rounds: the cells' check says which, in its words
            return
        if self.min_rounds >= longest:
            n = self.names
            most = ", the longest" if given and len(given) > 1 else ""
            raise ConfigError(f"{n.lead('min_rounds', self.min_rounds)}: the first cut would come at or after the "
                              f"last round ({n.key('rounds')} {longest}{most}), so no candidate would be cut; give a "
                              f"{n.key('min_rounds')} below {longest}, or leave out {n.key('prune')}")

    @property
    def features_folder(self) -> Path:
        return self.features or self.out / FEATURES

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["store"], d["out"] = str(self.store), str(self.out)
        d.pop("names")  # how its messages speak
        how = ("jobs", "track", "keep_checkpoints", "features", *(o.field for o in grid_options() if not o.opt.recorded))
        for key in how:  # how the cells run does not change their results
            d.pop(key)
        return d


@dataclass(frozen=True)
class Cell:
    method: str
    seed: int
    setting: tuple[tuple[str, str], ...]  # the swept (key, value) pairs, in spec order

    @property
    def name(self) -> str:
        """Its folder under cells/: the method, axes and seed, readable; a name too long for a file system keeps
        its first characters and ends with a hash of the whole (two such cells still differ)."""
        parts = [self.method] + [f"{k}={v}" for k, v in self.setting] + [f"seed={self.seed}"]
        name = re.sub(r"[^A-Za-z0-9_.=+-]", "_", "__".join(parts))
        if len(name) <= CELL_NAME_MAX:
            return name
        digest = hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return f"{name[:CELL_NAME_MAX - 18]}__{digest}"


Stops = dict  # Cell -> the round it pauses at (successive halving's rungs); a cell not in it runs to its end


def load_toml(path: Path) -> dict:
    """A grid file: the GridSpec fields at top level, sweeps under ``[set]`` (docs/getting-started.md), each value
    checked by the validator the command line's values pass (``grid_fields``), so a bad one is a message naming
    the file, the key, the value and what was expected."""
    return read_grid_file(path)[0]


def read_grid_file(path: Path) -> tuple[dict, Written]:
    """``load_toml``'s fields, and the file's values as it wrote them (``Written``), for the messages about them."""
    raw = _read_toml(Path(path))
    known = {f.name for f in dataclasses.fields(GridSpec) if f.name not in ("sweep", "features", "names")} | {"set"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"grid file {path}: unknown key(s) {', '.join(_suggested(k, known) for k in unknown)}; known: "
                          f"{', '.join(sorted(known))}; run options and settings (rounds, alpha, lr, ...) go under [set]")
    _refuse_tables(raw, path)
    fields = grid_fields({k: v for k, v in raw.items() if k != "set"}, lambda key: f"grid file {path}: {key}")
    if "set" in raw:
        if isinstance(raw["set"], dict):
            # engine at the top is the grid's (batched|processes), under [set] the run's: said by the axis check
            _refuse_grid_keys_under_set(raw["set"], known - {"set", "engine"}, path)
        fields["sweep"] = _sweep(raw["set"], path)
    written = Written.of_file(raw)
    check_lists(fields, Names.of_file(path, fields, written))
    return fields, written


def _refuse_tables(raw: dict, path: Path) -> None:
    """A grid key written as a table (``[prune]``, ``methods = {a = 1}``): each is one value or a list, which a
    [section] of its own does not give (said as "prune={'kind': 'halving'}: expected text")."""
    for key, value in raw.items():
        if key != "set" and isinstance(value, dict):
            raise ConfigError(f"grid file {path}: {key} is a table ([{key}] or {{...}}), and it takes a value: write "
                              f"{key} = ... at the top of the file, above [set]")


# A grid's own keys under [set], as a user may spell them there: the top-level key each one is.
_TOP_ALIASES = {"seed": "seeds", "method": "methods", "backbone": "backbones"}


def _refuse_grid_keys_under_set(table: dict, top: set[str], path: Path) -> None:
    """``seeds``, ``jobs``, ``select``, ... under [set]: keys of the grid itself, one per file at its top. Said as
    that (the unknown-key message suggested ``seed``, itself refused under [set]; ``select`` suggested ``seed``)."""
    for key, value in table.items():
        name = axis_key(key)
        if name in COMMAND_ONLY:
            raise ConfigError(f"{in_grid_file(path, key)}: not an axis; {key} is {COMMAND_ONLY[name]}")
        if isinstance(value, dict) and name in SECTIONS:
            continue  # method.mu = ... (or [set.method]) is TOML's table of the --set key method.mu, not methods
        name = _TOP_ALIASES.get(name, name)
        if name in top:
            raise ConfigError(f"{in_grid_file(path, key)}: not an axis; {name} is a key of the grid itself: write "
                              f"{name} = ... at the top of the file, above [set]")


def _suggested(key: str, known: set[str]) -> str:
    import difflib

    name = key.replace("-", "_")
    if len(key) > LONGEST_KEY:
        return shown_key(key)
    if name in _TOP_ALIASES or name in known:
        return f"{key} (did you mean {_TOP_ALIASES.get(name, name)}?)"
    if name in COMMAND_ONLY:
        return f"{key} ({COMMAND_ONLY[name]})"
    if is_option(name) and option(name).name not in _RESERVED:
        return f"{key} (a run option: put it under [set])"
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"{key} (did you mean {close[0]}?)" if close else key


def file_keys(keys: Iterable[str], methods: Iterable[str]) -> dict[str, str]:
    """A grid file's [set] ``keys`` by the full name of what each sets for any of ``methods`` (``optim.lr`` ->
    ``lr``), as ``wording.swept`` and ``filed`` look them up."""
    return {f"{s}.{f}": k for k in keys for _, (s, f) in setting_places(k, list(methods))}


def check_file_axes(spec: GridSpec, keys: list[str], path: Path) -> None:
    """The values a grid file's ``[set]`` gives (``keys``), checked as its cells will be, each with the command
    line's axes at their first values: a bad one is named with the file (a cell would name it as a --set flag)."""
    others = {k: vs[0] for k, vs in spec.sweep.items() if k not in keys}
    first = {k: spec.sweep[k][0] for k in keys}
    in_file = file_keys(keys, spec.methods)
    for m in spec.methods:
        try:
            base = RunSpec.of(store=spec.store, dataset=spec.dataset, backbones=spec.backbones, method=m,
                              seed=spec.seeds[0], out=None).override(others)
        except FedcacheError:
            return  # an unknown method, or the command line's own values: said where the cells are checked
        # The first values together first: what they refuse (fedavg-ssl's linear head only, head = "mlp") is of
        # no one key, and named by the key looped over next, it read as that key's fault.
        _check_file_values(base, first, path, in_file, None)
        for k in keys:
            for v in spec.sweep[k][1:]:
                _check_file_values(base, {**first, k: v}, path, in_file, k)


def _check_file_values(base: RunSpec, values: dict, path: Path, in_file: dict[str, str], key: str | None) -> None:
    """``base`` with ``values`` of grid file ``path``'s [set] (``key``'s other than its first, None: all at their
    first), a refusal named with the file, by ``key`` where the file's key is not named already."""
    try:
        with filed(path, in_file):  # err names the value by the file's key, as a cell does
            base.override(values)
    except ConfigError as err:
        raise ConfigError(_in_file_said(err, path, key, values)) from None


def _in_file_said(err: ConfigError, path: Path, key: str | None, values: dict) -> str:
    """A bad value of grid file ``path``'s [set] ``key`` (None: of its first ``values`` together): ``err`` with the
    file named once, as a cell names it."""
    said = str(err)
    # "0.1,0.01" is two values on the command line, one text in a file: said of the key at fault alone (of the first
    # values together, the one err names), as a valid text (betas = "0.9,0.999") is no list to make.
    at_fault = [key] if key is not None else [k for k in values if f"{in_grid_file(path, k)}=" in said]
    listed = "".join(_as_list(k, values[k]) for k in at_fault if isinstance(values[k], str) and "," in values[k])
    if in_grid_file(path) in said:  # err names the key itself: grid file g.toml's [set] lr=-1, [set] lrr: unknown key
        return said + listed
    return f"{in_grid_file(path, key or '')}: {said}{listed}"


def _as_list(key: str, value: str) -> str:
    """How to write ``value``, refused as one value of ``key``, as several. A list inside the file's list
    (``lr = [[0.1, 0.2]]``) reaches here as "(0.1,0.2)", one value of several numbers (Adam's betas)."""
    items = ", ".join(v.strip() for v in value.strip("()").split(","))
    if value.startswith("(") and value.endswith(")"):
        return (f"; a list inside the list is one value of several numbers (as Adam's betas); several values are "
                f"written as one flat list, e.g. {key} = [{items}]")
    return f"; several values are a list in a grid file: {key} = [{items}]"


def _read_toml(path: Path) -> dict:
    kind = not_a_file(path)  # a named pipe's read waited for ever
    if kind:
        given = named(f"--config {path}", f"config={str(path)!r}")
        raise ConfigError(f"{given} is {kind}; give a grid TOML file (docs/getting-started.md)")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"grid file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"grid file {path} cannot be read ({exc.strerror or exc}); check its permissions") from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (some Windows editors write one) is no statement
    except UnicodeDecodeError as exc:
        raise ConfigError(f"grid file {path} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); "
                          "save it as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"grid file {path} is not valid TOML: {_toml_problem(str(exc), text)}") from None


def _toml_problem(message: str, text: str) -> str:
    """tomllib's message, with what it means where it is terse: "Cannot overwrite a value" is a key given twice,
    or a dotted key beside a value of its first part (``partition.alpha`` is TOML's table ``partition``, which
    ``partition = "dirichlet"`` made a text)."""
    found = re.search(r"\(at line (\d+), column \d+\)", message)
    if not found or not message.startswith("Cannot overwrite a value"):
        return message
    lines, at = text.splitlines(), int(found.group(1))
    key = _line_key(lines[at - 1]) if at <= len(lines) else ""
    for before in range(at - 1, 0, -1):  # the lines above it in its table
        if lines[before - 1].lstrip().startswith("["):
            break
        other = _line_key(lines[before - 1])
        if key and other and (key.startswith(other + ".") or other.startswith(key + ".")):
            dotted, plain = (key, other) if len(key) > len(other) else (other, key)
            return (f"{dotted} makes {plain} a table, and {plain} = ... gives it a value (lines {before} and {at}); "
                    f"quote the dotted key: {toml_key(dotted)} = ...")
    return (f"{key or 'a key'} is given twice (the second at line {at}); give each key once, and the "
            "values of an axis as one list: key = [v1, v2]")


def _line_key(line: str) -> str:
    """The key of a ``key = value`` line as TOML reads it, ``partition . alpha`` as ``partition.alpha``."""
    return re.sub(r"\s*\.\s*", ".", line.split("=", 1)[0].strip()) if "=" in line else ""


def _grid_types() -> dict[str, tuple[Any, bool]]:
    """A grid's own fields: the type of one value (the run option's where a run has it) and whether the field
    is a list of them (one value, or text split at commas as on the command line, is a list of one or more)."""
    grid = {o.name: o.type for o in grid_options()}
    return {"store": (Path, False), "dataset": (option("dataset").type, False), "backbones": (str, True),
            "methods": (option("method").type, True), "out": (Path, False), "seeds": (option("seed").type, True),
            "jobs": (PositiveInt, False), "select": (str, True), "track": (str, True),
            "keep_checkpoints": (option("keep_checkpoints").type, False), "device": (option("device").type, False),
            **{name: (typ, False) for name, typ in grid.items()}}  # engine, max_batch_cells, prune, ...


def grid_fields(given: dict[str, Any], label) -> dict[str, Any]:
    """``given`` (a grid file's fields, or the API's and the command line's) typed and checked by ``config.parse``;
    ``label(key)`` names a field in messages (``--jobs``, ``grid file g.toml: jobs``). None is left out."""
    types = _grid_types()
    out = {}
    for key, value in given.items():
        if value is None or key not in types:
            out[key] = value
            continue
        typ, many = types[key]
        if typ is Path and isinstance(value, str) and not value.strip():
            raise ConfigError(f"{label(key)}='': give a path")
        if not many:
            out[key] = parse(label(key), value, typ)
            continue
        items = value if isinstance(value, (list, tuple)) else value.split(",") if isinstance(value, str) else [value]
        out[key] = [parse(label(key), v.strip() if isinstance(v, str) else v, typ) for v in items
                    if not (isinstance(v, str) and not v.strip())]
    return out


def _sweep(table: Any, path: Path) -> dict[str, list]:
    """The ``[set]`` table: key -> one value or a list of values, each text, a number or true/false. A dotted key
    (``optim.momentum = [0, 0.9]``, or a ``[set.optim]`` table), which TOML reads as a table, is the ``--set`` key
    of the same spelling."""
    if not isinstance(table, dict):
        raise ConfigError(f"grid file {path}: set={_as_written(table)}: expected a table ([set] with key = value lines)")
    table = _dotted(table)
    seen: dict[str, str] = {}
    for key in table:  # local-epochs and local_epochs: one axis; GridSpec kept the last without a word
        name = axis_key(key)
        if name in seen:
            raise ConfigError(f"{in_grid_file(path, seen[name])} and {key} are one key ({name}); give it once")
        seen[name] = key
    for key, value in table.items():
        values = value if isinstance(value, list) else [value]
        if not all(map(one_value, values)):
            raise ConfigError(f"{in_grid_file(path, key)}={_as_written(value)}: expected a value or a list of values "
                              "(text, numbers, true or false; a list of lists for a setting that takes several "
                              "numbers, as betas = [[0.9, 0.999]])")
    return table


def one_value(value: Any) -> bool:
    """One value of an axis or a setting: text, a number or true/false, or a list (a tuple) of those, one value of a
    setting that takes several numbers (betas = [[0.9, 0.999]]). None, which no TOML value is, passes: a Python
    sweep's none of an option (``few_shot=[None, 10]``), as ``axis_text`` spells it."""
    scalar = (str, numbers.Number, type(None))  # a number of numpy's too: numbers.Number, not int or float
    return isinstance(value, scalar) or (isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value))


def _unknown_to_all(key: str, methods: list[str]) -> ConfigError | None:
    """A setting no method of the grid has: said as the method whose keys come nearest it says it (a typo of
    fedproto's lam in a grid of fedavg and fedproto was said with fedavg's keys, and no suggestion). None where
    some method takes the key."""
    refusals = []
    for m in methods:
        try:
            route(key, m, run_options=True)
        except ConfigError as exc:
            refusals.append((m, exc))
    if len(refusals) < len(methods):
        return None
    m, exc = next(((m, e) for m, e in refusals if "did you mean" in str(e)), refusals[0])
    return ConfigError(str(exc).replace("Known keys --", f"No method of the grid has it; known keys of {m} --", 1))


def _axis_named(name: str, sweep: dict[str, list], lead: str, names: Names) -> str:
    """The axis a --select name means: itself, or the one axis it is the last part of (--alpha with perfedavg in the
    grid is the axis partition.alpha, option_axes) or the run option it names (--head is the axis head.name). A
    name two axes end with is refused, said by ``lead`` and advised as ``names`` advise."""
    if name in sweep:
        return name
    # The option's own name, not axis_label's rule: that reads the methods' settings (torch), and select is
    # checked before them.
    qualified = [a for a in sweep if a.rpartition(".")[2] == name or (is_option(a) and option(a).name == name)]
    if len(qualified) > 1:  # taking either would be a guess; "not an axis" was untrue
        example = next((a for a in qualified if len(sweep[a]) > 1), qualified[0])
        raise ConfigError(f"{lead}: {name} could be {' or '.join(qualified)}; select one by its full name, e.g. "
                          f"{names.add('select', [example])}")
    return qualified[0] if qualified else name


def _dotted(table: dict, prefix: str = "") -> dict:
    out: dict = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        out.update(_dotted(value, name + ".") if isinstance(value, dict) and value else {name: value})
    return out


def setting_places(key: str, methods: list[str]) -> set[tuple[str, tuple]]:
    """Where ``key`` lands in each method's configuration: ``lr`` and ``optim.lr`` land in one place. None for a
    method that lacks it (an unknown method, key or an ambiguous one: said by other checks)."""
    places = set()
    for m in methods:
        try:
            places.add((m, route(axis_key(key), m, run_options=True)))
        except FedcacheError:
            pass
    return places


def same_value(v: str) -> Any:
    """What an axis value means, whatever its spelling: 1e-3 and 0.001 are one value, 1 and 1.0, true and True."""
    if v.lower() in ("true", "false"):
        return v.lower()
    for kind in (int, float):  # int first: 2**53 and 2**53 + 1 are one float
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def _check_once(lead: str, values: list[str], shown: list[str] | None = None) -> None:
    """A value given twice made the same cell twice (or two cells of one value): counted twice in the table's mean
    and standard deviation. ``lead`` names the key and its values (``Names.lead``), ``shown`` each value as its
    user wrote it (``Names.items``)."""
    seen: dict = {}
    for v, said in zip(values, shown or values):
        if same_value(v) in seen:
            raise ConfigError(f"{lead}: {seen[same_value(v)]!r} and {said!r} are one value; give each value once")
        seen[same_value(v)] = said


def cells(spec: GridSpec) -> list[Cell]:
    keys = list(spec.sweep)
    combos = list(itertools.product(*(spec.sweep[k] for k in keys)))
    return [Cell(m, s, tuple(zip(keys, combo))) for m in spec.methods for combo in combos for s in spec.seeds]


def train_config(spec: GridSpec, cell: Cell, out: Path | None) -> RunSpec:
    """The cell's run: the grid's fixed options, then the cell's axes as overrides (run options and settings
    alike, each routed to the field it names: ``RunSpec.override``)."""
    how = {"track": spec.track, "track_dir": spec.out if spec.track else None, "keep_checkpoints": spec.keep_checkpoints,
           "device": spec.device}
    base = RunSpec.of(store=spec.store, dataset=spec.dataset, backbones=spec.backbones, method=cell.method,
                      seed=cell.seed, out=out, **how)
    return base.override(dict(cell.setting))


def option_axes(given: dict[str, list], methods: list[str]) -> dict[str, list]:
    """Axes given as run-option flags (``grid --alpha 0.1,1``): a flag names its option even where a method
    of the grid has a setting of the same name (perfedavg's ``alpha``), so it is qualified there
    (``partition.alpha``) instead of refused as ambiguous; elsewhere it keeps its short name."""
    from fedcache.spec import setting_fields

    def key(name: str) -> str:
        shared = any(name in fields for m in methods for fields in setting_fields(m).values())
        return option(name).key if shared else name

    return {key(name): values for name, values in given.items()}


def axis_label(key: str, methods: list[str]) -> str:
    """An axis as a table names it for people: a run option by its flag's name (``head``, typed ``--head``) where
    ``option_axes`` qualified it for the cell folders (``head.name``, kept: resuming finds cells by them) and the
    short name sets the same field for every method; ``partition.alpha`` stays so beside perfedavg's ``alpha``."""
    if not (is_option(key) and "." in key):
        return key
    short, places = option(key).name, setting_places(key, methods)
    return short if places and setting_places(short, methods) == places else key
