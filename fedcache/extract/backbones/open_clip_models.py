"""CLIP backbones from open_clip: image embeddings plus class-text embeddings."""
from __future__ import annotations

import logging
import posixpath
from typing import Sequence

import torch
from torch import nn

from fedcache.errors import WeightsNotFoundError
from fedcache.extract.backbones._checkpoint import read_state_dict
from fedcache.extract.backbones._hub import cached, hub_page, refuse_if_unreachable, without_full_stop
from fedcache.extract.backbones.base import (
    BACKBONES, CLIP_MEAN, CLIP_STD, LOADERS, TEXT_PREFIXES, BackboneSpec, LoadedBackbone, LoadRequest, hash_state,
    pass_weights, seeded_init,
)

log = logging.getLogger(__name__)

# open_clip's file names on the Hub, in the order it asks for them
_HUB_FILES = ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
_HELP = "open_clip pretrained={tag}, downloaded on first use (or --weights {name}=PATH)"

# name, open_clip arch, pretrained tag, embed dim
_CLIP = (
    ("clip-rn50", "RN50", "openai", 1024),
    ("clip-rn101", "RN101", "openai", 512),
    ("clip-vit-b32", "ViT-B-32", "openai", 512),
    ("clip-vit-b16", "ViT-B-16", "openai", 512),
    ("clip-vit-l14", "ViT-L-14", "openai", 768),
)
for _name, _arch, _tag, _dim in _CLIP:
    BACKBONES.add(_name, BackboneSpec(
        name=_name, source="open-clip", arch=_arch, weights=_tag, embed_dim=_dim, input_size=224,
        mean=CLIP_MEAN, std=CLIP_STD, interpolation="bicubic", has_text=True, fixed_size=True,
        weights_help=_HELP.format(tag=_tag, name=_name), description=f"CLIP {_arch} ({_tag})",
        options={"quick_gelu": True},  # as every OpenAI CLIP was trained (open_clip's pretrained config says so too)
    ))

# A CLIP small enough for tests: real open_clip code paths (BPE tokenizer, text tower), random weights.
TINY_CLIP_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
BACKBONES.add("tiny-clip-random", BackboneSpec(
    name="tiny-clip-random", source="open-clip", arch="tiny", weights="random", embed_dim=32, input_size=32,
    mean=CLIP_MEAN, std=CLIP_STD, random_weights=True, has_text=True, fixed_size=True,
    weights_help="random init (seed 0), for tests", description="tiny open_clip CLIP with a text tower, random",
))


def _open_clip_spec(rest: str) -> BackboneSpec:
    """``open_clip:<arch>/<tag>``, e.g. ``open_clip:ViT-B-32/laion2b_s34b_b79k``."""
    import open_clip  # imported on use: the library costs seconds to import and most commands never need it

    arch, _, tag = rest.partition("/")
    cfg = open_clip.get_model_config(arch)
    if cfg is None:
        raise WeightsNotFoundError(f"open_clip has no architecture {arch!r}; see open_clip.list_models()")
    size = cfg["vision_cfg"].get("image_size", 224)
    return BackboneSpec(
        name=f"open_clip:{rest}", source="open-clip", arch=arch, weights=tag or "openai", embed_dim=cfg["embed_dim"],
        input_size=size if isinstance(size, int) else size[0], mean=CLIP_MEAN, std=CLIP_STD, has_text=True, fixed_size=True,
        weights_help=_HELP.format(tag=tag or "openai", name=f"open_clip:{rest}"), description=f"open_clip {arch}/{tag}",
        options={"quick_gelu": bool((open_clip.get_pretrained_cfg(arch, tag or "openai") or {}).get("quick_gelu"))},
    )


BACKBONES.add_prefix("open_clip", _open_clip_spec, "open_clip:<arch>/<pretrained tag>")
TEXT_PREFIXES.add("open_clip")


class _ImageTower(nn.Module):
    def __init__(self, clip: nn.Module) -> None:
        super().__init__()
        self.clip = clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_image(x)


