"""Local training reads a memory-mapped store file through its working set: the same numbers, a copy of the
rows it trains on (``local.working_set``, ``FederatedData.train_features``)."""
from __future__ import annotations

import numpy as np
import torch

from fedcache.federate.data import features_tensor
from fedcache.federate.local import gather_rows, step_plan, train, working_set
from fedcache.federate.optim import OptimConfig
from tests.store.test_mapping import row_file


def test_training_on_a_mapped_table_is_training_on_its_copy(tmp_path):
    mapped = row_file(tmp_path / "a", rows=2000, dim=16)
    x_mapped, x_copy = features_tensor(mapped), torch.from_numpy(np.array(mapped))
    y = torch.from_numpy(np.random.default_rng(4).integers(0, 5, 2000))
    rows = [np.sort(np.random.default_rng(k).choice(2000, 37 + k, replace=False)) for k in range(3)]
    plan = step_plan(rows, 8, 2, seed=0, rnd=1, clients=[0, 1, 2])
    xs, ys, local = working_set(x_mapped, y, plan)
    assert len(xs) == len(np.unique(plan[plan >= 0])) + 1 < 2000  # and row 0, which padding reads
    assert torch.equal(xs[torch.from_numpy(local).clamp_min(0)], x_copy[torch.from_numpy(plan).clamp_min(0)])
    assert working_set(x_copy, y, plan)[0] is x_copy

    def loss(p, xb, yb, mask, info):
        logits = torch.einsum("kbd,kcd->kbc", xb, p["w"])
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view(yb.shape)
        return (ce * mask).sum(1) / mask.sum(1)

    start = {"w": torch.zeros(3, 5, 16)}
    opt = OptimConfig(lr=0.1)
    a, b = (train(start, ("w",), loss, x, y, plan, opt)["w"] for x in (x_mapped, x_copy))
    assert torch.equal(a, b)


def test_gathered_rows_are_indexed_rows_in_any_order_and_shape(tmp_path):
    mapped = row_file(tmp_path / "a", rows=3000, dim=8)
    x = features_tensor(mapped)
    idx = torch.from_numpy(np.random.default_rng(5).integers(0, 3000, (4, 7, 5)))  # repeats, any order
    assert torch.equal(gather_rows(x, idx), x[idx])
    assert torch.equal(gather_rows(x, idx[:0]), x[idx[:0]])


def test_other_indexes_are_what_indexing_gives(tmp_path):
    x = features_tensor(row_file(tmp_path / "a", rows=500, dim=4))
    for idx in (torch.tensor([-1, 3]), torch.tensor([4, 2], dtype=torch.int32), torch.arange(500) % 3 == 0):
        assert torch.equal(gather_rows(x, idx), x[idx])


def test_a_plan_reading_most_of_a_mapped_table_reads_it_in_place(tmp_path):
    x = features_tensor(row_file(tmp_path / "a", rows=400, dim=4))
    y = torch.zeros(400, dtype=torch.long)
    plan = step_plan([np.arange(300)], 8, 1, seed=0, rnd=0, clients=[0])
    assert working_set(x, y, plan)[0] is x  # a copy of most rows would cost more than the shared pages
