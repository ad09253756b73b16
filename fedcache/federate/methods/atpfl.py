"""ATPFL (Augmented TPFL, same paper as tpfl.py): TPFL plus the InfoNCE terms of Eq. 4-5, which pull a
client's prompted text and image features towards those of the global prompts (positive) and away
from those of the client's own previous prompts (negative):

    L = l_con + mu * (l_aug(z_text, z_text_global, z_text_prev) + l_aug(z_img, z_img_global, z_img_prev))

The previous prompts are the ones the client uploaded after its last round of training (its personal
state). A client that has not trained yet has none of its own: its previous prompts are the global prompts
it receives, so on its first round the two targets coincide and the terms are constant (zero gradient)
instead of pushing it away from the random initial prompts, whatever round it is first sampled in.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedcache.config import NonNegative
from fedcache.federate.local import masked_mean
from fedcache.federate.methods._prompt import info_nce
from fedcache.federate.methods.base import METHODS
from fedcache.federate.methods.tpfl import TPFL, TPFLSettings
from fedcache.heads import Params, as_rows

PREV = "prev_"  # client-state prefix of the previous round's prompts
TRAINED = "trained"  # client state: 1 once the client has trained (its previous prompts are its own)


@dataclass(frozen=True)
class ATPFLSettings(TPFLSettings):
    mu: NonNegative = 1.0  # weight of the InfoNCE terms (Eq. 5); the paper does not state its value
    tau: NonNegative = 0.0  # Gamma of Eq. 4; 0: CLIP's temperature 1 / logit_scale, the Gamma Eq. 2 uses


@METHODS.register("atpfl")
class ATPFL(TPFL):
    description = "TPFL plus InfoNCE towards the global prompts and away from the client's previous ones"
    Settings = ATPFLSettings

    def initial_states(self, clients: list[int]) -> Params:
        # Placeholders until a client trains: local_extra uses the received global prompts instead.
        n = len(clients)
        return {**{PREV + k: torch.zeros(n, *t.shape[1:], dtype=t.dtype) for k, t in self.init_server().items()},
                TRAINED: torch.zeros(n, 1)}

    def new_states(self, uploads: Params, states: Params) -> Params:
        k = len(next(iter(uploads.values())))
        return {**{PREV + n: t.clone() for n, t in uploads.items()}, TRAINED: torch.ones(k, 1)}

    def previous_prompts(self, glob: Params, states: Params) -> Params:
        """Each client's previous prompts: its last upload once it has trained, else the global ones."""
        trained = states[TRAINED].bool()
        return {n: torch.where(trained.view(-1, *[1] * (g.dim() - 1)), states[PREV + n], g) for n, g in glob.items()}

    def local_extra(self, clients: list[int], down: Params, states: Params) -> dict:
        """The global and previous prompts are fixed during the local pass: their text features are
        computed once here, not at every step."""
        if not self.p.mu:
            return {}
        glob = as_rows(down, len(clients))
        prev = self.previous_prompts(glob, states)
        with torch.no_grad():
            text_g, text_prev = self.text.encode(down["ctx"]), self.text.encode(prev["ctx"])
        return {"global": glob, "prev": prev, "text_g": text_g, "text_prev": text_prev}

    def regulariser(self, p: Params, rows, mask, image, text, info) -> torch.Tensor | float:
        if not self.p.mu:
            return 0.0
        tau = self.p.tau or 1.0 / self.scale
        l_text = info_nce(text, info["text_g"].expand_as(text), info["text_prev"], tau).mean(-1)  # over classes
        with torch.no_grad():
            image_g = self.visual.train_features(info["global"], rows, mask)
            image_prev = self.visual.train_features(info["prev"], rows, mask)
        l_image = masked_mean(info_nce(image, image_g, image_prev, tau), mask)
        return self.p.mu * (l_text + l_image)
