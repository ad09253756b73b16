"""The root of the command line: the app with its commands in the order `fedcache -h` lists them, one
example per command, and the entry point that turns errors and signals into exit codes."""
from __future__ import annotations

import gc
import os
import re
import signal
import sys
import time
from pathlib import Path

import typer
from rich.markup import escape

from fedcache.cli.common import HELP_FLAGS, Command, Group, console, err, restore_argument_help, said_on_interrupt
from fedcache.cli.extract import backbones, datasets, extract
from fedcache.cli.grid import _grid, report, reproduce
from fedcache.cli.methods import _method_commands, methods
from fedcache.cli.store import store_app
from fedcache.cli.threads import mark_start
from fedcache.cli.train import demo, flower_app, partition, shard, train
from fedcache.disk import full_disk, is_full
from fedcache.errors import ConfigError, FedcacheError, UnknownNameError, debugging
from fedcache.interrupts import RaisedAgain
from fedcache.paths import denied_line, is_denied
from fedcache.progress import log_to_stderr, logging_to_stderr
from fedcache.wording import flag_names

try:  # recent typer vendors click; older typer uses the click package
    from typer._click.exceptions import BadParameter, ClickException, MissingParameter, UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import BadParameter, ClickException, MissingParameter, UsageError


class _Commands(Group):
    """The commands registered below, then those methods declare (resolved only when named, so that
    `fedcache --help` does not import every method)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        restore_argument_help(self)

    def get_command(self, ctx, name):
        return super().get_command(ctx, name) or _method_commands(taken=set(self.commands)).get(name)


# A bug's traceback without each frame's locals: a summary's dict, a run's config printed whole were a thousand
# lines around the one that says what failed (and a deployment's locals may hold what no log should).
app = typer.Typer(add_completion=False, no_args_is_help=True, context_settings=HELP_FLAGS, cls=_Commands,
                  pretty_exceptions_show_locals=False,
                  help="Federated learning on cached embeddings of frozen pretrained models. "
                       "Methods may add commands of their own: `fedcache methods` lists them.")
app.add_typer(store_app, name="store")


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"fedcache {version('fedcache')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Federated learning on cached embeddings of frozen pretrained models."""


# The commands in the order `fedcache -h` lists them (store, a group, comes after them).
COMMANDS = {"extract": extract, "datasets": datasets, "backbones": backbones, "demo": demo, "train": train,
            "partition": partition, "methods": methods, "grid": _grid, "report": report, "reproduce": reproduce,
            "shard": shard, "flower-app": flower_app}
for _name, _fn in COMMANDS.items():
    app.command(_name, cls=Command)(_fn)


# One example per command, shown under its help (`fedcache COMMAND -h`); tests/test_cli.py parses each one
# (a method's own commands carry theirs in their hook, MethodCommand.example).
EXAMPLES = {
    "extract": "fedcache extract -d digits5-offline -b efficientnet-lite0 --store feats.zarr",
    "datasets": "fedcache datasets",
    "backbones": "fedcache backbones",
    "methods": "fedcache methods",
    "demo": "fedcache demo --store feats.zarr -b efficientnet-lite0 -o runs/demo-lite0",
    "train": "fedcache train --store feats.zarr -d digits5-offline -b efficientnet-lite0 -m fedavg --partition dirichlet "
             "--alpha 0.5 --clients 10 --rounds 50 -o runs/fedavg",
    "partition": "fedcache partition --store feats.zarr -d digits5-offline -b efficientnet-lite0 --partition dirichlet "
                 "--alpha 0.5 --plot part",
    "grid": "fedcache grid --store feats.zarr -d digits5-offline -b efficientnet-lite0 -m fedavg,fedprox --partition dirichlet "
            "--alpha 0.1,1 --subsample 0.8 --set lr=1e-3,1e-2 --select lr --seeds 0,1,2 -j 2 -o runs/cmp",
    "report": "fedcache report runs/cmp",
    "reproduce": "fedcache reproduce fedpcl-table2 --dry-run",
    "shard": "fedcache shard --store feats.zarr -d digits5-offline -b efficientnet-lite0 --partition domain --clients 5 -o shards",
    "flower-app": "fedcache flower-app my-flower-app",
    "store ls": "fedcache store ls --store feats.zarr",
    "store info": "fedcache store info 3f2a --store feats.zarr",
    "store verify": "fedcache store verify --store feats.zarr --repair",
    "store rm": "fedcache store rm --stale --store feats.zarr",
    "store upgrade": "fedcache store upgrade --store feats.zarr",
    "store export": "fedcache store export --store feats.zarr -d digits5-offline -b efficientnet-lite0 -o lite0.npz",
    "store import": "fedcache store import mine.npz -d mydata -b my-encoder --store feats.zarr",
}


