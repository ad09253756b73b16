"""What every command module shares: the consoles, the store option, options generated from the run
specification, comma lists and progress display. Nothing here registers a command (fedcache/cli/root.py
does), so every command module can import it without a cycle."""
from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import List, Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from fedcache import progress as steps
from fedcache.progress import PlainProgress
from fedcache.config import Option
from fedcache.errors import ConfigError
from fedcache.paths import STORE_HELP, default_store

HELP_FLAGS = {"help_option_names": ["-h", "--help"], "show_default": True}

# Redirected output (logs, CI) gets a wide console, as wide as COLUMNS says where it is set: rich would wrap
# lines at 80 columns (tables are printed whole: print_table).
_COLUMNS = os.environ.get("COLUMNS", "")
console = Console() if sys.stdout.isatty() else Console(width=int(_COLUMNS) if _COLUMNS.isdigit() and int(_COLUMNS) > 0 else 160)
err = Console(stderr=True, soft_wrap=True)  # a message is one line in a log or a pipe too (grep finds it); terminals wrap it

FLEXIBLE_MIN = 12  # characters of a free-text column (a description) below which other columns make room


def _piped() -> bool:
    """Whether stdout is no terminal (a pipe, a file, a log): it has no width for a table to fit."""
    return not console.is_terminal


def print_table(table: Table, optional: tuple[str, ...] = (), flexible: str | None = None) -> None:
    """``table`` as wide as the terminal: its ``flexible`` column (free text) is cut to the room the others leave;
    while that is under FLEXIBLE_MIN, the ``optional`` columns, least wanted first, are left out (a line says which
    and how to see them). A table still wider is printed whole for the terminal to wrap, never squeezed into
    columns of a few letters (``4096`` shown as ``40…``). Piped or redirected, every column is whole, one line a
    row: a log or a grep cut ``synthdigits`` to ``synt…`` at any width chosen for it."""
    if _piped():
        for column in table.columns:
            column.max_width = None
        _print_wide(table, _width(table))
        return
    flex = next((c for c in table.columns if c.header == flexible), None)
    cap = flex.max_width if flex else None

    def width(flex_width: int | None = cap) -> int:
        if flex is not None:
            flex.max_width = flex_width
        return _width(table)

    least = min(cap or FLEXIBLE_MIN, FLEXIBLE_MIN) if flex else None
    hidden = []
    for name in optional:
        if width(least) <= console.width:
            break
        column = next((c for c in table.columns if c.header == name), None)
        if column is not None:
            table.columns.remove(column)
            hidden.append(name)
    natural = width()
    if flex is not None:
        room = console.width - (width(1) - 1)
        natural = width(max(least, min(room, cap or room)))
    shown = console.width
    _print_wide(table, natural)
    if hidden:
        console.print(f"[dim]{', '.join(hidden)} not shown at {shown} columns (COLUMNS=160 shows them)[/]",
                      highlight=False)


def _width(table: Table) -> int:
    """The width ``table`` takes with room for all of it."""
    return console.measure(table, options=console.options.update_width(1 << 16)).maximum


def _print_wide(table: Table, natural: int) -> None:
    """Print ``table`` at least ``natural`` columns wide, wider than the console if need be."""
    shown, console.width = console.width, max(natural, console.width)
    try:  # print() itself cannot go wider than the console
        console.print(table)
    finally:
        console.width = shown


try:  # recent typer vendors click; older typer uses the click package
    from typer._click import exceptions as _click_exceptions
    from typer._click import globals as _click_globals
except ImportError:  # pragma: no cover
    from click import exceptions as _click_exceptions
    from click import globals as _click_globals


def given_on_command_line(values: dict) -> list[str]:
    """The names in ``values`` (a command's options) that the command line gave: typer passes every option, those
    left out at their defaults too, and only click knows which a user typed."""
    ctx = _click_globals.get_current_context(silent=True)
    if ctx is None:  # called outside a command (from Python): every value counts as given
        return list(values)
    return [k for k in values if getattr(ctx.get_parameter_source(k), "name", "DEFAULT") != "DEFAULT"]


