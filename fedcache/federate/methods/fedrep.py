"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning", ICML 2021).

The representation (the head's body) is shared and averaged; each client keeps its own classifier.
Locally the classifier is trained first with the body frozen, then the body with the classifier frozen.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedcache.config import Checked, NonNegativeInt
from fedcache.federate.local import train
from fedcache.federate.stacking import stackable
from fedcache.federate.methods.base import (METHODS, LocalResult, Method, MethodContext, aggregation_weights,
                                           weighted_average)
from fedcache.heads import Params, expand, forward


@dataclass(frozen=True)
class FedRepSettings(Checked):
    # Epochs on the personal classifier before the body's epochs (the run's local_epochs, the official
    # --local_rep_ep). Every official script trains the classifier 10 epochs (--local_ep minus --local_rep_ep),
    # the body 1 (CIFAR-10 2 shards, --local_rep_ep's default) or 5 (the other six scripts).
    # The FedPCL comparison presets set 1 (that paper's E = 1 for every method).
    head_epochs: NonNegativeInt = 10
    # uniform: Algorithm 1's plain average over the sampled clients, and the official code's for its image
    # datasets (lens = 1); samples: weighted by training rows, the official code's LEAF datasets and FedAvg.
    aggregate: Literal["uniform", "samples"] = "uniform"


@METHODS.register("fedrep")
@stackable()
class FedRep(Method):
    description = "shared representation (averaged), personal classifier per client"
    Settings = FedRepSettings
    default_head = "mlp"
    personalized = True
    has_global_model = False
    needs_representation = "shares the head's representation layers"

    def __init__(self, ctx: MethodContext, params=None) -> None:
        super().__init__(ctx, params)
        self.body = tuple(self.head.body_keys)

    def _initial(self) -> Params:
        # Every client starts from the same model, as in the official code (copies of net_glob).
        return self.head.init(1, self.generator(0, 0))

    def init_server(self) -> Params:
        return {n: t for n, t in self._initial().items() if n in self.body}

    def initial_states(self, clients: list[int]) -> Params:
        return expand({k: t for k, t in self._initial().items() if k not in self.body}, len(clients))

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        p = {**states, **expand(down, len(clients))}
        p = self._phase(p, rnd, clients, self.head.head_keys, 0, self.p.head_epochs)
        # The body's epochs continue the round's epoch count: epoch 0's shuffle again would replay the
        # classifier's first epoch batch for batch.
        p = self._phase(p, rnd, clients, self.body, self.p.head_epochs, self.ctx.local_epochs)
        uploads = {n: p[n] for n in self.body}
        weights = aggregation_weights(self.p.aggregate, self.sample_counts(clients))
        # BatchNorm running statistics describe the client's own data: they stay with the client.
        return LocalResult({n: t for n, t in p.items() if n not in self.body}, uploads, weights)

    def _phase(self, p: Params, rnd: int, clients: list[int], keys: tuple[str, ...], first: int, epochs: int) -> Params:
        """``epochs`` epochs (numbered from ``first`` within the round) on the clients' rows; only ``keys`` move."""
        c = self.ctx
        return train(p, keys, self.ce_loss, c.data.x_train, c.data.y_train, self.plan(rnd, clients, epochs, first), c.optim)

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return weighted_average(result.uploads, result.weights)

    def client_logits(self, server: Params, states: Params, clients: list[int], x):
        return forward(self.head, {**states, **expand(server, len(clients))}, x)
