"""`fedcache methods`, and the commands methods declare in their ``commands`` hook
(fedcache/federate/methods/base.py: MethodCommand), built here so that the CLI names no method."""
from __future__ import annotations

import inspect
from typing import Optional

import typer
import typer.main
from rich.table import Table

from fedcache.cli.common import HELP_FLAGS, Command, _spec_params, console, print_table
from fedcache.cli.threads import threads_for, threads_param
from fedcache.errors import ConfigError
from fedcache.spec import RunSpec, options


def methods(name: Optional[str] = typer.Argument(None, help="a method: show its settings")) -> None:
    """List the federated methods, or one method's settings (`fedcache methods fedprox`)."""
    from fedcache.federate.methods import METHODS

    if name is not None:
        _settings(METHODS.get(name), name)
        return
    table = Table(box=None)
    table.add_column("name", no_wrap=True, min_width=12)
    for col in ("head", "personal", "global", "federated"):
        table.add_column(col, no_wrap=True, min_width=len(col))
    table.add_column("description", overflow="ellipsis", no_wrap=True, max_width=48)
    for name, cls in METHODS.items():
        yes = lambda b: "yes" if b else ""
        table.add_row(name, cls.default_head, yes(cls.personalized), yes(cls.has_global_model), yes(cls.federated), cls.description)
    print_table(table, flexible="description")
    for name, cls in METHODS.items():
        for c in cls.commands:
            console.print(f"{name} adds [bold]fedcache {c.name}[/]: {c.help}")


def _settings(cls, name: str) -> None:
    """A method's ``--set`` settings: default and what each accepts, and where its page is."""
    import dataclasses

    from fedcache.config import allowed, fields_of

    console.print(f"[bold]{name}[/]: {cls.description}; head {cls.default_head} by default")
    table = Table(box=None)
    for col in ("setting", "default", "accepts"):
        table.add_column(col, no_wrap=col != "accepts")
    types = fields_of(cls.Settings)
    for f in dataclasses.fields(cls.Settings):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        table.add_row(f.name, str(default), allowed(types[f.name]))
    if not types:
        console.print(f"no settings of its own; its page: docs/methods/{name}.md", highlight=False)
    else:
        print_table(table, flexible="accepts")
        console.print(f"Set one with --set {next(iter(types))}=VALUE; its page: docs/methods/{name}.md", highlight=False)
    console.print(_optimizer_line(cls), highlight=False)


def _optimizer_line(cls) -> str:
    """The optimizer a method starts from: `--preset`'s help sends the reader here for "the method's" preset."""
    from fedcache.federate.optim_config import OPTIMIZER_PRESETS, describe

    if not cls.uses_optimizer:
        return ("Optimizer: none (it trains nothing with an optimizer; --set lr=... and the like are refused, "
                "--preset, --local-epochs and --batch-size are unused, with a warning)")
    preset = cls.default_preset
    return (f"Optimizer: preset {preset} ({describe(OPTIMIZER_PRESETS[preset])}); change it with --preset NAME or "
            "--set lr=VALUE --set weight_decay=VALUE (one --set each: lr=0.1,weight_decay=0 is one value of lr)")


def _method_commands(taken: set[str]) -> dict:
    """The commands methods declare (their ``commands`` hook), by name, built here as click commands; a name
    that is already a command (``taken``) or another method's is refused rather than shadowed."""
    from fedcache.federate.methods import METHODS

    out, owner = {}, {}
    for name, cls in METHODS.items():
        for c in cls.commands:
            if c.name in taken or c.name in out:
                raise ConfigError(f"method {name} declares the command {c.name!r}, which "
                                  f"{'fedcache has already' if c.name in taken else owner[c.name] + ' declares too'}: rename it")
            out[c.name], owner[c.name] = _method_command(c, name), name
    return out


def _method_command(mc, method: str):
    """A method's command: the run-spec options it names (with its defaults) and its own options; the method
    is its owner."""
    def run(threads: int | None = None, **given) -> None:
        extra = {o.name: given.pop(o.name) for o in mc.extra}
        with threads_for(threads):
            for line in mc.function()(RunSpec.of(method=method, **given), **extra):
                console.print(line, highlight=False)

    params = _spec_params([o for o in options() if o.name in mc.spec_options])
    for p in params:
        if p.name in mc.defaults:
            p.default.default = mc.defaults[p.name]
    params += [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.type if o.default is ... else Optional[o.type],
                                 default=typer.Option(o.default, *(o.flags or (f"--{o.name.replace('_', '-')}",)), help=o.help))
               for o in mc.extra] + [threads_param()]
    run.__signature__ = inspect.Signature(params)
    sub = typer.Typer(add_completion=False)
    sub.command(mc.name, cls=Command, help=mc.help, context_settings=HELP_FLAGS, epilog=f"Example: {mc.example}" if mc.example else None)(run)
    return typer.main.get_command(sub)
