"""``fedcache train`` as a function of a RunSpec: store -> fused features -> partition -> method -> the round
driver -> the run directory. What runs above the federated engine: which data a run reads, how its
partition is found or made, where it writes and whether it may."""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from fedcache import __version__
from fedcache.disk import again, human
from fedcache.errors import ConfigError, DeviceError, DiskFullError
from fedcache.federate.data import FederatedData
from fedcache.federate.divergence import DivergedError
from fedcache.federate.driver import Run, RunResult
from fedcache.federate.inprocess import OnRound, run_one
from fedcache.federate.methods import Method, MethodContext
from fedcache.federate.partitions import local_test_sets
from fedcache.federate.rundir import SUMMARY, RunDir, check_resumable, same_config
from fedcache.federate.source import attach_source
from fedcache.federate.tables import load_splits, load_views
from fedcache.federate.text import attach_text
from fedcache.ownership import Holder, check_free, hold
from fedcache.partitioning import partition_of
from fedcache.paths import GRID, check_outside, writable_dir
from fedcache.progress import StepCallback, said_step
from fedcache.spec import RunSpec, check_trackers, method_class, migrate_config, option
from fedcache.store.feature_store import FeatureStore, FeatureTable
from fedcache.wording import count, named

log = logging.getLogger(__name__)

Tables = tuple[FeatureTable, FeatureTable]  # fused (train, test) features


# The flat keyword form of a run specification (``TrainConfig(dataset=..., method=..., rounds=5)``), kept
# for scripts written against it: every option is declared once, in its section of the spec.
TrainConfig = RunSpec.of


def instantiate(spec, data: FederatedData) -> Method:
    """The method on ``data``, as every engine builds it: the spec's (or a Flower run's) method, optimizer,
    head and schedule sections."""
    cls = method_class(spec.method.name)
    return cls(MethodContext(data, spec.head.name, spec.optim, spec.schedule), spec.method.params)


def check_out(spec: RunSpec) -> None:
    """Where the run writes, checked before any work: writable, and not silently replacing another run."""
    e = spec.engine
    resume, overwrite, out = (option(name).flag for name in ("resume", "overwrite", "out"))  # or the API's keywords
    if e.resume and e.overwrite:
        raise ConfigError(f"{resume} continues the run in {out} and {overwrite} replaces it; give one of them")
    if e.track:
        _check_trackers(spec)
    elif e.track_dir is not None:  # read by trackers alone: without one, nothing would be written there
        track_dir = option("track_dir").flag
        raise ConfigError(f"{track_dir} is where trackers write, and no tracker was given; add "
                          f"{option('track').given('tensorboard')} (or mlflow), or leave {track_dir} out")
    if e.out is None:
        if e.resume or e.overwrite:  # found out only after the data is read, or (--overwrite) never
            raise ConfigError(f"{resume if e.resume else overwrite} works on the run folder in {out}, and none was "
                              f"given; add {out}{named(' DIR', '=...')}")
        return
    writable_dir(e.out, out)
    if e.resume:
        check_resumable(e.out)
    # Another command writing it is named, not mistaken for a finished run.
    check_free(e.out, _what(e.out), resumes=_resumes())
    _check_not_started(spec)


def check_not_a_cell(out: Path | str | None) -> None:
    """A run given a grid's cell folder (``grid/cells/<cell>``) as its --out: the grid writes its cells itself (a
    stack of cells at once), locking each only while it trains it, so the two wrote one folder in turns."""
    if out is not None:
        check_outside(out)  # and outside a feature store


def _check_not_started(spec: RunSpec) -> None:
    e = spec.engine
    resume, overwrite, out = (option(name).flag for name in ("resume", "overwrite", "out"))
    if (Path(e.out) / GRID).exists():
        raise ConfigError(f"{e.out} holds a grid ({GRID}), not a run; choose another {out}")
    run = RunDir(e.out)
    # Metrics lines without a checkpoint are of rounds nothing can continue (a kill between the first round's line
    # and its checkpoint): such a directory is started again, not refused (--resume would find no checkpoint).
    # --engine flower-sim refuses --overwrite: offered there, the advice led to a second refusal.
    replace = "delete the folder to start it again" if e.name == "flower-sim" else f"{overwrite} to replace it"
    if run.finished() and not run.has_checkpoint() and not e.overwrite:
        # --keep-checkpoints none: --resume has nothing to go on from, and offering it sent the user in a loop.
        raise ConfigError(f"{resume + ': ' if e.resume else ''}the run in {e.out} finished (its {SUMMARY} is there) and "
                          f"kept no checkpoint; nothing is left to run: {replace}, or choose another {out}")
    if not e.resume and not e.overwrite and (run.has_checkpoint() or run.finished()):
        raise ConfigError(f"{e.out} already holds a run; pass {resume} to continue it, {replace}, or choose another {out}")


