"""Prompt templates for CLIP class-text embeddings.

``single`` is the template of the FST-CBDG and PromptFL papers. ``ensemble`` averages
varied phrasings, which is known to make zero-shot heads more robust to wording.
"""
from __future__ import annotations

from typing import Iterable

from fedcache.store.keys import TextKey

TEMPLATE_SETS: dict[str, tuple[str, ...]] = {
    "single": ("a photo of a {}.",),
    "ensemble": (
        "a photo of a {}.",
        "a blurry photo of a {}.",
        "a photo of a small {}.",
        "a photo of a large {}.",
        "a close-up photo of a {}.",
        "a bright photo of a {}.",
        "a dark photo of a {}.",
        "a low resolution photo of a {}.",
        "a drawing of a {}.",
        "a painting of a {}.",
        "a sketch of a {}.",
        "a rendering of a {}.",
        "a cropped photo of a {}.",
        "a black and white photo of a {}.",
        "itap of a {}.",
        "a {} in a video game.",
    ),
}


def text_key(backbone: str, weights_hash: str, classes: Iterable[str], set_name: str) -> TextKey:
    """The key of the text entry an extraction writes for ``backbone``'s weights, ``classes`` and one template set:
    what a reader that needs them may be refused (an unreadable entry of unknown key is its only if it has its id)."""
    return TextKey(backbone, weights_hash, tuple(classes), tuple(TEMPLATE_SETS[set_name]), set_name)
