"""FST-CBDG's L_tSamp weighting (Eq. 6 per step) against hand values, and that the setting reaches training."""
from __future__ import annotations

import math

import pytest
import torch

from fedcache.federate.methods import _fst_cbdg as cbdg
from fedcache.presets import PRESETS

L2, LE, LE2 = math.log(2), math.log(1 + math.e), math.log(1 + math.exp(-2))


@pytest.mark.parametrize("weighting, want", [
    ("epoch", [(L2 + LE) / (0.25 * 4), LE2 / (0.25 * 2), 0.0]),  # / (share * n): the epoch's mean
    ("sum", [(L2 + LE) / 0.25, LE2 / 0.25, 0.0]),  # / share: the epoch's sum, as Eq. 6 is written
    ("step", [(L2 + LE) / 2, LE2 / 1, 0.0]),  # / the step's own draws
])
def test_tsamp_weighting_matches_hand_values(weighting, want):
    logits = torch.tensor([[[0.0, 0.0], [1.0, 0.0]], [[2.0, 0.0], [5.0, 5.0]], [[1.0, 1.0], [1.0, 1.0]]])
    y = torch.tensor([[0, 1], [0, 1], [0, 0]])
    mask = torch.tensor([[True, True], [True, False], [False, False]])  # client 2 drew nothing this step
    n = torch.tensor([[3, 1], [0, 2], [4, 4]])  # the epoch's Eq. 7 counts, sum 4, 2, 8
    share = torch.tensor([0.25, 0.25, 0.1])
    torch.testing.assert_close(cbdg.tsamp_loss(logits, y, mask, n, share, weighting), torch.tensor(want))


def test_tsamp_weight_reaches_training():
    from tests.federate.test_fst_cbdg import biased_problem, make
    from fedcache.federate.inprocess import RunConfig, run

    data = biased_problem(n_clients=4, per_client=60)
    heads = {w: run(make("fst-cbdg", data, rounds=1, tsamp_weight=w), RunConfig(rounds=1)).server["weight"]
             for w in ("epoch", "sum")}
    assert not torch.equal(heads["epoch"], heads["sum"])


def test_paper_presets_use_the_cited_batch_size():
    """The paper follows Lee et al. (2022), whose configuration trains with batch 50."""
    for name in ("fst-cbdg-table1", "fst-cbdg-table2"):
        assert all(e.sweep["batch_size"] == 50 for e in PRESETS.get(name).experiments)


def test_paper_presets_train_every_method_with_the_papers_sgd():
    """Sec. 4.1: SGD lr 0.01, momentum 0.9, weight decay 1e-5 for the linear classifier, baselines included."""
    from tests.resolve import resolve_settings

    for name in ("fst-cbdg-table1", "fst-cbdg-table2"):
        for e in PRESETS.get(name).experiments:
            for m in e.methods:
                o = resolve_settings(m, [], preset=e.sweep["preset"]).optim
                assert (o.optimizer, o.lr, o.momentum, o.weight_decay) == ("sgd", 0.01, 0.9, 1e-5), (name, m)


def test_paper_presets_start_the_supervised_baselines_from_the_zero_shot_classifier(tmp_path):
    """Figure 3: FedAvg's and FedNTD's curves start at the zero-shot accuracy. Their cells resolve to init=text;
    the other methods' grids carry no such setting, and every paper number refers to the grid its method runs in."""
    from fedcache.grids import GridSpec, cells, train_config

    for name in ("fst-cbdg-table1", "fst-cbdg-table2"):
        p = PRESETS.get(name)
        where = {e.key: e.methods for e in p.experiments}
        assert all(n.method in where[n.experiment] for n in p.paper)
        for e in p.experiments:
            spec = GridSpec(tmp_path, e.store_dataset, list(e.backbones), list(e.methods), tmp_path, list(e.seeds), dict(e.sweep))
            for cell in cells(spec):
                params = train_config(spec, cell, None).method.params
                if cell.method in ("fedavg", "fedntd"):
                    assert params.init == "text", (name, e.key)
                else:
                    assert "init" not in e.sweep, (name, e.key)
        assert {m for e in p.experiments for m in e.methods if "init" in e.sweep} == {"fedavg", "fedntd"}
