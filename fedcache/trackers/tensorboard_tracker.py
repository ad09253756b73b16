"""TensorBoard event files: one run directory per run under ``<directory>/tensorboard``."""
from __future__ import annotations

from fedcache.trackers.base import ROUND_KEYS, Tracker, numbers, register


@register
class TensorBoard(Tracker):
    name, extra = "tensorboard", "tensorboard"

    def __init__(self, directory, run_name, params) -> None:
        super().__init__(directory, run_name, params)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise self.missing(exc) from None
        self.writer = SummaryWriter(log_dir=str(directory / "tensorboard" / run_name))
        self.writer.add_text("settings", "\n".join(f"    {k} = {v}" for k, v in sorted(params.items())))

    def log(self, step: int, metrics: dict) -> None:
        for key, value in numbers(metrics, ROUND_KEYS).items():
            self.writer.add_scalar(key, value, step)

    def close(self, summary: dict) -> None:
        final = {f"final/{k}": v for k, v in numbers(summary).items()}
        self.writer.add_hparams(self.params, final, run_name=".")
        self.writer.close()

    def fail(self) -> None:
        self.writer.close()
