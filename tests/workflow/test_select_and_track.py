"""Tune on validation then test once (--select), checkpoints kept as asked, --overwrite, trackers per run."""
from __future__ import annotations

import json

import pytest

from fedcache.cli import main
from fedcache.errors import ConfigError

from .conftest import BACKBONE

SWEEP = {"partition": "iid", "clients": 2, "subsample": 0.5, "rounds": 2, "lr": ["0.001", "0.1"]}


def test_select_tunes_on_validation_and_tests_only_the_choice(toy_store, tmp_path):
    from fedcache.api import grid

    out = tmp_path / "cmp"
    progress = []
    table = grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=SWEEP,
                 seeds=[0, 1], out=out, select=["lr"], on_cell=lambda done, total, row: progress.append((done, total)))
    assert progress == [(i, 8 + 4) for i in range(1, 13)]  # one count over validation then test, never going back
    validation = sorted(p.name for p in (out / "validation" / "cells").iterdir())
    assert len(validation) == 2 * 2 * 2 and all("validation=true" in n for n in validation)
    tested = sorted(p.name for p in (out / "test" / "cells").iterdir())
    assert len(tested) == 2 * 2 and not any("validation" in n for n in tested)
    selection = json.loads((out / "selection.json").read_text())
    for choice in selection["choices"]:
        scores = {c["lr"]: c["validation_score"] for c in choice["candidates"]}
        assert choice["chosen"]["lr"] == max(scores, key=scores.get)  # the best mean validation score
        runs = [r for r in table.to_records() if r["method"] == choice["method"]]
        assert {str(r["lr"]) for r in runs} == {choice["chosen"]["lr"]} and len(runs) == 2
    # Validation runs scored spare training rows; the test runs the test split.
    cfg = json.loads(next((out / "validation" / "cells").iterdir()).joinpath("config.json").read_text())
    assert cfg["spec"]["schedule"]["validation"] is True and "spare training rows" in cfg["partition"]["scored_on"]
    md = (out / "table.md").read_text()
    assert "chosen per method and setting on validation" in md and ", lr=" in md
    # The report draws the one partition both stages used once (bubbles and sizes), titled by both panels.
    from fedcache.reports import write_report

    html = write_report(out).html.read_text()
    assert html.count("<h2>Partition (split=test; split=validation): ") == 2 and "<h2>Partition (split=test): " not in html
    # The directory now holds a --select grid: the same grid without --select is refused, naming the difference.
    with pytest.raises(ConfigError, match=r"differs in select \(lr there, unset here\)"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=SWEEP,
             seeds=[0, 1], out=out)


def test_select_of_something_not_swept_says_how(toy_store, tmp_path):
    from fedcache.api import grid

    with pytest.raises(ConfigError, match="--select mu: not an axis"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], sweep=SWEEP, out=tmp_path / "g",
             select=["mu"])


def train_args(toy_store, out, *extra):
    return ["train", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
            "--clients", "2", "--rounds", "3", "--out", str(out), *extra]


def test_keep_checkpoints_and_overwrite(toy_store, tmp_path, capsys):
    assert main(train_args(toy_store, tmp_path / "all", "--keep-checkpoints", "all")) == 0
    # The result is one line in a log (not a terminal), not wrapped at the console's width.
    result = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedavg: ")]
    assert len(result) == 1 and len(result[0]) > 160 and result[0].endswith(str(tmp_path / "all")), result
    assert sorted(p.name for p in (tmp_path / "all").glob("checkpoint*.pt")) == [
        "checkpoint-round0001.pt", "checkpoint-round0002.pt", "checkpoint-round0003.pt", "checkpoint.pt"]
    assert main(train_args(toy_store, tmp_path / "none", "--keep-checkpoints", "none")) == 0
    assert not list((tmp_path / "none").glob("checkpoint*.pt")) and (tmp_path / "none" / "summary.json").exists()
    # A directory holding a run is refused, and replaced with --overwrite (other files are left alone).
    (tmp_path / "none" / "notes.txt").write_text("mine")
    assert main(train_args(toy_store, tmp_path / "none")) == 2 and "--overwrite" in capsys.readouterr().err
    assert main(train_args(toy_store, tmp_path / "none", "--overwrite", "--rounds", "2")) == 0
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["rounds"] == 2
    assert (tmp_path / "none" / "notes.txt").read_text() == "mine"
    assert main(train_args(toy_store, tmp_path / "none", "--overwrite", "--resume")) == 2