@LOADERS.register("open-clip")
def load_open_clip(req: LoadRequest) -> LoadedBackbone:
    import open_clip  # imported on use: the library costs seconds to import and most commands never need it

    spec = req.spec
    model = _build(spec, req)
    model.eval().requires_grad_(False)
    tokenizer = open_clip.get_tokenizer("RN50" if spec.arch == "tiny" else spec.arch)

    def encode_text(texts: Sequence[str]) -> torch.Tensor:
        device = next(model.parameters()).device
        with torch.inference_mode():
            return model.encode_text(tokenizer(list(texts)).to(device))

    tower = _ImageTower(model)
    return LoadedBackbone(spec, tower, hash_state(model, _activation(model, spec)), encode_text=encode_text,
                          embed_dim=_embed_dim(model, spec), model=model, tokenize=tokenizer)


def _build(spec: BackboneSpec, req: LoadRequest) -> nn.Module:
    import open_clip  # imported on use: the library costs seconds to import and most commands never need it

    if spec.random_weights or req.checkpoint is not None:
        with seeded_init(0):
            model = (open_clip.CLIP(**TINY_CLIP_CFG) if spec.arch == "tiny" else
                     open_clip.create_model(spec.arch, pretrained=None, force_quick_gelu=_quick_gelu(spec)))
        if req.checkpoint is not None:
            model.load_state_dict(read_state_dict(req.checkpoint))
        return model
    local = _in_hub_cache(spec)
    try:
        # A cached file is given as a path (the Hub is not asked); the tag's QuickGELU is then forced by hand.
        return open_clip.create_model(spec.arch, pretrained=local or spec.weights, force_quick_gelu=_quick_gelu(spec))
    except Exception as exc:
        raise WeightsNotFoundError(
            f"could not get open_clip weights {spec.arch}/{spec.weights}: {without_full_stop(exc)}. {_fix(spec)}"
        ) from exc


def _quick_gelu(spec: BackboneSpec) -> bool:
    """Whether the weights were trained with QuickGELU (all of OpenAI's CLIPs). Since open_clip's PR #970
    (October 2024) its plain architectures (RN50, ViT-B-32, ...) are built with nn.GELU even for
    pretrained="openai", with a warning only: the text tower (and a ViT's image tower) then runs an activation
    its weights never saw, and the embeddings move by several percent. The spec says it: a checkpoint or random
    weights keep the architecture, not the tag."""
    return bool(spec.options.get("quick_gelu"))


def _in_hub_cache(spec: BackboneSpec) -> str | None:
    """The tag's weights where the Hub's cache holds them; where it does not, a Hub that cannot be reached is
    said at once, not after huggingface_hub's retries."""
    import open_clip

    hub = (open_clip.get_pretrained_cfg(spec.arch, spec.weights) or {}).get("hf_hub", "")
    if not hub:
        return None  # from a URL, or no such tag: open_clip's own error is quick
    repo_id, filename = posixpath.split(hub)  # "org/model/" names the repository alone
    local = cached(repo_id, _hub_files(filename))
    if local is None:
        refuse_if_unreachable(f"open_clip weights {spec.arch}/{spec.weights}",
                              _fix(spec, f" ({filename or _HUB_FILES[0]} of {hub_page(repo_id)})"))
    return local


def _hub_files(filename: str) -> list[str]:
    """The files of a tag's repository open_clip would load, in its order: a .safetensors beside a named .bin or
    .pth first (only where the repository's file is named is it looked for alone)."""
    if not filename or filename == _HUB_FILES[1]:
        return _HUB_FILES
    stem, suffix = posixpath.splitext(filename)
    return ([stem + ".safetensors"] if suffix in (".bin", ".pth") else []) + [filename]


def _fix(spec: BackboneSpec, which: str = "") -> str:
    return f"Without network access, download them{which} elsewhere and pass {pass_weights(spec.name)}"


def _activation(model: nn.Module, spec: BackboneSpec) -> str:
    """"quick_gelu" where the model runs QuickGELU that its architecture does not name: fedcache built those with
    nn.GELU before (open_clip's plain RN50, ViT-B-32, ... for OpenAI's weights), and those features are not these.
    A `-quickgelu` architecture always ran it: its features, and their key, are unchanged."""
    import open_clip
    from open_clip.transformer import QuickGELU

    named = spec.arch != "tiny" and bool((open_clip.get_model_config(spec.arch) or {}).get("quick_gelu"))
    return "quick_gelu" if not named and any(isinstance(m, QuickGELU) for m in model.modules()) else ""


def _embed_dim(model: nn.Module, spec: BackboneSpec) -> int:
    proj = getattr(model, "text_projection", None)
    return int(proj.shape[1]) if isinstance(proj, torch.Tensor) else spec.embed_dim
