"""Progress for output that is not a terminal (logs, CI, notebooks): one plain line per milestone.

A rich progress bar draws nothing when stderr is redirected, so a long `extract` or `grid` in a log looked
hung. `PlainProgress` takes the calls the CLI makes on a rich `Progress` (`add_task`, `advance`, `update`,
`console`) and prints a line when a task starts, at every tenth of its total (at most one line per
`min_interval` seconds) with the time left, and when it finishes, with the time it took.

`said_step` is for the steps before a task starts (a grid reading its features): logged, and said where slow;
`said_now` for a step said as it starts, one slow whatever the data (Ray starting). `check_callback` refuses a
progress callback that cannot take what it will be given.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from fedcache.errors import ConfigError

if TYPE_CHECKING:  # rich's import draws from Python's random: the library's steps (said_step) must not import it
    from rich.console import Console


# Seconds a step before a command's own progress starts (reading a large store, making its partitions) must take to
# be said where that progress is shown: a short run prints what it printed before; the log has every step.
SLOW_STEP = 2.0

StepCallback = Callable[[str], None]  # a step done, said in one line (``said_step``)


def said_step(logger: logging.Logger, on_step: StepCallback | None, text: str, seconds: float) -> None:
    """A step done before the progress of the work itself (a grid's cells, a run's rounds): ``text`` in the log
    (INFO), and to ``on_step`` (a command prints it beside its progress) where it took ``SLOW_STEP`` seconds or
    more. Without it, a grid on a million rows said nothing for the half minute before its first cell."""
    logger.info(text)
    if on_step is not None and seconds >= SLOW_STEP:
        on_step(text)


def said_now(logger: logging.Logger, on_step: StepCallback | None, text: str) -> None:
    """A step said as it starts, in the log (INFO) and to ``on_step``, where it is slow whatever the data (Ray
    starting and shutting down take seconds on any run): ``said_step`` says a step once it is done, and only
    where it was slow, which left a Flower simulation's command silent for its first half minute."""
    logger.info(text)
    if on_step is not None:
        on_step(text)


def check_callback(name: str, callback: Callable | None, *arguments: str) -> None:
    """A callback that cannot take what fedcache passes would fail only once a round or a cell has trained and
    written its folder (a retry then finds a run there), so it is checked before anything runs."""
    if callback is None:
        return
    call = f"{name}({', '.join(arguments)})"
    if not callable(callback):
        raise ConfigError(f"{name}={callback!r} is not a function; give one that fedcache calls as {call}")
    try:
        inspect.signature(callback).bind(*arguments)
    except TypeError as exc:
        raise ConfigError(f"{name}: fedcache calls it as {call}, which {callback!r} cannot take ({exc})") from None
    except ValueError:  # no signature to read (some builtins): it is called as it is
        pass


def log_to_stderr(level: str | int) -> None:
    """A command's log lines on stderr from ``level`` up. The level goes on the handler too: a library that sets
    its own logger lower (flwr's is at DEBUG) passes the root logger's level, which only filters the root's
    own records, and its debug lines reached the terminal."""
    root = logging.getLogger()
    before = list(root.handlers)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in root.handlers:
        if handler not in before:  # a handler that was there (a test's, an application's) is not ours to change
            handler.setLevel(level)
            handler.addFilter(_not_printed_by_its_library)