def test_out_that_is_a_file_is_refused_before_work(toy_store, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(train_args(toy_store, tmp_path / "f")) == 2
    assert "is a file; give a directory" in capsys.readouterr().err


def test_a_grid_sends_each_cell_to_tensorboard(toy_store, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "g"
    assert main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
                 "--clients", "2", "--rounds", "2", "--seeds", "0,1", "--track", "tensorboard", "--keep-checkpoints", "none",
                 "-o", str(out)]) == 0
    assert not list((out / "cells").glob("*/checkpoint*.pt"))  # every cell, not only a train run, keeps none
    runs = sorted(p.name for p in (out / "tensorboard").iterdir())
    assert runs == sorted(p.name for p in (out / "cells").iterdir()) and len(runs) == 2
    events = EventAccumulator(str(out / "tensorboard" / runs[0]))
    events.Reload()
    assert [e.step for e in events.Scalars("accuracy")] == [1, 2]


def test_an_unknown_tracker_is_refused_before_work(toy_store, tmp_path, capsys):
    assert main(train_args(toy_store, tmp_path / "r", "--track", "tensorbord")) == 2
    err = capsys.readouterr().err
    assert "unknown tracker" in err and "tensorboard" in err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_candidate_that_diverges_loses_instead_of_stopping_the_grid(toy_store, tmp_path, engine):
    """SGD with lr 1e30 turns the weights NaN in round 1: while tuning, that is the candidate's result (recorded,
    never chosen), not an error that stops the grid and leaves a run that --resume replays into NaN. The batched
    engine stacks each seed's two cells: a batch diverges, and its cells then run as their own runs."""
    from fedcache.api import grid
    from fedcache.reports import write_report

    out, seen = tmp_path / "div", []
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0, 1], out=out,
              select=["lr"], sweep={**SWEEP, "preset": "fst-cbdg", "lr": ["0.001", "1e30"]}, engine=engine)
    table = grid(**kw, on_cell=lambda done, total, row: seen.append(row))
    assert sorted(r["lr"] for r in seen if r.get("diverged")) == ["1e30", "1e30"]
    assert len(table) == 2 and {str(r["lr"]) for r in table} == {"0.001"}
    (choice,) = json.loads((out / "selection.json").read_text())["choices"]
    assert choice["chosen"] == {"lr": "0.001"} and "diverged on any seed is not chosen" in (out / "table.md").read_text()
    assert {c["lr"]: c.get("diverged", False) for c in choice["candidates"]} == {"0.001": False, "1e30": True}
    assert "NaN" in next((out / "validation" / "cells").glob("*1e30*seed=0/diverged.json")).read_text()
    again = grid(**kw, on_cell=lambda done, total, row: pytest.fail("a finished or diverged cell ran again"))
    assert again.column("mean_accuracy") == table.column("mean_accuracy")
    assert "lr=1e30: diverged" in write_report(out).html.read_text()


def test_a_directory_holds_runs_once_a_cell_finished_checkpointed_or_diverged(tmp_path):
    """What keeps another grid out of a --out: a refused start's cell.json alone does not."""
    from fedcache.grids.run import _holds_runs

    cell = tmp_path / "validation" / "cells" / "fedavg__lr=1e30__seed=0"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text("{}")
    assert not _holds_runs(tmp_path)
    for name in ("diverged.json", "checkpoint.pt", "summary.json"):
        (cell / name).write_text("{}")
        assert _holds_runs(tmp_path), name
        (cell / name).unlink()