class Group(typer.core.TyperGroup):
    """A group of commands whose misspelled command is answered with one suggestion: click 8.4+ suggests close
    names itself (NoSuchCommand), and typer's own suggestion repeated it (`Did you mean 'train'? Did you mean
    'train'?`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if hasattr(_click_exceptions, "NoSuchCommand"):
            self.suggest_commands = False


class Command(typer.core.TyperCommand):
    """A command whose help names a switch in one column, ``--batch/--no-batch``: typer gave the ``--no-`` form a
    column of its own, 12 of every line's 76 characters at 80 columns, and cut the longest names to make room
    (``--backbones,--backbo…``). Only the help is changed: the switch parses as declared."""

    def format_help(self, ctx, formatter) -> None:
        switches = [(p, p.opts, p.secondary_opts, p.help, p.show_default) for p in self.params
                    if getattr(p, "secondary_opts", None)]
        for p, on, off, text, shown in switches:
            if shown is not False and isinstance(p.default, bool):  # [default: batch], as typer named it from the pair
                p.help = f"{text or ''} \\[default: {(on if p.default else off)[0].lstrip('-')}]".strip()
            p.opts, p.secondary_opts, p.show_default = ["/".join(on + off)], [], False
        try:
            super().format_help(ctx, formatter)
        finally:
            for p, on, off, text, shown in switches:
                p.opts, p.secondary_opts, p.help, p.show_default = on, off, text, shown


DEFAULT_STORE = default_store()
StoreOpt = typer.Option(DEFAULT_STORE, "--store", help=STORE_HELP)


def _spec_params(opts: list[Option], **help_for: str) -> list[inspect.Parameter]:
    """Typer parameters of options declared on typed settings (fedcache/spec.py, fedcache/extract/config.py),
    named, typed, flagged and documented as declared (``help_for``: a command's own help text for an option it
    reads differently)."""
    return [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=_typer_type(o),
                              default=typer_option(o, help_for.get(o.name))) for o in opts]


def typer_option(o: Option, help: str | None = None):
    """``o`` as typer's option: its flags, its default as the command line writes it, its help."""
    if o.required:
        default = ...
    elif o.default is None:
        default = None
    elif o.opt.repeatable:
        default = list(o.default)
    elif o.base is tuple:  # one text: a comma list
        default = o.opt.sep.join(map(str, o.default))
    else:  # a type read from its own text (a Part, ``0/1``) as that text
        default = str(o.default) if o.read else o.default
    return typer.Option(default, *o.flags, help=escape(help or o.help))  # help is rich markup


def _typer_type(o: Option):
    """What typer passes: a repeatable option's texts, one text for a comma list or a type read from text (the
    settings parse it), else the field's own type."""
    if o.opt.repeatable:
        return List[str]
    typ = str if o.base is tuple or o.read else o.base
    return Optional[typ] if o.default is None else typ


def restore_argument_help(command) -> None:
    """Put back the help of every typer.Argument of ``command`` and its subcommands. click 8.5 sets
    ``Parameter.help`` in its own ``__init__``, after typer's TyperArgument has set it, so every argument's
    help was lost (`fedcache report -h` listed RUN_DIR with none)."""
    for sub in getattr(command, "commands", {}).values():
        restore_argument_help(sub)
    declared = inspect.signature(command.callback.__wrapped__).parameters if hasattr(command.callback, "__wrapped__") else {}
    for p in command.params:
        info = getattr(declared.get(p.name), "default", None)
        if p.param_type_name == "argument" and not getattr(p, "help", None) and getattr(info, "help", None):
            p.help = info.help


def _signed(fn, params: list[inspect.Parameter]):
    """``fn(**options)`` with a generated signature, which is what typer reads its options from."""
    fn.__signature__ = inspect.Signature(params)
    return fn


