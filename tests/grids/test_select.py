"""Tune on validation, then test once (fedcache/grids/select.py): per method and other setting, the values with the
best mean validation score over seeds; a candidate that diverges loses instead of stopping the grid."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedcache.errors import ConfigError
from fedcache.grids.select import choose
from tests.conftest import BACKBONE

SWEEP = {"partition": "iid", "clients": 2, "subsample": 0.5, "rounds": 2, "lr": ["0.001", "0.1"]}


def rows():
    out = []
    # fedavg: lr 0.01 wins at alpha 0.1 on the mean over seeds although lr 0.001 has the best single seed.
    for alpha, lr, scores in (("0.1", "0.001", (70, 40)), ("0.1", "0.01", (60, 58)),
                              ("1", "0.001", (80, 80)), ("1", "0.01", (70, 75))):
        out += [{"method": "fedavg", "alpha": alpha, "lr": lr, "seed": s, "mean_accuracy": v} for s, v in enumerate(scores)]
    # fedprox ties: the value listed first wins.
    out += [{"method": "fedprox", "alpha": "0.1", "lr": lr, "seed": 0, "mean_accuracy": 50} for lr in ("0.01", "0.001")]
    return out


def test_each_method_and_setting_gets_its_own_choice():
    got = {(c.method, c.fixed): (c.chosen, c.score) for c in choose(rows(), ["alpha", "lr"], ["lr"])}
    assert got[("fedavg", (("alpha", "0.1"),))] == ((("lr", "0.01"),), 59.0)
    assert got[("fedavg", (("alpha", "1"),))] == ((("lr", "0.001"),), 80.0)
    assert got[("fedprox", (("alpha", "0.1"),))][0] == (("lr", "0.01"),)


def test_selecting_a_setting_that_is_not_an_axis_says_how():
    with pytest.raises(ConfigError, match=r"--select mu: not an axis.*--set lr=1e-3,1e-2 --select lr"):
        choose(rows(), ["alpha", "lr"], ["mu"])


def test_a_value_that_diverged_on_any_seed_is_not_chosen():
    """lr 0.1 scores 90 on the seed that did not diverge: averaging only that seed would choose it."""
    rows = [{"method": "fedavg", "lr": "0.001", "seed": s, "mean_accuracy": v} for s, v in enumerate((60, 62))]
    rows += [{"method": "fedavg", "lr": "0.1", "seed": 0, "mean_accuracy": 90},
             {"method": "fedavg", "lr": "0.1", "seed": 1, "mean_accuracy": None, "diverged": True}]
    (choice,) = choose(rows, ["lr"], ["lr"])
    assert choice.chosen == (("lr", "0.001"),) and choice.score == 61.0
    assert dict(choice.candidates) == {(("lr", "0.001"),): 61.0, (("lr", "0.1"),): None}
    every = [{**r, "mean_accuracy": None, "diverged": True} for r in rows if r["lr"] == "0.1"]
    with pytest.raises(ConfigError, match=r"every value of lr diverged on validation for fedavg; add smaller values"):
        choose(every, ["lr"], ["lr"])


def test_select_tunes_on_validation_and_tests_only_the_choice(toy_store, tmp_path):
    from fedcache.api import grid

    out = tmp_path / "cmp"
    progress = []
    table = grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg", "fedprox"], sweep=SWEEP,
                 seeds=[0, 1], out=out, select=["lr"], on_cell=lambda done, total, row: progress.append((done, total, row)))
    assert [p[:2] for p in progress] == [(i, 8 + 4) for i in range(1, 13)]  # one count over both stages, never back
    # Each row's run_dir is relative to out, as the returned table's (it was the stage's own folder's: cells/...).
    told = [p[2]["run_dir"] for p in progress]
    assert all((out / d / "summary.json").exists() for d in told) and told[-4:] == [r["run_dir"] for r in table]
    # Both stages read one copy of the features, the grid's own.
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("features")) == ["features"]
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
    # Every result names its run relative to --out, in the table returned and in results.csv
    from fedcache.grids import load_results

    for results in (table, load_results(out)):
        assert all((out / r["run_dir"] / "summary.json").exists() for r in results)
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

    with pytest.raises(ConfigError, match=r"^select=\['mu'\]: mu is not an axis.*e.g. sweep=\{'lr': \['1e-3', '1e-2'\]\} and select=\['lr'\]$"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedprox"], sweep=SWEEP, out=tmp_path / "g",
             select=["mu"])


@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_candidate_that_diverges_loses_instead_of_stopping_the_grid(toy_store, tmp_path, engine, caplog):
    """SGD with lr 1e30 turns the weights NaN in round 2: while tuning, that is the candidate's result (recorded,
    never chosen), not an error that stops the grid and leaves a run that --resume replays into NaN. The batched
    engine stacks each seed's two cells: a batch diverges, and its cells then run as their own runs."""
    from fedcache.api import grid
    from fedcache.reports import write_report

    out, seen = tmp_path / "div", []
    kw = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0, 1], out=out,
              select=["lr"], sweep={**SWEEP, "preset": "fst-cbdg", "lr": ["0.001", "1e30"]}, engine=engine)
    with caplog.at_level("WARNING", logger="fedcache.grids"):
        table = grid(**kw, on_cell=lambda done, total, row: seen.append(row))
    assert sorted(r["lr"] for r in seen if r.get("diverged")) == [1e30, 1e30]
    said = re.search(r"2 candidate cells diverged on validation, never chosen \((\S+) is the first; its error is in "
                     r"(\S+)\); (\S+) marks them", caplog.text)
    assert said and said[2].endswith("diverged.json") and Path(said[2]).exists(), caplog.text
    assert said[3] == str(out / "validation" / "table.md")
    assert len(table) == 2 and {str(r["lr"]) for r in table} == {"0.001"}
    (choice,) = json.loads((out / "selection.json").read_text())["choices"]
    assert choice["chosen"] == {"lr": "0.001"} and "diverged on any seed is not chosen" in (out / "table.md").read_text()
    assert {c["lr"]: c.get("diverged", False) for c in choice["candidates"]} == {"0.001": False, "1e30": True}
    assert "NaN" in next((out / "validation" / "cells").glob("*1e30*seed=0/diverged.json")).read_text()
    again = grid(**kw, on_cell=lambda done, total, row: pytest.fail("a finished or diverged cell ran again"))
    assert again.column("mean_accuracy") == table.column("mean_accuracy")
    assert "lr=1e30: diverged" in write_report(out).html.read_text()
    assert "(every seed diverged in round 2)" in (out / "report.md").read_text()
    assert "| fedavg | " in (out / "test" / "table.md").read_text() and ", lr=0.001 |" in (out / "test" / "table.md").read_text()


