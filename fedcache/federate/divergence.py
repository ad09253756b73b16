"""A round's results must be finite; when they are not, say what is: the client's inputs, what the
server sent, or the method's own result (only the last is a divergence a smaller learning rate may cure)."""
from __future__ import annotations

import torch

from fedcache.errors import FedcacheError
from fedcache.federate.methods.base import LocalResult, Method
from fedcache.heads import Params
from fedcache.wording import setting


class DivergedError(FedcacheError, FloatingPointError):
    """A client's update became NaN or infinite; ``in_round``: the round it did (from 1), where known."""

    def __init__(self, message: str, in_round: int | None = None):
        super().__init__(message)
        self.in_round = in_round


def check_finite(method: Method, result: LocalResult, clients: list[int], rnd: int, down: Params) -> None:
    for tensors in (result.uploads, result.states):
        for name, t in tensors.items():
            # NaN and inf survive a sum: one reduction per client instead of a mask over every parameter.
            # Summed in float32: a float16 upload (e.g. quantised similarities) would overflow a float16 sum.
            bad = ~torch.isfinite(t.flatten(1).sum(1, dtype=torch.float32))
            if bad.any():
                k = clients[int(bad.nonzero()[0, 0])]
                raise DivergedError(f"round {rnd + 1}, client {k}: '{name}' became NaN/inf; {_cause(method, k, name, down)}",
                                    in_round=rnd + 1)


def _cause(method: Method, k: int, name: str, down: Params) -> str:
    d = method.ctx.data
    rows = torch.as_tensor(d.client_train[k] if k < len(d.client_train) else [], dtype=torch.long)
    inputs = [("cached training features", d.train_features(rows).flatten(1))]
    if d.views is not None:
        inputs.append(("cached augmented views", d.views[rows].flatten(1)))
    for what, x in inputs:
        bad = (~torch.isfinite(x)).any(1).nonzero().flatten()
        if len(bad):
            return (f"the client's {what} are not finite ({len(bad)} of its {len(rows)} training rows, e.g. rows "
                    f"{rows[bad[:5]].tolist()} of the training table): re-extract them (fedcache extract refuses "
                    "non-finite features since it checks them)")
    sent = [n for n, t in down.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if sent:
        return f"what the server sent this round was already not finite ({', '.join(sent)}): resume from an earlier checkpoint"
    h = method.head
    if name in (*h.body_keys, *h.head_keys, *getattr(h, "buffer_keys", ())):
        return f"training diverged from finite inputs: lower the learning rate ({setting('optim.lr')}=...)"
    return (f"'{name}' is not a weight of the {getattr(h, 'name', '')} head but something {method.name} computes or trains itself, "
            "from finite features and a finite received model: check the method's settings (learning rate, "
            "noise scale, ...)")