def _csv(text: str, option: str = "") -> list[str]:
    """``a,b`` -> ``["a", "b"]``; an empty item (``0,,1``, ``0,1,``) is a value left out by mistake, refused as
    ``--set`` refuses one, not dropped without a word. ``option``: its flag, for the message."""
    items = [t.strip() for t in text.split(",")]
    if text.strip() and not all(items):
        raise ConfigError(f"{option + ' ' if option else ''}{text}: an empty value between commas; write v1,v2")
    return [t for t in items if t]


class _Rate(ProgressColumn):
    """Images per second, or the task's own ``unit`` ("": none, for a count of cells that a rate would not help)."""

    def render(self, task) -> Text:
        unit = task.fields.get("unit", "img/s")
        return Text(f"{task.speed:,.0f} {unit}" if task.speed and unit else "", style="cyan")


# What an interrupted command left, as the command itself knew it (``said_on_interrupt``): one at a time.
_LEFT: list[str] = []


def said_on_interrupt(left: str | None = None) -> str | None:
    """What an interrupted command's work left (extract: the entries it finished, the rows it wrote), given by the
    command as it stops, for the "interrupted" line to say instead of what the command line alone tells. Called
    without ``left``: the one given, taken (None where none was), so that the next command starts without it."""
    if left is not None:
        _LEFT[:] = [left]
        return left
    return _LEFT.pop() if _LEFT else None


class ExtractProgress:
    """Turns the library's progress events into rich progress bars."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.tasks = progress, {}

    def __call__(self, e) -> None:
        if e.kind == "start":
            self.tasks[e.label] = self.progress.add_task(e.label, total=e.total)
        elif e.kind == "advance":
            self.progress.advance(self.tasks[e.label], e.advance)
        elif e.kind == "info" and e.message and not _steps_in_log():  # the log line says it (extract logs each)
            self.progress.console.print(f"[dim]{escape(e.message)}[/]")


def _progress(*columns: ProgressColumn) -> Progress | PlainProgress:
    """Bars on a terminal; elsewhere (logs, CI, notebooks) plain lines, since bars draw nothing there."""
    if not err.is_terminal:
        return PlainProgress(err)
    return Bar(*(columns or bar_columns()), console=err)


def bar_columns() -> tuple[ProgressColumn, ...]:
    """A bar's columns where its command gives none (extract's): what it is, the bar, the count, the rate, the time left."""
    return TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _Rate(), TimeRemainingColumn()


BAR_LEAST = 10  # cells of a bar worth drawing: with less room beside the text, the line goes without it


class Bar(Progress):
    """A live bar whose command's log lines print above it. The command's stderr handler (``log_to_stderr``) holds
    the terminal's stream, not the one rich puts in sys.stderr while the bar is drawn: a line (a grid worker's record,
    a cell's) landed on the bar's own line, after its text, and left a copy of the bar behind it in the scrollback.
    Its lines fit the terminal (:meth:`make_tasks_table`)."""

    def make_tasks_table(self, tasks) -> Table:
        """The tasks' lines, each one line of the terminal's width: the counts, the rate and the time left whole; the
        bar (a ``BarColumn``) in the room the description (the first column) leaves, up to its own width, or left
        out where that is under BAR_LEAST; the description cut (…) only where it alone does not fit. rich shared the
        room out otherwise: at 80 columns an extraction's line showed ``960/…`` and its ``img/s`` on a second line."""
        shown = [t for t in tasks if t.visible]
        if not shown:  # nothing to fit (and, as the bar is made, no console yet)
            return super().make_tasks_table(shown)
        rows = [[c.format(task=t) if isinstance(c, str) else c(t) for c in self.columns] for t in shown]
        columns = [Column(no_wrap=True) if isinstance(c, str) else c.get_table_column().copy() for c in self.columns]
        bar = next((i for i, c in enumerate(self.columns) if isinstance(c, BarColumn)), None)
        widths = [max((self.console.measure(r[i]).maximum for r in rows), default=0) for i in range(len(columns))]
        others = sum(w for i, w in enumerate(widths) if i not in (0, bar)) + len(columns) - 1  # a space between
        spare = self.console.width - others - widths[0]  # beside the whole text: the bar's
        if bar is not None:
            cells = min(spare, self.columns[bar].bar_width or spare)
            for r in rows:
                r[bar].width = cells
            if cells < BAR_LEAST:  # left out, with the space before it
                rows, columns = [r[:bar] + r[bar + 1:] for r in rows], columns[:bar] + columns[bar + 1:]
                spare += 1
        table = Table.grid(*columns, padding=(0, 1), expand=self.expand)
        for r in rows:
            table.add_row(_cut(r[0], widths[0] + min(spare, 0)), *r[1:])
        return table

    def start(self) -> None:
        super().start()
        proxy = sys.stderr  # rich's, writing through the bar's console, where it redirects (a terminal)
        self._moved = [(h, h.stream) for h in logging.getLogger().handlers if type(h) is logging.StreamHandler
                       and h.stream is self.console.file and hasattr(proxy, "rich_proxied_file")]
        for handler, _ in self._moved:
            handler.setStream(proxy)

    def stop(self) -> None:
        for handler, stream in getattr(self, "_moved", []):
            handler.setStream(stream)
        self._moved = []
        super().stop()


