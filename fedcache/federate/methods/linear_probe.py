"""Linear probe: scikit-learn logistic regression on the pooled training features (the reference ceiling)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedcache.config import Checked, Positive
from fedcache.federate.methods.base import METHODS, LocalResult, Method
from fedcache.federate.probe import fit_probe
from fedcache.heads import Params
from fedcache.federate.local import here


@dataclass(frozen=True)
class LinearProbeSettings(Checked):
    c: Positive = 1.0  # inverse L2 strength of scikit-learn's LogisticRegression


@METHODS.register("linear-probe")
class LinearProbe(Method):
    description = "scikit-learn logistic regression on all training features pooled (reference ceiling)"
    Settings = LinearProbeSettings
    federated = False
    splittable = False
    pools_data = True
    all_clients = True
    uses_optimizer = False
    heads = ("linear",)  # the fitted probe is expressed as a linear head

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        if rnd > 0:  # the probe is fitted once; later rounds change nothing
            return LocalResult({}, down, torch.ones(1))
        d = self.ctx.data
        rows = np.concatenate(self.client_rows(clients))
        x = d.train_features(torch.from_numpy(rows)).cpu().numpy()
        model = fit_probe(x, d.y_train[rows].cpu().numpy(), self.p.c, self.ctx.seed)
        return LocalResult({}, _as_linear_head(model, d.dim, d.n_classes), torch.ones(1))

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return result.uploads


def _as_linear_head(model, dim: int, n_classes: int) -> Params:
    """Fold the scaler into W and b: logits = ((x - mu) / s) C^T + c0 = x W + b."""
    scaler, lr = model[0], model[-1]
    coef = lr.coef_ if len(lr.classes_) > 2 else np.vstack([-lr.coef_[0], lr.coef_[0]]) / 2
    icpt = lr.intercept_ if len(lr.classes_) > 2 else np.array([-lr.intercept_[0], lr.intercept_[0]]) / 2
    w = np.zeros((dim, n_classes), np.float32)
    b = np.full((n_classes,), -1e9, np.float32)  # classes never seen in training are never predicted
    w[:, lr.classes_] = (coef / scaler.scale_).T
    b[lr.classes_] = icpt - (scaler.mean_ / scaler.scale_) @ coef.T
    return {"weight": here(w)[None], "bias": here(b)[None, None]}
