"""Backbones timm does not carry, from torchvision; and FedPCL's domain-specific ResNet18s."""
from __future__ import annotations

import torch
from torch import nn

from fedcache.errors import WeightsNotFoundError
from fedcache.extract.backbones._checkpoint import read_state_dict
from fedcache.extract.backbones.base import BACKBONES, LOADERS, BackboneSpec, LoadedBackbone, LoadRequest, hash_state, pass_weights

BACKBONES.add("alexnet-imagenet", BackboneSpec(
    name="alexnet-imagenet", source="torchvision", arch="alexnet", weights="IMAGENET1K_V1", embed_dim=4096,
    input_size=224, interpolation="bilinear",
    weights_help="downloaded by torchvision on first use (AlexNet_Weights.IMAGENET1K_V1)",
    description="torchvision AlexNet, ImageNet; penultimate 4096-d layer",
))

# FedPCL's backbones: ResNet18s each trained on one Meta-Dataset domain, run at 64x64.
_META_DATASET_HELP = (
    "a ResNet18 trained on Meta-Dataset's {domain} domain (e.g. the single-domain backbones released with "
    "SUR / URL, which FedPCL uses); pass --weights {name}=PATH to a .pth/.safetensors state dict "
    "in torchvision's resnet18 naming (an 'fc' layer, if present, is ignored)"
)
for _domain, _name in (("QuickDraw", "resnet18-quickdraw"), ("Aircraft", "resnet18-aircraft"), ("CU-Birds", "resnet18-birds")):
    BACKBONES.add(_name, BackboneSpec(
        name=_name, source="checkpoint", arch="resnet18", weights="user-checkpoint", embed_dim=512, input_size=64,
        interpolation="bilinear", weights_help=_META_DATASET_HELP.format(domain=_domain, name=_name),
        description=f"ResNet18 trained on Meta-Dataset {_domain} (FedPCL); needs --weights",
    ))


class _AlexNetFeatures(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.features, self.avgpool = net.features, net.avgpool
        self.head = nn.Sequential(*list(net.classifier.children())[:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.avgpool(self.features(x)), 1))


# How to cut each torchvision classifier down to its embedding layer.
_FEATURE_HEADS = {"alexnet": _AlexNetFeatures}


@LOADERS.register("torchvision")
def load_torchvision(req: LoadRequest) -> LoadedBackbone:
    import torchvision  # imported on use: the library costs seconds to import and most commands never need it

    spec = req.spec
    net = torchvision.models.get_model(spec.arch, weights=None)
    if req.checkpoint is not None:
        net.load_state_dict(read_state_dict(req.checkpoint))
    elif not spec.random_weights:
        try:
            net = torchvision.models.get_model(spec.arch, weights=spec.weights)
        except Exception as exc:
            raise WeightsNotFoundError(
                f"could not download the {spec.weights} weights of {spec.name}: {exc}. "
                f"Download them elsewhere and pass {pass_weights(spec.name)}"
            ) from exc
    model = _FEATURE_HEADS[spec.arch](net)
    return LoadedBackbone(spec, model, hash_state(model), embed_dim=spec.embed_dim)


@LOADERS.register("checkpoint")
def load_user_resnet18(req: LoadRequest) -> LoadedBackbone:
    import torchvision  # imported on use: the library costs seconds to import and most commands never need it

    spec = req.spec
    net = torchvision.models.resnet18(weights=None)
    net.fc = nn.Identity()
    if req.checkpoint is None and not spec.random_weights:
        # The help, as `fedcache backbones` shows it, says the flag: a Python caller passes the keyword.
        help_ = spec.weights_help.replace(f"--weights {spec.name}=PATH", pass_weights(spec.name))
        raise WeightsNotFoundError(f"{spec.name} needs a checkpoint: {help_}")
    if req.checkpoint is not None:
        sd = {k: v for k, v in read_state_dict(req.checkpoint).items() if not k.startswith("fc.")}
        missing, unexpected = net.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise WeightsNotFoundError(
                f"{req.checkpoint} is not a torchvision-style resnet18 state dict: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
    return LoadedBackbone(spec, net, hash_state(net), embed_dim=512)
