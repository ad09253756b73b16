"""docs/getting-started.md's worked example runs as written: its commands are read from the page, shrunk to a
tiny dataset by the table below, and run in an empty directory; the output has the documented shape."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from fedcache.cli import main
from fedcache.errors import ConfigError

from tests.conftest import BACKBONE

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
SECTION = "## A worked example"
# Only sizes and data change: every other option runs as documented.
TINY = {"--store": None, "-d": "test-toy", "-b": BACKBONE, "--clients": "3", "--rounds": "2", "--seeds": "0,1"}


def section() -> str:
    text = PAGE.read_text()
    start = text.index(SECTION)
    return text[start: text.index("\n## ", start + 1)]


def documented_commands() -> list[list[str]]:
    block = re.search(r"```bash\n(.*?)```", section(), re.S).group(1)
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def documented_output() -> str:
    return re.search(r"```text\n(.*?)```", section(), re.S).group(1)


def shrink(argv: list[str], store: Path) -> list[str]:
    out = list(argv)
    for i, word in enumerate(argv[:-1]):
        if word in TINY:
            out[i + 1] = str(store) if TINY[word] is None else TINY[word]
    return out


def test_the_worked_example_is_the_issue_s_task():
    grid, report = documented_commands()
    assert grid[:2] == ["fedcache", "grid"] and report == ["fedcache", "report", grid[grid.index("--out") + 1]]
    given = dict(zip(grid[2::2], grid[3::2]))
    assert given["-m"] == "fedavg,fedprox,fedproto" and given["--alpha"] == "0.1,1" and given["--clients"] == "10"
    assert given["--seeds"] == "0,1,2" and given["--set"] == "lr=1e-3,1e-2" and given["--select"] == "lr"
    assert given["-d"] == "digits5-offline" and given["--partition"] == "dirichlet"


@pytest.mark.slow  # 36 tiny runs in two worker processes: a minute or more on 2 cores
def test_the_worked_example_runs_as_documented(toy_store, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (grid, report) = [shrink(c, toy_store) for c in documented_commands()]
    assert main(grid[1:]) == 0, capsys.readouterr().err
    printed = "".join(capsys.readouterr())  # the documented output shows stderr's progress lines, then stdout
    out = tmp_path / grid[grid.index("--out") + 1]
    selection = json.loads((out / "selection.json").read_text())
    assert len(selection["choices"]) == 3 * 2  # one lr per method and alpha
    assert len(list((out / "validation" / "cells").iterdir())) == 3 * 2 * 2 * 2  # methods x alpha x lr x seeds
    assert len(list((out / "test" / "cells").iterdir())) == 3 * 2 * 2  # the chosen lr only
    # The documented output's lines that hold no measured number are printed as they are.
    fixed = [line for line in documented_output().splitlines() if line.strip() and not re.search(r"\d", line)]
    assert fixed and all(line.strip() in printed for line in fixed), printed
    last = documented_output().strip().splitlines()[-1]
    assert last in printed  # "wrote runs/cmp/results.csv and ...": the same paths
    assert main(report[1:]) == 0, capsys.readouterr().err
    html = (out / "report.html").read_text()
    assert "validation" in html and "chosen" in html


def test_select_without_spare_rows_names_the_option_to_add(toy_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = shrink(documented_commands()[0], toy_store)
    i = grid.index("--subsample")
    from fedcache.api import grid as run_grid

    sweep = {"partition": "dirichlet", "alpha": 1, "clients": 3, "rounds": 2, "lr": ["1e-3", "1e-2"]}
    with pytest.raises(ConfigError, match=r"add subsample=0\.8"):  # the Python API's keyword for --subsample
        run_grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0],
                 sweep=sweep, select=["lr"], out=tmp_path / "no-spare")
    assert grid[i + 1] == "0.8"  # the option the message names is the one the page uses
    assert not (tmp_path / "no-spare" / "validation" / "cells").exists() or \
        not list((tmp_path / "no-spare" / "validation" / "cells").iterdir())  # refused before any run
    # The command the message asks for, with the same --out, runs: the refused start claimed nothing (it was
    # refused as "a different grid (it differs in subsample)").
    table = run_grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0],
                     sweep={**sweep, "subsample": 0.8}, select=["lr"], out=tmp_path / "no-spare")
    assert len(table) == 1
    # Once a cell has run, the directory is that grid's: another one is refused, naming what differs.
    with pytest.raises(ConfigError, match=r"differs in subsample \(0.8 there, unset here\)"):
        run_grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0],
                 sweep=sweep, select=["lr"], out=tmp_path / "no-spare")
