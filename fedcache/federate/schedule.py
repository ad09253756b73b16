"""The schedule of a run: rounds, participation, local training and evaluation cadence (the run spec's
``schedule`` section; the round driver and every method read it)."""
from __future__ import annotations

from dataclasses import dataclass

from fedcache.config import Checked, NonNegativeInt, PositiveInt, Share, opt


@dataclass(frozen=True)
class Schedule(Checked):
    section = "schedule"

    rounds: PositiveInt = opt(50, help="Federated rounds.")
    fraction: Share = opt(1.0, help="Fraction of clients sampled each round.")
    local_epochs: PositiveInt = opt(1, help="Local epochs per round (each client, each round).")
    batch_size: PositiveInt = opt(32, help="Local mini-batch size.")
    eval_every: PositiveInt = opt(1, help="Evaluate every k rounds (and after the last).")
    seed: NonNegativeInt = opt(0, axis=False, help="Seed of the partition, initialisation, sampling and batches.")
    # Spare training rows (no client trains on them, drawn with each client's class and domain mix)
    # instead of the test split: for choosing hyperparameters without touching the test set.
    validation: bool = opt(False, help="Score on spare training rows instead of the test split (for tuning).")