def _what(out: Path) -> str:
    return f"the run directory {out}"


def _resumes() -> str:
    """How a run held by another command is taken up once that one is stopped, named for the caller."""
    return named("the same command with --resume continues it", "the same call with resume=True continues it")


@contextlib.contextmanager
def owned(spec: RunSpec, holder: Holder | None = None):
    """The run's --out held for the block (fedcache/ownership.py): a second command on it is refused, naming this
    one (or ``holder``: the command this process works for). Checked again once held: a command that finished
    between ``check_out`` and now left its run there."""
    if spec.engine.out is None:
        yield
        return
    with hold(spec.engine.out, _what(spec.engine.out), resumes=_resumes(), holder=holder):
        _check_not_started(spec)
        yield


def _check_trackers(spec: RunSpec) -> None:
    check_trackers(spec.engine.track)
    where = spec.engine.track_dir or spec.engine.out
    if where is None:
        track, out, track_dir = (option(name).flag for name in ("track", "out", "track_dir"))
        raise ConfigError(f"{track} needs {out} or {track_dir}: the directory the trackers write into")
    writable_dir(where, option("track_dir" if spec.engine.track_dir else "out").flag)


def prepare(spec: RunSpec, tables: Tables | None = None, on_step: StepCallback | None = None) -> tuple[Method, dict]:
    """Everything before the first round: data, partition, method, on the run's device (the caller's
    ``torch.device`` context: ``on_device``); returns the run's config.json too. ``on_step``: the data read from
    the store, where that took a while (``progress.said_step``)."""
    cls = method_class(spec.method.name)
    warn_unused_options(spec, cls)
    data, part_info = load_data(spec, tables, views=cls.uses_views, on_step=on_step)
    device = torch.get_default_device()
    method = instantiate(spec, data.to(device))
    return method, run_config(spec, part_info, data, device)


def _data_text(spec: RunSpec, data: FederatedData, part_info: dict, seconds: float) -> str:
    # Scored on validation, the test table is the training table: its rows are read once.
    tensors = [data.x_train] if spec.schedule.validation else [data.x_train, data.x_test]
    rows, size, d = sum(len(x) for x in tensors), sum(x.nbytes for x in tensors), spec.data
    return (f"data ready in {seconds:.1f} s: {count(rows, 'row')} ({human(size)}) of {d.dataset} on "
            f"{'+'.join(d.backbones)} read from {d.store}, partition {part_info['partition_id']}")


def run_device(request: str) -> torch.device:
    """Where a run's rounds run: ``auto`` is the GPU when there is one (CUDA, else Apple's MPS), said once."""
    if request == "auto":
        return _auto_device()
    device = torch.device(request)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"{option('device').given(request)} was asked for but no CUDA GPU is visible; use "
                          f"{option('device').given('cpu')} or auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"{option('device').given('mps')} was asked for but this torch sees no Apple GPU; use "
                          f"{option('device').given('cpu')} or auto")
    return device


@functools.cache
def _auto_device() -> torch.device:
    if torch.cuda.is_available():
        log.info("rounds run on the GPU (%s); --device cpu keeps them on the CPU", torch.cuda.get_device_name())
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        log.info("rounds run on Apple's GPU (mps); --device cpu keeps them on the CPU")
        return torch.device("mps")
    return torch.device("cpu")


@contextlib.contextmanager
def on_device(spec: RunSpec):
    """Within it, tensors are made on the run's device (``torch.device`` as a context: this thread only). Not
    entered where that is already the default: the context intercepts every torch call in Python, which on small
    heads costs more than the arithmetic it wraps."""
    device = run_device(spec.engine.device)
    with contextlib.nullcontext() if device == torch.get_default_device() else torch.device(device):
        yield


