"""PromptFL (Guo et al. 2022, "PromptFL: Let Federated Participants Cooperatively Learn Prompts
Instead of Models"): clients learn CoOp's shared text context vectors against their cached CLIP
image features; the server averages the contexts (FedAvg). Nothing else is trained or sent.

tpfl and atpfl (tpfl.py, atpfl.py) extend this class with a visual prompt and contrastive terms.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from fedcache.config import Checked, NonNegative, PositiveInt
from fedcache.federate.local import cross_entropy, train
from fedcache.federate.methods._prompt import PromptedText, load_clip, logit_scale, prompt_logits
from fedcache.federate.methods._visual_prompt import CachedFeatures
from fedcache.federate.methods.base import METHODS, LocalResult, Method, MethodContext, weighted_average
from fedcache.heads import Params, expand

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptFLSettings(Checked):
    n_ctx: PositiveInt = 16  # context tokens (CoOp, PromptFL)
    ctx_init: str = ""  # "": N(0, 0.02^2) as CoOp; or words to start from, e.g. "a photo of a" (with n_ctx=4)
    logit_scale: NonNegative = 0.0  # 0: the CLIP model's own exp(t) (100 for OpenAI's weights)
    weights: str = ""  # checkpoint the features were extracted with (extract --weights NAME=PATH)
    device: str = "cpu"  # where the frozen CLIP towers run, e.g. "cuda"


@METHODS.register("promptfl")
class PromptFL(Method):
    description = "CoOp context vectors through CLIP's frozen text tower on cached image features; FedAvg of the contexts"
    Settings = PromptFLSettings
    default_preset = "promptfl"

    heads = ("linear",)  # it classifies with prompted class-text features: no head of its own

    def __init__(self, ctx: MethodContext, params=None) -> None:
        super().__init__(ctx, params)
        self.bb = load_clip(ctx.data, self.name, self.p.weights)
        self.bb.model.to(torch.device(self.p.device))
        self.text = PromptedText(self.bb, ctx.data.class_names, self.p.n_ctx)
        self.scale = logit_scale(self.bb, self.p.logit_scale)
        self.ctx0 = self.text.init_context(self.p.ctx_init, self.bb, self.generator(0, 0))  # checks ctx_init now
        self.visual = self.make_visual()
        # train() indexes this instead of the features, so the loss sees row numbers and each visual
        # kind decides how to turn them into image features (cached rows or re-read images).
        self.rows = torch.arange(len(ctx.data.x_train))
        if ctx.data.random_weights:
            log.warning("%s: the CLIP weights are RANDOM (test backbone); accuracies mean nothing", self.name)

    def make_visual(self) -> CachedFeatures:
        return CachedFeatures(self.ctx.data)

    def init_server(self) -> Params:
        return {"ctx": self.ctx0.clone(),
                **self.visual.init(self.generator(0, 1))}

    # ---- client ---------------------------------------------------------------------
    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        # expand() clones: each client trains (and uploads) its own copy, never an alias of the
        # global prompt (the official PromptFL loop's aliasing bug, design.md).
        params = expand(down, len(clients))
        extra = self.local_extra(clients, down, states)
        params = train(params, tuple(params), self.loss, self.rows, self.ctx.data.y_train,
                       self.plan(rnd, clients), self.ctx.optim, extra)
        return LocalResult(self.new_states(params, states), params, self.sample_counts(clients))

    def local_extra(self, clients: list[int], down: Params, states: Params) -> dict:
        """What the loss needs besides the batch, computed once per local pass (atpfl: frozen targets)."""
        return {}

    def new_states(self, uploads: Params, states: Params) -> Params:
        return {}

    def loss(self, p: Params, rows: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, info: dict) -> torch.Tensor:
        image = self.visual.train_features(p, rows, mask)
        text = self.text.encode(p["ctx"])
        ce = cross_entropy(prompt_logits(image, text, self.scale), yb, mask)
        return ce + self.regulariser(p, rows, mask, image, text, info)

    def regulariser(self, p: Params, rows, mask, image, text, info) -> torch.Tensor | float:
        return 0.0

    # ---- server / evaluation ---------------------------------------------------------------
    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return weighted_average(result.uploads, result.weights)  # Eq. 3 of TPFL; PromptFL's FedAvg

    def global_logits(self, server: Params, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            text = self.text.encode(server["ctx"])[0]
            return self.scale * self.visual.eval_features(server, x) @ text.T
