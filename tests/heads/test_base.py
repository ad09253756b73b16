"""What every head shares (fedcache/heads/base.py): the few-class layout of the affine map."""
from __future__ import annotations

import numpy as np
import torch

from fedcache.federate.optim import OPTIMIZER_PRESETS
from tests.federate.conftest import synthetic


def test_fast_logits_train_exactly_like_the_linear_head():
    """The few-class layout (W^T z^T)^T trains exactly like z W + b; SGD steps with each agree (a
    transposed gradient once reached torch's fused SGD kernel and was applied scrambled)."""
    from fedcache.federate.local import cross_entropy, train
    from fedcache.heads import make_head
    from fedcache.heads.base import transposed_affine

    data = synthetic(n_clients=2, dim=16)
    head = make_head("linear", data.dim, data.n_classes)
    start = head.init(2, torch.Generator().manual_seed(0))
    plan = np.stack([r[:24] for r in data.client_train]).reshape(2, 3, 8)
    out = []
    for logits in (lambda p, x: torch.baddbmm(p["bias"], x, p["weight"]), lambda p, x: transposed_affine(p["weight"], p["bias"], x)):
        loss = lambda p, x, y, m, info, f=logits: cross_entropy(f(p, x), y, m)  # noqa: E731
        out.append(train({n: t.clone() for n, t in start.items()}, ("weight", "bias"), loss, data.x_train, data.y_train,
                         plan, OPTIMIZER_PRESETS["fst-cbdg"]))
    for n in start:
        torch.testing.assert_close(out[1][n], out[0][n])
