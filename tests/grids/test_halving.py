"""Successive halving for --select (fedcache/grids/halving.py): the rungs, the cuts, and pruned grids on both
engines: the same choices when resumed, a diverged candidate dropped, continued candidates equal to their full
runs bit for bit."""
from __future__ import annotations

import collections
import importlib
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

import fedcache

from fedcache.errors import ConfigError
from fedcache.federate.rundir import load_checkpoint
from fedcache.grids.cell import read_diverged
from fedcache.grids.halving import Group
from fedcache.grids.rungs import rungs
from fedcache.grids.spec import Cell
from tests.conftest import BACKBONE
from tests.grids.test_batches import stop_after_round


@pytest.mark.parametrize("rounds, n, eta, first, expected", [
    (50, 6, 3, None, [6, 17]),  # two cuts (6 -> 2 -> 1), the last at rounds / eta
    (50, 18, 3, None, [2, 6, 17]),
    (50, 4, 2, None, [12, 25]),
    (50, 6, 3, 10, [10, 30]),  # from --min-rounds on
    (50, 6, 3, 20, [20]),  # the next (60) is past the rounds: the two left run to round 50
    (9, 6, 3, None, [1, 3]),
    (2, 6, 3, None, [1]),
    (1, 6, 3, None, []),  # too few rounds to cut
    (50, 1, 3, None, []),  # nothing to cut
])
def test_rungs(rounds, n, eta, first, expected):
    assert rungs(rounds, n, eta, first) == expected


def group(scores: dict[str, list], rounds=9, at=(1, 3), eta=3):
    """A group whose candidate ``lr=v`` has ``scores[v][k]`` (a score per seed, or None: diverged) at the k-th stop."""
    cands = {(("lr", v),): [Cell("fedavg", s, (("lr", v),)) for s in range(2)] for v in scores}
    return Group("fedavg", (), cands, rounds, list(at), eta)


def rows_at(g: Group, scores: dict[str, list], k: int) -> dict:
    out = {}
    for value in g.alive:
        for c in g.candidates[value]:
            s = scores[value[0][1]][k]
            out[c] = {"diverged": True} if s is None else {"mean_accuracy": s + c.seed}
    return out


