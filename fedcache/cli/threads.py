"""How many torch threads the `fedcache` command computes with.

The library changes nothing process-wide (``import fedcache``, ``fedcache.train(...)`` leave torch's threads as
the caller set them). The command owns its process, so it chooses, from the work it is about to do, through
torch's public ``torch.set_num_threads``, and says what it chose in one line (also logged at INFO):

- Rounds on cached features (train, grid, the method commands, a demo or reproduce whose features are
  cached): one thread. A head's products are small (a mini-batch of a few clients' rows times a 784- to
  3840-wide first layer); torch's OpenMP threads spin while they wait for each other, and beside any other busy
  process on the machine they wait for a descheduled peer: 3-9x slower than one thread, and never faster on an
  idle machine in benchmarks/threads.py (docs/performance.md).
- A command that must first extract features (a demo or reproduce whose features are not in the store yet):
  torch's default, since a backbone's forward pass over images is where threads pay on an idle machine.

A user's own choice always wins: ``--threads N``, else ``OMP_NUM_THREADS`` (which torch has already read).
Grid worker processes (``--jobs`` > 1) train on one thread each whatever this process uses.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from fedcache.cli.common import err

log = logging.getLogger("fedcache.cli")

ENV = "OMP_NUM_THREADS"
HELP = ("Torch threads of this process (default: chosen from the work and said in the log: one for rounds on cached "
        "features; OMP_NUM_THREADS is honoured).")


PROCESS_OPTIONS = ("threads",)  # options of the command's process, not of a run: no part of fedcache/spec.py


def threads_option():
    """`--threads N`: every command that trains declares it the same way."""
    return typer.Option(None, "--threads", min=1, help=HELP)


ThreadsOpt = threads_option()


def threads_param() -> inspect.Parameter:
    """`--threads` for a command whose signature is generated (train, the method commands)."""
    return inspect.Parameter("threads", inspect.Parameter.KEYWORD_ONLY, default=threads_option(), annotation=Optional[int])


# A head with this many parameters per client or more has products that several threads share to advantage on an
# idle machine (benchmarks/threads.py, docs/performance.md).
WIDE = 100_000


@dataclass(frozen=True)
class Work:
    """What a command is about to compute, as far as its thread count depends on it."""

    what: str  # named in the log line: "rounds on cached features"
    head_params: int = 0  # parameters of the widest head one client trains (0: none or not known)
    frozen_model: str = ""  # a method that runs a frozen model in its rounds (promptfl: CLIP's towers)
    extracts: bool = False  # a backbone's forward pass over images comes first
    workers: int = 1  # grid worker processes (one thread each): more than one, and this process only coordinates


EXTRACTS = Work("feature extraction, then rounds", extracts=True)


@dataclass(frozen=True)
class Choice:
    threads: int
    why: str

    def line(self) -> str:
        return f"torch threads: {self.threads} ({self.why})"


def choose(work: Work, requested: int | None, environ: Mapping[str, str], current: int) -> Choice:
    """The thread count for ``work``: ``requested`` (--threads), else the ``OMP_NUM_THREADS`` that torch has
    already applied (``current``), else the policy of this module's docstring."""
    if requested is not None:
        return Choice(requested, "--threads")
    if environ.get(ENV, "").strip():
        return Choice(current, f"{ENV}={environ[ENV].strip()}")
    if work.extracts:
        return Choice(current, "torch's default: features are extracted first, a backbone's forward pass over images")
    if work.workers > 1:
        return Choice(1, f"{work.what} in {work.workers} worker processes of one thread each")
    if work.frozen_model:
        return Choice(current, f"torch's default: {work.frozen_model} runs a frozen model in its rounds")
    if work.head_params >= WIDE:
        return Choice(current, f"torch's default: {work.what} with a wide head, {work.head_params:,} parameters per client")
    size = f" with a head of {work.head_params:,} parameters per client" if work.head_params else ""
    return Choice(1, f"{work.what}{size}; --threads N or {ENV} to change")


