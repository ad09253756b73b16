"""The Python API: cheap import, the same functions as the CLI, results with history and trained state."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import fedcache
from fedcache.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_import_fedcache_loads_no_torch():
    code = "import sys, fedcache; fedcache.train; fedcache.grid; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


def test_train_returns_summary_history_and_state(toy_store, tmp_path):
    run = fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", settings={"lr": 0.05}, clients=2,
                         rounds=3, out=tmp_path / "run")
    assert [line["round"] for line in run.metrics] == [1, 2, 3]
    assert run.metrics[-1]["accuracy"] == pytest.approx(run.summary["mean_accuracy"], abs=1e-3)  # summary: per-client values rounded
    assert run.server["weight"].shape[-1] == 3 and run.server["bias"].shape[-1] == 3  # the global head, 3 classes
    assert (tmp_path / "run" / "summary.json").exists() and "fedavg" in repr(run)
    with pytest.raises(ConfigError, match="unknown option.*round\\b"):
        fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", round=3)


def test_extract_is_callable_and_reuses_the_cache(toy_store):
    import fedcache.extract.runner

    reports = fedcache.extract_features("test-toy", "tiny-timm-random", store=toy_store, workers=0)
    assert reports and all(r.status == "already complete" for r in reports)
    with pytest.raises(ConfigError, match="unknown option"):
        fedcache.extract_features("test-toy", "tiny-timm-random", store=toy_store, colour="red")


def test_table_to_pandas_without_pandas_says_so(monkeypatch):
    table = fedcache.Table([{"a": 1}, {"a": 2, "b": 3}])
    assert table.columns == ["a", "b"] and table.column("b") == [None, 3]
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="to_records"):
        table.to_pandas()


def test_performance_page_quotes_the_grid_benchmark_json():
    spec = importlib.util.spec_from_file_location("grid_speed", ROOT / "benchmarks" / "grid_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.render() in (ROOT / "docs" / "performance.md").read_text()
