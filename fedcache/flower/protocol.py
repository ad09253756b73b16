"""What crosses the network: tensors as Flower ArrayRecords (numpy .npy bytes, never pickled), the
rest as ConfigRecords / MetricRecords of plain numbers."""
from __future__ import annotations

import torch
from flwr.app import ArrayRecord

STATE = "fedcache.state"  # the key of a node's personal state in its Flower context


def to_record(params: dict[str, torch.Tensor]) -> ArrayRecord:
    # contiguous copies: a stacked slice may be a view into a larger tensor
    return ArrayRecord({n: t.detach().contiguous() for n, t in params.items()})


def from_record(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {n: torch.from_numpy(a.numpy().copy()) for n, a in record.items()}