def _add_examples(group: typer.Typer, prefix: str = "") -> None:
    for info in group.registered_commands:
        name = prefix + (info.name or info.callback.__name__.replace("_", "-"))
        if name in EXAMPLES:  # tests/test_cli.py fails a command without one
            info.epilog = f"Example: {EXAMPLES[name]}"
    for sub in group.registered_groups:
        _add_examples(sub.typer_instance, f"{prefix}{sub.name} ")


_add_examples(app)


INTERRUPTED = 130  # the shell's code for SIGINT, so `extract ... && train ...` stops


def _exit_code(code: int) -> int:
    """An interrupted command exits as the shell reports a process its signal ended: 128 + the signal's number (130
    for Ctrl-C, 143 for SIGTERM), which a scheduler or a script reads as stopped from outside."""
    return 128 + _RAISED_BY[0] if code == INTERRUPTED and _RAISED_BY else code


def main(argv: list[str] | None = None) -> int:
    """Entry point: FedcacheError -> one red line and exit 1 (bad options: 2); FEDCACHE_DEBUG=1 shows tracebacks.
    Called from Python (a script, a notebook, a test) the process is the caller's: what the command sets up for
    itself, its log handler on the root logger and typer's ``sys.excepthook``, is put back when it returns."""
    hook = sys.excepthook
    try:
        with logging_to_stderr(_log_level()):
            return _command(argv)
    finally:
        sys.excepthook = hook


def _log_level() -> str:
    return os.environ.get("FEDCACHE_LOG", "WARNING").upper()


def _command(argv: list[str] | None) -> int:
    mark_start()  # a command that trains chooses its threads from how busy the machine is from here on
    started = time.time()  # what this command wrote is newer (said on an interrupt)
    said_on_interrupt()  # an earlier command's (main called again in one process), not this one's
    debug = debugging()
    empty = _empty_argument(sys.argv[1:] if argv is None else argv)
    if empty:
        err.print(f"[red]error:[/] {escape(empty)}: an unset shell variable? Give a value, or leave the option out",
                  highlight=False, soft_wrap=True)
        return 2
    try:
        # Without standalone mode click returns typer.Exit codes (130 for Ctrl-C) instead of raising them.
        with flag_names():  # its user typed flags, also where a command calls the Python API (reproduce)
            code = app(args=argv, standalone_mode=False, prog_name="fedcache")
    except typer.Exit as exc:
        code = exc.exit_code
    except UsageError as exc:  # click's refusal of what was typed: one line, as fedcache's checks say theirs
        return _usage_error(exc, argv)
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    except (KeyboardInterrupt, typer.Abort):
        code = INTERRUPTED
    except FedcacheError as exc:
        if debug:
            raise
        # escape: a message quoting a value or a TOML table ([set]) is text, not markup
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        refused = isinstance(exc, (ConfigError, UnknownNameError)) or getattr(exc, "refused_as_given", False)
        return 2 if refused else 1  # 2: the command as given is refused (docs/getting-started.md)
    except OSError as exc:  # a full disk, an unwritable path, in a write fedcache does not check itself: one line too
        if debug:
            raise
        err.print(f"[red]error:[/] {escape(_os_error(exc))}", highlight=False, soft_wrap=True)
        return 1
    code = code if isinstance(code, int) else 0
    if code == INTERRUPTED:
        left = said_on_interrupt() or _how_to_go_on(sys.argv[1:] if argv is None else argv, started)
        err.print(f"[yellow]interrupted[/]: {escape(left)}")
    return code


def _usage_error(exc: UsageError, argv: list[str] | None) -> int:
    """One line for a value of the wrong type (--rounds abc), an option or command misspelled, an extra argument; the
    usage where it says more: a value missing, or nothing given to a group (click's NoArgsIsHelpError, its help
    shown already)."""
    said = exc.format_message()
    if isinstance(exc, MissingParameter) or not said:
        exc.show()
    elif isinstance(exc, BadParameter):
        several = _several(exc, argv)
        said = said.rstrip(".") + several if several else said
        err.print(f"[red]error:[/] {escape(said)}", highlight=False, soft_wrap=True)
    else:
        where = exc.ctx.command_path if exc.ctx else "fedcache"
        said = said + ("" if said.endswith((".", "?", "?)")) else ".") + _named_otherwise(exc)
        err.print(f"[red]error:[/] {escape(said)} See `{where} --help`.", highlight=False, soft_wrap=True)
    return exc.exit_code


