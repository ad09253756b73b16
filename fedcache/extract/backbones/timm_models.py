"""ImageNet backbones from timm (and torchvision where timm lacks the model), plus ``timm:<name>``."""
from __future__ import annotations

import logging

import torch
from torch import nn

from fedcache.errors import WeightsNotFoundError
from fedcache.extract.backbones._checkpoint import read_state_dict
from fedcache.extract.backbones._hub import cached, hub_page, refuse_if_unreachable, without_full_stop
from fedcache.extract.backbones.base import BACKBONES, LOADERS, BackboneSpec, LoadedBackbone, LoadRequest, hash_state, pass_weights, seeded_init

log = logging.getLogger(__name__)

_HUB_FILES = ["model.safetensors", "pytorch_model.bin"]
_HUB_HELP = "downloaded by timm from the Hugging Face hub on first use ({})"

# name, timm model (with pretrained tag), embed dim, input size, interpolation
_TIMM = (
    ("resnet18-imagenet", "resnet18.tv_in1k", 512, 224, "bilinear"),
    ("resnet50-imagenet", "resnet50.tv_in1k", 2048, 224, "bilinear"),
    ("vit-tiny-imagenet", "vit_tiny_patch16_224.augreg_in21k_ft_in1k", 192, 224, "bicubic"),
    ("vit-small-imagenet", "vit_small_patch16_224.augreg_in21k_ft_in1k", 384, 224, "bicubic"),
    ("vit-base-imagenet", "vit_base_patch16_224.augreg_in21k_ft_in1k", 768, 224, "bicubic"),
    ("vgg11-imagenet", "vgg11.tv_in1k", 4096, 224, "bilinear"),
)
_VIT_MEAN = (0.5, 0.5, 0.5)

for _name, _arch, _dim, _size, _interp in _TIMM:
    _vit = _arch.startswith("vit")
    BACKBONES.add(_name, BackboneSpec(
        name=_name, source="timm", arch=_arch, weights=_arch.split(".", 1)[1], embed_dim=_dim, input_size=_size,
        interpolation=_interp, weights_help=_HUB_HELP.format(_arch), fixed_size=_vit,
        **({"mean": _VIT_MEAN, "std": _VIT_MEAN} if _vit else {}),
        description=f"timm {_arch}, ImageNet",
    ))

BACKBONES.add("tiny-timm-random", BackboneSpec(
    name="tiny-timm-random", source="timm", arch="test_resnet", weights="random", embed_dim=96, input_size=32,
    mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), random_weights=True,
    weights_help="random init (seed 0), for tests", description="timm test_resnet, tiny and random",
))


def _timm_spec(rest: str) -> BackboneSpec:
    """``timm:<model>[.<tag>]``: pretrained weights; the embedding size and preprocessing come from timm."""
    import timm  # imported on use: the library costs seconds to import and most commands never need it

    try:
        model = timm.create_model(rest, pretrained=False, num_classes=0)
    except Exception as exc:  # timm raises RuntimeError for unknown names
        raise WeightsNotFoundError(f"timm has no model {rest!r}: {exc}") from exc
    cfg = model.pretrained_cfg
    return BackboneSpec(
        name=f"timm:{rest}", source="timm", arch=rest, weights=cfg.get("tag") or "default", embed_dim=model.num_features,
        input_size=int(cfg.get("input_size", (3, 224, 224))[-1]), mean=tuple(cfg.get("mean", (0.485, 0.456, 0.406))),
        std=tuple(cfg.get("std", (0.229, 0.224, 0.225))), interpolation=cfg.get("interpolation", "bicubic"),
        fixed_size=bool(cfg.get("fixed_input_size", False)), weights_help=_HUB_HELP.format(rest), description=f"timm {rest}",
    )


BACKBONES.add_prefix("timm", _timm_spec, "timm:<model>[.<tag>] (any timm model)")


@LOADERS.register("timm")
def load_timm(req: LoadRequest) -> LoadedBackbone:
    import timm  # imported on use: the library costs seconds to import and most commands never need it

    spec = req.spec
    if req.checkpoint is not None:
        model = timm.create_model(spec.arch, pretrained=False, num_classes=0)
        _load_partial(model, read_state_dict(req.checkpoint), req)
    elif spec.random_weights:
        with seeded_init(0):
            model = timm.create_model(spec.arch, pretrained=False, num_classes=0)
    else:
        model = _create_pretrained(spec)
    return LoadedBackbone(spec, model, hash_state(model), embed_dim=model.num_features)


def _create_pretrained(spec: BackboneSpec) -> nn.Module:
    import timm  # imported on use: the library costs seconds to import and most commands never need it
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(spec.arch)
    local = None
    if cfg is not None and cfg.hf_hub_id:  # others come from a URL (torch.hub's cache), whose failure is quick
        # in the order timm asks for them: safetensors first
        local = cached(cfg.hf_hub_id, [cfg.hf_hub_filename] if cfg.hf_hub_filename else _HUB_FILES)
        if local is None:
            refuse_if_unreachable(f"the pretrained weights of {spec.name} ({spec.arch})",
                                  _fix(spec, f" (from {hub_page(cfg.hf_hub_id)})"))
    try:
        # The hub's file is a state dict: custom_load (a ViT's JAX .npz reader) must not read it (timm < 1.0.30).
        overlay = {"file": local, "custom_load": False} if local else None
        return timm.create_model(spec.arch, pretrained=True, num_classes=0, pretrained_cfg_overlay=overlay)
    except Exception as exc:  # network errors come in many types
        raise WeightsNotFoundError(f"could not get the pretrained weights of {spec.name} ({spec.arch}) from the "
                                   f"hub: {without_full_stop(exc)}. {_fix(spec)}") from exc


def _fix(spec: BackboneSpec, where: str = "") -> str:
    return (f"Without network access, download them{where} elsewhere and pass {pass_weights(spec.name)} "
            "(a .safetensors or .pth state dict)")


def _load_partial(model: nn.Module, sd: dict[str, torch.Tensor], req: LoadRequest) -> None:
    """Load a user checkpoint, ignoring only classifier weights (the backbone has no head)."""
    missing, unexpected = model.load_state_dict(sd, strict=False)
    unexpected = [k for k in unexpected if k.split(".")[0] not in ("fc", "head", "classifier", "last_linear")]
    if missing or unexpected:
        raise WeightsNotFoundError(
            f"{req.checkpoint} does not fit {req.spec.arch}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
