"""Draws without replacement for many requests at once pick exactly what rng.choice picks one request at a time, and
local test sets drawn through them are the ones drawn cell by cell (every recorded local-test number rests on it)."""
import numpy as np
import pytest

import fedcache.federate.partitions.sampling as sampling
from fedcache.federate.partitions import local_test_sets
from fedcache.federate.partitions.sampling import choice_sets


def one_call_each(rng, pops, sizes) -> list[np.ndarray]:
    return [rng.choice(int(p), int(s), replace=False) for p, s in zip(pops, sizes)]


def requests(seed: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    n = int(g.integers(1, 60))
    pops = [g.integers(1, 50, n), g.integers(1, 3000, n), g.choice([1, 2, 5, 10_000, 10_001, 20_000, 70_000], n),
            g.integers(1, 200, n)][seed % 4]
    sizes = np.array([int(g.integers(0, p + 1)) if g.random() < 0.5 else min(int(p), int(g.integers(0, 5)))
                      for p in pops])
    return pops, sizes


def assert_same_picks(seed: int, pops, sizes) -> None:
    ours, theirs = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 1])
    expected = one_call_each(theirs, pops, sizes)
    got = np.split(choice_sets(ours, pops, sizes), np.cumsum(sizes)[:-1])
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(np.sort(have), np.sort(want))
    assert ours.integers(0, 2**62) == theirs.integers(0, 2**62), "the generator was left elsewhere"


@pytest.mark.parametrize("seed", range(80))
def test_the_same_picks_as_one_choice_call_per_request(seed):
    # Populations over 10,000 with samples over 1/50 of them take numpy's other algorithm (a partial shuffle);
    # size 0 and size == population are both there.
    assert_same_picks(seed, *requests(seed))


@pytest.mark.parametrize("seed", range(0, 80, 3))
def test_the_sparse_walk_and_small_chunks_pick_the_same(seed, monkeypatch):
    monkeypatch.setattr(sampling, "_DENSE_CELLS", 64)  # every block too large to table
    monkeypatch.setattr(sampling, "_MIN_BLOCK", 2)
    monkeypatch.setattr(sampling, "_CHUNK_DRAWS", 50)  # requests drawn a few at a time
    assert_same_picks(seed, *requests(seed))


