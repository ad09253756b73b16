"""The package's shape: no import cycles, nothing imports the CLI, no process-wide side effects."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedcache"


def _modules() -> dict[str, Path]:
    return {".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): f
            for f in PACKAGE.rglob("*.py")}


def _imports() -> dict[str, set[str]]:
    """module -> the fedcache modules it imports (at any level of the file), __init__ files as packages."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            graph[m].update(n for n in names if n in mods and n != m)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), packages left out as nodes:
    a package's __init__ re-exporting its own modules is not a cycle between modules."""
    packages = {m for m, f in _modules().items() if f.name == "__init__.py"}
    graph = {m: e - packages for m, e in graph.items() if m not in packages}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_imports()) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"fedcache.a": {"fedcache.b"}, "fedcache.b": {"fedcache.a"}, "fedcache.c": set()}) == [["fedcache.a", "fedcache.b"]]


# The allowed direction of imports: a module imports only from its own layer or the layers below it (first is
# lowest). Within federate, the methods reach behind the cache through extract (CLIP towers, images); that is why
# extract sits below federate. spec composes the sections its layers declare (best, beside it, reads its options to
# mark one best result alike for grids and reports); training runs one spec, partitioning finds its partition; grids, flower and reports build on
# training; the API, demo and paper presets on those; nothing imports the CLI but the console script's entry point
# (_console.py, which imports it inside the function it runs: a grid's worker re-runs that script).
LAYERS = [
    ("errors", "wording", "borrowed"),
    ("config", "registry", "paths", "progress", "table", "noise", "disk", "ownership", "workers", "interrupts"),
    ("store", "trackers"),
    ("heads",),
    ("extract",),
    ("federate",),
    ("spec", "best"),
    ("training", "partitioning"),
    ("flower", "grids", "presets"),
    ("reports",),
    ("api",),
    ("demo", "reproduce"),
    ("cli", "_console", "__main__"),
]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package itself: its lazy attribute access reaches the API, which is the point of it
    top = parts[1]
    found = [i for i, layer in enumerate(LAYERS) if top in layer]
    assert found, f"{top} is in no layer of test_structure.LAYERS: place it"
    return found[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for m, deps in graph.items():
        here = _layer(m)
        for d in deps:
            there = _layer(d)
            if here is not None and there is not None and there > here:
                out.append(f"{m} -> {d}")
    return sorted(out)


def test_imports_go_down_the_layers():
    assert upward_imports(_imports()) == []


def test_the_layer_check_finds_an_upward_import():
    assert upward_imports({"fedcache.federate.driver": {"fedcache.spec"}}) == ["fedcache.federate.driver -> fedcache.spec"]
    assert upward_imports({"fedcache.spec": {"fedcache.federate.driver"}}) == []


def test_method_commands_name_code_below_the_cli_that_exists():
    """A method's command may name its code by string (``MethodCommand.run``: a report that trains runs, above the
    methods, imported when the command runs); the import graph cannot see that edge, so it is checked here: every
    such name resolves to a function, in a layer below the CLI."""
    from fedcache.federate.methods import METHODS

    named = [c.run for _, cls in METHODS.items() for c in cls.commands if isinstance(c.run, str)]
    assert named, "no method names its command's code by string: this check has nothing to check"
    for target in named:
        module, _, function = target.partition(":")
        assert _layer(module) is not None and _layer(module) < _layer("fedcache.cli"), target
        assert callable(getattr(importlib.import_module(module), function)), target


ENTRY = "fedcache._console"  # pyproject.toml's [project.scripts]


def test_nothing_imports_the_cli():
    """Only the CLI package's own modules import it, and the console script's entry point."""
    def cli(m: str) -> bool:
        return m == "fedcache.cli" or m.startswith("fedcache.cli.")

    assert [m for m, deps in _imports().items() if not cli(m) and m != ENTRY and any(map(cli, deps))] == []


def test_plotting_leaves_the_callers_matplotlib_backend_alone(tmp_path):
    script = f"""
import matplotlib
matplotlib.use("svg")
import numpy as np
from fedcache.federate.partitions import PartitionRequest, make_partition
from fedcache.reports.partition_plots import plot_partition
labels = np.arange(40) % 4
part = make_partition(PartitionRequest.of("iid", 2, min_size=1), labels, np.zeros(40, int), labels, np.zeros(40, int))
paths = plot_partition(part, labels, ["a", "b", "c", "d"], r"{tmp_path}/p")
import matplotlib.pyplot as plt
print(matplotlib.get_backend(), len(plt.get_fignums()), all(p.stat().st_size > 0 for p in paths))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["svg", "0", "True"]


def test_no_module_is_made_callable_by_swapping_its_class():
    """A package's __init__ must not replace its module object or class to make ``fedcache.extract(...)`` callable."""
    tricks = []
    for m, f in _modules().items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("ModuleType", "__class__") and isinstance(node.ctx, (ast.Load, ast.Store)):
                tricks.append(f"{m}: {node.attr}")
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules" and isinstance(node.ctx, ast.Store):
                tricks.append(f"{m}: sys.modules[...] =")
    assert tricks == []


def test_plotting_lives_in_reports():
    """Only fedcache.reports draws; digits5-offline reads matplotlib's bundled fonts (``import matplotlib``)."""
    drawing = [m for m, f in _modules().items() if not m.startswith("fedcache.reports")
               for node in ast.walk(ast.parse(f.read_text()))
               if isinstance(node, (ast.Import, ast.ImportFrom))
               and any(n.startswith("matplotlib.") for n in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                                          else [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]))]
    assert drawing == []


SCREEN = 50  # lines a function may take, from its def (or first decorator) to its end, docstring included


def _long_functions(source: str, limit: int = SCREEN) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - start + 1 > limit:
                out.append(f"{node.name} ({node.end_lineno - start + 1} lines)")
    return out


def test_every_function_fits_on_one_screen():
    assert {m: found for m, f in _modules().items() if (found := _long_functions(f.read_text()))} == {}


def test_the_screen_check_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(SCREEN))
    assert _long_functions(f"@decorated\ndef short():\n    pass\n\ndef long():\n{body}\n") == [f"long ({SCREEN + 1} lines)"]


def _unsafe_torch(source: str) -> list[str]:
    """Private torch APIs (``torch._x``, ``from torch._x import``), ``torch.load`` without ``weights_only=True``
    and ``np.load`` with ``allow_pickle``: what could break on a torch release, or unpickle what it reads."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and ast.unparse(node.value).startswith("torch"):
            out.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._"):
            out.append(f"from {node.module} import")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
            safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
            out += [] if safe else [ast.unparse(node)]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("np.load", "numpy.load"):
            out += [ast.unparse(node) for k in node.keywords if k.arg == "allow_pickle" and getattr(k.value, "value", 1) is not False]
    return out


def test_no_private_torch_api_and_no_unpickling_load():
    assert {m: found for m, f in _modules().items() if (found := _unsafe_torch(f.read_text()))} == {}


def test_the_torch_check_finds_each_kind():
    source = ("import torch\nfrom torch._dynamo import x\ntorch._C.f()\ntorch.load(p)\ntorch.load(p, weights_only=False)\n"
              "torch.load(p, weights_only=True)\nnp.load(p, allow_pickle=True)\nnp.load(p, allow_pickle=False)\n"
              "torch.nn.Linear(1, 1)\n")
    assert sorted(_unsafe_torch(source)) == ["from torch._dynamo import", "np.load(p, allow_pickle=True)", "torch._C",
                                             "torch.load(p)", "torch.load(p, weights_only=False)"]