def test_each_cut_keeps_the_best_third_by_mean_over_seeds_then_one_is_chosen():
    # Ordered by construction: at round 1 d > c > b = e > a > f; at round 3 b overtakes d.
    scores = {"a": [10], "b": [30, 70], "c": [40, 50], "d": [50, 60], "e": [30], "f": [5]}
    g = group(scores)
    g.cut(rows_at(g, scores, 0), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["c", "d"] and g.cuts[0]["round"] == 1 and not g.done
    assert {v[0][1]: at for v, at in g.stopped_at.items()} == dict.fromkeys("abef", 1)
    assert g.cuts[0]["scores"][(("lr", "d"),)] == 50.5  # the mean over the two seeds
    g.cut(rows_at(g, scores, 1), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["d"] and g.done and g.stopped_at[(("lr", "d"),)] == 3


def test_a_cut_keeps_a_third_rounded_up():
    scores = {v: [i] for i, v in enumerate("abcd")}
    g = group(scores)
    g.cut(rows_at(g, scores, 0), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["c", "d"]  # ceil(4 / 3) = 2


def test_ties_go_to_the_value_listed_first_and_a_diverged_candidate_is_cut():
    scores = {"a": [20], "b": [None], "c": [20], "d": [20]}  # b would be kept by its place; it diverged
    g = group(scores, eta=2)
    g.cut(rows_at(g, scores, 0), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["a", "c"] and g.cuts[0]["scores"][(("lr", "b"),)] is None


def test_candidates_left_after_the_last_rung_run_the_full_rounds():
    scores = {v: [i, i] for i, v in enumerate("abcdef")}
    g = group(scores, at=(5,))
    g.cut(rows_at(g, scores, 0), "mean_accuracy")
    assert g.stop is None and len(g.alive) == 2 and not g.done
    g.cut(rows_at(g, scores, 1), "mean_accuracy")
    assert g.done and set(g.stopped_at.values()) == {5, 9}
    assert g.planned() == (6 + 2) * 2  # cell runs: six candidates, then two, each on two seeds


SWEEP = {"partition": "iid", "clients": 2, "subsample": 0.5, "rounds": 9, "preset": "fst-cbdg"}
LRS = ["0.0001", "0.001", "0.01", "0.1", "0.003", "0.03"]


def kw(toy_store, out, engine="processes", **more):
    return dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods=["fedavg"], seeds=[0, 1], out=out,
                select=["lr"], sweep={**SWEEP, "lr": LRS}, engine=engine, **more)


@pytest.fixture
def ordered(monkeypatch):
    """Validation scores ordered by construction, the same on every engine: lr's rank in LRS at round 1, the reverse
    from round 3 on; a seed adds a point. The runs train for real (checkpoints, pauses, continuations)."""
    cells = importlib.import_module("fedcache.grids.cell")

    original = cells.row

    def row(c, summary, out):
        got = original(c, summary, out)
        if summary and dict(c.setting).get("validation"):
            rank = LRS.index(dict(c.setting)["lr"])
            got["mean_accuracy"] = (rank if summary["rounds"] < 3 else 10 - rank) + c.seed
        return got

    monkeypatch.setattr(cells, "row", row)


def selection(out):
    return json.loads((out / "selection.json").read_text())


@pytest.mark.parametrize("engine", [pytest.param("processes", marks=pytest.mark.slow), "batched"])
def test_a_group_ordered_by_construction_is_cut_exactly_as_expected(toy_store, tmp_path, ordered, engine):
    from fedcache.api import grid

    plans = []
    table = grid(**kw(toy_store, tmp_path / "g", engine), prune="halving", on_plan=plans.append)
    (choice,) = selection(tmp_path / "g")["choices"]
    # 6 candidates, reduction factor 3: cut at rounds 1 and 3 of 9. Round 1 keeps the two best (the last two
    # listed); at round 3 the order is reversed, so the first of those two is chosen.
    assert [c["round"] for c in choice["cuts"]] == [1, 3]
    assert [k["lr"] for k in choice["cuts"][0]["kept"]] == ["0.003", "0.03"]
    assert [k["lr"] for k in choice["cuts"][1]["kept"]] == ["0.003"] and choice["chosen"] == {"lr": "0.003"}
    assert {c["lr"]: c["stopped_at"] for c in choice["candidates"]} == {**dict.fromkeys(LRS[:4], 1), "0.003": 3, "0.03": 3}
    assert {str(r["lr"]) for r in table} == {"0.003"} and len(table) == 2  # tested once, on both seeds
    cells_dir = tmp_path / "g" / "validation" / "cells"
    assert not any((d / "summary.json").exists() for d in cells_dir.iterdir())  # none trained to round 9
    assert sorted(json.loads((d / "rungs.json").read_text()).keys() == {"1", "3"} for d in cells_dir.iterdir()).count(True) == 4
    assert any("cut at rounds 1, 3 of 9" in p for p in plans) and any("round 1: 2 of 6 candidates kept" in p for p in plans)
    md = (tmp_path / "g" / "table.md").read_text()
    assert "successive halving (reduction factor 3): 20 of the full grid's 108 validation rounds (19%) trained" in md


def test_a_resumed_pruned_grid_makes_the_same_choices_as_an_uninterrupted_one(toy_store, tmp_path, ordered):
    """Interrupted in the middle of its second rung, then run again on the other engine: each cell continues
    from its checkpoint or its recorded rung, to the same cuts, choice and test results."""
    from fedcache.api import grid

    whole = grid(**kw(toy_store, tmp_path / "whole"), prune="halving")
    seen = []

    def stop_in_rung_two(done, total, row):
        seen.append(row)
        if len(seen) == 6 * 2 + 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, tmp_path / "part"), prune="halving", on_cell=stop_in_rung_two)
    again = []
    resumed = grid(**kw(toy_store, tmp_path / "part", "batched"), prune="halving",
                   on_cell=lambda done, total, row: again.append((done, total)))
    assert selection(tmp_path / "part") == selection(tmp_path / "whole")
    assert resumed.column("mean_accuracy") == whole.column("mean_accuracy")
    assert [d for d, _ in again] == sorted(d for d, _ in again) and again[-1][0] == again[-1][1]  # never goes back
    for d in (tmp_path / "whole" / "validation" / "cells").iterdir():
        mine = tmp_path / "part" / "validation" / "cells" / d.name
        assert (mine / "metrics.jsonl").read_text() == (d / "metrics.jsonl").read_text()


@pytest.mark.parametrize("trained, paused", [(9, 1), pytest.param(6 * 2 + 2 * 2, 3, marks=pytest.mark.slow)])
def test_a_pruned_grid_interrupted_before_a_cut_shows_its_paused_candidates_unfinished(toy_store, tmp_path, ordered,
                                                                                        trained, paused, monkeypatch):
    """Ctrl-C before the cut at round 1 (9 of its 12 cells there), or before the one at round 3 (both kept candidates
    there): the report showed the candidates paused there as "stopped at round r", as if cut. No cut was made: they
    are unfinished, as a full grid's interrupted cells are; the grid resumed makes the cuts an uninterrupted one made."""
    from fedcache.api import grid
    from fedcache.reports import write_report

    def interrupt(done, total, row):
        if done == trained:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, tmp_path / "part"), prune="halving", on_cell=interrupt)
    if paused == 1:  # nothing has a result yet: where its runs wait is said (test_..._says_where_its_runs_wait)
        with pytest.raises(ConfigError, match="^no results under .* paused before its first cut"):
            write_report(tmp_path / "part")
    else:  # the four cut at round 1 have theirs
        md = write_report(tmp_path / "part").markdown.read_text()
        assert "Unfinished grid: 8 of its 14 cells have a result" in md
        assert "(stopped at round 1)" in md and f"stopped at round {paused}" not in md
        assert _cell_json_reads(tmp_path / "part", monkeypatch) == {1}  # a paused run's was read for its group, then to judge it
    grid(**kw(toy_store, tmp_path / "part"), prune="halving")
    grid(**kw(toy_store, tmp_path / "whole"), prune="halving")
    assert selection(tmp_path / "part") == selection(tmp_path / "whole")
    assert "Unfinished" not in write_report(tmp_path / "part").markdown.read_text()


@pytest.mark.parametrize("engine, waiting", [("processes", 3), ("batched", 4)])  # kept cells still at round 1
def test_a_kept_candidate_not_yet_trained_past_its_rung_is_unfinished_not_cut(toy_store, tmp_path, ordered, engine,
                                                                             waiting):
    """Ctrl-C as the first cell after the cut at round 1 finished: the other kept candidate's two seeds still waited at
    round 1, and the report showed it "stopped at round 1", as if cut there (the cut was made; only the seeds of a
    candidate with one gone past it were called unfinished). Stopped as the cut was said, before any kept one trained
    on, the grid and its report said it was paused before its first cut. A kept one's rung says it trains on."""
    from fedcache.api import grid
    from fedcache.grids.rungs import paused_before_first_cut
    from fedcache.reports import write_report

    def on_cell(done, total, row):
        if done == 6 * 2 + 1:
            raise KeyboardInterrupt

    def on_plan(text):
        if text.startswith("halving: round 1"):
            raise KeyboardInterrupt

    stop = dict(on_cell=on_cell) if engine == "processes" else dict(on_plan=on_plan)
    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, tmp_path / "g", engine), prune="halving", **stop)
    kept = [c for c in (tmp_path / "g" / "validation" / "cells").iterdir() if re.search(r"lr=0\.00?3__", c.name)]
    at_rung = [c for c in kept if "round\": 2" not in (c / "metrics.jsonl").read_text()]
    assert len(at_rung) == waiting and all(json.loads((c / "rungs.json").read_text()).keys() == {"1"} for c in at_rung)
    assert paused_before_first_cut(tmp_path / "g") is None
    md = write_report(tmp_path / "g").markdown.read_text()
    assert "Unfinished grid: 8 of its 14 cells have a result" in md  # the four cut at round 1, on two seeds each
    assert md.count("(stopped at round 1)") == 4, md