def warn_unused_options(spec: RunSpec, cls) -> None:
    """Run options a method without an optimizer never reads are said, not dropped. A warning, not an
    error: a grid (e.g. FST-CBDG's, with clip-zs beside the trained methods) applies them to every method."""
    if cls.uses_optimizer:
        return
    s, defaults = spec.schedule, type(spec.schedule)()
    unused = [option(k).given(getattr(s, k)) for k in ("local_epochs", "batch_size") if getattr(s, k) != getattr(defaults, k)]
    unused += [option("preset").given(spec.optim.preset)] if spec.optim.preset != cls.default_preset else []
    if unused:
        log.warning("%s trains nothing with an optimizer: %s not used", spec.method.name, ", ".join(unused))


def load_data(spec: RunSpec, tables: Tables | None = None, views: bool = False,
              on_step: StepCallback | None = None) -> tuple[FederatedData, dict]:
    """``tables``: the fused (train, test) features already in memory (a grid shares one memory-mapped copy).
    ``on_step``: the data read from the store and partitioned, where that took a while (``progress.said_step``)."""
    t0 = time.perf_counter()
    data, info = _load_data(spec, tables, views)
    if tables is None:  # read from the store here, not shared by a grid
        seconds = time.perf_counter() - t0
        said_step(log, on_step, _data_text(spec, data, info, seconds), seconds)
    return data, info


def _load_data(spec: RunSpec, tables: Tables | None, views: bool) -> tuple[FederatedData, dict]:
    d, validation = spec.data, spec.schedule.validation
    store = FeatureStore(d.store, create=False)
    train_t, test_t = tables or load_splits(store, d.dataset, list(d.backbones))
    partition, info = partition_of(spec, store, train_t, test_t)
    if validation:
        spare = spare_rows(partition, train_t)  # the clients' validation rows, and the global model's
        data = FederatedData.from_tables(train_t, train_t, partition.train, validation_sets(partition, train_t, spec, spare))
        data.global_rows = spare
    else:
        data = FederatedData.from_tables(train_t, test_t, partition.train, partition.test)
    data = attach_source(data, store, train_t, train_t if validation else test_t)
    if views:  # augmented views (extract --views K), kept in the store's dtype: float16 halves the memory
        aug = load_views(store, d.dataset, list(d.backbones), train_t)
        data.views = None if aug is None else torch.from_numpy(aug)
    return attach_text(data, store, list(d.backbones), train_t), info


def spare_rows(partition, train_t) -> np.ndarray:
    """The training rows no client trains on: what a run scored on validation is scored on."""
    return np.setdiff1d(np.arange(len(train_t)), np.concatenate(partition.train))


def validation_sets(partition, train_t, spec: RunSpec, spare: np.ndarray) -> list[np.ndarray]:
    """Per client, some of the ``spare`` training rows (nobody trains on them), with the client's (class, domain) mix."""
    if not len(spare):
        raise ConfigError(f"scoring on validation ({option('validation').flag}, or grid {named('--select', 'select')}) "
                          f"needs training rows that no client trains on: {_spare_advice(spec.partition)}")
    rng = np.random.default_rng(np.random.SeedSequence([spec.schedule.seed, 7]))
    picked = local_test_sets(partition.train, train_t.labels, train_t.domains, train_t.labels[spare],
                             train_t.domains[spare], spec.partition.local_test, rng, spec.partition.local_test_mix)
    empty = [k for k, rows in enumerate(picked) if not len(rows)]
    if empty:
        given = _spare_makers(spec.partition)
        cure = f"use a smaller {' or '.join(option(o).flag for o, _ in given)}" if given else _spare_advice(spec.partition)
        raise ConfigError(f"{option('validation').flag}: clients {empty} have no spare training rows of their classes; "
                          f"{cure}")
    return [spare[rows] for rows in picked]


def _subsample_advice() -> str:
    return f"add {option('subsample').given(0.8)} (each client trains on 80% of its rows; the rest are spare)"


def _spare_makers(p) -> list[tuple[str, object]]:
    """The options given that leave training rows spare, as (option name, value)."""
    made = (("few_shot", p.few_shot), ("class_budget", p.class_budget),
            ("subsample", p.subsample if p.subsample < 1 else None))
    return [(name, value) for name, value in made if value is not None]


