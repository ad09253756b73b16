"""FedAvg (McMahan et al., 2017): clients train the global head locally; the server averages."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fedcache.config import Checked
from fedcache.federate.methods._clip import anchor_head, require_linear, unit
from fedcache.federate.stacking import stackable
from fedcache.federate.methods.base import METHODS, LocalResult, Method, MethodContext, weighted_average
from fedcache.federate.text import text_from_info
from fedcache.heads import Params, expand


@dataclass(frozen=True)
class FedAvgSettings(Checked):
    # random: the head's own initialisation on the cached features. text: FST-CBDG's classifier, a linear
    # head on unit-norm features that starts as CLIP's zero-shot classifier (W = class-text embeddings,
    # b = 0); that paper's FedAvg and FedNTD curves start at the zero-shot accuracy (Figure 3).
    init: Literal["random", "text"] = "random"


@METHODS.register("fedavg")
@stackable()
class FedAvg(Method):
    description = "average of locally trained heads, weighted by sample counts"
    Settings = FedAvgSettings

    def __init__(self, ctx: MethodContext, params=None) -> None:
        super().__init__(ctx, params)
        self.text = None
        if self.p.init == "text":
            require_linear(ctx.head, f"{self.name} init=text")
            self.text = text_from_info(ctx.data, self.name, without={"init": "random"})

    def init_server(self) -> Params:
        return anchor_head(self.text) if self.text is not None else super().init_server()

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """What the head sees: the cached features, or with init=text their unit-norm version (CLIP's
        zero-shot classifier compares cosines)."""
        return unit(x) if self.text is not None else x

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        params = self.fit(expand(down, len(clients)), rnd, clients, self.loss, {"anchor": down})
        return LocalResult({}, params, self.sample_counts(clients))

    def loss(self, p, xb, yb, mask, info):
        return self.ce_loss(p, xb, yb, mask, info)

    def ce_loss(self, p, xb, yb, mask, info):
        return super().ce_loss(p, self.inputs(xb), yb, mask, info)

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return weighted_average(result.uploads, result.weights)

    def global_logits(self, server: Params, x: torch.Tensor) -> torch.Tensor:
        return super().global_logits(server, self.inputs(x))
