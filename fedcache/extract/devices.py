"""Choosing the device and the precision of the forward pass."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch

from fedcache.config import DEVICES
from fedcache.errors import ConfigError, DeviceError
from fedcache.wording import named

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class DevicePlan:
    device: torch.device
    autocast_dtype: torch.dtype | None  # None: full float32
    channels_last: bool
    note: str = ""


def plan_device(request: str = "auto", precision: str = "auto") -> DevicePlan:
    """``auto`` uses CUDA when present, else Apple's GPU (MPS), else the CPU, and says which it took."""
    if not re.fullmatch(DEVICES, request):
        raise ConfigError(f"{named('--device', 'device')} must be auto, cpu, cuda, cuda:N or mps, got {request!r}")
    has_cuda, has_mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if request.startswith("cuda") and not has_cuda:
        raise DeviceError(f"{_device('cuda')} was requested but no CUDA GPU is visible; use {_device('cpu')} or "
                          f"{_device('auto')}")
    if request == "mps" and not has_mps:
        raise DeviceError(f"{_device('mps')} was requested but this torch sees no Apple GPU (MPS); use "
                          f"{_device('cpu')} or {_device('auto')}")
    note = ""
    if request == "auto":
        request, note = _auto(has_cuda, has_mps)
    device = torch.device(request)
    return DevicePlan(device, _autocast_dtype(device, precision), device.type == "cuda", note)


def _device(name: str) -> str:
    """A device as the caller chooses it: ``--device cpu``, or ``device='cpu'`` in a Python API call."""
    return named(f"--device {name}", f"device={name!r}")


def _auto(has_cuda: bool, has_mps: bool) -> tuple[str, str]:
    """The device ``auto`` takes, and the note that says which."""
    if has_cuda:
        return "cuda", "using the GPU"
    if has_mps:
        return "mps", "no CUDA GPU found; extracting on Apple's GPU (mps)"
    return "cpu", "no CUDA GPU found; extracting on the CPU"


def _autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    choices = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    if precision == "auto":
        if device.type != "cuda":
            # CPU autocast is slower than fp32 on most CPUs and changes the bits. On MPS autocast covers only some
            # operators (which, and in which dtypes, varies with torch and macOS) and changes the bits too; fp32 is
            # what the CPU computes, and --precision fp16 asks for the faster pass where wanted.
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision not in choices:
        raise ConfigError(f"{named('--precision', 'precision')} must be auto, fp32, bf16 or fp16, got {precision!r}")
    if device.type == "mps" and precision == "bf16":
        # Where a torch or macOS lacks bf16 autocast on MPS, torch warns and runs fp32, while the entry's key would
        # record bf16 features.
        said = named("--precision bf16 is not supported on MPS; use --precision fp16 or fp32",
                     "precision='bf16' is not supported on MPS; use precision='fp16' or 'fp32'")
        raise ConfigError(said)
    return choices[precision]
