"""Optimizer settings and the named presets, without torch: the CLI's help texts read them at start-up."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedcache.errors import ConfigError
from fedcache.federate.settings import NonNegative, Positive, UnitOpen, check_fields


@dataclass(frozen=True)
class OptimConfig:
    optimizer: Literal["sgd", "adam"] = "adam"
    lr: Positive = 1e-3
    momentum: UnitOpen = 0.9  # SGD only
    weight_decay: NonNegative = 1e-4
    betas: tuple[UnitOpen, UnitOpen] = (0.9, 0.999)  # Adam only
    eps: Positive = 1e-8  # Adam only

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "adam"):
            raise ConfigError(f"optimizer must be sgd or adam, got {self.optimizer!r}")
        check_fields(self)
        if len(self.betas) != 2:  # their range is the type's, checked above
            raise ConfigError(f"betas must be two numbers in [0, 1), e.g. betas=0.9,0.999 (got {self.betas})")

    def ignored(self) -> dict[str, str]:
        """Fields this optimizer does not read (``--set`` refuses them rather than dropping them)."""
        if self.optimizer == "adam":
            return {"momentum": "Adam has no momentum term; its betas play that role, or set optim.optimizer=sgd"}
        why = "an Adam setting; the optimizer is sgd (set optim.optimizer=adam to use it)"
        return {"betas": why, "eps": why}


# Optimizer presets. "default" is every method's unless the method is compared in a paper with another
# setting; "fedpcl" names the same setting after the code it comes from (FedPCL's official code).
_ADAM_1E3 = OptimConfig("adam", 1e-3, 0.9, 1e-4)
PRESETS = {
    "default": _ADAM_1E3,  # Adam 1e-3, wd 1e-4
    "fedpcl": _ADAM_1E3,  # FedPCL's official code: Adam 1e-3, wd 1e-4 (every method of its comparison)
    "flesd": OptimConfig("adam", 1e-3, 0.9, 1e-6),  # FLESD's official code: Adam 1e-3, wd 1e-6 (local SimCLR)
    "fst-cbdg": OptimConfig("sgd", 1e-2, 0.9, 1e-5),  # FST-CBDG paper: SGD 0.01, momentum 0.9, wd 1e-5
    "promptfl": OptimConfig("sgd", 1e-3, 0.9, 5e-4),  # PromptFL's code: SGD 0.001 (CoOp's momentum 0.9, wd 5e-4)
    "tpfl": OptimConfig("adam", 1e-3, 0.9, 5e-4),  # TPFL paper: Adam 1e-3; wd unstated, CoOp's 5e-4
    # pFedMe's w step and Per-FedAvg's outer step are plain SGD in their papers and official code:
    # pFedMe eta = 0.005 (--learning_rate), Per-FedAvg beta = 0.001 (--beta; the pFedMe repository's commands).
    "pfedme": OptimConfig("sgd", 5e-3, 0.0, 0.0),
    "perfedavg": OptimConfig("sgd", 1e-3, 0.0, 0.0),
}


def describe(cfg: OptimConfig) -> str:
    """A preset in a few words, for help texts: 'SGD 0.01, momentum 0.9, wd 1e-05'."""
    extra = f", momentum {cfg.momentum:g}" if cfg.optimizer == "sgd" else ""
    return f"{cfg.optimizer.upper() if cfg.optimizer == 'sgd' else 'Adam'} {cfg.lr:g}{extra}, wd {cfg.weight_decay:g}"
