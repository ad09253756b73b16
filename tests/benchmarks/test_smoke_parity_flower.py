"""parity.py and flower_overhead.py at tiny sizes (beside test_smoke.py's): they run, and they write what the
docs read from their JSON (they measure nothing here)."""
from __future__ import annotations

import json

import pytest

from tests.benchmarks.test_smoke import bench


def test_parity_tiny(tmp_path):
    out = tmp_path / "parity.json"
    bench("parity").main(["--tiny", "--seeds", "1", "--rounds", "1", "--only", "PFLlib", "--out", str(out)])
    res = json.loads(out.read_text())
    (case,) = res["results"]
    assert case["case"] == "fedproto (PFLlib options)" and {"fedcache", "reference"} <= set(case["runs"][0])
    assert case["speed_ratio_fedcache_over_reference"]["median"] > 0 and "when" in res["meta"]
    assert "meta_of_case" not in res


def test_parity_only_keeps_the_earlier_cases_and_their_meta(tmp_path):
    out = tmp_path / "parity.json"
    earlier = {"results": [{"case": "fedproto (PFLlib options)", "runs": []}], "meta": {"when": "earlier"}}
    out.write_text(json.dumps(earlier))
    bench("parity").main(["--tiny", "--seeds", "1", "--rounds", "1", "--only", "fedavg", "--out", str(out)])
    res = json.loads(out.read_text())
    assert [r["case"] for r in res["results"]] == ["fedavg", "fedproto (PFLlib options)"]
    assert res["meta_of_case"] == {"fedproto (PFLlib options)": {"when": "earlier"}} and res["meta"]["when"] != "earlier"
    bench("parity").main(["--tiny", "--seeds", "1", "--rounds", "1", "--only", "PFLlib", "--out", str(out)])
    again = json.loads(out.read_text())  # the fedavg case now from the run before, the first case's meta still its own
    assert again["meta_of_case"] == {"fedavg": res["meta"]}


def test_parity_needs_a_store_or_tiny(tmp_path):
    with pytest.raises(SystemExit):
        bench("parity").main(["--out", str(tmp_path / "p.json")])


def test_flower_overhead_in_process_tiny(tmp_path):
    out = tmp_path / "flower.json"
    bench("flower_overhead").main(["--tiny", "--engines", "in_process", "--out", str(out)])
    res = json.loads(out.read_text())
    assert set(res["results"]) == {"in_process"} and res["results"]["in_process"]["per_round_s"] > 0
    assert "when" in res["meta"]


@pytest.mark.slow
def test_flower_overhead_simulation_tiny(tmp_path):
    """Ray starts in the simulation (tens of seconds); its accuracy equals the in-process engine's."""
    out = tmp_path / "flower.json"
    bench("flower_overhead").main(["--tiny", "--engines", "in_process,simulation", "--out", str(out)])
    r = json.loads(out.read_text())["results"]
    assert r["simulation"]["accuracy"] == pytest.approx(r["in_process"]["accuracy"])


def test_every_benchmark_has_a_smoke_test():
    """A script in benchmarks/ that no test here runs would rot; the suite is the scripts run below."""
    import re
    from pathlib import Path

    here = Path(__file__).parent
    run = set(re.findall(r'bench\("(\w+)"\)', "".join(f.read_text() for f in here.glob("test_*.py"))))
    scripts = {f.stem for f in (here.parents[1] / "benchmarks").glob("*.py") if not f.stem.startswith("_")}
    assert scripts - run == set()
