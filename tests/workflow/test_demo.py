"""The demo's machinery on the toy dataset: fused backbones, every demo method, heatmap, report, reuse."""
from __future__ import annotations

import json

import pytest

from fedcache.demo import METHODS, run_demo


@pytest.mark.slow
def test_demo_trains_reports_and_reuses_its_runs(tmp_path):
    store, out = tmp_path / "s.zarr", tmp_path / "demo"
    kw = dict(backbones=["tiny-timm-random", "tiny-clip-random"], rounds=3, few_shot=3, out=out, dataset="test-toy")
    events = []
    first = run_demo(store, **kw, progress=events.append)
    # After extraction, one stage that advances once per method (a log prints a line each, with an ETA).
    stage = [e for e in events if e.label.startswith("demo:") and "methods" in e.label]
    assert stage[0].kind == "start" and stage[0].total == len(METHODS)
    assert [e.kind for e in stage[1:]] == ["advance"] * len(METHODS)
    assert list(first.runs) == list(METHODS) and first.random_weights
    assert first.report == out / "report.html"
    html = first.report.read_text()
    assert "backbone each client leans on" in html  # FedPCL's heatmap from contribution.json
    scores = json.loads((out / "contribution.json").read_text())["scores"]
    assert len(scores) == 2 and all(abs(sum(row) - 1) < 1e-6 for row in scores)
    stamps = {m: (out / m / "summary.json").stat().st_mtime_ns for m in METHODS}
    second = run_demo(store, **kw)
    assert second.runs == first.runs
    assert {m: (out / m / "summary.json").stat().st_mtime_ns for m in METHODS} == stamps  # read back, not re-run
    third = run_demo(store, **{**kw, "rounds": 2})  # another configuration replaces the old runs
    assert all(s["rounds"] == 2 for s in third.runs.values())


def test_the_probe_stage_prints_progress_in_a_log():
    """The per-domain probe took minutes with nothing printed when output was not a terminal: it is one stage,
    advanced per domain and once more for all domains pooled."""
    import numpy as np

    from fedcache.demo import _probes
    from fedcache.store.feature_store import FeatureTable

    rng = np.random.default_rng(0)

    def table(n):
        return FeatureTable(rng.normal(size=(n, 4)).astype(np.float32), np.arange(n) % 2, np.arange(n), np.arange(n) % 3,
                            ("a", "b", "c"), ("0", "1"), False, ("e",))

    events = []
    probes = _probes(table(60), table(30), None, events.append)
    assert [(e.kind, e.label) for e in events] == [("start", "demo: linear probe per domain")] + [
        ("advance", "demo: linear probe per domain")] * 4
    assert events[0].total == 4 == len(probes)  # three domains and the pooled probe