# Options other toolkits have, which fedcache spells otherwise: said beside click's suggestions, which go by spelling.
OTHERWISE = {"--clients-per-round": "A round samples --fraction of the clients (10 of 5,000 a round: --fraction 0.002).",
             "--num-clients": "The number of clients is --clients.",
             "--num-rounds": "The number of rounds is --rounds."}


def _named_otherwise(exc: UsageError) -> str:
    from click.exceptions import NoSuchOption

    hint = OTHERWISE.get(exc.option_name) if isinstance(exc, NoSuchOption) else None
    has = {o for p in (exc.ctx.command.params if exc.ctx else []) for o in p.opts}
    named = re.findall(r"--[a-z-]+", hint or "")
    return f" {hint}" if hint and all(n in has for n in named) else ""  # only where the command has what it names


def _several(exc: BadParameter, argv: list[str] | None) -> str:
    """What `train` refused as no number (``--alpha 0.1,1``) was a comma list, which a grid makes an axis of."""
    from fedcache.cli.train import SEVERAL

    if exc.ctx is None or exc.ctx.info_name != "train" or exc.param is None:
        return ""
    given = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(given):
        flag, eq, value = a.partition("=")
        value = value if eq else (given[i + 1] if i + 1 < len(given) else "")
        if flag in exc.param.opts and "," in value:
            return "; " + SEVERAL.format(pair=f"{flag} {value}")
    return ""


def _empty_argument(argv: list[str]) -> str | None:
    """An empty argument is an unset shell variable (``--out "$RUN"``) far more often than a choice, and one is
    read as something else: an empty path is the current directory, where a run would write its files."""
    for i, a in enumerate(argv):
        if a == "":
            return f'an empty argument after {argv[i - 1]}' if i else "an empty argument"
        if a.startswith("--") and a.endswith("=") and a.count("=") == 1:
            return f"{a} with nothing after the ="
    return None


def _os_error(exc: OSError) -> str:
    if is_full(exc):
        return str(full_disk(exc))
    if is_denied(exc):
        return denied_line(exc)
    where = f" {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}:{where} (FEDCACHE_DEBUG=1 shows where it happened)"


# Commands an interrupt leaves nothing of to resume: what it left instead.
_READ_ONLY = "it only reads the store: nothing was changed"
NOTHING_TO_RESUME = {
    ("store", "export"): "no part of the export was written (a file already at --out is as it was); run the same "
                         "command again",
    ("store", "ls"): _READ_ONLY, ("store", "info"): _READ_ONLY,
    ("store", "verify"): "what it said so far stands (entries --repair said it removed are gone); run the same command "
                         "again to check every entry",
    ("store", "rm"): "the entries it said it removed are gone, the others kept; run it again for those",
    ("store", "import"): "rows it had written are kept in partial entries (none while it was checking the file); "
                         "run the same command again to go on",
    # The shards are moved into --out only once all are whole, and the staging folder is removed: nothing to resume.
    ("shard",): "no shard was written (they appear in --out only once all of them are whole); run the same command "
                "again, which shards again from the start",
}


def _how_to_go_on(argv: list[str], started: float | None = None) -> str:
    words = [a for a in argv if not a.startswith("-")]
    if words[:1] == ["report"]:  # nothing to resume: the figures are drawn aside and replace the last report whole
        return ("the report is whole: the last one (if any) as it was, or the new one where it was being put in "
                "place; run the same command again to write it")
    for command in (tuple(words[:2]), tuple(words[:1])):  # a subcommand's entry, else its command's
        if command in NOTHING_TO_RESUME:
            return NOTHING_TO_RESUME[command]
    if words[:1] != ["train"]:
        return "finished work is kept; re-run the same command to resume"
    out = _out_of(argv)
    if out is None:
        return "the run had no --out, so nothing of it was kept"
    from fedcache.paths import CHECKPOINT  # not rundir's import of torch: an interrupt may have cut torch's short

    if not Path(out).exists():  # the run's lock made it, and removed it again as it let go, empty
        return f"no round had finished and {out} does not exist; re-run the same command"
    if not (Path(out) / CHECKPOINT).exists():
        return f"no round had finished, so {out} holds no checkpoint; re-run the same command"
    if "--resume" not in argv and started is not None and _before(Path(out) / CHECKPOINT, started):
        # --overwrite, or a finished run's folder given again, stopped before this run's first checkpoint: its
        # --resume would continue the other run, or be refused as other options.
        return (f"no round had finished: the checkpoint in {out} is of the run that was there before this command; "
                "re-run the same command")
    # A run's directory is refused without --resume: a re-run must not silently continue another run.
    return "its last checkpoint is kept; re-run the command with --resume to continue from it"