def test_a_chosen_value_that_diverges_on_the_test_split_says_so_in_one_line(toy_store, tmp_path, monkeypatch):
    """The test stage's divergence named no stage nor choice; the choices are written before it runs."""
    from fedcache.api import grid
    from fedcache.federate.divergence import DivergedError
    from fedcache.grids import cell

    real = cell.train

    def train(cfg, **kw):
        if not cfg.schedule.validation:
            raise DivergedError("round 2, client 0: 'weight' became NaN/inf")
        return real(cfg, **kw)

    monkeypatch.setattr(cell, "train", train)
    out = tmp_path / "g"
    with pytest.raises(DivergedError, match=r"^select: a value chosen on validation \(.*selection.json\) diverged on the "
                                            r"test split: round 2, client 0.*Choose among smaller values, in a new directory \(out='DIR'\)$"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0], out=out,
             select=["lr"], sweep=SWEEP, engine="processes")
    assert json.loads((out / "selection.json").read_text())["choices"]


def test_a_misspelt_setting_is_named_as_one_even_where_out_holds_another_grid(toy_store, tmp_path):
    """Re-run into its --out with a typo (a hand-written grid file's few_shot as fewshot, say), a --select grid
    said '... holds a different grid (it differs in ...)': the typo is the first thing wrong."""
    from fedcache.api import grid

    out = tmp_path / "g"
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], sweep=SWEEP, out=out, select=["lr"])
    with pytest.raises(ConfigError, match=r"sweep\['lrr'\]: unknown key \(did you mean 'lr'\?\)"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"],
             sweep={**SWEEP, "lrr": ["0.1", "0.2"]}, out=out, select=["lr"])


def test_a_grid_refused_before_its_first_cell_leaves_no_copy_of_the_features(toy_store, tmp_path):
    """--select without spare rows is refused once the features are read; the copy it made for its cells went with
    it (a store's worth of float32 in a directory nothing would read), and the corrected command runs there."""
    from fedcache.api import grid

    out = tmp_path / "g"
    no_spare = {k: v for k, v in SWEEP.items() if k != "subsample"}
    with pytest.raises(ConfigError, match="needs training rows that no client trains on"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], sweep=no_spare, out=out,
             select=["lr"])
    assert not list(out.rglob("features"))
    grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], sweep=SWEEP, out=out, select=["lr"])
    assert (out / "features" / "meta.json").exists()


@pytest.mark.parametrize("changed", [False, True])
def test_an_older_select_grid_s_copy_per_stage_becomes_the_grid_s_own(toy_store, tmp_path, changed):
    """An older fedcache wrote the features once per stage. Resumed, the validation copy becomes the grid's (checked
    against the store as ever: a re-extraction since is refused, not mixed in) and the test copy goes."""
    import shutil

    from fedcache.api import grid

    out = tmp_path / "g"
    run = lambda: grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], sweep=SWEEP,  # noqa: E731
                       out=out, select=["lr"])
    first = run().to_records()
    for stage in ("validation", "test"):  # the older layout
        shutil.copytree(out / "features", out / stage / "features")
    shutil.rmtree(out / "features")
    if changed:
        meta = json.loads((out / "validation" / "features" / "meta.json").read_text())
        meta["train"]["entry_ids"][0] = "0" * 16  # as if that entry had been re-extracted since
        (out / "validation" / "features" / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(ConfigError, match="changed since the grid"):
            run()
        return
    again = run().to_records()
    assert [r["mean_accuracy"] for r in again] == [r["mean_accuracy"] for r in first]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("features")) == ["features"]


def test_a_chosen_option_is_named_in_the_tables_as_its_flag(toy_store, tmp_path):
    """`--head linear,mlp` is the axis head.name (its cell folders keep that name: resuming finds them by it); the
    tables, read by people who typed --head, say head in the caption and beside each result."""
    from fedcache.cli import main

    out = tmp_path / "heads"
    assert main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
                 "--clients", "2", "--subsample", "0.5", "--rounds", "2", "--head", "linear,mlp", "--select", "head.name",
                 "--seeds", "0", "--out", str(out)]) == 0
    assert all("__head.name=" in p.name for p in (out / "validation" / "cells").iterdir())
    tables = {stage: (out / stage / "table.md").read_text() for stage in (".", "test")}
    assert "; head chosen per method and setting on validation" in tables["."]
    assert "; head as chosen on validation" in tables["test"]
    assert all(", head=" in md and "head.name" not in md for md in tables.values())
