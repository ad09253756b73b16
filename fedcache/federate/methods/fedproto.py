"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients", AAAI 2022).

Clients keep their own heads and exchange only class prototypes: the mean representation of each
class they hold. The local loss pulls every representation towards its class's global prototype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedcache.config import Checked, NonNegative
from fedcache.federate.local import cross_entropy, masked_mean, train
from fedcache.federate.methods.base import METHODS, LocalResult, Method
from fedcache.federate.prototypes import aggregate, class_means, class_sums, means_of, nearest, padded_rows
from fedcache.federate.stacking import per_run, stackable
from fedcache.heads import Params, as_rows, expand, forward

INDEX_BYTES = 8  # a class index or a sample count travels as int64
CHUNK = 16  # clients per prototype pass, to bound the (K, T, D) gather


@dataclass(frozen=True)
class FedProtoSettings(Checked):
    lam: NonNegative = 1.0  # weight of the prototype loss; the official code's --ld default (README)
    # "classifier": the client's own head; "proto": the nearest global prototype (the official code reports both)
    predict: Literal["classifier", "proto"] = "classifier"
    # "after": one pass over all the client's rows after local training, evaluation mode (the paper's
    # prototype of the trained representation); "last-epoch": the mean of the representations the
    # last local epoch's training steps produced (train mode, changing weights), as the official code
    # does, which saves that pass; "every-epoch": the same over every local epoch's steps (PFLlib).
    local_protos: Literal["after", "last-epoch", "every-epoch"] = "after"
    # "weighted": each client's prototype weighted by its count of the class (the paper's Eq.);
    # "uniform": a plain mean over the clients that hold the class (official code and PFLlib).
    aggregation: Literal["weighted", "uniform"] = "weighted"
    # "per-client": every client's head drawn independently (the official code builds one model per
    # client); "shared": every client starts from the same draw (PFLlib deep-copies one model).
    init: Literal["per-client", "shared"] = "per-client"
    # Skip each epoch's incomplete last batch, as the official code's and PFLlib's DataLoader(drop_last=True).
    drop_last: bool = False
    # Rows the prototype loss averages over: "with-prototype" only rows whose class has a global
    # prototype; "all" every row of the batch, a row without one adding 0 (nn.MSELoss on a copy of the
    # representation, as the official code and PFLlib). Equal once every class has a prototype.
    loss_rows: Literal["with-prototype", "all"] = "with-prototype"
    # A class no sampled client holds this round: "keep" its previous global prototype; "drop" it
    # (the official code and PFLlib rebuild the prototype set from this round's uploads only).
    missing: Literal["keep", "drop"] = "keep"


