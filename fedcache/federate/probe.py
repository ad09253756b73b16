"""Centralised linear probe on cached features: the reference ceiling for every method."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedcache.borrowed import random_kept
from fedcache.store.feature_store import FeatureTable


@dataclass(frozen=True)
class ProbeResult:
    domain: str
    n_train: int
    n_test: int
    accuracy: float  # percent


def fit_probe(x: np.ndarray, y: np.ndarray, c: float = 1.0, seed: int = 0):
    # scikit-learn takes a second to import; every Flower ClientApp process would pay it for nothing
    with random_kept():
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=seed))
    with warnings.catch_warnings():
        # A probe that stops at max_iter is still a valid (slightly conservative) reference.
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(x, y)
    return model


def probe_per_domain(train: FeatureTable, test: FeatureTable, c: float = 1.0, seed: int = 0,
                     on_probe: Callable[[int, int], None] | None = None) -> list[ProbeResult]:
    """One probe per domain (trained and tested within it), then one on all domains pooled.
    ``on_probe(done, total)`` before the first (done = 0) and after each: the probes take minutes on a CPU."""
    domains = [(d, name) for d, name in enumerate(train.domain_names) if (train.domains == d).any() and (test.domains == d).any()]
    total = len(domains) + (len(domains) > 1)
    done = on_probe or (lambda i, n: None)
    results = []
    done(0, total)
    for d, name in domains:
        tr, te = train.domains == d, test.domains == d
        results.append(_probe(train.features[tr], train.labels[tr], test.features[te], test.labels[te], name, c, seed))
        done(len(results), total)
    if len(results) > 1:
        results.append(_probe(train.features, train.labels, test.features, test.labels, "all (pooled)", c, seed))
        done(len(results), total)
    return results


def _probe(xtr, ytr, xte, yte, name: str, c: float, seed: int) -> ProbeResult:
    model = fit_probe(xtr, ytr, c, seed)
    acc = 100.0 * float(np.mean(model.predict(xte) == yte))
    return ProbeResult(name, len(ytr), len(yte), acc)
