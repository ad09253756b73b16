"""Any clients' initial heads made alone are the rows of every client's heads drawn at once."""
import pytest
import torch

import fedcache.heads.draws as draws
from fedcache.heads import HEADS, make_head
from fedcache.heads.draws import ClientHeads


@pytest.mark.parametrize("name", sorted(HEADS.names()))
@pytest.mark.parametrize("n", [1, 15, 16, 17, 40])
def test_rows_are_head_init_rows(name, n):
    head = make_head(name, 12, 5)
    every = head.init(n, torch.Generator().manual_seed(3))
    heads = ClientHeads.of(head, n, lambda: torch.Generator().manual_seed(3))
    for clients in ([0], [n - 1], list(range(n)), sorted({n // 2, 0, n - 1}, reverse=True), [n - 1, n - 1]):
        got = heads.rows(clients)
        assert list(got) == list(every)
        for key, t in every.items():
            torch.testing.assert_close(got[key], t[clients], rtol=0, atol=0)


def test_blocks_of_one_and_no_clients(monkeypatch):
    monkeypatch.setattr(draws, "BLOCK", 1)
    head = make_head("mlp", 6, 3)
    heads = ClientHeads.of(head, 5, lambda: torch.Generator().manual_seed(1))
    every = head.init(5, torch.Generator().manual_seed(1))
    torch.testing.assert_close(heads.rows([4, 2])["fc2.weight"], every["fc2.weight"][[4, 2]], rtol=0, atol=0)
    assert heads.rows([])["fc1.weight"].shape == (0, 6, 256)


def test_a_head_without_a_layout_has_no_client_heads():
    class Plain:
        def init(self, k, gen):
            return {"w": torch.rand(k, 2, generator=gen)}

    assert ClientHeads.of(Plain(), 4, torch.Generator) is None
