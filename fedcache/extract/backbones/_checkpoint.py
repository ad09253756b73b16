"""Reading weight files safely: safetensors, or torch.load with weights_only=True."""
from __future__ import annotations

from pathlib import Path

import torch

from fedcache.errors import WeightsNotFoundError

_WRAPPERS = ("state_dict", "model", "model_state_dict", "net", "encoder")
_PREFIXES = ("module.", "backbone.", "encoder.", "model.")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A flat name -> tensor dict from a checkpoint file, never unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise WeightsNotFoundError(f"checkpoint {path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path))
        else:
            _check_torch_file(path)
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except WeightsNotFoundError:
        raise
    except Exception as exc:
        raise WeightsNotFoundError(
            f"cannot read checkpoint {path}: {exc}. fedcache loads only tensors "
            "(torch.load weights_only=True, or .safetensors)"
        ) from exc
    for key in _WRAPPERS:  # training scripts often nest the weights one level down
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise WeightsNotFoundError(f"checkpoint {path} does not hold a state dict of tensors")
    return {_strip(k): v for k, v in sd.items()}


# What torch.save writes begins with: a zip archive (torch >= 1.6), or a pickle (the legacy format).
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def _check_torch_file(path: Path) -> None:
    """A file that is no checkpoint at all (a text file, a wrong path's image) is said to be one: torch.load's own
    words for it were "list index out of range" or "101"."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if not head.startswith(_TORCH_MAGIC):
        raise WeightsNotFoundError(
            f"{path} is not a checkpoint: torch.save writes a zip archive (or, before torch 1.6, a pickle), and this "
            f"file begins {head!r}; give a file torch.save or safetensors wrote (.safetensors)")


def _strip(name: str) -> str:
    for p in _PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name