def _not_printed_by_its_library(record: logging.LogRecord) -> bool:
    """False for a record a library's own handler on stderr has printed already: huggingface_hub has one on its
    logger and lets its records go on to the root, so each of its warnings showed twice."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None and logger.parent is not None:  # up to the root, whose handlers are ours
        if any(_on_stderr(h) and record.levelno >= h.level and h.filter(record) for h in logger.handlers):
            return False
        logger = logger.parent if logger.propagate else None
    return True


def _on_stderr(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stderr, sys.__stderr__)


@contextlib.contextmanager
def logging_to_stderr(level: str | int) -> Iterator[None]:
    """``log_to_stderr`` for a block, for a command called from Python (a script, a test): the handler it adds is
    removed and the root logger's level put back after the block, since the process is the caller's."""
    root = logging.getLogger()
    handlers, level_before = list(root.handlers), root.level
    log_to_stderr(level)
    added = [h for h in root.handlers if h not in handlers]
    try:
        yield
    finally:
        for handler in added:
            root.removeHandler(handler)
        root.setLevel(level_before)


@dataclass
class _Task:
    description: str
    total: float | None
    fields: dict[str, Any]
    start: float = field(default_factory=time.monotonic)
    completed: float = 0.0
    first: float = 0.0  # what was done before it started (a resumed run's rounds): no part of its rate
    printed_step: int = -1
    printed_at: float = 0.0
    printed_total: float | None = None  # the total its last line said: a new end after one said is said too
    printed_count: float = 0.0  # the count its last line said


class PlainProgress:
    def __init__(self, console: Console, min_interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.min_interval, self.clock = console, min_interval, clock
        self.tasks: list[_Task] = []

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        for task in self.tasks:  # an end held back by min_interval (a total grown again) is said as the work ends
            if task.total and task.completed >= task.total and not self._said_done(task):
                self._print(task, self.clock())
            elif kind is not None and task.completed != task.printed_count:
                # Stopped (Ctrl-C, an error): a log's last line said where the work was up to 10 s before, a run's
                # first line "0/3000" although 454 rounds had been checkpointed.
                self.console.print(self.line(task, self.clock(), stopped=True), highlight=False, soft_wrap=True)

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields: Any) -> int:
        self.tasks.append(_Task(description, total, fields, start=self.clock(), completed=completed, first=completed))
        self._emit(self.tasks[-1], force=True)
        return len(self.tasks) - 1

    def advance(self, task_id: int, advance: float = 1) -> None:
        task = self.tasks[task_id]
        task.completed += advance
        self._emit(task)

    def update(self, task_id: int, *, total: float | None = None, completed: float | None = None, **fields: Any) -> None:
        task = self.tasks[task_id]
        grown = total is not None and task.total is not None and total > task.total
        task.total = task.total if total is None else total
        task.completed = task.completed if completed is None else completed
        task.fields.update(fields)
        if grown:  # given more (halving's revived runs, its test stage), even once said finished: its tenths go on
            now = int(10 * task.completed / task.total)
            # But from the tenth just below the one said last, the next line would say that tenth again.
            if now < task.printed_step - 1:
                task.printed_step = now
        self._emit(task)

    def _emit(self, task: _Task, force: bool = False) -> None:
        now = self.clock()
        step = int(10 * task.completed / task.total) if task.total else 0
        done = bool(task.total) and task.completed >= task.total
        waited = now - task.printed_at >= self.min_interval
        due = step > task.printed_step and waited
        # A first end is said at once; a new one after an end was said (a total grown with the count: halving's
        # revived runs) waits as the tenths do, or a line a cell would print, and the last is said on exit.
        end = done and not self._said_done(task) and (task.printed_step != 10 or waited)
        if force or due or end:
            self._print(task, now)

    @staticmethod
    def _said_done(task: _Task) -> bool:
        return task.printed_step == 10 and task.printed_total == task.total

    def _print(self, task: _Task, now: float) -> None:
        done = bool(task.total) and task.completed >= task.total
        step = 10 if done else (int(10 * task.completed / task.total) if task.total else 0)
        task.printed_step, task.printed_at, task.printed_total, task.printed_count = step, now, task.total, task.completed
        self.console.print(self.line(task, now), highlight=False, soft_wrap=True)

    def line(self, task: _Task, now: float, stopped: bool = False) -> str:
        extra = " ".join(str(v) for v in task.fields.values() if v)
        elapsed = now - task.start
        if not task.total:
            parts = [task.description, f"{_number(task.completed)} done" if task.completed else "started"]
        else:
            parts = [task.description, f"{_number(task.completed)}/{_number(task.total)} ({100 * task.completed / task.total:.0f}%)"]
        if stopped:
            parts.append(f"stopped after {_duration(elapsed)}")
        elif task.total and task.first < task.completed < task.total and elapsed > 0:
            parts.append(f"ETA {_duration(elapsed * (task.total - task.completed) / (task.completed - task.first))}")
        elif task.total and task.completed >= task.total:
            parts.append(f"in {_duration(elapsed)}")
        return " ".join(parts + ([extra] if extra else []))


def _number(x: float) -> str:
    """A count in full (``1100000``, where ``:g`` wrote an import's rows as ``1.1e+06``)."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else (
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s")