def test_collisions_and_many_requests():
    # Samples of a quarter of a small population collide often: Floyd's replacement is exercised thousands of times.
    g = np.random.default_rng(3)
    pops = g.integers(8, 40, 5000)
    assert_same_picks(3, pops, pops // 4 + g.integers(0, 2, 5000))


def test_large_populations_and_large_samples():
    assert_same_picks(4, np.array([100_000, 3, 100_000, 5000, 70_000]), np.array([64, 2, 10, 2048, 3]))


def test_a_sample_larger_than_its_population_is_refused():
    with pytest.raises(ValueError, match="between 0 and its population"):
        choice_sets(np.random.default_rng(0), [3], [4])


def reference_local_test_sets(clients, labels, domains, test_labels, test_domains, budget, rng, mix="client"):
    """The definition local_test_sets' docstring gives, one rng.choice per (client, cell)."""
    cell_rows = {}
    for row, key in enumerate(zip(test_labels.tolist(), test_domains.tolist())):
        cell_rows.setdefault(key, []).append(row)
    classes = np.unique(labels).tolist()
    out = []
    for rows in clients:
        held = {}
        for key in sorted(zip(labels[rows].tolist(), domains[rows].tolist())):
            held[key] = held.get(key, 0) + 1
        if mix == "uniform":
            held = {(c, d): 1 for d in sorted({d for _, d in held}) for c in classes}
        present = {key: n for key, n in held.items() if key in cell_rows}
        if not present:
            out.append(np.zeros(0, np.int64))
            continue
        n_k = sum(present.values())
        total = budget if mix == "uniform" else min(budget, sum(len(cell_rows[key]) for key in present))
        take = {key: min(int(np.floor(total * n / n_k + 0.5)), len(cell_rows[key])) for key, n in present.items()}
        if not any(take.values()):
            take = dict.fromkeys(present, 1)
        drawn = [rng.choice(np.array(cell_rows[key]), t, replace=False) for key, t in take.items() if t]
        out.append(np.sort(np.concatenate(drawn)).astype(np.int64))
    return out


@pytest.mark.parametrize("mix", ["client", "uniform"])
@pytest.mark.parametrize("seed", range(40))
def test_local_test_sets_are_the_cell_by_cell_draws(seed, mix):
    g = np.random.default_rng(seed)
    n_rows, n_test, n_classes, n_domains = int(g.integers(1, 3000)), int(g.integers(0, 2000)), int(g.integers(1, 12)), int(g.integers(1, 4))
    labels, domains = g.integers(0, n_classes, n_rows), g.integers(0, n_domains, n_rows)
    # Every third split's test rows have a class the training rows lack; rows the test split lacks are skipped.
    test_labels, test_domains = g.integers(0, n_classes + (seed % 3 == 0), n_test), g.integers(0, n_domains, n_test)
    n_clients = int(g.integers(1, min(n_rows, 40) + 1))
    owner = g.integers(0, n_clients, n_rows)
    clients = [np.flatnonzero(owner == k) for k in range(n_clients)]
    clients = [rows if len(rows) else np.array([k % n_rows]) for k, rows in enumerate(clients)]
    budget = int(g.choice([1, 3, 10, 100, 5000]))
    args = (clients, labels, domains, test_labels, test_domains, budget)
    want = reference_local_test_sets(*args, np.random.default_rng(seed), mix)
    got = local_test_sets(*args, np.random.default_rng(seed), mix)
    assert len(got) == len(want)
    for have, expected in zip(got, want):
        assert have.dtype == np.int64
        np.testing.assert_array_equal(have, expected)


def test_large_and_negative_labels_and_domains_find_their_cells():
    labels, domains = np.array([3, 3, 2**33, 2**33, -5]), np.array([0, 2**31 - 1, 0, 2**31 - 1, -(2**40)])
    clients = [np.array([0]), np.array([2]), np.array([3, 4])]
    args = (clients, labels, domains, labels.copy(), domains.copy(), 4)
    want = reference_local_test_sets(*args, np.random.default_rng(0))
    got = local_test_sets(*args, np.random.default_rng(0))
    assert [r.tolist() for r in got] == [r.tolist() for r in want] == [[0], [2], [3, 4]]


def test_no_clients_have_no_test_sets():
    assert local_test_sets([], np.arange(3), np.zeros(3, np.int64), np.arange(3), np.zeros(3, np.int64), 5,
                           np.random.default_rng(0)) == []


def test_the_walk_over_positions_stays_short(monkeypatch):
    """Samples of 128 or more go to rng.choice, whose loop does their work faster, so the vectorised walk (one
    numpy step per position) never walks far; runs between them still draw together."""
    walked, calls = [], []
    real_dense = sampling._resolve_dense
    monkeypatch.setattr(sampling, "_resolve_dense", lambda values, out, starts, pops, sizes: (
        walked.append(int(sizes[-1])), real_dense(values, out, starts, pops, sizes))[1])

    class Counted:  # the generator, its calls counted
        def __init__(self, rng):
            self.rng = rng

        def integers(self, *a, **k):
            calls.append("integers")
            return self.rng.integers(*a, **k)

        def choice(self, *a, **k):
            calls.append("choice")
            return self.rng.choice(*a, **k)

    g = np.random.default_rng(5)
    large = np.arange(3000) % 40 == 0
    sizes = np.where(large, g.integers(128, 1000, 3000), g.integers(0, 60, 3000))
    pops = sizes + g.integers(0, 2000, 3000)
    choice_sets(Counted(np.random.default_rng(1)), pops, sizes)
    assert walked and max(walked) < sampling._DIRECT_SIZE
    assert calls.count("choice") == large.sum() and calls.count("integers") <= large.sum() + 1
    monkeypatch.undo()
    assert_same_picks(5, pops, sizes)
