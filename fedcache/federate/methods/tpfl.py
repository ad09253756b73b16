"""TPFL (Twin Prompt Federated Learning; "Inclusive Data Representation in Federated Learning: A Novel
Approach Integrating Textual and Visual Prompt"): PromptFL's text context plus a visual prompt, both
trained locally with the CLIP loss (Eq. 2) and both averaged by sample count on the server (Eq. 3).

``visual=feature`` (default) adds the visual prompt to the cached image embedding, keeping the cache;
the paper's prompt is on pixels, which ``visual=pixel`` implements by re-reading the raw images and
running CLIP's frozen image tower every step (it bypasses the cache; GPU recommended).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch

from fedcache.config import PositiveInt
from fedcache.federate.methods._visual_prompt import CachedFeatures, FeaturePrompt, PixelPrompt
from fedcache.federate.methods.base import METHODS
from fedcache.federate.methods.promptfl import PromptFL, PromptFLSettings
from fedcache.federate.source import source_from_info

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TPFLSettings(PromptFLSettings):
    visual: Literal["feature", "pixel"] = "feature"
    pad: PositiveInt = 30  # visual=pixel: width of the padding prompt in pixels (Bahng et al.'s default at 224 px)
    dataset: str = ""  # visual=pixel: the dataset's registry name if the store names it differently
    data_root: str = ""  # visual=pixel: where the raw images are (as `fedcache extract --data-root`)

    def ignored(self) -> dict[str, str]:
        """Settings this configuration does not read: ``--set`` refuses them instead of dropping them."""
        if self.visual == "pixel":
            return {}
        why = "visual=feature prompts the cached embedding; it reads no images (set visual=pixel to use it)"
        return {"pad": why, "dataset": why, "data_root": why}


def _feature(m: TPFL) -> CachedFeatures:
    return FeaturePrompt(m.ctx.data)


def _pixel(m: TPFL) -> CachedFeatures:
    log.warning("%s visual=pixel BYPASSES THE FEATURE CACHE: it re-reads the raw images and runs the image "
                "tower every step (GPU recommended)", m.name)
    src = source_from_info(m.ctx.data, m.name)
    return PixelPrompt(m.ctx.data, src, m.bb.model, m.p.pad, m.p.dataset, m.p.data_root, torch.device(m.p.device))


VISUAL = {"feature": _feature, "pixel": _pixel}


@METHODS.register("tpfl")
class TPFL(PromptFL):
    description = "PromptFL plus a visual prompt (on cached features, or pixels with visual=pixel); both averaged"
    Settings = TPFLSettings
    default_preset = "tpfl"

    def make_visual(self) -> CachedFeatures:
        return VISUAL[self.p.visual](self)

    def summary_extra(self) -> dict:
        return {"bypasses_cache": self.visual.bypasses_cache}
