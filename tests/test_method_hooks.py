"""Methods state their name once (the registration) and hang their own commands off a hook the CLI builds
from (fedcache/federate/methods/base.py: MethodCommand), so the CLI (fedcache/cli/) names no method-specific command."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fedcache.errors import ConfigError
from fedcache.federate.methods import METHODS, MethodRegistry
from fedcache.federate.methods.base import CommandOption, Method, MethodCommand

PACKAGE = Path(__file__).resolve().parents[1] / "fedcache"


def test_the_registration_names_every_method():
    assert all(cls.name == name for name, cls in METHODS.items())
    # no method file assigns the name itself
    for f in (PACKAGE / "federate" / "methods").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef) and f.name != "base.py":
                assigned = [t.id for s in node.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)]
                assert "name" not in assigned, f"{f.name}: {node.name} states its name; the registration does"


def test_a_name_stated_twice_is_refused():
    reg = MethodRegistry("method")

    class Twice(Method):
        name = "twice"

    with pytest.raises(ConfigError, match="states its name"):
        reg.add("twice", Twice)

    class Once(Method):
        pass

    assert reg.add("once", Once).name == "once" and Method.name == ""


def test_the_cli_builds_a_method_command_from_the_hook(monkeypatch, tmp_path, capsys):
    import fedcache.cli as cli

    seen = {}

    def run(spec, out, verbose):
        seen.update(spec=spec, out=out, verbose=verbose)
        return ["first line", "second line"]

    hook = MethodCommand("toy-figure", "A toy method command.", run, spec_options=("dataset", "backbones", "store", "clients", "rounds"),
                         defaults={"rounds": 7}, extra=(CommandOption("out", Path, "Where.", ("--out", "-o")),
                                                        CommandOption("verbose", bool, "Talk.", ("--verbose",), False)))
    # the app's command group looks the method commands up in fedcache/cli/root.py
    monkeypatch.setattr(cli.root, "_method_commands", lambda taken: {"toy-figure": cli._method_command(hook, "fedproto")})
    code = cli.main(["toy-figure", "-d", "test-toy", "-b", "a,b", "--store", str(tmp_path / "s.zarr"), "--clients", "3", "-o", "x.png"])
    assert code == 0, capsys.readouterr().err
    spec = seen["spec"]
    assert spec.method.name == "fedproto" and spec.partition.clients == 3 and spec.schedule.rounds == 7
    assert spec.data.backbones == ("a", "b") and seen["out"] == Path("x.png") and seen["verbose"] is False
    assert capsys.readouterr().out.splitlines() == ["first line", "second line"]
    # an option the hook does not name is not an option of the command
    assert cli.main(["toy-figure", "-d", "t", "-b", "a", "-o", "x.png", "--fraction", "0.5"]) == 2


def test_fedpcl_declares_the_backbone_heatmap_and_the_cli_does_not():
    assert [c.name for c in METHODS.get("fedpcl").commands] == ["backbone-heatmap"]
    assert not [f for f in (PACKAGE / "cli").glob("*.py") if "backbone-heatmap" in f.read_text()]
    assert [n for n, cls in METHODS.items() if cls.commands] == ["fedpcl"]


def test_every_method_command_shows_an_example_that_parses():
    import shlex

    from fedcache.cli import _method_commands

    for name, cmd in _method_commands(taken=set()).items():
        assert (cmd.epilog or "").startswith(f"Example: fedcache {name} "), f"{name} has no example in its help"
        cmd.make_context(name, shlex.split(cmd.epilog.removeprefix("Example: "))[2:])


def test_method_commands_are_listed_by_methods(capsys):
    from fedcache.cli import main

    assert main(["methods"]) == 0
    assert "fedpcl adds fedcache backbone-heatmap" in capsys.readouterr().out


def test_the_cli_starts_without_importing_the_methods():
    code = "import sys; from fedcache.cli import app; import typer.main; typer.main.get_command(app); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_a_method_command_cannot_shadow_a_command(monkeypatch):
    import fedcache.cli as cli

    hook = MethodCommand("train", "Shadows train.", lambda spec: [], spec_options=("dataset",))
    monkeypatch.setattr(METHODS.get("solo"), "commands", (hook,))
    with pytest.raises(ConfigError, match="'train', which fedcache has already"):
        cli._method_commands(taken={"train", "grid"})
    monkeypatch.setattr(METHODS.get("solo"), "commands", (MethodCommand("backbone-heatmap", "Twice.", lambda spec: [], ()),))
    with pytest.raises(ConfigError, match="fedpcl declares too|solo declares too"):
        cli._method_commands(taken=set())