def _cut(cell, width: int):
    """``cell`` (a column's text) no wider than ``width``, cut with "…"; any other renderable as it is."""
    if not isinstance(cell, Text) or cell.cell_len <= width:
        return cell
    cut = cell.copy()
    cut.truncate(max(1, width), overflow="ellipsis")
    return cut


def step_printer(console: Console):
    """A library call's ``on_step`` (and a grid's ``on_plan``) for a command: each line printed beside its progress,
    unless the command's log shows it already (``FEDCACHE_LOG=info``: the library logs every step it says, and the
    line appeared twice)."""
    def on_step(text: str) -> None:
        if not _steps_in_log():
            console.print(text, soft_wrap=True, highlight=False, markup=False)

    return on_step


def _steps_in_log() -> bool:
    """The command's stderr handler (``progress.log_to_stderr``) writes fedcache's INFO records."""
    if not logging.getLogger("fedcache").isEnabledFor(logging.INFO):
        return False
    return any(type(h) is logging.StreamHandler and h.level <= logging.INFO and h.stream in (sys.stderr, sys.__stderr__)
               for h in logging.getLogger().handlers)


def import_with_torch(module: str) -> ModuleType:
    """``module``, which imports torch, imported, said on stderr while that takes ``progress.SLOW_STEP`` seconds or
    more: torch's import took 2.5 to 8 s on a busy machine, the silence before a grid's or a run's first line."""
    if module in sys.modules:
        return importlib.import_module(module)
    with loading_torch(f"{module} imported"):
        return importlib.import_module(module)


@contextlib.contextmanager
def loading_torch(what: str) -> Iterator[None]:
    """A block that imports torch (``what`` it does: for the log), said on stderr (``loading torch ...``) while it takes
    ``progress.SLOW_STEP`` seconds or more; nothing is said where torch is loaded already (a command called from
    Python, a test)."""
    if "torch" in sys.modules:
        yield
        return
    t0 = time.perf_counter()
    with said_while_slow("loading torch ..."):
        yield
    logging.getLogger("fedcache.cli").info("%s, with torch, in %.1f s", what, time.perf_counter() - t0)


@contextlib.contextmanager
def said_while_slow(text: str) -> Iterator[None]:
    """``text`` on stderr once the block has run ``progress.SLOW_STEP`` seconds, while it still runs (a step said
    after it is done leaves the wait silent); a fast block prints nothing. Said before anything after the block."""
    done = threading.Event()

    def say() -> None:
        if not done.wait(steps.SLOW_STEP):
            err.print(text, highlight=False, markup=False)

    sayer = threading.Thread(target=say, name="fedcache-said-while-slow", daemon=True)
    sayer.start()
    try:
        yield
    finally:
        done.set()
        sayer.join()
