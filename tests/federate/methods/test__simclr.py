"""The local SimCLR the self-supervised methods share (fedcache/federate/methods/_simclr.py): the NT-Xent and
the official cross-view losses by hand, and that each local step contrasts two different cached views."""
from __future__ import annotations

import math

import pytest
import torch

from fedcache.federate.methods._simclr import cross_view, nt_xent


def tagged_views(p: int, n_views: int, dim: int) -> torch.Tensor:
    """(P, V, D) views whose last coordinate is the view's index, so a spy can tell which view it sees."""
    v = torch.randn(p, n_views, dim, generator=torch.Generator().manual_seed(0))
    v[..., -1] = torch.arange(n_views, dtype=v.dtype)
    return v


def test_nt_xent_matches_hand_computation_and_ignores_padding():
    z1 = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    z2 = torch.tensor([[[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]])
    mask = torch.tensor([[True, True, False]])
    got = nt_xent(z1, z2, mask, t=1.0)
    # Real views a0=(1,0), a1=(0,1), b0=(1,0), b1=(.6,.8); each is contrasted with the other three.
    v = {"a0": torch.tensor([1.0, 0]), "a1": torch.tensor([0.0, 1]), "b0": torch.tensor([1.0, 0]), "b1": torch.tensor([0.6, 0.8])}
    pos = {"a0": "b0", "a1": "b1", "b0": "a0", "b1": "a1"}
    losses = []
    for i, vi in v.items():
        others = [torch.exp(vi @ vj) for j, vj in v.items() if j != i]
        losses.append(-math.log(torch.exp(vi @ v[pos[i]]) / sum(others)))
    torch.testing.assert_close(got, torch.tensor([sum(losses) / 4]))


def test_cross_view_loss_matches_hand_computation_and_ignores_padding():
    z1 = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    z2 = torch.tensor([[[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    # Row 0: logits (z1_0 . z2_0, z1_0 . z2_1) = (0.6, 0) / t, positive first; row 1: (0.8, 1), positive second.
    t = 0.5
    l0 = -math.log(math.exp(0.6 / t) / (math.exp(0.6 / t) + 1))
    l1 = -math.log(math.exp(1 / t) / (math.exp(0.8 / t) + math.exp(1 / t)))
    torch.testing.assert_close(cross_view(z1, z2, mask, t), torch.tensor([(l0 + l1) / 2]))


def test_local_simclr_contrasts_two_different_views(monkeypatch):
    """Each local step embeds two different cached views of the same rows (Eq. 3's positive pair)."""
    import fedcache.federate.methods._simclr as simclr
    from tests.federate.conftest import synthetic
    from tests.federate.test_methods import make

    data = synthetic(n_clients=2, per_client=16, n_classes=3, dim=6)
    data.views = tagged_views(len(data.x_train), 3, 6)
    seen = []
    real = simclr.embed
    monkeypatch.setattr(simclr, "embed", lambda p, x: seen.append(set(x[..., -1].flatten().tolist())) or real(p, x))
    m = make("fedavg-ssl", data, hidden=4, out=3, probe_rows=0)
    m.local_update(0, [0, 1], m.init_server(), {})
    assert seen and len(seen) % 2 == 0
    pairs = list(zip(seen[::2], seen[1::2]))
    assert all(len(a) == 1 and len(b) == 1 and a != b for a, b in pairs)
    assert set().union(*seen) == {0.0, 1.0, 2.0}  # consecutive pairs cycle through every view


@pytest.mark.parametrize("name", ["flesd", "fedavg-ssl", "fedprox-ssl", "min-local"])
def test_a_head_the_encoder_methods_do_not_read_is_refused(name):
    """They train an encoder of their own: --head mlp was accepted, recorded in config.json and never run."""
    from fedcache.errors import ConfigError
    from fedcache.spec import RunSpec

    with pytest.raises(ConfigError, match=f"{name} runs with the linear head only, not 'mlp'"):
        RunSpec.of(store="s.zarr", dataset="d", backbones=["b"], method=name, head="mlp")
    with pytest.raises(ConfigError, match="linear head only"):
        RunSpec.of(store="s.zarr", dataset="d", backbones=["b"], method=name, settings=["head=mlp"])
