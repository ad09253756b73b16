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


@pytest.mark.slow
def test_making_every_clients_draw_points_keeps_no_heads_in_memory():
    """Skipping a block's draws made a tensor a block, which the allocator kept once a freed 16 MB tensor had raised
    its mmap threshold (as any earlier step of a run may): every client's heads stayed in the process."""
    import subprocess
    import sys

    code = ("import torch; from fedcache.heads.mlp import MLPHead; from fedcache.heads.draws import ClientHeads\n"
            "anon = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('RssAnon')).split()[1]) // 1024\n"
            "torch.set_num_threads(1); x = torch.empty(4 << 20).fill_(1.0); del x; before = anon()\n"
            "ClientHeads(MLPHead(512, 100).layout(), 5000, torch.Generator().manual_seed(0)); print(anon() - before)")
    grown_mb = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grown_mb < 250  # every client's first layer is 2,500 MB


def test_the_draws_past_each_block_go_into_one_buffer_per_parameter(monkeypatch):
    """The mechanism of the test above, which the allocator's mood made pass with the old code in 2 runs of 6."""
    from fedcache.heads.mlp import MLPHead

    buffers, real = [], torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, out=None, **k: buffers.append(out) or real(*a, out=out, **k))
    layout = MLPHead(32, 10).layout()
    ClientHeads(layout, 100, torch.Generator().manual_seed(0))
    assert len(buffers) == 7 * sum(1 for p in layout if p.fan_in)  # 100 clients: 7 blocks of 16
    assert None not in buffers
    for first in range(0, len(buffers), 7):  # a parameter's seven blocks
        assert len({b.untyped_storage().data_ptr() for b in buffers[first: first + 7]}) == 1

