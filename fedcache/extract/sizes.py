"""The size an extraction resizes images to: one rule for the runner, which keys entries by it, and for what
reads those keys back (``reproduce``'s check of a store, ``store.lookup``'s hints). No torch: a spec is enough."""
from __future__ import annotations


def image_size(given: int | None, dataset, backbone) -> int:
    """``given`` (``--image-size``; None: not given), else ``dataset``'s default size, else ``backbone``'s input size.
    A backbone with a fixed input size (ViTs, CLIP) takes its own only: neither applies to it (its positional
    embeddings would not match). ``dataset``: its ``DatasetSpec`` or loaded ``Dataset`` (both say
    ``default_image_size``), or None where it is unknown; ``backbone``: its ``BackboneSpec``."""
    if backbone.fixed_size:
        return backbone.input_size
    return given or getattr(dataset, "default_image_size", None) or backbone.input_size