def _spare_advice(p) -> str:
    """How to leave rows spare, said for what was given: `add --few-shot N` to a run given --few-shot 500, which
    kept every row its clients hold, was no advice."""
    given = _spare_makers(p)
    if not given:
        return f"{_subsample_advice()} or {named('--few-shot N', 'few_shot=N')}"
    said = " and ".join(option(o).given(value) for o, value in given)
    smaller = " or ".join(option(o).flag for o, _ in given)
    more = "" if p.subsample < 1 else f", or {_subsample_advice()}"
    return f"{said} left every row to its clients; use a smaller {smaller}{more}"


def run_config(spec: RunSpec, part_info: dict, data: FederatedData, device: torch.device) -> dict:
    """config.json: the spec's tree (``RunSpec.from_dict(config["spec"])`` gives it back), the device kind the
    rounds ran on (a GPU rounds differently from a CPU), the partition and the data it ran on."""
    return {
        "fedcache_version": __version__,
        "spec": spec.to_dict(),
        "device": device.type,
        # Where the spec's relative paths (its store) were read from: a report made elsewhere still finds them.
        "cwd": str(Path.cwd()),
        "partition": part_info,
        "data": {"dim": data.dim, "classes": list(data.class_names), "domains": list(data.domain_names),
                 "client_train_sizes": data.sizes().tolist(), "client_test_sizes": [len(r) for r in data.client_test],
                 "random_weights": data.random_weights},
    }


def train(spec: RunSpec, on_round: OnRound | None = None, tables: Tables | None = None,
          run_name: str | None = None, stop_after: int | None = None, on_step: StepCallback | None = None) -> RunResult:
    """One run. ``run_name`` names it for trackers (default: its --out directory's name). ``stop_after``: pause
    after that round, to be continued with ``resume`` (``driver.run``; a grid's successive halving). ``on_step``:
    the steps before the first round that took a while (``progress.said_step``), and an evaluation that took most
    of its round (``driver.SlowEvaluation``)."""
    if spec.engine.name != "in-process":  # run silently in-process, it would be recorded as what it is not
        raise ConfigError(f"this runs in-process; engine={spec.engine.name!r} runs through "
                          "fedcache.flower.sim.train_flower_sim(spec) or `fedcache train --engine`")
    check_out(spec)
    with owned(spec), on_device(spec):
        method, resolved = prepare(spec, tables, on_step)
        e = spec.engine
        if e.out is not None:
            if e.overwrite or (not e.resume and not RunDir(e.out).has_checkpoint()):
                RunDir(e.out).clear()  # --overwrite; or the lines of rounds no checkpoint covers (see _check_not_started)
            _prepare_out(spec, resolved)
        out = RunDir(e.out, e.keep_checkpoints) if e.out is not None else None
        # A finished run resumed trains nothing and writes nothing (driver._finish): no second tracker run of it.
        finished = e.resume and out is not None and out.finished()
        trackers = [] if finished else _open_trackers(spec, resolved, run_name)
        r = Run(method, spec.schedule, out, {"partition_id": resolved["partition"]["partition_id"],
                                             "device": device_name(torch.get_default_device())})
        t0 = time.perf_counter()
        try:
            result = run_one(r, e.batched, _tracked(on_round, trackers), e.resume, stop_after, on_step)
        except BaseException as exc:
            for t in trackers:
                t.fail()
            if isinstance(exc, DivergedError) and e.out is not None:
                # --resume would replay the same rounds into the same NaN: say how to start this --out again.
                overwrite, out_flag = option("overwrite").flag, option("out").flag  # or the API's keywords
                raise DivergedError(f"{exc}. The run in {e.out} stopped there: start it again with the change and "
                                    f"{overwrite}, or choose another {out_flag}", in_round=exc.in_round) from None
            if isinstance(exc, DiskFullError) and e.out is not None:
                raise _after_full_disk(exc, RunDir(e.out)) from None
            raise
    log.info("%s %s in %.2fs", method.name, f"paused after round {stop_after}" if result.paused else "finished",
             time.perf_counter() - t0)
    for t in trackers:
        t.close(result.summary)
    return result


