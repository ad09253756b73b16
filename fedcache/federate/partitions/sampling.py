"""Many draws without replacement at once, picking what ``rng.choice`` picks one draw at a time.

Local test sets draw a few rows from each (class, domain) cell of each client: 400,000 ``rng.choice`` calls for
10,000 clients of 40 cells, 2.8 s of a run's 3.7 s setup, nearly all of it the calls' own overhead. The rows a
local test set holds are part of every recorded number, so they must not change. numpy's ``Generator.choice``
(``replace=False``, no ``p``) draws Floyd's algorithm's values and then shuffles them, and the ranges of all
those bounded integers depend only on (population, size), never on what was drawn. So the draws of a whole run
of small requests come from one ``rng.integers`` call, which consumes the generator exactly as the calls would,
and the collisions Floyd's algorithm resolves are then resolved for all of them together, one position at a time.
Larger samples, whose work outweighs a call's overhead, are still ``rng.choice`` calls, made in their turn.
tests/federate/test_sampling.py holds this to ``rng.choice`` itself on thousands of requests.
"""

from __future__ import annotations

import numpy as np

# numpy's Generator.choice serves a population over 10,000 by a partial shuffle when the sample is over 1/50 of it
# (with shuffle=True): such requests are passed to rng.choice itself.
_TAIL_POPULATION, _TAIL_CUTOFF = 10_000, 50
# So are samples of 128 or more: numpy's own loop does their work faster than a walk over their positions here,
# and one call's overhead is small beside it. The draws of the requests between two such calls still come from one
# rng.integers call, and every drawn request of a chunk is resolved together.
_DIRECT_SIZE = 128
_DENSE_CELLS = 1 << 24  # a block's (requests x population) booleans of what is taken: 16 MB
_BLOCK, _MIN_BLOCK = 4096, 256
_CHUNK_DRAWS = 1 << 21  # draws made at once: their int64 arrays stay near 16 MB whatever the number of clients


