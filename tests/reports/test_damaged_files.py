"""fedcache report of a folder with a torn or hand-edited file (an older version wrote some in place; a user may
edit one): one line naming the file and what to do, or, for a part the report can go without, a warning naming it
and a report that says the part is missing. Never a traceback."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedcache.reports import CONTRIBUTION, PAPER, save_contribution
from fedcache.reports.contribution import Contribution
from fedcache.reports.runs import SELECTION
from tests.faults import one_error_line, run_cli


def tear(path: Path) -> None:
    """Cut ``path`` half-way, as a crash of an in-place write leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture
def grid(toy_grid, tmp_path) -> Path:
    shutil.copytree(toy_grid, tmp_path / "grid")
    return tmp_path / "grid"


def as_halving_stopped_it(cell: Path) -> None:
    """The cell as a --prune grid leaves one it cut at round 1: rungs.json, no summary.json."""
    summary = json.loads((cell / "summary.json").read_text())
    (cell / "rungs.json").write_text(json.dumps({"1": {**summary, "rounds": 1}}))
    (cell / "summary.json").unlink()


@pytest.mark.parametrize("name", ["summary.json", "cell.json", "config.json", "rungs.json"])
def test_a_torn_file_of_a_run_is_one_line_naming_it_and_the_folder_to_run_again(grid, name, capsys):
    cell = sorted((grid / "cells").iterdir())[0]
    if name == "rungs.json":
        as_halving_stopped_it(cell)
    tear(cell / name)
    code, err = run_cli(["report", grid], capsys)
    line = one_error_line(err)
    assert code == 1 and f"{cell / name} is damaged (not JSON:" in line
    assert f"delete the folder {cell} and run the same `fedcache train` or `fedcache grid` command again" in line
    assert not (grid / "report.html").exists() and not list(grid.glob(".report-figures*"))
    shutil.rmtree(cell)  # as the line says: the report of the others is written
    assert run_cli(["report", grid], capsys)[0] == 0


def test_a_summary_edited_into_other_json_is_named_too(grid, capsys):
    cell = sorted((grid / "cells").iterdir())[0]
    (cell / "summary.json").write_text('["fedavg"]')
    code, err = run_cli(["report", grid], capsys)
    assert code == 1 and f"{cell / 'summary.json'} is damaged (not a JSON object;" in one_error_line(err)
    (cell / "summary.json").write_text('{"mean_accuracy": 50}')
    code, err = run_cli(["report", grid], capsys)
    assert code == 1 and 'is damaged (no "method" in it;' in one_error_line(err)
    # A figure as text was a traceback of numpy's sum, with a thousand lines of its locals.
    summary = json.loads((sorted((grid / "cells").iterdir())[1] / "summary.json").read_text())
    for wrong, said in [({"mean_accuracy": "41.2"}, 'its "mean_accuracy" is "41.2", not a number'),
                        ({"seconds": True}, 'its "seconds" is true, not a number'),
                        ({"per_client_accuracy": [50, "x"]}, 'its "per_client_accuracy" is not a list of numbers')]:
        (cell / "summary.json").write_text(json.dumps({**summary, **wrong}))
        code, err = run_cli(["report", grid], capsys)
        assert code == 1 and f"{cell / 'summary.json'} is damaged ({said};" in one_error_line(err), err


def test_a_torn_metrics_log_of_a_finished_run_is_said_in_the_report(grid, capsys, caplog):
    cell = sorted((grid / "cells").iterdir())[0]
    tear(cell / "metrics.jsonl")
    (cell / "metrics.jsonl").write_bytes((cell / "metrics.jsonl").read_bytes() + b"\xe2\x82")  # cut inside a character
    code, err = run_cli(["report", grid], capsys)
    assert code == 0 and f"{cell / 'metrics.jsonl'} holds rounds up to 1 of the run's 3 (cut short)" in caplog.text
    assert f"{cell / 'metrics.jsonl'} holds rounds up to 1 of 3" in (grid / "report.md").read_text()


@pytest.mark.parametrize("edit, said", [
    (lambda text: "garbage\nnot json {\n", "line 1 is not JSON: 'garbage'"),
    (lambda text: '[1, 2]\n"x"\n', 'line 1 is not a JSON object with a whole-number "round": \'[1, 2]\''),
    (lambda text: text.replace('{"round": 2', '{"round": "2"', 1), 'line 2 is not a JSON object with a whole-number'),
    (lambda text: text.replace('{"round": 2', '{"round": 2 ?', 1), "line 2 is not JSON: '{\"round\": 2 ?"),
    (lambda text: text + '{"round": 4, "acc\n', "line 4 is not JSON"),  # a line end after it: no crash's tear
])
def test_a_metrics_log_of_garbage_is_one_line_naming_the_line_not_a_run_cut_short(grid, edit, said, capsys, caplog):
    """Lines that were no round were skipped: a log of garbage was "rounds up to 0 of the run's 3 (cut short)"."""
    cell = sorted((grid / "cells").iterdir())[0]
    metrics = cell / "metrics.jsonl"
    metrics.write_text(edit(metrics.read_text()))
    code, err = run_cli(["report", grid], capsys)
    line = one_error_line(err)
    assert code == 1 and f"{metrics} is damaged ({said}" in line, line
    assert f"delete the folder {cell} and run the same `fedcache train` or `fedcache grid` command again" in line
    assert "cut short" not in caplog.text
    assert not (grid / "report.html").exists() and not list(grid.glob(".report-figures*"))


def optional_files(grid: Path) -> dict[str, Path]:
    """Whole paper.json, contribution.json and selection.json beside the grid, as their commands write them."""
    (grid / PAPER).write_text(json.dumps({"title": "FedPCL", "text": "t", "rows": [{"what": "a", "paper": 1.0, "fedcache": 2.0}]}))
    save_contribution(Contribution(np.eye(2), ["c0", "c1"], ["b0", "b1"]), grid / CONTRIBUTION)
    (grid / SELECTION).write_text(json.dumps({"rule": "r", "selected": ["lr"], "choices": []}))
    return {PAPER: grid / PAPER, CONTRIBUTION: grid / CONTRIBUTION, SELECTION: grid / SELECTION}


@pytest.mark.parametrize("name, command", [(PAPER, "fedcache reproduce"), (CONTRIBUTION, "fedcache demo"),
                                           (SELECTION, "fedcache grid")])
def test_a_torn_optional_file_is_a_warning_and_a_missing_part_of_the_report(grid, name, command, capsys, caplog):
    files = optional_files(grid)
    tear(files[name])
    code, err = run_cli(["report", grid], capsys)
    assert code == 0 and f"{files[name]} is damaged (not JSON:" in caplog.text
    assert "the report goes on without it" in caplog.text
    md = (grid / "report.md").read_text()
    assert f"**Not shown: {files[name]} is damaged" in md and f"`{command}" in md
    assert md.count("Not shown:") == 1  # the other two are whole: shown


def test_an_optional_file_of_another_shape_is_missing_not_a_traceback(grid, capsys, caplog):
    (grid / PAPER).write_text(json.dumps({"title": "FedPCL", "rows": [{"paper": 1.0}]}))  # no "what"
    code, err = run_cli(["report", grid], capsys)
    assert code == 0 and "paper.json is damaged (not as fedcache writes it, or not read as written: KeyError: 'what'" in caplog.text