def _after_full_disk(exc: DiskFullError, out: RunDir) -> DiskFullError:
    """What to do once there is space: continue from the last checkpoint, or, before the first, start again (its
    files are removed: --resume would find no round to continue, and a plain re-run would call it started)."""
    if out.has_checkpoint():
        resume = named("the same command with --resume", "the same call with resume=True")
        return exc.advised(f"free some space, then continue the run: {resume}")
    out.clear()
    return exc.advised(f"nothing of the run was kept; {again()}")


def device_name(device: torch.device) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H100 80GB HBM3)``: what summary.json says the rounds ran on."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def _open_trackers(spec: RunSpec, resolved: dict, run_name: str | None) -> list:
    if not spec.engine.track:
        return []
    from fedcache.trackers import open_trackers

    name = run_name or (Path(spec.engine.out).name if spec.engine.out else spec.method.name)
    settings = {"spec": resolved["spec"]}
    return open_trackers(list(spec.engine.track), Path(spec.engine.track_dir or spec.engine.out), name, settings)


def _tracked(on_round: OnRound | None, trackers: list) -> OnRound | None:
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
    out = RunDir(spec.engine.out)
    if spec.engine.resume:
        _not_a_flower_run(out)
        differ = same_run(out, resolved)
        if differ is None:
            raise ConfigError(f"{option('resume').flag}: {out.path} has no config.json; start the run without "
                              f"{option('resume').flag}")
        if differ:
            raise ConfigError(f"{option('resume').flag}: the options differ from the run in {out.path} "
                              f"({_differences(out, resolved, differ)}); use the same options, "
                              f"{option('overwrite').flag} to replace the run, or a new {option('out').flag}")
        if not out.finished():  # a finished run's files stay as they were: its summary names the older id too
            _same_partition_id(out, resolved)
        return
    out.write_config(resolved)


def _not_a_flower_run(out: RunDir) -> None:
    """A Flower run's config.json, compared as a spec, said every option differed, in a dump of both records."""
    if out.made_by() == "flower":
        raise ConfigError(f"{option('resume').flag}: {out.path} holds a run of "
                          f"{named('--engine flower-sim', 'the Flower simulation')}, which this engine cannot continue; "
                          f"resume it with {named('--engine flower-sim', 'fedcache.flower.sim.train_flower_sim')}")


def _same_partition_id(out: RunDir, resolved: dict) -> None:
    """A run recorded before the partition's hash took in the labels names its partition by the older id: the
    run's files name it by today's from its resume on, as its summary will (one partition, one id)."""
    saved = out.config()
    pid = resolved.get("partition", {}).get("partition_id")
    if pid and saved.get("partition", {}).get("partition_id") not in (None, pid):
        out.write_config({**saved, "partition": {**saved["partition"], "partition_id": pid}})


def _differences(out: RunDir, config: dict, keys: list[str]) -> str:
    """``seed (0 there, 1 here), rounds (400 there, 300 here)``: the options given otherwise; what follows from
    them (the partition a seed draws, its clients' sizes) is named only where no option differs."""
    saved = migrate_config(out.config())
    options = [k for k in keys if _value(config.get("spec", {}), k) is not _MISSING]  # same_run drops "spec."
    if options:
        saved, config, keys = saved.get("spec", {}), config["spec"], options
    return ", ".join(f"{k.rpartition('.')[2] if options else k} ({_shown(saved, k)} there, {_shown(config, k)} here)"
                     for k in keys)


def _shown(doc: dict, key: str) -> str:
    v = _value(doc, key)
    return "unset" if v is _MISSING or v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


_MISSING = object()


def _value(doc: dict, key: str):
    for part in key.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return _MISSING
        doc = doc[part]
    return doc


def same_run(out: RunDir, config: dict) -> list[str] | None:
    """How ``config`` differs from the run recorded in ``out`` (its config.json read in today's layout): the
    keys that differ, a spec's as ``section.field``; None when ``out`` records none."""
    saved = out.config()
    if saved is None:
        return None
    # The partition's id hashes its request and its data, both compared (partition.request, partition.entries);
    # the hash itself took in the labels later, and a run made before that must stay resumable.
    return [k.removeprefix("spec.") for k in same_config(migrate_config(saved), config) if k not in _NOT_COMPARED]


# The partition's id: see same_run. Where a run started: a run resumed from another directory is the same run.
_NOT_COMPARED = ("partition.partition_id", "cwd")
