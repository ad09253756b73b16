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


@dataclass(frozen=True)
class Work:
    """What a command is about to compute, as far as its thread count depends on it."""

    what: str  # named in the log line: "rounds on cached features"
    extracts: bool = False  # a backbone's forward pass over images comes first


ROUNDS = Work("rounds on cached features")


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
        return Choice(current, "torch's default: features are extracted first, and a backbone's forward pass uses every core")
    return Choice(1, f"{work.what}; --threads N or {ENV} to change")


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