@METHODS.register("fedproto")
# predict, aggregation and missing are read by each run's own server and evaluation, init by its own init_clients.
@stackable(per_row=("lam",), per_run=("predict", "aggregation", "missing", "init"))
class FedProto(Method):
    description = "personal heads; clients exchange per-class prototypes of their representation"
    Settings = FedProtoSettings
    default_head = "mlp"
    personalized = True
    has_global_model = False
    count_uploads = ("counts",)
    needs_representation = "learns prototypes of a representation"

    def init_server(self) -> Params:
        c, f = self.ctx.data.n_classes, self.head.feature_dim
        return {"protos": torch.zeros(c, f), "counts": torch.zeros(c)}  # count 0: no prototype yet

    def init_clients(self, n: int) -> Params:
        if self.p.init == "shared":
            return super().init_clients(n)
        return self.head.init(n, self.generator(0, 1))

    def initial_states(self, clients: list[int]) -> Params | None:
        if self.p.init == "shared":
            return expand(self.head.init(1, self.generator(0, 1)), len(clients))
        return self.client_heads(clients)

    def broadcast(self, server: Params, rnd: int) -> Params:
        # With a leading model axis of 1, as a head's parameters travel: ``per_row`` gives each client its copy.
        return {n: t.unsqueeze(0) for n, t in server.items()}

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        down = as_rows(down, len(clients))
        info = {"protos": down["protos"], "has": down["counts"] > 0}
        if self.p.local_protos != "after":
            info["sums"] = EpochSums(self.epoch_steps(clients), self.ctx.data.n_classes, self.head.feature_dim)
        c = self.ctx
        plan = self.plan(rnd, clients)
        if self.p.drop_last:
            plan = drop_incomplete(plan)
        states = train(states, self.trainable(states), self.loss, c.data.x_train, c.data.y_train, plan, c.optim, info)
        protos, counts = info["sums"].means() if "sums" in info else self.local_prototypes(states, clients)
        if "sums" in info:
            # Summed over steps, counts reach epochs x rows; the weight is the paper's |D_ij| (the
            # client's rows of class j), and a server checks it against the client's rows.
            counts = torch.where(counts > 0, self.class_counts(clients), 0.0)
        return LocalResult(states, {"protos": protos, "counts": counts}, self.sample_counts(clients))

    def class_counts(self, clients: list[int]) -> torch.Tensor:
        """(K, C) the clients' training rows per class."""
        y = self.ctx.data.y_train
        return torch.stack([torch.bincount(y[torch.as_tensor(r)], minlength=self.ctx.data.n_classes).float()
                            for r in self.client_rows(clients)])

    def epoch_steps(self, clients: list[int]) -> torch.Tensor:
        """(K, S) True where step s of client k's local pass feeds its prototypes: the last epoch's steps
        (step_plan's layout: each client's epochs back to back, ceil(n_k / B) steps each, floor with
        drop_last), or every step."""
        c = self.ctx
        size = (lambda n: n // c.batch_size) if self.p.drop_last else (lambda n: -(-n // c.batch_size))
        per_epoch = torch.tensor([size(len(r)) for r in self.client_rows(clients)])
        s = torch.arange(int(per_epoch.max()) * c.local_epochs if len(per_epoch) else 0)
        first = 0 if self.p.local_protos == "every-epoch" else c.local_epochs - 1
        return (s >= (per_epoch * first).unsqueeze(1)) & (s < (per_epoch * c.local_epochs).unsqueeze(1))

    def loss(self, p, xb, yb, mask, info):
        z, buffers = self.head.train_features(p, xb, mask)
        if "sums" in info:
            info["sums"].add(info["step"], z.detach(), yb, mask)
        ce = cross_entropy(self.head.classify(p, z), yb, mask)
        # Squared distance averaged over dimensions, as the official code's nn.MSELoss; rows whose
        # class has no global prototype yet (all rows in round 1) add nothing.
        k = torch.arange(len(yb)).unsqueeze(1)
        has = info["has"][k, yb]
        dist = ((z - info["protos"][k, yb]) ** 2).mean(-1)
        if self.p.loss_rows == "all":
            return ce + self.p.lam * masked_mean(dist * has, mask), buffers
        return ce + self.p.lam * masked_mean(dist, mask & has), buffers

    @per_run("states")
    def local_prototypes(self, states: Params, clients: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, C, F) mean representation per class of each client's training rows, and (K, C) counts, a chunk
        of clients at a time. A chunk is padded to its largest client, and the padded width decides how the
        products and sums round: so chunks are always of one run's clients."""
        parts = [self._prototypes({n: t[i: i + CHUNK] for n, t in states.items()}, clients[i: i + CHUNK])
                 for i in range(0, len(clients), CHUNK)]
        return torch.cat([p for p, _ in parts]), torch.cat([c for _, c in parts])

    def _prototypes(self, states: Params, clients: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx, mask = padded_rows(self.client_rows(clients))
        x, y = self.ctx.data.train_features(idx), self.ctx.data.y_train[idx]
        with torch.no_grad():
            z = self.head.features(states, x, mask)
        return class_means(z, y, mask, self.ctx.data.n_classes)

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        avg, seen = aggregate(result.uploads["protos"], result.uploads["counts"], weighted=self.p.aggregation == "weighted")
        total = result.uploads["counts"].sum(0)
        if self.p.missing == "drop":
            return {"protos": torch.where(seen.unsqueeze(-1), avg, 0.0), "counts": total}
        # A class no sampled client holds this round keeps its previous prototype.
        return {"protos": torch.where(seen.unsqueeze(-1), avg, server["protos"]),
                "counts": torch.where(seen, total, server["counts"])}

    def upload_size(self, uploads: Params, i: int) -> tuple[int, int]:
        # Only held classes travel: per class its prototype (float32), index and, for the weighted
        # average, sample count (int64).
        ints = 2 if self.p.aggregation == "weighted" else 1
        return _prototype_size(uploads["counts"][i], uploads["protos"].shape[-1], per_class_ints=ints)

    def download_size(self, down: Params) -> tuple[int, int]:
        return _prototype_size(down["counts"], down["protos"].shape[-1], per_class_ints=1)

    def client_logits(self, server: Params, states: Params, clients: list[int], x: torch.Tensor) -> torch.Tensor:
        return PREDICTORS[self.p.predict](self, server, states, x)

    def scores_by_own_state(self) -> bool:
        return self.p.predict in OWN_STATE_PREDICTORS


class EpochSums:
    """Per-client class sums of the representations the last local epoch's steps produce."""

    def __init__(self, last: torch.Tensor, n_classes: int, dim: int) -> None:
        self.last = last
        self.sums = torch.zeros(last.shape[0], n_classes, dim)
        self.counts = torch.zeros(last.shape[0], n_classes)

    def add(self, step: int, z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> None:
        sums, counts = class_sums(z, y, mask & self.last[:, step].unsqueeze(1), self.counts.shape[1])
        self.sums += sums
        self.counts += counts

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        return means_of(self.sums, self.counts), self.counts


def drop_incomplete(plan: np.ndarray) -> np.ndarray:
    """The (K, S, B) plan without its incomplete batches (an epoch's last one when B does not divide
    the client's rows), as DataLoader(drop_last=True) skips them: each client's full batches, in order,
    so an epoch takes floor(n_k / B) steps."""
    full = [p[(p >= 0).all(-1)] for p in plan]
    out = np.full((len(plan), max((len(f) for f in full), default=0), plan.shape[-1]), -1, np.int64)
    for i, f in enumerate(full):
        out[i, : len(f)] = f
    return out


def _prototype_size(counts: torch.Tensor, dim: int, per_class_ints: int) -> tuple[int, int]:
    n = int((counts > 0).sum())
    return n * dim, n * dim * 4 + n * per_class_ints * INDEX_BYTES


def _by_classifier(method: FedProto, server: Params, states: Params, x: torch.Tensor) -> torch.Tensor:
    return forward(method.head, states, x)


def _by_prototype(method: FedProto, server: Params, states: Params, x: torch.Tensor) -> torch.Tensor:
    """Minus the squared L2 distance to each global prototype; classes without one score -inf."""
    z = method.head.features(states, x)
    k = len(z)
    return nearest(z, server["protos"].expand(k, -1, -1), (server["counts"] > 0).expand(k, -1))


PREDICTORS = {"classifier": _by_classifier, "proto": _by_prototype}
OWN_STATE_PREDICTORS = ("classifier",)  # those that read nothing of the server (the global prototypes)

# The reference algorithm researchers run as "FedProto" (PFLlib's clientproto/serverproto, which follow
# the official code's training step): every option that differs from the defaults above. The optimizer,
# batch size, epochs and participation are the run's own settings.
PFLLIB = {"predict": "proto", "local_protos": "every-epoch", "aggregation": "uniform", "init": "shared",
          "drop_last": True, "loss_rows": "all", "missing": "drop"}
