"""Optimizer settings (the run spec's ``optim`` section) and the named presets they start from, without torch:
the CLI's help texts read them at start-up."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fedcache.config import Checked, Choices, NonNegative, Positive, UnitOpen, opt
from fedcache.wording import write_setting


def _optimizers() -> tuple[str, ...]:
    return tuple(OPTIMIZERS_KNOWN)


def _presets() -> tuple[str, ...]:
    return tuple(_PRESET_ROWS)


def _preset_help() -> str:
    return ("Optimizer defaults: " + "; ".join(f"{n} ({describe(c)})" for n, c in OPTIMIZER_PRESETS.items())
            + "; default: the method's (`fedcache methods`).")


@dataclass(frozen=True)
class OptimConfig(Checked):
    section = "optim"

    optimizer: Annotated[str, Choices(_optimizers)] = "adam"
    lr: Positive = 1e-3
    momentum: UnitOpen = 0.9  # SGD only
    weight_decay: NonNegative = 1e-4
    betas: tuple[UnitOpen, UnitOpen] = (0.9, 0.999)  # Adam only
    eps: Positive = 1e-8  # Adam only
    # The preset these settings start from (``--set`` changes them from there); None: given in Python.
    preset: Annotated[str, Choices(_presets)] | None = opt(None, help=_preset_help)

    def ignored(self) -> dict[str, str]:
        """Fields this optimizer does not read (``--set`` refuses them rather than dropping them), and why, with the
        setting that would read them written as its user gives settings."""
        unread = OPTIMIZERS_KNOWN[self.optimizer].unread.items()
        return {field: why(write_setting("optimizer", value=other)) for field, (why, other) in unread}


@dataclass(frozen=True)
class Optimizer:
    """An optimizer as the settings know it, without torch: its name in prose, and the fields it does not read (each
    with why, given how to choose the optimizer that reads it, and that optimizer). Its update rule is the entry of
    the same name in federate/optim.py's OPTIMIZERS, which imports torch; a test holds the two lists equal."""

    title: str
    unread: dict


def _adam_only(use: str) -> str:
    return f"an Adam setting; the optimizer is sgd ({use} to use it)"


OPTIMIZERS_KNOWN = {
    "sgd": Optimizer("SGD", {"betas": (_adam_only, "adam"), "eps": (_adam_only, "adam")}),
    "adam": Optimizer("Adam", {"momentum": (lambda use: f"Adam has no momentum term; its betas play that role, or {use}",
                                            "sgd")}),
}


# Optimizer presets: (optimizer, lr, momentum, weight decay). "default" is every method's unless the method is
# compared in a paper with another setting; "fedpcl" names the same setting after the code it comes from.
_PRESET_ROWS = {
    "default": ("adam", 1e-3, 0.9, 1e-4),  # Adam 1e-3, wd 1e-4
    "fedpcl": ("adam", 1e-3, 0.9, 1e-4),  # FedPCL's official code: Adam 1e-3, wd 1e-4 (every method of its comparison)
    "flesd": ("adam", 1e-3, 0.9, 1e-6),  # FLESD's official code: Adam 1e-3, wd 1e-6 (local SimCLR)
    "fst-cbdg": ("sgd", 1e-2, 0.9, 1e-5),  # FST-CBDG paper: SGD 0.01, momentum 0.9, wd 1e-5
    "promptfl": ("sgd", 1e-3, 0.9, 5e-4),  # PromptFL's code: SGD 0.001 (CoOp's momentum 0.9, wd 5e-4)
    "tpfl": ("adam", 1e-3, 0.9, 5e-4),  # TPFL paper: Adam 1e-3; wd unstated, CoOp's 5e-4
    # pFedMe's w step and Per-FedAvg's outer step are plain SGD in their papers and official code:
    # pFedMe eta = 0.005 (--learning_rate), Per-FedAvg beta = 0.001 (--beta; the pFedMe repository's commands).
    "pfedme": ("sgd", 5e-3, 0.0, 0.0),
    "perfedavg": ("sgd", 1e-3, 0.0, 0.0),
}
OPTIMIZER_PRESETS = {name: OptimConfig(*row, preset=name) for name, row in _PRESET_ROWS.items()}


def describe(cfg: OptimConfig) -> str:
    """A preset in a few words, for help texts: 'SGD 0.01, momentum 0.9, wd 1e-05'."""
    extra = f", momentum {cfg.momentum:g}" if "momentum" not in cfg.ignored() else ""
    return f"{OPTIMIZERS_KNOWN[cfg.optimizer].title} {cfg.lr:g}{extra}, wd {cfg.weight_decay:g}"
