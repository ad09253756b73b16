"""How many torch threads the `fedcache` command computes with.

The library changes nothing process-wide (``import fedcache``, ``fedcache.train(...)`` leave torch's threads as
the caller set them). The command owns its process, so it chooses, through torch's public
``torch.set_num_threads``, and says what it chose in the log (an INFO record, shown with ``FEDCACHE_LOG=info``,
as the GPU that ``--device auto`` picks is said; on stderr it would come before a bad option's one-line error):

- The cores other processes leave free, measured while the command starts (from its first line to the choice,
  at least a quarter of a second): torch's default on an idle machine, fewer threads beside busy work, one at the
  least. torch's OpenMP threads spin while they wait for each other; beside other busy processes they wait for a
  peer the system has descheduled, and every measured run, from a 784-d logistic regression to an mlp head on
  3840-d features, was slower on two threads than on one. On an idle machine the same runs were faster on two
  threads than on one (benchmarks/threads.py, docs/performance.md), so the work itself does not decide: the
  machine does.
- A grid's worker processes (``--jobs`` > 1 on the CPU) take one thread each, as they start
  (fedcache/grids/pool.py); the choice is this process's, for what it trains itself: a grid with one batch or one
  cell left trains here whatever ``--jobs`` says, and then runs as fast as ``train`` would.

A user's own choice always wins: ``--threads N``, else ``OMP_NUM_THREADS`` (which torch has already read).
The thread count does not change a run's numbers (the benchmark compares the final states bit for bit).
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

log = logging.getLogger("fedcache.cli")

ENV = "OMP_NUM_THREADS"
HELP = ("Torch threads of this process (default: the cores other processes leave free, said with FEDCACHE_LOG=info; "
        "OMP_NUM_THREADS is honoured).")
PROCESS_OPTIONS = ("threads",)  # options of the command's process, not of a run: no part of fedcache/spec.py
SHORTEST = 0.25  # seconds of watching the machine before choosing: /proc/stat counts in hundredths of a second


def threads_option():
    """`--threads N`: every command that trains declares it the same way."""
    return typer.Option(None, "--threads", min=1, metavar="N", help=HELP)


ThreadsOpt = threads_option()


def threads_param() -> inspect.Parameter:
    """`--threads` for a command whose signature is generated (train, the method commands)."""
    return inspect.Parameter("threads", inspect.Parameter.KEYWORD_ONLY, default=threads_option(), annotation=Optional[int])


# ---- how busy the machine is -----------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One moment: the busy CPU seconds of the cores this process may run on (None where the system does not
    say), and the CPU seconds this process has used."""

    at: float
    busy: float | None
    own: float

    @classmethod
    def now(cls) -> "Sample":
        return cls(time.monotonic(), _busy_seconds(usable_cores()), _own_seconds())


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _busy_seconds(cores: list[int]) -> float | None:
    """Busy CPU seconds of ``cores`` since boot, from /proc/stat's per-core lines (Linux)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted, busy = {f"cpu{c}" for c in cores}, 0
    for line in lines:
        name, *ticks = line.split()
        if name in wanted:
            values = [int(t) for t in ticks[:8]]  # user nice system idle iowait irq softirq steal
            busy += sum(values) - values[3] - values[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


_START: Sample | None = None


def mark_start() -> None:
    """The moment the command started: the choice averages what the machine did since (fedcache/cli/root.py)."""
    global _START
    _START = Sample.now()


def others_busy(start: Sample | None, end: Sample) -> float | None:
    """Cores that other processes kept busy between ``start`` and ``end``; without /proc/stat, the one-minute
    load average; None where neither is known."""
    if start is not None and start.busy is not None and end.busy is not None and end.at > start.at:
        return max(0.0, (end.busy - start.busy - (end.own - start.own)) / (end.at - start.at))
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _watched() -> float | None:
    """Cores other processes kept busy since the command started, watched for at least SHORTEST seconds."""
    if _START is not None:
        time.sleep(max(0.0, SHORTEST - (time.monotonic() - _START.at)))
    return others_busy(_START, Sample.now())


# ---- the choice --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    threads: int
    why: str

    def line(self) -> str:
        return f"torch threads: {self.threads} ({self.why})"


def choose(requested: int | None, environ: Mapping[str, str], current: int, cores: int,
           measure: Callable[[], float | None]) -> Choice:
    """``requested`` (--threads), else the ``OMP_NUM_THREADS`` torch has already applied (``current``), else the
    cores that the busy ones (``measure``: how many other processes keep busy) leave free, at most torch's default
    (``current``)."""
    if requested is not None:
        return Choice(requested, "--threads")
    if environ.get(ENV, "").strip():
        return Choice(current, f"{ENV}={environ[ENV].strip()}")
    others = measure()
    if others is None:
        return Choice(current, "torch's default: this system does not say how busy its cores are")
    free = max(1, min(current, round(cores - others)))
    busy = f"other processes kept {others:.1f} of {cores} cores busy as this command started"
    return Choice(free, (f"torch's default; {busy}" if free == current else busy) + f"; --threads N or {ENV} to change")


@contextlib.contextmanager
def threads_for(requested: int | None) -> Iterator[Choice]:
    """Run the block with the chosen thread count, said once in the log; the previous count is restored after it (a
    test or a script that calls ``fedcache.cli.main`` keeps its own)."""
    import torch

    before = torch.get_num_threads()
    choice = choose(requested, os.environ, before, len(usable_cores()), _watched)
    log.info(choice.line())
    torch.set_num_threads(choice.threads)
    try:
        yield choice
    finally:
        torch.set_num_threads(before)