@pytest.mark.parametrize("engine, at, waits", [
    ("processes", None, "(round 1 of 9): 9 of its 12 validation runs are there, 3 not started"),
    ("batched", None, "(round 1 of 9): its 12 validation runs are all there"),  # its two batches of 6 reached it
    ("processes", 2, "(round 3 of 9): none of its 12 validation runs is there yet, 1 at round 2, 11 not started"),
    ("batched", 2, "(round 3 of 9): none of its 12 validation runs is there yet, 6 at round 2, 6 not started"),
])
def test_a_pruned_grid_stopped_before_its_first_cut_says_where_its_runs_wait(toy_store, tmp_path, monkeypatch, engine,
                                                                             at, waits):
    """Ctrl-C before the first cut (at round 1, or with --min-rounds 3 part-way, at round 2): no run has a result,
    and the report said only "no finished runs", as if nothing were kept. The grid as it stops, the report (of the
    grid or its validation stage) and the results say where its runs wait, and that running it again continues: to a
    Python caller, the same call (they said the `fedcache grid` command, which it never typed)."""
    from fedcache.api import grid, report
    from fedcache.federate import driver, rundir
    from fedcache.grids import load_results

    plans, out = [], tmp_path / "g"

    def interrupt(done, total, row):
        if done == 9:
            raise KeyboardInterrupt

    if at:
        stop_after_round(monkeypatch, driver if engine == "batched" else rundir, at=at)
    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, out, engine), prune="halving", min_rounds=3 if at else None, on_plan=plans.append,
             on_cell=None if at else interrupt)
    said = f"paused before its first cut {waits}"
    assert plans[-1] == f"{out}: the grid is {said}; the same fedcache.grid(...) call run again continues it from there"
    for root in (out, out / "validation"):
        with pytest.raises(ConfigError, match=re.escape(f"no results under {root} yet: its --prune halving grid is "
                                                        f"{said}, and no run has a result before that cut; run the same "
                                                        "fedcache.grid(...) call again to continue it from there")):
            report(root)
    with pytest.raises(ConfigError, match=re.escape(f"has no results.csv yet: its --prune halving grid is {said}; run "
                                                    "the same fedcache.grid(...) call again to continue it")):
        load_results(out)


@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_pruned_grid_stopped_after_its_first_cut_is_not_said_to_wait_before_it(toy_store, tmp_path, ordered,
                                                                                monkeypatch, engine):
    """Stopped at round 2, past the cut at round 1: its kept candidates' rungs.json still holds round 1 alone, and the
    grid as it stopped, its report and load_results said it was "paused before its first cut ... all there". Their
    metrics say round 2. One kept there that then diverged (its metrics stop at the rung) is past that cut too."""
    from fedcache.api import grid
    from fedcache.federate import driver, rundir
    from fedcache.grids import load_results
    from fedcache.grids.rungs import paused_before_first_cut

    plans, out = [], tmp_path / "g"
    logged = lambda cell: [json.loads(x) for x in (cell / "metrics.jsonl").read_text().splitlines()]
    stop_after_round(monkeypatch, driver if engine == "batched" else rundir, at=2)
    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, out, engine), prune="halving", on_plan=plans.append)
    assert paused_before_first_cut(out) is None and not any("paused before" in p for p in plans), plans
    with pytest.raises(ConfigError, match=re.escape(f"no results.csv; run fedcache.grid(..., out={str(out)!r}) first")):
        load_results(out)
    past = [c for c in (out / "validation" / "cells").iterdir() if logged(c)[-1]["round"] == 2]
    assert past and all(json.loads((c / "rungs.json").read_text()).keys() == {"1"} for c in past)
    for cell in past:  # as a run that diverged in round 2 leaves it: round 2 never logged
        (cell / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in logged(cell) if x["round"] <= 1))
        (cell / "diverged.json").write_text(json.dumps({"error": "NaN", "round": 2}) + "\n")
    assert paused_before_first_cut(out) is None


def test_a_group_too_short_to_cut_leaves_the_others_paused_before_their_first_cut(toy_store, tmp_path):
    """A rounds axis of 1,9: the group of 1 round has no rung and runs in full, uncut. It said nothing of the group of
    9 rounds, stopped before its cut at round 1, yet made the whole grid read as past its first cut."""
    from fedcache.api import grid
    from fedcache.grids.rungs import paused_before_first_cut

    out = tmp_path / "g"

    def interrupt(done, total, row):
        if done == 18:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grid(**{**kw(toy_store, out), "sweep": {**SWEEP, "rounds": ["1", "9"], "lr": LRS}}, prune="halving",
             on_cell=interrupt)
    assert paused_before_first_cut(out) == ("paused before its first cut (round 1 of 9): 6 of its 24 validation runs "
                                            "are there, 12 finished (too few rounds to cut), 6 not started")


def test_an_interrupted_pruned_grid_says_where_its_runs_wait_before_the_interrupted_line(toy_store, tmp_path,
                                                                                       monkeypatch, capsys):
    """`fedcache grid` stopped before its first cut said only "finished work is kept" of a grid none of whose runs had
    finished: it says where they wait, then the interrupted line."""
    from fedcache.cli import main
    from fedcache.federate import rundir

    stop_after_round(monkeypatch, rundir)  # the first cell, as it reaches the cut at round 1
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition",
                 "iid", "--clients", "2", "--subsample", "0.5", "--rounds", "9", "--seeds", "0,1", "--set",
                 f"lr={','.join(LRS)}", "--select", "lr", "--prune", "halving", "--engine", "processes",
                 "-o", str(tmp_path / "g")])
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert code == 130, err
    assert (f"{tmp_path / 'g'}: the grid is paused before its first cut (round 1 of 9): 1 of its 12 validation runs is "
            "there, 11 not started; the same `fedcache grid` command run again continues it from there interrupted: "
            "finished work is kept; re-run the same command to resume") in err, err
    assert main(["report", str(tmp_path / "g")]) == 2  # a directory of no report is a bad argument
    err = " ".join(capsys.readouterr().err.split())
    assert "no run has a result before that cut; run the same `fedcache grid` command again to continue it" in err, err