def rounds_work(store: Path, dataset: str, backbones: Iterable[str], runs: Iterable[tuple[str, str | None]],
                workers: int = 1) -> Work:
    """The rounds of ``runs`` ((method, head) pairs; head None: the method's own) on ``dataset``'s cached features
    of ``backbones``: the widest head a client trains, and the first method that runs a frozen model. What the
    store or the registries cannot tell counts as nothing (the run itself then says what is wrong)."""
    import dataclasses

    import torch

    from fedcache.errors import FedcacheError
    from fedcache.federate.methods import METHODS
    from fedcache.heads import make_head

    shape, widest, frozen = feature_shape(store, dataset, backbones), 0, ""
    for method, head in runs:
        try:
            cls = METHODS.get(method)
            model = make_head(head or cls.default_head, *shape) if shape else None
        except FedcacheError:
            continue
        if not frozen and "device" in {f.name for f in dataclasses.fields(cls.Params)}:  # where its frozen towers run
            frozen = method
        if model is not None:
            params = model.init(1, torch.Generator())
            widest = max(widest, sum(t.numel() for k, t in params.items() if k not in getattr(model, "buffer_keys", ())))
    return Work("rounds on cached features", head_params=widest, frozen_model=frozen, workers=workers)


def run_work(spec) -> Work:
    """The work of one run (`train`, a method's command), from its RunSpec."""
    return rounds_work(spec.data.store, spec.data.dataset, spec.data.backbones, [(spec.method.name, spec.head.name)])


def grid_work(spec) -> Work:
    """The work of a grid, from its GridSpec: its widest head over its methods and any swept --head."""
    return rounds_work(spec.store, spec.dataset, spec.backbones, _pairs(spec.methods, spec.sweep), spec.jobs)


def preset_work(preset, store: Path, jobs: int) -> Work:
    """The work of `fedcache reproduce`: extraction when the store lacks features, else the widest of its grids."""
    if any(features_missing(store, e.store_dataset, e.backbones) for e in preset.experiments):
        return EXTRACTS
    works = [rounds_work(store, e.store_dataset, e.backbones, _pairs(e.methods, e.sweep), jobs) for e in preset.experiments]
    return max(works, key=lambda w: (bool(w.frozen_model), w.head_params))


def demo_work(store: Path, dataset: str, backbones: list[str], methods: Iterable[str]) -> Work:
    """The work of `fedcache demo`: extraction when the store lacks its features, else its methods' rounds."""
    if features_missing(store, dataset, backbones):
        return EXTRACTS
    return rounds_work(store, dataset, backbones, [(m, None) for m in methods])


def _pairs(methods: Iterable[str], sweep: Mapping) -> list[tuple[str, str | None]]:
    heads = sweep.get("head") or sweep.get("head.head") or [None]
    return [(m, h) for m in methods for h in ([heads] if isinstance(heads, str) else heads)]


def feature_shape(store: Path, dataset: str, backbones: Iterable[str]) -> tuple[int, int] | None:
    """(fused feature width, classes) of ``dataset``'s training features in ``store``; None when they are not there."""
    from fedcache.errors import FedcacheError
    from fedcache.store.feature_store import FeatureStore

    try:
        fs = FeatureStore(store, create=False)
        entries = [fs.find(dataset, "train", b)[0] for b in backbones]
    except FedcacheError:
        return None
    return sum(e.dim for e in entries), len(entries[0].attrs.get("classes", ())) if entries else 0


@contextlib.contextmanager
def threads_for(work: Work, requested: int | None) -> Iterator[Choice]:
    """Run the block with the chosen thread count, said once; the previous count is restored after it (a test or a
    script that calls ``fedcache.cli.main`` keeps its own)."""
    import torch

    before = torch.get_num_threads()
    choice = choose(work, requested, os.environ, before)
    if log.isEnabledFor(logging.INFO):  # FEDCACHE_LOG=info: the record is the line
        log.info(choice.line())
    else:
        err.print(f"[dim]{choice.line()}[/]", highlight=False, soft_wrap=True)
    torch.set_num_threads(choice.threads)
    try:
        yield choice
    finally:
        torch.set_num_threads(before)


def features_missing(store: Path, dataset: str, backbones: Iterable[str], splits: Iterable[str] = ("train", "test")) -> bool:
    """Whether a command would have to extract: some split of ``dataset`` has no complete features of some backbone."""
    from fedcache.errors import FedcacheError
    from fedcache.store.feature_store import FeatureStore

    try:
        fs = FeatureStore(store, create=False)
        return not all(fs.find(dataset, s, b) for b in backbones for s in splits)
    except FedcacheError:
        return True
