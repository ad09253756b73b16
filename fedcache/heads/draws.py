"""Any clients' rows of ``head.init(n, gen)``, without every client's head in memory.

Methods that give each client its own random head (fedpcl, fedproto's default) draw all N heads from one
generator: each drawn tensor for every client in turn, float by float (``torch.rand`` on the CPU takes one value of
the generator per element, in order). Client k's part of a tensor is therefore the draws that follow the tensor's
start by k times its size. Keeping the generator's state at every ``BLOCK``-th client of every drawn tensor
(5 KB each: 12 MB for 10,000 clients of the mlp head, whose heads take 1.4 GB on 128-dimensional features of
10 classes) lets a block be drawn again when one of its clients is asked for, the very floats
``head.init(n, gen)`` gives it.
tests/heads/test_draws.py holds every head's rows to ``head.init``.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch

from fedcache.heads.base import Head, Param, Params, init_params

BLOCK = 16  # clients drawn again together: a round's few clients cost 16 heads' draws each


class ClientHeads:
    """``head.init(n, gen())``'s rows for the clients asked, made when asked."""

    def __init__(self, layout: list[Param], n: int, gen: torch.Generator) -> None:
        self.layout, self.n = layout, n
        self.states: dict[str, list[torch.Tensor]] = {}
        for p in layout:
            if not p.fan_in:
                continue
            size = torch.Size(p.shape).numel()
            self.states[p.name] = []
            # Past each block's draws into one buffer: a new tensor a block left about every client's heads in the
            # process in half the runs (+2.5 GB at 5,000 clients of 512-d), freed but kept by the allocator.
            skipped = torch.empty(min(BLOCK, n) * size, device=gen.device)
            for lo in range(0, n, BLOCK):
                self.states[p.name].append(gen.get_state())
                torch.rand(min(BLOCK, n - lo) * size, generator=gen, out=skipped[: min(BLOCK, n - lo) * size])

    @classmethod
    def of(cls, head: Head, n: int, gen: Callable[[], torch.Generator]) -> "ClientHeads | None":
        """None for a head that does not list its parameters (its ``init`` is then the only way to its draws)."""
        layout = getattr(head, "layout", None)
        return cls(layout(), n, gen()) if layout is not None else None

    def rows(self, clients: Iterable[int]) -> Params:
        clients = np.asarray([int(c) for c in clients], dtype=np.int64)
        return {p.name: self._rows(p, clients) if p.name in self.states
                else torch.full((len(clients), *p.shape), p.fill) for p in self.layout}

    def _rows(self, p: Param, clients: np.ndarray) -> torch.Tensor:
        blocks = np.unique(clients // BLOCK)
        # A whole block in order (evaluation reads every client a block at a time) is the drawn tensor itself: with each
        # head copied out of it (torch.stack), an evaluation's draws took 1.6-1.8x as long (benchmarks/personal_eval.py).
        first = int(blocks[0]) * BLOCK if len(blocks) == 1 else 0
        if len(blocks) == 1 and np.array_equal(clients, np.arange(first, min(self.n, first + BLOCK))):
            return self._block(p, int(blocks[0]))
        out = torch.empty((len(clients), *p.shape))
        for b in blocks.tolist():  # a block drawn, its clients' rows copied out, then freed
            mine = np.flatnonzero(clients // BLOCK == b)
            drawn = self._block(p, b)
            out[torch.from_numpy(mine).to(out.device)] = drawn[torch.from_numpy(clients[mine] % BLOCK).to(drawn.device)]
        return out

    def _block(self, p: Param, b: int) -> torch.Tensor:
        gen = torch.Generator()
        gen.set_state(self.states[p.name][b])
        return init_params([p], min(BLOCK, self.n - b * BLOCK), gen)[p.name]  # as head.init draws it