def _cell_json_reads(root, monkeypatch) -> set[int]:
    """How many times a report's search for runs under ``root`` reads each cell.json it reads."""
    from fedcache.reports import runs

    reads, real = collections.Counter(), runs._run_json

    def counted(path, name, problem=None):
        reads[path] += name == runs.CELL
        return real(path, name, problem)

    with monkeypatch.context() as patched:
        patched.setattr(runs, "_run_json", counted)
        runs.find_runs(root)
    return set(reads.values()) - {0}


@pytest.mark.parametrize("engine", [pytest.param("processes", marks=pytest.mark.slow), "batched"])
def test_candidates_continued_from_a_rung_equal_their_runs_in_the_full_grid(toy_store, tmp_path, monkeypatch, engine):
    """--min-rounds 5: one cut at round 5, the two best continue to round 9 from their checkpoints (never trained
    again from round 0). Their validation runs are those of the full --select grid, bit for bit, and so the choice
    is the same."""
    from fedcache.api import grid
    from fedcache.federate import driver

    grid(**kw(toy_store, tmp_path / "full", engine))
    trained, original = [], driver._round
    monkeypatch.setattr(driver, "_round", lambda runs, *a: trained.append(len(runs)) or original(runs, *a))
    grid(**kw(toy_store, tmp_path / "cut", engine), prune="halving", min_rounds=5)
    # Federation-rounds: 6 candidates x 2 seeds to round 5, 2 x 2 from 5 to 9; then the choice on the test split.
    assert sum(trained) == 6 * 2 * 5 + 2 * 2 * 4 + 2 * 9
    (choice,) = selection(tmp_path / "cut")["choices"]
    kept = [k["lr"] for k in choice["cuts"][0]["kept"]]
    assert len(kept) == 2 and choice["chosen"] == selection(tmp_path / "full")["choices"][0]["chosen"]
    shown = (tmp_path / "cut" / "validation" / "table.md").read_text()  # scores of round 5 beside those of round 9
    assert shown.count(", at round 5") == 4 and ", at round 9" not in shown, shown
    for d in (tmp_path / "cut" / "validation" / "cells").iterdir():
        full = tmp_path / "full" / "validation" / "cells" / d.name
        if any(f"lr={lr}__" in d.name for lr in kept):
            assert (d / "metrics.jsonl").read_text() == (full / "metrics.jsonl").read_text()
            mine, theirs = ({k: v for k, v in json.loads((p / "summary.json").read_text()).items() if k != "seconds"}
                            for p in (d, full))
            assert mine == theirs
            ours, others = (load_checkpoint(p / "checkpoint.pt")["runs"][0] for p in (d, full))
            for part in ("server", "clients"):  # the weights too: metrics.jsonl rounds its losses
                assert ours[part].keys() == others[part].keys()
                assert all(torch.equal(ours[part][n], others[part][n]) for n in ours[part]), (d.name, part)
        else:  # cut at round 5: its lines are the full run's first five
            assert (d / "metrics.jsonl").read_text().splitlines() == (full / "metrics.jsonl").read_text().splitlines()[:5]
    assert (tmp_path / "cut" / "test" / "results.csv").read_text().split("seconds")[0] == \
        (tmp_path / "full" / "test" / "results.csv").read_text().split("seconds")[0]


@pytest.mark.parametrize("engine, prune", [("processes", "halving"), ("batched", "halving"), ("batched", "none")])
def test_a_select_grid_makes_its_partitions_once_for_every_rung_and_its_test_stage(toy_store, tmp_path, ordered, caplog,
                                                                                   monkeypatch, engine, prune):
    """Each rung (cuts at rounds 1 and 3) and the test stage found every partition in the store again, built the
    method again and said "partitions ready" again, which read as work redone: the partitions once per command, on
    either engine, the method once per split (it checks the data it is built on: tpfl's visual=pixel, the test
    split's images, which a test stage built no method on to check until its first cell trained)."""
    from fedcache.api import grid
    from fedcache.grids import run

    loads, real = [], run.load_data
    monkeypatch.setattr(run, "load_data", lambda cfg, *a, **k: loads.append(cfg.schedule.validation) or real(cfg, *a, **k))
    caplog.set_level(logging.INFO, logger="fedcache.grids.run")
    grid(**kw(toy_store, tmp_path / "g", engine), prune=prune)
    said = [r.getMessage() for r in caplog.records if "partitions ready" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(": 2 partitions, 1 method checked"), said
    # The partitions of seeds 0 and 1 and the method on validation, then the method on the test split.
    assert loads == [True] * 3 + [False]


@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_re_run_past_its_first_rung_says_only_the_methods_it_checks_now(toy_store, tmp_path, ordered, caplog, engine):
    """Stopped once every candidate reached round 1: the re-run reads them back there (its partitions made, no
    method to build), and the next rung's cells train, their method built only then: said as what is new."""
    from fedcache.api import grid

    def interrupt(done, total, row):
        if done == 6 * 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, tmp_path / "g", engine), prune="halving", on_cell=interrupt)
    caplog.set_level(logging.INFO, logger="fedcache.grids.run")
    grid(**kw(toy_store, tmp_path / "g", engine), prune="halving")
    said = [r.getMessage() for r in caplog.records if " checked" in r.getMessage()]
    assert [re.sub(r"\d+\.\d s", "t s", text) for text in said] == [
        "partitions ready in t s: 2 partitions, 0 methods checked", "1 method checked in t s",
        "1 method checked on the test split in t s"], said  # built on the data it checks (test_..._partitions_once)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_parallel_pruned_grid_trains_its_rungs_and_test_stage_in_the_same_workers(toy_store, tmp_path, caplog, engine):
    """--jobs 2: the rungs (cuts at rounds 1 and 3) and the test stage train in the same two worker processes,
    started once (a start imports torch in each: seconds a rung), told by the process of each record the workers
    send; to the choices and results of one process. (The batched engine runs the test stage's one batch here.)"""
    import logging
    import os

    from fedcache.api import grid

    grid(**kw(toy_store, tmp_path / "one", engine), prune="halving")
    caplog.set_level(logging.INFO, logger="fedcache")  # the workers send their records from INFO on
    grid(**kw(toy_store, tmp_path / "par", engine, jobs=2), prune="halving")
    workers = {r.process for r in caplog.records if r.process != os.getpid()}
    # One worker may take every task of a toy grid (the other idle, or started late); a start per rung made more.
    assert 1 <= len(workers) <= 2, workers
    if engine == "processes":  # the test stage's runs, the only ones to finish (one candidate left trains no more)
        tested = {r.process for r in caplog.records if r.name == "fedcache.training" and "finished" in r.getMessage()}
        assert tested and tested <= workers
    assert (tmp_path / "par" / "selection.json").read_bytes() == (tmp_path / "one" / "selection.json").read_bytes()
    for stage in ("validation", "test"):
        for d in (tmp_path / "one" / stage / "cells").iterdir():
            mine = tmp_path / "par" / stage / "cells" / d.name
            assert (mine / "metrics.jsonl").read_text() == (d / "metrics.jsonl").read_text()


