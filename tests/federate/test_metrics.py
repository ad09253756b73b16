"""The summary's figures over clients (fedcache/federate/metrics.py): fairness and the population std."""
import numpy as np
import pytest

from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.metrics import fairness, summarize

from .test_driver import make


def test_fairness_figures():
    f = fairness(np.array([10.0, 20, 30, 40, 50, 60, 70, 80, 90, 100]))
    assert f["worst10"] == 10 and f["worst20"] == 15 and f["worst40"] == 25 and f["best10"] == 100
    assert f["variance"] == pytest.approx(np.var(np.arange(10, 101, 10)))


def test_std_over_clients_is_the_population_std_the_summary_names(data):
    # Two clients at 50 and 100: population std 25 (ddof=0, what `definitions` says); the sample std is 35.36.
    s = summarize(np.array([50.0, 100.0]))
    assert (s["std_accuracy"], s["variance"]) == (25.0, 625.0)
    r = run(make("fedavg", data), RunConfig(rounds=1)).summary
    acc = np.array(r["per_client_accuracy"])
    assert acc.std() > 0  # clients that differ, so ddof matters here
    assert r["std_accuracy"] == pytest.approx(acc.std(ddof=0)) and "ddof=0" in r["definitions"]["std_accuracy"]