# Seconds a file's time may lag the clock it was written by (a file system's coarse timestamps, a network mount's).
CLOCK_SLACK = 1.0


def _before(path: Path, started: float) -> bool:
    """Whether ``path`` was last written before the command started."""
    try:
        return path.stat().st_mtime < started - CLOCK_SLACK
    except OSError:
        return False


def _out_of(argv: list[str]) -> str | None:
    """The value of --out / -o in any of its forms (``--out X``, ``--out=X``, ``-o X``, ``-oX``)."""
    for i, a in enumerate(argv):
        if a in ("--out", "-o"):
            return argv[i + 1] if i + 1 < len(argv) else None
        if a.startswith("--out="):
            return a.split("=", 1)[1]
        if a.startswith("-o") and not a.startswith("--") and len(a) > 2:
            return a[2:]
    return None


def _console_script() -> None:
    # The command line owns its process: SIGTERM (a job scheduler, `kill`) stops it like Ctrl-C, so grid
    # workers are stopped and finished work kept, instead of the process vanishing mid-write.
    signal.signal(signal.SIGTERM, _interrupted)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # one started ignoring it (in the background) still does
        signal.signal(signal.SIGINT, _interrupted)
    sys.unraisablehook = RaisedAgain(_rearm)
    # Its log lines and typer's tracebacks (FEDCACHE_DEBUG=1) last until the process exits: nothing to put back.
    log_to_stderr(_log_level())
    code = _command(None)
    try:
        _ours_to(signal.SIG_IGN)  # nothing is left to stop (see _interrupted)
    except KeyboardInterrupt:  # one pending as the command returned: it had nothing left to stop either
        _ours_to(signal.SIG_IGN)
    # Python's last garbage collections at exit walked every object torch's import made: half a second or more of
    # every command, and of Ctrl-C to exit (docs/performance.md#the-commands-exit), longer beside busy work.
    # What is alive now is left to the OS; atexit hooks run and objects no cycle holds are freed as before.
    gc.freeze()
    sys.exit(_exit_code(code))


def _interrupted(signum: int, frame: object) -> None:
    """The first SIGTERM or Ctrl-C stops the command as Ctrl-C does; later ones change nothing. One that came while
    the first was handled (workers stopped, the "interrupted" line printed, torch's exit hooks) raised again there:
    a KeyboardInterrupt traceback instead of the one line, and exit -2 instead of 130. They are caught by a handler
    that does nothing until the command returns, then ignored: ignored at once, one already pending was reported
    by Python ("Signal 15 ignored due to race condition"), and handled to the end, one sent as Python exits (its
    handlers back to the default by then) killed the process."""
    _ours_to(_ignored)
    _RAISED[:] = [KeyboardInterrupt()]
    _RAISED_BY[:] = [signum]
    raise _RAISED[0]


_RAISED: list[KeyboardInterrupt] = []  # the interrupt _interrupted raised last (_rearm knows it by that)
_RAISED_BY: list[int] = []  # the signal that stopped the command: its exit code, and the one _rearm sends again


def _ignored(signum: int, frame: object) -> None:
    pass


def _rearm(dropped: BaseException) -> int | None:
    """The first interrupt, ``dropped`` by Python where it was raised (``interrupts``): the command trained on, and
    ignored every later Ctrl-C and SIGTERM. Its handlers raise again; the signal to send again is the one that
    stopped the command (its exit code says which). None for another's KeyboardInterrupt, or once the command has returned."""
    if not _RAISED or dropped is not _RAISED[0] or signal.getsignal(signal.SIGTERM) is not _ignored:
        return None
    _ours_to(_interrupted)
    return _RAISED_BY[0]


def _ours_to(handler) -> None:
    for each in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(each) in (_interrupted, _ignored):
            signal.signal(each, handler)