def test_kept_candidates_that_diverge_later_are_replaced_by_the_next_best_of_their_cut():
    """d and c are kept at round 1 and both diverge on the way to round 3, which keeps one: a full grid would rank
    them last, so the best candidate cut at round 1 (e) trains on to round 3 in their place and is chosen there (it
    said every value diverged and chose nothing). With one of them left, the cut is the one halving always made."""
    scores = {"a": [10], "b": [30, 40], "c": [40, None], "d": [50, None], "e": [35, 20], "f": [5]}
    g = group(scores)
    g.cut(rows_at(g, scores, 0), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["c", "d"]
    g.cut(rows_at(g, scores, 1), "mean_accuracy")  # c and d diverged: nobody cut yet
    assert [v[0][1] for v in g.alive] == ["e"] and g.stop == 3 and not g.done and len(g.cuts) == 1
    assert [[v[0][1] for v in r[k]] for r in g.revivals for k in ("diverged", "revived")] == [["c", "d"], ["e"]]
    g.cut(rows_at(g, scores, 1), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["e"] and g.done
    one_left = {**scores, "c": [40, 45]}
    g = group(one_left)
    for k in (0, 1):
        g.cut(rows_at(g, one_left, k), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["c"] and g.done and not g.revivals


def test_when_every_candidate_diverged_none_is_revived():
    scores = {"a": [20, None], "b": [None], "c": [30, None]}
    g = group(scores, eta=2, at=(1,))
    g.cut(rows_at(g, scores, 0), "mean_accuracy")
    assert [v[0][1] for v in g.alive] == ["a", "c"]
    g.cut(rows_at(g, scores, 1), "mean_accuracy")  # the full rounds: a and c diverged, b had already
    assert g.done and not g.revivals


@pytest.mark.parametrize("engine", [pytest.param("processes", marks=pytest.mark.slow), "batched"])
def test_a_candidate_that_diverges_at_a_rung_is_dropped_not_chosen(toy_store, tmp_path, monkeypatch, engine):
    """lr=1e30 survives round 1 (scored best there by construction) and diverges before round 3 (for real):
    it is cut at round 3, never chosen, and the grid goes on."""
    from fedcache.api import grid

    cells = importlib.import_module("fedcache.grids.cell")
    original = cells.row

    def row(c, summary, out):
        got = original(c, summary, out)
        if summary and dict(c.setting).get("validation") and summary["rounds"] == 1:
            got["mean_accuracy"] = 100.0 if dict(c.setting)["lr"] == "1e30" else got["mean_accuracy"]
        return got

    monkeypatch.setattr(cells, "row", row)
    grid(**{**kw(toy_store, tmp_path / "d", engine), "sweep": {**SWEEP, "lr": LRS[:5] + ["1e30"]}}, prune="halving")
    (choice,) = selection(tmp_path / "d")["choices"]
    assert "1e30" in [k["lr"] for k in choice["cuts"][0]["kept"]]
    bad = next(c for c in choice["candidates"] if c["lr"] == "1e30")
    assert bad.get("diverged") and bad["stopped_at"] == choice["cuts"][1]["round"]
    assert choice["chosen"]["lr"] != "1e30"
    from fedcache.reports import write_report

    md = write_report(tmp_path / "d").markdown.read_text()
    assert "lr=1e30: diverged by round" in md and "then diverged" in md
    # The rounds that ran: 1e30's seeds stopped in the round they diverged in, before the cut at round 3.
    val = tmp_path / "d" / "validation"
    lost = {r["run_dir"]: int(re.match(r"round (\d+),", read_diverged(val / r["run_dir"])).group(1))
            for r in fedcache.Table.from_csv(val / "results.csv").to_records() if r["diverged"]}
    assert len(lost) == 2 and all(at < 3 for at in lost.values()), lost
    trained = 4 * 2 * 1 + 2 * 3 + sum(lost.values())  # four cut at round 1, the other kept to round 3 (two seeds each)
    assert f"{trained} of the full grid's 108 validation rounds" in (tmp_path / "d" / "table.md").read_text()
    # Run again: the cell paused at round 1 that diverged later is read back as it was at round 1, so the same
    # cuts are made and nothing trains (it was read as diverged at round 1: other cuts, a cut candidate retrained).
    before = selection(tmp_path / "d")
    grid(**{**kw(toy_store, tmp_path / "d", engine), "sweep": {**SWEEP, "lr": LRS[:5] + ["1e30"]}}, prune="halving",
         on_cell=lambda done, total, row: pytest.fail(f"{row} trained again"))
    assert selection(tmp_path / "d") == before


def test_a_revived_candidate_s_runs_are_counted_and_the_test_stage_counts_on_from_them(toy_store, tmp_path,
                                                                                         monkeypatch):
    """Both candidates kept at round 1 diverge before the next rung: the next best is revived, runs the plan did not
    count. The test stage counted on from the plan's count, so the progress went back (and a log's never said 100%)."""
    from fedcache.api import grid

    cells = importlib.import_module("fedcache.grids.cell")
    original = cells.row

    def row(c, summary, out):
        got = original(c, summary, out)
        if summary and dict(c.setting).get("validation") and summary["rounds"] == 1 and "e" in dict(c.setting)["lr"][1:]:
            got["mean_accuracy"] = 100.0  # 1e30 and 1e29 kept at round 1 by construction; they diverge after it
        return got

    monkeypatch.setattr(cells, "row", row)
    counts = []
    grid(**{**kw(toy_store, tmp_path / "r"), "sweep": {**SWEEP, "lr": LRS[:4] + ["1e29", "1e30"]}}, prune="halving",
         on_cell=lambda done, total, row: counts.append((done, total)))
    (choice,) = selection(tmp_path / "r")["choices"]
    assert [r["diverged"] for r in choice["revived"]] == [[{"lr": "1e29"}, {"lr": "1e30"}]], choice
    assert [done for done, _ in counts] == list(range(1, len(counts) + 1)) and counts[-1][0] == counts[-1][1], counts


def test_a_kept_candidate_beside_revived_ones_is_counted_once(toy_store, tmp_path, monkeypatch):
    """Reduction factor 2: round 1 keeps three (0.1, 1e29, 1e30 by construction), the two huge ones diverge before
    round 2, and the next best of round 1 is revived beside 0.1, which waits at round 2. Its cells were read back
    there and counted again: the progress count skipped their number."""
    from fedcache.api import grid

    cells = importlib.import_module("fedcache.grids.cell")
    original = cells.row
    kept = {"0.1", "1e29", "1e30"}

    def row(c, summary, out):
        got = original(c, summary, out)
        if summary and dict(c.setting).get("validation") and summary["rounds"] == 1 and dict(c.setting)["lr"] in kept:
            got["mean_accuracy"] = 1000.0
        return got

    monkeypatch.setattr(cells, "row", row)
    counts = []
    grid(**{**kw(toy_store, tmp_path / "r"), "sweep": {**SWEEP, "lr": LRS[:4] + ["1e29", "1e30"]}}, prune="halving",
         reduction_factor=2, on_cell=lambda done, total, row: counts.append((done, total)))
    (choice,) = selection(tmp_path / "r")["choices"]
    assert [r["diverged"] for r in choice["revived"]] == [[{"lr": "1e29"}, {"lr": "1e30"}]], choice
    assert [done for done, _ in counts] == list(range(1, len(counts) + 1)) and counts[-1][0] == counts[-1][1], counts
    # Six candidates to round 1, three to round 2, one revived to round 2, one chosen on test; two seeds each.
    assert len(counts) == (6 + 3 + 1 + 1) * 2


def test_a_grid_stopped_after_its_kept_candidates_diverged_shows_the_cut_ones_cut(toy_store, tmp_path, monkeypatch):
    """Round 1 keeps 1e29 and 1e30 (by construction), both diverge in round 2, and the grid is stopped before the
    next best, revived, trains past round 1. No run's metrics go past round 1 (a round that diverged is never
    logged), so the report took the cut made at round 1 for one never made: the cut candidates were unfinished."""
    from fedcache.api import grid
    from fedcache.reports import write_report

    cells = importlib.import_module("fedcache.grids.cell")
    original = cells.row

    def row(c, summary, out):
        got = original(c, summary, out)
        if summary and dict(c.setting).get("validation") and summary["rounds"] == 1 and dict(c.setting)["lr"] in HUGE:
            got["mean_accuracy"] = 1000.0
        return got

    def interrupt(done, total, row):
        if done == 6 * 2 + 2 * 2:  # every cell to round 1, then the kept ones' diverged
            raise KeyboardInterrupt

    HUGE = ("1e29", "1e30")
    monkeypatch.setattr(cells, "row", row)
    with pytest.raises(KeyboardInterrupt):
        grid(**{**kw(toy_store, tmp_path / "r"), "sweep": {**SWEEP, "lr": LRS[:4] + list(HUGE)}}, prune="halving",
             on_cell=interrupt)
    md = write_report(tmp_path / "r").markdown.read_text()
    assert md.count("(stopped at round 1)") == 4, md  # the four candidates cut there


def test_pruned_grid_report_draws_candidates_to_where_they_stopped(toy_store, tmp_path, ordered):
    from fedcache.api import grid
    from fedcache.reports import write_report

    grid(**kw(toy_store, tmp_path / "r"), prune="halving")
    paths = write_report(tmp_path / "r")
    md = paths.markdown.read_text()
    assert "(stopped at round 1)" in md and "(stopped at round 3)" in md
    assert "Dotted vertical lines: the rounds at which --prune halving cut candidates" in md
    assert "a cut of successive halving" in paths.html.read_text()  # the legend entry of the rung lines
    assert "lr=0.0001: 0.50 at round 1" in md  # a cut candidate's score says its round


# Over 20 s on a 2-core machine: in make test-slow (CI runs both), so that make test stays under 10 minutes.
@pytest.mark.slow
def test_table_md_never_marks_a_cut_candidate_best(toy_store, tmp_path, ordered):
    """A paused cell's summary says the round it reached: with rounds not an axis, a cut candidate's row read as a
    whole run (stopped_at == rounds), and validation/table.md bolded it where the report marks none."""
    from fedcache.api import grid

    sweep = {k: v for k, v in kw(toy_store, tmp_path)["sweep"].items() if k != "rounds"}  # rounds: train's default
    grid(**{**kw(toy_store, tmp_path / "g"), "sweep": sweep}, prune="halving")
    rows = fedcache.Table.from_csv(tmp_path / "g" / "validation" / "results.csv").to_records()
    # The group stops at one candidate (round 17 of 50): no candidate ran the full rounds, so none is whole.
    assert all(int(r["stopped_at"]) < 50 and int(r["rounds"]) == 50 for r in rows)
    table = (tmp_path / "g" / "validation" / "table.md").read_text()
    assert "10.50 (0.71)" in table and "**" not in table, table


@pytest.mark.parametrize("given, message", [
    (dict(prune="halving", select=None), r"^prune='halving' cuts the candidates of select; .* and select=\['lr'\]$"),
    (dict(prune="halving", track=["jsonl"]), "^prune='halving' with track: .*, or leave out track$"),
    (dict(prune="halving", reduction_factor=1), r"^reduction_factor=1: must be >= 2$"),
    (dict(prune="halving", min_rounds=0), r"^min_rounds=0: must be >= 1$"),
    (dict(prune="sometimes"), "must be one of none, halving"),
    # At or past the last round no cut is made: halving asked for, the full grid trained (the plan said "run in full").
    (dict(prune="halving", min_rounds=9), r"^min_rounds=9: the first cut would come at or after the last round "
                                          r"\(rounds 9\), so no candidate would be cut; give a min_rounds below 9, or "
                                          r"leave out prune$"),
    (dict(prune="halving", min_rounds=100), r"^min_rounds=100: .* \(rounds 9\), .* below 9, or leave out prune$"),
    (dict(prune="halving", min_rounds=9, sweep={**SWEEP, "rounds": [3, 9], "lr": LRS}),
     r"^min_rounds=9: .* \(rounds 9, the longest\), .* below 9, or leave out prune$"),
])
def test_bad_pruning_options_are_clear_errors(toy_store, tmp_path, given, message):
    from fedcache.api import grid

    with pytest.raises(ConfigError, match=message):
        grid(**{**kw(toy_store, tmp_path / "e"), **given})
    assert not (tmp_path / "e").exists()  # refused before anything was written


def test_a_min_rounds_past_only_some_groups_is_taken(tmp_path):
    """A rounds axis of 3,9 with --min-rounds 5: the groups of 3 rounds run in full, those of 9 are cut at 5."""
    from fedcache.grids.spec import GridSpec

    spec = GridSpec(store="s.zarr", dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path / "g", select=["lr"],
                    sweep={"rounds": ["3", "9"], "lr": ["0.1", "0.01"]}, prune="halving", min_rounds=5)
    assert spec.min_rounds == 5


def test_the_progress_says_a_group_chose_only_after_a_cut_that_left_it_one():
    """"(a group left with one has chosen it)" ended every step's line: after 6 -> 2, where no group had chosen, and
    after the full rounds. The plan said "run in full (1 rounds)"."""
    from fedcache.grids.halving import plan_text, step_text

    scores = {v: [i, i] for i, v in enumerate("abcdef")}
    g = group(scores)
    g.cut(rows_at(g, scores, 0), "mean_accuracy")
    assert step_text([(g, 1, 0)]) == "halving: round 1: 2 of 6 candidates kept"
    g.cut(rows_at(g, scores, 1), "mean_accuracy")
    assert step_text([(g, 3, 0)]) == "halving: round 3: 1 of 2 candidates kept (a group left with one has chosen it)"
    whole = group(scores, rounds=1, at=())
    whole.cut(rows_at(whole, scores, 0), "mean_accuracy")
    assert step_text([(whole, None, 0)]) == "halving: 1 group trained to the full rounds"
    assert "no cut before the last round: run in full (1 round);" in plan_text([whole], 3)


def test_prune_from_the_command_line_and_from_toml(toy_store, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fedcache import progress
    from fedcache.cli import app

    toml = tmp_path / "grid.toml"
    toml.write_text(f'store = "{toy_store}"\ndataset = "test-toy"\nbackbones = ["{BACKBONE}"]\nmethods = ["fedavg"]\n'
                    f'out = "{tmp_path / "t"}"\nselect = ["lr"]\nprune = "halving"\nreduction_factor = 2\n'
                    '[set]\npartition = "iid"\nclients = 2\nsubsample = 0.5\nrounds = 4\nlr = ["0.001", "0.01", "0.1"]\n')
    got = CliRunner().invoke(app, ["grid", "--config", str(toml)])
    assert got.exit_code == 0, got.output
    assert "successive halving (reduction factor 2)" in got.output and "candidates kept" in got.output
    # Each cell counted once: a candidate at every rung it reached was a cell more each time (the progress's count).
    cells = sum(1 for stage in ("validation", "test") for _ in (tmp_path / "t" / stage / "cells").iterdir())
    assert f"trained {cells} cells in" in " ".join(got.output.split()) and cells == 3 + 1
    # The steps before the first cell said (SLOW_STEP 0), then the plans and "grid started", as a plain grid says them
    # (test_run): halving's plan came first, and "grid started" with it, before the partitions were made.
    monkeypatch.setattr(progress, "SLOW_STEP", 0.0)
    cli = CliRunner().invoke(app, ["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg",
                                   "--partition", "iid", "--clients", "2", "--subsample", "0.5", "--rounds", "4",
                                   "--set", "lr=0.001,0.01,0.1", "--select", "lr", "--prune", "halving",
                                   "--reduction-factor", "2", "-o", str(tmp_path / "c")])
    assert cli.exit_code == 0, cli.output
    said = cli.output.splitlines()
    assert [line.split(" ")[0] for line in said[:4]] == ["shared", "partitions", "successive", "batched"], said
    assert said[4] == "grid started", said
    assert sum(line.startswith("partitions ready") for line in said) == 1, said  # not again at each rung, nor to test
    assert selection(tmp_path / "c")["choices"] == selection(tmp_path / "t")["choices"]
    shutil.rmtree(tmp_path / "c")


@pytest.mark.parametrize("lrs", [LRS[:2], ["0.0001", "1e30"]])
def test_a_halving_grid_that_cut_nothing_says_so_in_its_caption(toy_store, tmp_path, lrs):
    """One round leaves no rung to cut at: table.md said "candidates cut by successive halving ... (100%)". A
    candidate that diverged (1e30) is in no cut either. (--min-rounds at the rounds, the other way to no rung, is
    refused: test_bad_pruning_options_are_clear_errors.)"""
    from fedcache.api import grid

    grid(**{**kw(toy_store, tmp_path / "one"), "sweep": {**SWEEP, "rounds": 1, "lr": lrs}, "seeds": [0]},
         prune="halving")
    caption = (tmp_path / "one" / "validation" / "table.md").read_text()
    assert "successive halving (reduction factor 3) cut no candidate: every group trained its candidates to the full " \
           "rounds" in caption and "candidates cut by" not in caption


@pytest.mark.parametrize("engine", [pytest.param("processes", marks=pytest.mark.slow), "batched"])
def test_a_rung_s_damaged_metrics_line_is_trained_again_on_either_engine(toy_store, tmp_path, monkeypatch, ordered,
                                                                         caplog, engine):
    """Killed right after the checkpoint of round 1, the first rung, whose metrics line is then damaged: a batched
    grid continued the batch (only the full rounds' line dropped it), so the cells lacked their rung's line for good
    and the report called the grid unfinished. Either engine trains them again, said: the grid's choices and the
    cells' lines are an uninterrupted grid's."""
    from fedcache.api import grid
    from fedcache.federate import driver, rundir
    from fedcache.reports import write_report

    grid(**kw(toy_store, tmp_path / "whole", engine), prune="halving")
    # A batch's checkpoint, or a cell's own; patched in this process, where the cells train (--jobs 1).
    writer = driver if engine == "batched" else rundir
    save = stop_after_round(monkeypatch, writer)
    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, tmp_path / "g", engine, jobs=1), prune="halving")
    monkeypatch.setattr(writer, "save_checkpoint", save)
    cells = tmp_path / "g" / "validation" / "cells"
    damaged = [c for c in sorted(cells.iterdir()) if (c / "metrics.jsonl").exists()]
    assert damaged and all(not (c / "rungs.json").exists() for c in damaged)
    for cell in damaged:
        (line,) = (cell / "metrics.jsonl").read_text().splitlines()
        assert json.loads(line)["round"] == 1
        (cell / "metrics.jsonl").write_text(line[:20] + "\n")
    caplog.set_level(logging.WARNING, logger="fedcache")
    grid(**kw(toy_store, tmp_path / "g", engine), prune="halving")
    said = ("whose checkpoint is of the round its cells stop at (1), whose metrics line in "
            f"{damaged[0] / 'metrics.jsonl'} is damaged" if engine == "batched" else
            f"{damaged[0]}: its checkpoint is of the round it stops at (1), whose metrics line in "
            f"{damaged[0] / 'metrics.jsonl'} is damaged; it trains again from round 0")
    assert said in caplog.text and "lacked readable metrics lines" not in caplog.text
    assert selection(tmp_path / "g") == selection(tmp_path / "whole")
    for cell in damaged:
        whole = tmp_path / "whole" / "validation" / "cells" / cell.name
        assert (cell / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
    assert "Unfinished" not in write_report(tmp_path / "g").markdown.read_text()


@pytest.mark.parametrize("engine", ["processes", "batched"])
def test_a_rung_that_logs_no_line_continues_past_a_damaged_earlier_line(toy_store, tmp_path, monkeypatch, ordered,
                                                                      caplog, engine):
    """--eval-every 2, rungs at rounds 1 and 3 of 9: a cell paused at round 3, which logs no line, whose round-2
    line is damaged continues (a gap in its history), on either engine: it was emptied and trained again from
    round 0, said as if round 3's line were damaged."""
    from fedcache.api import grid
    from fedcache.federate import driver, rundir

    writer = driver if engine == "batched" else rundir
    save = stop_after_round(monkeypatch, writer, at=3)
    args = kw(toy_store, tmp_path / "g", engine, jobs=1)
    args["sweep"] = {**args["sweep"], "eval_every": 2}
    with pytest.raises(KeyboardInterrupt):
        grid(**args, prune="halving")
    monkeypatch.setattr(writer, "save_checkpoint", save)
    hit = []
    for metrics in sorted((tmp_path / "g" / "validation" / "cells").glob("*/metrics.jsonl")):
        lines = metrics.read_text().splitlines()
        if lines and json.loads(lines[-1])["round"] == 2:
            metrics.write_text("\n".join([*lines[:-1], lines[-1][:20]]) + "\n")
            hit.append(metrics)
    assert hit
    caplog.set_level(logging.WARNING, logger="fedcache")
    grid(**args, prune="halving")
    assert "trains again from round 0" not in caplog.text
    assert "whose checkpoint is of the round its cells stop at" not in caplog.text


def test_a_cell_killed_while_it_is_emptied_to_train_again_starts_afresh(toy_store, tmp_path, monkeypatch, ordered):
    """Killed while a cell whose rung line was damaged is emptied (grids/cell.start_again), right after its
    metrics.jsonl went: the next grid continued the cell from its checkpoint, its rung line lost for good; the
    checkpoint goes first, so the cell trains afresh and its lines are an uninterrupted grid's."""
    from fedcache.api import grid
    from fedcache.federate import rundir
    from fedcache.grids import cell as cell_module

    grid(**kw(toy_store, tmp_path / "whole", "processes"), prune="halving")
    save = stop_after_round(monkeypatch, rundir)
    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, tmp_path / "g", "processes", jobs=1), prune="halving")
    monkeypatch.setattr(rundir, "save_checkpoint", save)
    damaged = sorted(p.parent for p in (tmp_path / "g" / "validation" / "cells").glob("*/metrics.jsonl"))
    for cell in damaged:
        (line,) = (cell / "metrics.jsonl").read_text().splitlines()
        (cell / "metrics.jsonl").write_text(line[:20] + "\n")
    real = cell_module.discard

    def killed(paths):  # one file gone (the metrics line, where the listing puts it first), then the kill
        first = sorted(paths, key=lambda p: Path(p).name != "metrics.jsonl")[:1]
        real(first)
        raise KeyboardInterrupt

    monkeypatch.setattr(cell_module, "discard", killed)
    with pytest.raises(KeyboardInterrupt):
        grid(**kw(toy_store, tmp_path / "g", "processes", jobs=1), prune="halving")
    monkeypatch.setattr(cell_module, "discard", real)
    grid(**kw(toy_store, tmp_path / "g", "processes"), prune="halving")
    whole = tmp_path / "whole" / "validation" / "cells" / damaged[0].name
    assert (damaged[0] / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