def choice_sets(rng: np.random.Generator, pops, sizes) -> np.ndarray:
    """For each request ``i`` in order, the indices ``rng.choice(pops[i], sizes[i], replace=False)`` picks (as a
    set: in no particular order within the request), concatenated; ``rng`` is left as those calls leave it."""
    pops, sizes = np.asarray(pops, np.int64), np.asarray(sizes, np.int64)
    if np.any(sizes > pops) or np.any(sizes < 0):
        raise ValueError("every size must be between 0 and its population")
    starts = np.r_[0, np.cumsum(sizes)]
    out = np.empty(int(starts[-1]), np.int64)
    direct = ((pops > _TAIL_POPULATION) & (sizes > pops // _TAIL_CUTOFF)) | (sizes >= _DIRECT_SIZE)
    for lo, hi in _chunks(np.where(direct, 0, sizes), 0, len(pops)):
        _chunk(rng, pops[lo:hi], sizes[lo:hi], direct[lo:hi], out[starts[lo]:starts[hi]])
    return out


def _chunks(sizes: np.ndarray, first: int, stop: int) -> list[tuple[int, int]]:
    """Requests first..stop in runs of about ``_CHUNK_DRAWS`` draws (at least one request each)."""
    ends = np.cumsum(2 * sizes[first:stop])
    cuts = [first]
    while cuts[-1] < stop:
        done = ends[cuts[-1] - first - 1] if cuts[-1] > first else 0
        cuts.append(max(cuts[-1] + 1, first + int(np.searchsorted(ends, done + _CHUNK_DRAWS, side="right"))))
    return list(zip(cuts[:-1], cuts[1:]))


def _chunk(rng: np.random.Generator, pops: np.ndarray, sizes: np.ndarray, direct: np.ndarray, out: np.ndarray) -> None:
    """A chunk of requests in order: each direct one by rng.choice, the draws of each run of the others between them
    by one rng.integers call; then Floyd's picks of all the others at once."""
    drawn_pops, drawn_sizes = pops[~direct], sizes[~direct]
    highs, floyd = _ranges(drawn_pops, drawn_sizes)
    drawn = np.empty(len(highs), np.int64)
    # Where each direct request falls among the draws of the others: after every draw of the requests before it.
    lengths = drawn_sizes + np.maximum(drawn_sizes - 1, 0)
    before = np.r_[0, np.cumsum(lengths)][np.cumsum(~direct)[direct]]
    at, done = np.r_[0, np.cumsum(sizes)], 0
    for i, cut in zip(np.flatnonzero(direct).tolist(), before.tolist()):
        if cut > done:
            drawn[done:cut] = rng.integers(0, highs[done:cut], endpoint=True, dtype=np.int64)
            done = cut
        out[at[i]:at[i + 1]] = rng.choice(int(pops[i]), int(sizes[i]), replace=False)
    if len(highs) > done:
        drawn[done:] = rng.integers(0, highs[done:], endpoint=True, dtype=np.int64)
    slots = np.repeat(at[:-1][~direct], drawn_sizes) + _within(drawn_sizes)
    out[slots] = _resolve(drawn[floyd], drawn_pops, drawn_sizes)


def _within(sizes: np.ndarray) -> np.ndarray:
    """0 .. size-1 for each size, concatenated."""
    return np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def _ranges(pops: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The upper bounds of every bounded integer numpy draws for these requests, in its order, and which of them are
    Floyd's (the rest are the shuffle's)."""
    # Per request, numpy draws a value in [0, j] for j = pop - size ... pop - 1, then one in [0, i] for
    # i = size - 1 ... 1 to shuffle them (whose outcome a set does not need, but whose draws it must consume).
    n = len(sizes)
    length = np.empty(2 * n, np.int64)
    length[0::2], length[1::2] = sizes, np.maximum(sizes - 1, 0)
    step = np.tile(np.array([1, -1], np.int64), n)
    start = np.empty(2 * n, np.int64)
    start[0::2], start[1::2] = pops - sizes, sizes - 1
    # Each run of ranges counts up (Floyd's) or down (the shuffle's) by one: a cumulative sum of steps whose first
    # step in each run jumps from where the previous run ended to where this one starts.
    keep = length > 0
    length, step, start = length[keep], step[keep], start[keep]
    first = np.cumsum(length) - length
    steps = np.repeat(step, length)
    ends = start + step * (length - 1)
    steps[first] = start - np.r_[0, ends[:-1]] if len(ends) else start
    return np.cumsum(steps), np.repeat(step > 0, length)


def _resolve(values: np.ndarray, pops: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Floyd's picks from its draws: the k-th draw of a request is picked unless the request already holds it, when
    ``pop - size + k`` (which it cannot hold yet) is picked instead. Requests go in blocks of similar size, each
    block one position at a time for all its requests."""
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    out = np.empty_like(values)
    order = np.argsort(sizes, kind="stable")
    order = order[sizes[order] > 0]
    at = 0
    while at < len(order):
        rows = min(_BLOCK, len(order) - at)
        while rows > _MIN_BLOCK and rows * int(pops[order[at:at + rows]].max()) > _DENSE_CELLS:
            rows //= 2
        block = order[at:at + rows]
        if rows * int(pops[block].max()) <= _DENSE_CELLS:
            _resolve_dense(values, out, starts[block], pops[block], sizes[block])
        else:
            while rows > 1 and rows * int(sizes[block[-1]]) > _DENSE_CELLS // 4:
                rows //= 2
                block = order[at:at + rows]
            _resolve_sparse(values, out, starts[block], pops[block], sizes[block])
        at += rows
    return out


def _resolve_dense(values, out, starts, pops, sizes) -> None:
    """One block, its sizes ascending (at position k the requests still drawing are a suffix of the block), with a
    table of every value of every request."""
    taken = np.zeros((len(sizes), int(pops.max())), dtype=bool)
    rows, spare = np.arange(len(sizes)), pops - sizes
    for k in range(int(sizes[-1])):
        first = int(np.searchsorted(sizes, k, side="right"))
        r, at = rows[first:], starts[first:] + k
        drawn = values[at]
        picked = np.where(taken[r, drawn], spare[first:] + k, drawn)
        taken[r, picked] = True
        out[at] = picked


def _resolve_sparse(values, out, starts, pops, sizes) -> None:
    """As ``_resolve_dense`` for populations too large to table: over ids of the (request, value) pairs that can
    occur, a draw's and the ``pop - size + k`` that replaces it."""
    k = np.arange(int(sizes[-1]))
    live = k < sizes[:, None]
    at = np.where(live, starts[:, None] + k, 0)
    drawn = np.where(live, values[at], 0)
    instead = (pops - sizes)[:, None] + k
    row = np.arange(len(sizes))[:, None] * (int(pops.max()) + 1)
    _, ids = np.unique(np.concatenate([(row + drawn)[live], (row + instead)[live]]), return_inverse=True)
    drawn_id, instead_id = np.zeros_like(drawn), np.zeros_like(drawn)
    drawn_id[live], instead_id[live] = np.split(ids.reshape(-1), 2)
    taken = np.zeros(int(ids.max()) + 1, dtype=bool)
    for j in k.tolist():
        first = int(np.searchsorted(sizes, j, side="right"))
        hit = taken[drawn_id[first:, j]]
        taken[np.where(hit, instead_id[first:, j], drawn_id[first:, j])] = True
        out[at[first:, j]] = np.where(hit, instead[first:, j], drawn[first:, j])
