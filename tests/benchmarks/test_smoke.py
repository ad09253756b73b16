"""Every maintained benchmark runs at tiny sizes, so none can rot unnoticed (they measure nothing here)."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def bench(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_rounds_floor_and_batched(tmp_path):
    out = tmp_path / "rounds.json"
    bench("rounds").main(["--tiny", "--trials", "1", "--only", "floor,batched", "--out", str(out)])
    res = json.loads(out.read_text())
    assert set(res["floor"]) == {"fedavg", "fedproto", "fedpcl"}
    assert all(v["run_over_floor"]["median_ratio"] > 0 for v in res["floor"].values())
    assert res["batched"]["same_accuracy"] is True and "when" in res["meta"]
    res["meta"], res["meta_of_case"] = {"when": "second"}, {"floor": {"when": "first"}}  # floor kept from a run before
    out.write_text(json.dumps(res))
    bench("rounds").main(["--tiny", "--trials", "1", "--only", "batched", "--out", str(out)])
    assert json.loads(out.read_text())["meta_of_case"] == {"floor": {"when": "first"}}


@pytest.mark.slow
def test_rounds_cached_vs_backbone_in_the_loop(tmp_path):
    out = tmp_path / "rounds.json"
    bench("rounds").main(["--tiny", "--trials", "1", "--only", "cached", "--out", str(out)])
    assert json.loads(out.read_text())["cached"]["in_loop_over_cached"]["median_ratio"] > 1


@pytest.mark.slow
def test_extract_throughput(tmp_path):
    out = tmp_path / "extract.json"
    bench("extract_throughput").main(["--tiny", "--out", str(out)])
    res = json.loads(out.read_text())
    (row,) = res["results"]
    assert row["images"] > 0 and row["ratio"] > 0 and {"when", "torch", "load_average_at_end"} <= set(res["meta"])


# Over 20 s on a 2-core machine: in make test-slow (CI runs both), so that make test stays under 10 minutes.
@pytest.mark.slow
def test_grid_speed_runs_both_engines(tmp_path):
    out = tmp_path / "grid_speed.json"
    bench("grid_speed").main(["--tiny", "--jobs", "1", "--store", str(tmp_path / "store.zarr"), "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert res["processes"]["cells"] == res["batched"]["cells"] == 8
    assert res["same_table_md"] is True and res["batched"]["plan"][0].startswith("batched engine: 8 cells")
    assert res["cells_differing"] == {"cells": 8, "differing": 0, "max_points": 0.0}
    assert res["floor"]["cells_per_minute"] > 0 and len(res["floor_over_processes_per_trial"]) == 2
    steps = res["stack_steps"]  # 2 partitions' steps per epoch; one stack steps as long as the longest
    assert len(steps["per_partition"]) == 2 and steps["one_stack"] == 2 * max(steps["per_partition"]) >= steps["by_partition"]
    text = bench("grid_speed").render(out)
    assert "cells per minute" in text and "arithmetic floor" in text and "mini-batch steps" in text


@pytest.mark.slow
def test_grid_speed_worked_grid_runs_both_engines(tmp_path):
    out = tmp_path / "worked.json"
    gs = bench("grid_speed")
    gs.main(["--worked", "--tiny", "--jobs", "1", "--trials", "1", "--store", str(tmp_path / "store.zarr"), "--out", str(out)])
    doc = json.loads(out.read_text())
    res = doc["result"]
    assert res["same_table_md"] is True and len(res["batched_over_processes_per_trial"]) == 1
    assert res["batched"]["trials"][0]["plan"][0].startswith("batched engine:")  # one plan per stage (validation, test)
    assert "identical tables" in gs._worked_paragraph(doc)


def test_partition_codec(tmp_path):
    out = tmp_path / "p.json"
    res = bench("partition_codec").main(["--tiny", "--trials", "2", "--out", str(out)])
    assert set(res["lz4_over_zstd"]) == {"write_s", "read_s", "bytes"} and json.loads(out.read_text())["clients"] == 100


def test_store_verify(tmp_path):
    out = tmp_path / "verify.json"
    bench("store_verify").main(["--tiny", "--trials", "2", "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert res["entries"] == 2 and res["verified_over_unverified"]["median_ratio"] > 0
    assert len(res["verified_s"]) == len(res["unverified_s"]) == 2


@pytest.mark.slow
def test_scale_measures_every_ratio(tmp_path):
    out = tmp_path / "scale.json"
    bench("scale").main(["--tiny", "--trials", "1", "--work", str(tmp_path), "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert res["read"]["store_read_over_page_cache_copy"]["median_ratio"] > 0
    assert res["format_1_read"]["format_1_read_over_page_cache_copy"]["median_ratio"] > 0
    assert res["import"]["GB_per_s"] > 0 and all(v["GB_per_s_stored"] > 0 for v in res["writer"].values())
    for run in ("first_run", "repeat_run"):
        assert res["train"][run]["setup_over_rounds"] > 0 and res["train"][run]["peak_rss_over_features"] > 0
        assert res["train"][run]["peak_anon_above_start_over_features"] > 0
    assert {"10", "100", "1000"} <= set(res["clients"]) and res["clients"]["1000"]["local_test_rows"] > 0
    assert res["grid"]["jobs_1"]["peak_pss_bytes"] > 0 and res["grid"]["jobs_2"]["peak_pss_bytes"] > 0
    assert len(res["grid"]["jobs_2"]["processes_at_peak"]) >= len(res["grid"]["jobs_1"]["processes_at_peak"]) >= 1
    # RSS counters are batched per task on some kernels: a few faults on a tiny table may not show yet
    assert res["mapping"]["rows_touched"] == 60 and res["mapping"]["rss_growth_over_features"] >= 0
    assert res["mapping"]["same_rows"] and res["mapping"]["gather_rss_growth_over_features"] >= 0
    text = bench("scale").render(out)
    assert "FeatureStore.read" in text and "| 1,000 | 60 |" in text and "random rows" in text
    assert "store.mapping.gather" in text and "processes at the peak" in text


def test_scale_from_a_store_of_real_features(tmp_path):
    """Entries of the kept format-1 store (tests/store/data) written again in both formats: sizes and reads."""
    out = tmp_path / "from_store.json"
    store = Path(__file__).resolve().parents[1] / "store" / "data" / "store-format-1"
    bench("scale").main(["--from-store", str(store), "-d", "imported", "-b", "enc", "--trials", "1",
                         "--work", str(tmp_path), "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert res["rows"] == 40 and res["format_1_read_over_format_2_read"]["median_ratio"] > 0
    assert set(res["entries_bytes_on_disk"]) == {"format_1", "format_2"} and 0 < res["zstd_level_0_kept"] < 2
    assert store.joinpath("zarr.json").read_text().count('"fedcache_store": 1') == 1  # the original is left as it was


def test_halving_against_the_full_select_grid(tmp_path):
    out = tmp_path / "halving.json"
    keep = tmp_path / "kept"
    bench("halving").main(["--tiny", "--trials", "1", "--jobs", "1", "--store", str(tmp_path / "store.zarr"), "--out", str(out),
                           "--keep", str(keep)])
    res = json.loads(out.read_text())["grids"]["tiny"]
    assert res["replay_matches_pruned_grid"] is True and res["choices"]["of"] == 1
    assert res["full_over_halving"] > 0 and "validation rounds" in res["validation_rounds"]
    assert all(c > 0 for c in res["cpu_seconds"]["full"] + res["cpu_seconds"]["halving"])
    # The kept grids give the same choices again, timed from their files (a run stopped early is not lost).
    bench("halving").main(["--from-dirs", str(keep), "--out", str(tmp_path / "again.json")])
    again = json.loads((tmp_path / "again.json").read_text())["grids"]["tiny"]
    assert again["choices"] == res["choices"] and again["trials"] == 1 and again["full_over_halving"] > 0
    played = bench("halving").replay(keep / "tiny" / "full-0")
    assert played["of"] == 1 and played["same"] == (res["choices"]["same"] == 1) and 0 < played["validation_rounds_share"] < 1
    alone = played["full_grid_without_one_seed"]  # seeds 0 and 1: each grid of one seed beside the full grid's choice
    assert "full_choice_behind_until" in played["groups"][0]
    assert alone["of"] == 1 and len(next(iter(alone["groups"].values()))["each_left_out"]) == 2
    # Other rules at every reduction factor and first cut: the plain one's frontier includes what halving chose.
    bench("halving").main(["--replay", str(keep / "tiny" / "full-0"), "--search", "--out", str(tmp_path / "search.json")])
    rules = json.loads((tmp_path / "search.json").read_text())["search"]["rules"]
    assert set(rules) == set(bench("halving").RULES) and all(r["frontier"] for r in rules.values())
    assert max(p["same"] for p in rules["halving"]["frontier"]) >= played["same"]
    table = bench("halving").render_search(json.loads((tmp_path / "search.json").read_text()))
    assert table.count("\n") == 1 + len(rules) and "| halving | " in table
    assert rules["halving"]["default_cuts"]["same"] == played["same"]
    # A full grid stopped before its choices: its finished groups, chosen as --select chooses; none unfinished.
    import shutil

    stopped = shutil.copytree(keep / "tiny" / "full-0", tmp_path / "stopped")
    (stopped / "selection.json").unlink()
    assert bench("halving").chosen(stopped) == bench("halving").chosen(keep / "tiny" / "full-0")
    (next((stopped / "validation" / "cells").iterdir()) / "summary.json").unlink()
    assert bench("halving").chosen(stopped) == {}


@pytest.mark.slow
def test_grid_speed_stacking_comparison_runs(tmp_path):
    """On a GPU it compares stacks across partitions with stacks by partition; here (CPU) it checks the script."""
    out = tmp_path / "stacking.json"
    bench("grid_speed").main(["--tiny", "--stacking", "--trials", "1", "--store", str(tmp_path / "store.zarr"), "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert res["cells_differing"]["differing"] == 0 and len(res["by_draws_over_across_per_trial"]) == 1


@pytest.mark.slow
def test_grid_speed_heads_comparison_runs(tmp_path):
    """Cells stacked vs alone per head: here on test-toy's tiny features, the script and its table."""
    out = tmp_path / "heads.json"
    bench("grid_speed").main(["--heads", "--tiny", "--trials", "1", "--store", str(tmp_path / "store.zarr"), "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert set(res) == set(bench("grid_speed").HEAD_METHODS)
    for r in res.values():
        assert r["head_parameters"] > 0
        for case in bench("grid_speed").HEAD_CASES:
            assert r[case]["cells_differing"] == {"cells": 6, "differing": 0, "max_points": 0.0}
            assert len(r[case]["alone_over_stacked_per_trial"]) == 1
            plans = r[case]["plans"]
            assert plans["stacked"][0].startswith("batched engine: 6 cells in 1 batch")
            assert "6 cells as their own runs: a head of" in plans["alone"][0]
    table = bench("grid_speed").render_heads(out)
    assert table.count("\n") == 1 + len(res) and "| fedproto | " in table


def test_grid_speed_heads_synthetic_features(tmp_path):
    """--data synthetic:DxC imports random features of that shape once, then finds them."""
    from fedcache.store.feature_store import FeatureStore

    store = tmp_path / "store.zarr"
    data = bench("grid_speed").synthetic(store, "8x3")
    assert data == ("synthetic", "random-8d-3c") and bench("grid_speed").synthetic(store, "8x3") == data
    table = FeatureStore(store, create=False).read(*data[:1], "train", data[1])
    assert table.features.shape == (7000, 8) and set(table.labels.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("args, said", [(["--heads", "--data", "digits5"], "give DATASET,BACKBONE"),
                                        (["--heads", "--data", "synthetic:512"], "or synthetic:DxC"),
                                        (["--heads", "--tiny", "--data", "synthetic:8x3"], "without --tiny"),
                                        (["--data", "synthetic:8x3"], "goes with --heads")])
def test_grid_speed_refuses_a_data_it_would_not_measure(args, said, capsys):
    with pytest.raises(SystemExit) as exc:
        bench("grid_speed").main(args)
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_device_context_comparison_runs(tmp_path):
    out = tmp_path / "device_context.json"
    bench("device_context").main(["--tiny", "--trials", "1", "--store", str(tmp_path / "store.zarr"), "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert all(r["same_accuracy"] and r["context_over_none"] > 0 for r in res.values())


def test_single_product_compares_the_three_products(tmp_path):
    out = tmp_path / "single_product.json"
    bench("single_product").main(["--tiny", "--trials", "1", "--repeat", "1", "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    assert [(r["classes"], r["threads"]) for r in res] == [(65, 1), (65, 2), (10, 1), (10, 2)]
    assert all(r["fedcache_over_torch"] > 0 and r["fedcache_over_first_of_two"] > 0 for r in res)



@pytest.mark.parametrize("method, reference", [("fedproto", "rescored"), *(
    pytest.param(*arms, marks=pytest.mark.slow) for arms in (("pfedme", "rescored"), ("fedproto", "stacked")))])
def test_personal_eval_times_both_arms_to_the_same_outputs(tmp_path, method, reference):
    out = tmp_path / "personal_eval.json"
    bench("personal_eval").main(["--tiny", "--method", method, "--reference", reference, "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["same_outputs"] is True and set(res["seconds"]) == {"current", reference}
    assert res["run_current_over_reference"]["median"] > 0 and 0 < res["initial_states_share_of_run"]["current"] < 1
    assert 0 < res["rounds_share_of_run"][reference] < 1

@pytest.mark.parametrize("rounds", [1, 50])
def test_the_benchmarks_read_train_s_result_line_as_train_prints_it(rounds):
    """benchmarks/_runs.py parses `fedcache train`'s last line; when its wording changed, only the slow smoke tests
    (the published workloads' rounds came back None) said so."""
    from rich.text import Text

    from fedcache.cli.train import _result_line

    summary = {"method": "fedavg", "mean_accuracy": 61.584, "std_accuracy": 15.93, "global_accuracy": 61.0,
               "params_up_per_client": 5130, "params_up_per_round": 51300, "bytes_up": 12810000,
               "bytes_down": 12810000, "rounds": rounds, "seconds": 3.214}
    found = bench("_runs").RESULT_LINE.search(Text.from_markup(_result_line(summary)).plain)
    assert found and found.groups() == ("61.58", str(rounds), "3.21")
