"""Solo: every client trains its own head on its own data and never communicates (FedPCL's lower bound)."""
from __future__ import annotations

from fedcache.federate.stacking import stackable
from fedcache.federate.methods.base import METHODS, LocalResult, Method
from fedcache.heads import Params, forward


@METHODS.register("solo")
@stackable()
class Solo(Method):
    description = "local training only, no communication"
    personalized = True
    has_global_model = False
    federated = False
    all_clients = True

    def init_server(self) -> Params:
        return {}

    def init_clients(self, n: int) -> Params:
        return self.head.init(n, self.generator(0, 1))

    def broadcast(self, server: Params, rnd: int) -> Params:
        return {}

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        states = self.fit(states, rnd, clients, self.ce_loss)
        return LocalResult(states, {}, self.sample_counts(clients))

    def client_logits(self, server: Params, states: Params, clients: list[int], x):
        return forward(self.head, states, x)

    def scores_by_own_state(self) -> bool:
        return True
