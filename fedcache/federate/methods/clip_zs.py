"""CLIP zero-shot (FST-CBDG's "CLIP-ZS" baseline, Radford et al. 2021): each test image goes to the class
whose text embedding is most cosine-similar. Nothing is trained and nothing travels."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fedcache.config import Checked, Positive
from fedcache.federate.methods._clip import anchor_head, unit_logits
from fedcache.federate.methods.base import METHODS, LocalResult, Method, MethodContext
from fedcache.federate.text import text_from_info
from fedcache.heads import Params


@dataclass(frozen=True)
class ClipZSSettings(Checked):
    templates: Literal["single", "ensemble"] = "single"  # FST-CBDG: "a photo of a {object}."
    logit_scale: Positive = 100.0  # CLIP's learned temperature; scores only, argmax is unchanged


@METHODS.register("clip-zs")
class ClipZS(Method):
    description = "CLIP zero-shot: nearest class-text embedding by cosine similarity; no training"
    Settings = ClipZSSettings
    federated = False
    splittable = False
    all_clients = True
    default_preset = "fst-cbdg"
    uses_optimizer = False
    heads = ("linear",)  # the zero-shot classifier is a linear head W = s * T, b = 0

    def __init__(self, ctx: MethodContext, params=None) -> None:
        super().__init__(ctx, params)
        self.text = text_from_info(ctx.data, self.name, self.p.templates)

    def init_server(self) -> Params:
        return anchor_head(self.text, self.p.logit_scale)

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        return LocalResult({}, {}, torch.ones(1))

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return server

    def global_logits(self, server: Params, x: torch.Tensor) -> torch.Tensor:
        return unit_logits(server, x)
