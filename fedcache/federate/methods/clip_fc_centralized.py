"""CLIP-FC-Centralized (FST-CBDG's supervised upper bound, Section 4.1): the ``centralized`` method with
the FST-CBDG classifier, a linear head on unit-norm CLIP features initialised from the class text."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fedcache.config import Checked
from fedcache.federate.local import cross_entropy
from fedcache.federate.methods._clip import anchor_head, linear_logits, require_linear, unit, unit_logits
from fedcache.federate.methods.base import METHODS, MethodContext
from fedcache.federate.methods.centralized import Centralized
from fedcache.federate.text import text_from_info
from fedcache.heads import Params


@dataclass(frozen=True)
class ClipFCSettings(Checked):
    # The paper's comparison curves (Figure 3) start at the zero-shot accuracy, so its linear
    # classifiers start from the text embeddings; "random" is PyTorch's default Linear init.
    init: Literal["text", "random"] = "text"
    templates: Literal["single", "ensemble"] = "single"


@METHODS.register("clip-fc-centralized")
class ClipFCCentralized(Centralized):
    description = "supervised linear classifier on pooled unit-norm CLIP features, text-initialised (upper bound)"
    Settings = ClipFCSettings
    default_preset = "fst-cbdg"

    def __init__(self, ctx: MethodContext, params=None) -> None:
        require_linear(ctx.head, "clip-fc-centralized")
        super().__init__(ctx, params)
        self.text = None
        if self.p.init == "text":
            self.text = text_from_info(ctx.data, self.name, self.p.templates, without={"init": "random"})

    def init_server(self) -> Params:
        return anchor_head(self.text) if self.text is not None else super().init_server()

    def ce_loss(self, p: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, info: dict) -> torch.Tensor:
        return cross_entropy(linear_logits(p, unit(xb)), yb, mask)

    def global_logits(self, server: Params, x: torch.Tensor) -> torch.Tensor:
        return unit_logits(server, x)
