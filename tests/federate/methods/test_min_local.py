"""Min-Local's paper metric: the worst client's linear probe on the whole test split (FLESD Table 1)."""
from __future__ import annotations

import json

import numpy as np
import torch

from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods._simclr import probe_logits

from ..conftest import synthetic
from ..test_methods import make


def test_summary_reports_the_worst_clients_probe_on_the_whole_test_split():
    data = synthetic(n_clients=3, per_client=30, n_classes=4, dim=8, sizes=[10, 30, 50])
    data.views = data.x_train[:, None] + 0.3 * torch.randn(len(data.x_train), 2, 8, generator=torch.Generator().manual_seed(1))
    m = make("min-local", data, hidden=6, out=4, probe_rows=0)
    result = run(m, RunConfig(rounds=1))
    whole = []
    for k in range(3):  # each client's encoder probed by hand on every test row
        logits = probe_logits({n: t[k: k + 1] for n, t in result.clients.items()}, data, m.eval_rows, data.x_test,
                              m.p.probe_c, m.ctx.seed)
        whole.append(100.0 * float((logits.argmax(1) == data.y_test).float().mean()))
    s = result.summary
    np.testing.assert_allclose(s["per_client_global_accuracy"], whole, atol=1e-3)
    assert s["worst_client_global_accuracy"] == min(s["per_client_global_accuracy"])
    assert len(set(whole)) > 1  # the clients differ, so min is not max or mean here
    assert s["global_accuracy"] is None  # no global model


def test_a_run_resumed_at_its_last_round_reports_the_worst_clients_probe(tmp_path):
    """Killed between its last checkpoint and its summary.json, its metrics lines intact: the resume trains no round,
    so evaluation never ran in it, and the summary lacked the probes evaluation finds (FLESD Table 1's metric)."""
    data = synthetic(n_clients=3, per_client=30, n_classes=4, dim=8, sizes=[10, 30, 50])
    data.views = data.x_train[:, None] + 0.3 * torch.randn(len(data.x_train), 2, 8, generator=torch.Generator().manual_seed(1))
    full = run(make("min-local", data, hidden=6, out=4, probe_rows=0), RunConfig(rounds=2, out=tmp_path))
    (tmp_path / "summary.json").unlink()
    again = run(make("min-local", data, hidden=6, out=4, probe_rows=0), RunConfig(rounds=2, out=tmp_path, resume=True))
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert "worst_client_global_accuracy" in full.summary
    assert drop(again.summary) == drop(full.summary)
    assert drop(json.loads((tmp_path / "summary.json").read_text())) == drop(full.summary)


def test_flesd_table1_compares_min_local_on_the_metric_it_reports():
    from fedcache.presets import PRESETS
    from fedcache.grids import METRIC_COLUMNS

    rows = [n for n in PRESETS.get("flesd-table1").paper if n.method == "min-local"]
    assert rows and all(n.metric == "worst_client_global_accuracy" for n in rows)
    assert "worst_client_global_accuracy" in METRIC_COLUMNS  # it reaches results.csv, which paper.json reads
