"""Client partitions: every scheme's invariants, few-shot, local test sets, errors, storage, plots."""
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedcache.errors import ConfigError, StoreError, UnknownNameError
from fedcache.reports.partition_plots import plot_partition
from fedcache.federate.partitions import (
    PARTITIONERS,
    Partition,
    PartitionRequest,
    find_partition,
    keys_hash,
    load_partition,
    local_test_sets,
    make_partition,
    save_partition,
    table_keys,
)
from fedcache.store.feature_store import FeatureStore, FeatureTable

REPO = Path(__file__).resolve().parents[2]

N_CLASSES, N_DOMAINS = 8, 3


def make_split(n_per_cell: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, domains and per-domain ids of a balanced (class, domain) grid, rows shuffled."""
    labels = np.tile(np.repeat(np.arange(N_CLASSES), n_per_cell), N_DOMAINS)
    domains = np.repeat(np.arange(N_DOMAINS), N_CLASSES * n_per_cell)
    order = np.random.default_rng(seed).permutation(len(labels))
    ids = np.concatenate([np.arange(N_CLASSES * n_per_cell)] * N_DOMAINS)
    return labels[order], domains[order], ids[order]


TRAIN = make_split(50, 0)  # 1200 rows
TEST = make_split(20, 1)  # 480 rows

REQUESTS = {
    "iid": PartitionRequest.of("iid", 6),
    "dirichlet": PartitionRequest.of("dirichlet", 6, alpha=0.5),
    "shards": PartitionRequest.of("shards", 6, shards=2),
    "domain": PartitionRequest.of("domain", 6),
    "domain-dirichlet": PartitionRequest.of("domain-dirichlet", 6, alpha=0.5),
    "class-disjoint": PartitionRequest.of("class-disjoint", 4),
}


def part(request: PartitionRequest, train=TRAIN, test=TEST) -> Partition:
    return make_partition(request, train[0], train[1], test[0], test[1])


def classes_of(rows: np.ndarray, labels=TRAIN[0]) -> set[int]:
    return set(np.unique(labels[rows]).tolist())


def test_every_registered_scheme_is_tested():
    assert set(REQUESTS) == set(PARTITIONERS.names())


@pytest.mark.parametrize("scheme", sorted(REQUESTS))
def test_scheme_invariants(scheme):
    request = REQUESTS[scheme]
    p = part(request)
    assert p.n_clients == request.n_clients
    everything = np.concatenate(p.train)
    assert len(np.unique(everything)) == len(everything), "clients share training rows"
    assert np.array_equal(np.sort(everything), np.arange(len(TRAIN[0])))  # these requests use every row
    for rows in p.train + p.test:
        assert rows.dtype == np.int32 and np.all(np.diff(rows) > 0)  # compact, sorted, no repeats within a client
    assert all(len(r) > 0 for r in p.test)
    assert all(r.max() < len(TEST[0]) for r in p.test)
    assert min(len(r) for r in p.train) >= 10
    assert part(request) == p  # deterministic
    other = part(PartitionRequest.from_dict({**request.to_dict(), "seed": 1}))
    assert other != p and any(not np.array_equal(a, b) for a, b in zip(other.train, p.train))


def test_request_dict_round_trip_and_numpy_scalars_hash_the_same():
    r = PartitionRequest.of("dirichlet", np.int64(5), alpha=np.float32(0.5))
    assert type(r.n_clients) is int and r == PartitionRequest.of("dirichlet", 5, alpha=0.5)
    assert PartitionRequest.from_dict(r.to_dict()) == r
    assert r.to_dict()["alpha"] is None  # the declared default, stored as partitions were before it was declared


def test_iid_sizes_even():
    sizes = [len(r) for r in part(REQUESTS["iid"]).train]
    assert max(sizes) - min(sizes) <= 1


def mean_label_entropy(p: Partition) -> float:
    ent = []
    for rows in p.train:
        q = np.bincount(TRAIN[0][rows], minlength=N_CLASSES) / len(rows)
        ent.append(-np.sum(q[q > 0] * np.log(q[q > 0])))
    return float(np.mean(ent))


def test_dirichlet_smaller_alpha_is_more_skewed():
    skewed = part(PartitionRequest.of("dirichlet", 10, alpha=0.1))
    flat = part(PartitionRequest.of("dirichlet", 10, alpha=100.0))
    assert mean_label_entropy(skewed) < mean_label_entropy(flat) - 0.5
    assert mean_label_entropy(flat) > 0.95 * np.log(N_CLASSES)
    assert min(len(r) for r in skewed.train) >= 10  # min_size holds


def test_dirichlet_min_size_is_enforced():
    p = part(PartitionRequest.of("dirichlet", 10, alpha=0.1, min_size=60))
    assert min(len(r) for r in p.train) >= 60


def test_shards_of_two_give_at_most_two_classes():
    # 1200 rows = 24 shards of 50 rows; each class has 150 rows, so every shard is pure.
    p = part(PartitionRequest.of("shards", 12, shards=2))
    assert all(len(classes_of(r)) <= 2 for r in p.train)
    assert all(len(r) == 100 for r in p.train)


def test_domain_clients_hold_one_domain_each_in_domain_order():
    for scheme in ("domain", "domain-dirichlet"):
        p = part(PartitionRequest.of(scheme, 6))
        held = [np.unique(TRAIN[1][r]).tolist() for r in p.train]
        assert held == [[0], [0], [1], [1], [2], [2]]


def test_domain_dirichlet_is_label_skewed_within_domains():
    p = part(PartitionRequest.of("domain-dirichlet", 6, alpha=0.05, min_size=5))
    assert mean_label_entropy(p) < 0.8 * np.log(N_CLASSES)


def test_class_disjoint_without_repeats():
    p = part(PartitionRequest.of("class-disjoint", 4))
    held = [classes_of(r) for r in p.train]
    assert all(len(h) == 2 for h in held)
    assert set().union(*held) == set(range(N_CLASSES)) and sum(map(len, held)) == N_CLASSES


def test_class_disjoint_with_repeats_shares_classes_not_rows():
    p = part(PartitionRequest.of("class-disjoint", 4, classes_per_client=2, repeat_rate=0.5))
    held = [classes_of(r) for r in p.train]
    assert all(len(h) == 3 for h in held)  # 2 own + round(0.5 * 2) repeated
    everything = np.concatenate(p.train)
    assert len(np.unique(everything)) == len(everything) == len(TRAIN[0])
    counts = np.zeros(N_CLASSES, int)
    for h in held:
        counts[list(h)] += 1
    assert counts.sum() == 12 and counts.max() >= 2


def test_class_disjoint_explicit_group_size_leaves_classes_unused():
    p = part(PartitionRequest.of("class-disjoint", 3, classes_per_client=2))
    held = [classes_of(r) for r in p.train]
    assert all(len(h) == 2 for h in held) and len(set().union(*held)) == 6


@pytest.mark.parametrize("scheme", ["dirichlet", "class-disjoint", "domain"])
def test_few_shot_keeps_min_of_n_and_available_per_class(scheme):
    base = REQUESTS[scheme]
    full = part(base)
    few = part(PartitionRequest.from_dict({**base.to_dict(), "few_shot": 7}))
    for before, after in zip(full.train, few.train):
        assert np.isin(after, before).all()
        expected = np.minimum(np.bincount(TRAIN[0][before], minlength=N_CLASSES), 7)
        assert np.array_equal(np.bincount(TRAIN[0][after], minlength=N_CLASSES), expected)
    assert part(PartitionRequest.from_dict({**base.to_dict(), "few_shot": 7})) == few


@pytest.mark.parametrize("scheme", sorted(REQUESTS))
def test_local_test_sets_follow_the_client_cells(scheme):
    p = part(REQUESTS[scheme])
    for train_rows, test_rows in zip(p.train, p.test):
        train_cells = set(zip(TRAIN[0][train_rows].tolist(), TRAIN[1][train_rows].tolist()))
        test_cells = set(zip(TEST[0][test_rows].tolist(), TEST[1][test_rows].tolist()))
        assert test_cells <= train_cells


def test_local_test_of_a_two_class_client():
    p = part(PartitionRequest.of("class-disjoint", 4, seed=3))
    for train_rows, test_rows in zip(p.train, p.test):
        assert classes_of(test_rows, TEST[0]) == classes_of(train_rows)


def test_local_test_proportions_and_budget():
    p = part(PartitionRequest.of("dirichlet", 6, alpha=1.0, local_test=60))
    for train_rows, test_rows in zip(p.train, p.test):
        assert 0 < len(test_rows) <= 60 + N_CLASSES * N_DOMAINS  # rounding may add a few
        q_train = np.bincount(TRAIN[0][train_rows], minlength=N_CLASSES) / len(train_rows)
        q_test = np.bincount(TEST[0][test_rows], minlength=N_CLASSES) / len(test_rows)
        assert np.abs(q_train - q_test).max() < 0.1


def test_local_test_never_empty_with_tiny_budget():
    p = part(PartitionRequest.of("iid", 4, local_test=1))
    assert all(len(r) >= 1 for r in p.test)


def test_cells_missing_from_test_are_skipped_with_a_warning(caplog):
    keep = ~((TEST[0] == 2) & (TEST[1] == 0))
    test = tuple(a[keep] for a in TEST)
    with caplog.at_level(logging.WARNING):
        p = part(REQUESTS["iid"], test=test)
    assert "class 2/domain 0" in caplog.text
    for rows in p.test:
        assert not np.any((test[0][rows] == 2) & (test[1][rows] == 0))
        assert len(rows) > 0


def test_unused_options_are_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        part(PartitionRequest.of("iid", 3, alpha=0.3))
    assert "ignores alpha" in caplog.text


ONE_DOMAIN = (TRAIN[0], np.zeros_like(TRAIN[1]), TRAIN[2])


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: PartitionRequest.of("iid", 0), "n_clients must be at least 1"),
        (lambda: part(PartitionRequest.of("iid", 1201)), "only 1200 training rows"),
        (lambda: PartitionRequest.of("dirichlet", 4, alpha=0.0), r"--alpha \(partition.alpha\)=(0.0|-1.0): must be > 0"),
        (lambda: PartitionRequest.of("dirichlet", 4, alpha=-1.0), r"--alpha \(partition.alpha\)=(0.0|-1.0): must be > 0"),
        (lambda: PartitionRequest.of("shards", 4, shards=0), r"--shards \(partition.shards\)=0: must be >= 1"),
        (lambda: part(PartitionRequest.of("shards", 100, shards=13)), "1300 shards but only 1200"),
        (lambda: part(PartitionRequest.of("domain", 4)), "multiple of 3 clients"),
        (lambda: part(PartitionRequest.of("domain", 5, clients_per_domain=2)), "use --clients 6, or leave --clients-per-domain out"),
        (lambda: part(PartitionRequest.of("domain-dirichlet", 7)), "multiple of 3 clients"),
        (lambda: part(PartitionRequest.of("domain", 2), train=ONE_DOMAIN), "has 1 domain"),
        (lambda: part(PartitionRequest.of("dirichlet", 20, min_size=100)), "use fewer clients"),
        (lambda: part(PartitionRequest.of("dirichlet", 100, alpha=0.01, min_size=12)), "no Dirichlet"),
        (lambda: part(PartitionRequest.of("class-disjoint", 9)), "needs 9 classes but the data has 8"),
        (lambda: part(PartitionRequest.of("class-disjoint", 1, repeat_rate=1.0)), "smaller repeat_rate"),
        (lambda: PartitionRequest.of("class-disjoint", 4, repeat_rate=1.5), r"--repeat-rate \(partition.repeat_rate\)=1.5: must be in \[0, 1\]"),
        (lambda: part(PartitionRequest.of("iid", 4, few_shot=151)), "few-shot 151 is larger than a class"),
        (lambda: PartitionRequest.of("iid", 4, few_shot=0), r"--few-shot \(partition.few_shot\)=0: must be >= 1"),
    ],
)
def test_impossible_requests_are_config_errors(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_empty_client_is_named():
    # Domain 0 has a single row, so the second of its two clients gets nothing.
    keep = (TRAIN[1] != 0) | (np.arange(len(TRAIN[0])) == np.flatnonzero(TRAIN[1] == 0)[0])
    train = tuple(a[keep] for a in TRAIN)
    with pytest.raises(ConfigError, match=r"client 1 got no training rows \(1 empty of 6, scheme domain\); use fewer "
                                          r"clients$"):  # the domain scheme reads no alpha, and min_size is no option
        part(PartitionRequest.of("domain", 6), train=train)


def test_a_client_left_empty_by_subsample_is_said_to_be_its():
    """Every client had rows until --subsample kept none of one's: the advice named alpha and min_size, which the
    domain scheme does not read and no option sets."""
    with pytest.raises(ConfigError, match=r"got no training rows \(\d+ empty of 6, scheme domain\) once subsample=0.001 "
                                          r"kept that share .* use a larger subsample or fewer clients$"):
        part(PartitionRequest.of("domain", 6, subsample=0.001))


def test_unknown_scheme_suggests():
    with pytest.raises(UnknownNameError, match="dirichlet"):
        PartitionRequest.of("dirichlett", 4)


def table(split, order=None) -> FeatureTable:
    labels, domains, ids = (a if order is None else a[order] for a in split)
    return FeatureTable(
        features=np.zeros((len(labels), 2), np.float32), labels=labels, ids=ids, domains=domains.astype(np.int16),
        domain_names=("a", "b", "c"), class_names=tuple(map(str, range(N_CLASSES))), random_weights=False, entry_ids=(),
    )


def sample_keys(p: Partition, t: FeatureTable, split: str) -> list[set]:
    return [set(zip(t.domains[r].tolist(), t.ids[r].tolist())) for r in getattr(p, split)]


def test_save_load_round_trip(store_path):
    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    p = part(REQUESTS["dirichlet"])
    pid = save_partition(store, "ds", p, table_keys(train), table_keys(test))
    assert pid == p.partition_id(keys_hash(table_keys(train), table_keys(test)))
    g = store.root["partitions"]["ds"][pid]
    assert g.attrs["complete"] is True and g.attrs["request"] == p.request.to_dict()
    assert g["train_offsets"].shape == (p.n_clients + 1,)
    assert "blosc" in repr(g["test_id"].metadata.codecs).lower()  # rows LZ4-compressed, byte-shuffled

    reopened = FeatureStore(store_path)
    assert load_partition(reopened, "ds", pid, table_keys(train), table_keys(test)) == p
    assert find_partition(reopened, "ds", p.request, table_keys(train), table_keys(test)) == p
    assert save_partition(reopened, "ds", p, table_keys(train), table_keys(test)) == pid  # kept, not rewritten


def test_a_partition_stored_with_zarr_s_default_codec_still_loads(store_path, monkeypatch):
    """Partitions stored before their rows were LZ4-compressed used Zarr's default (zstd)."""
    import fedcache.federate.partitions.storage as storage

    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    p = part(REQUESTS["dirichlet"])
    monkeypatch.setattr(storage, "_ROWS_CODEC", "auto")
    pid = save_partition(store, "ds", p, table_keys(train), table_keys(test))
    codecs = store.root["partitions"]["ds"][pid]["test_id"].metadata.codecs
    assert "zstd" in repr(codecs).lower() and "blosc" not in repr(codecs).lower()
    monkeypatch.undo()
    assert load_partition(FeatureStore(store_path), "ds", pid, table_keys(train), table_keys(test)) == p


def test_a_new_partition_in_a_store_this_user_may_not_write_says_so(store_path, monkeypatch):
    """Another user's store: a partition it holds is read; a new one is refused in one line naming the store and
    the way on (the raw PermissionError named a Zarr file). Root is not stopped by permission bits: Zarr's write
    is refused here as the file system refuses it."""
    import fedcache.federate.partitions.storage as storage

    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    held = save_partition(store, "ds", part(REQUESTS["iid"]), table_keys(train), table_keys(test))

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(store_path / "partitions" / "ds" / "zarr.json"))

    monkeypatch.setattr(storage, "_save", refused)
    assert save_partition(store, "ds", part(REQUESTS["iid"]), table_keys(train), table_keys(test)) == held
    with pytest.raises(StoreError, match=f"cannot store the new partition [0-9a-f]+ of ds in {store_path} \\(Permission "
                                         "denied: .*zarr.json\\): use a store you can write to, or have its owner make"):
        save_partition(store, "ds", part(REQUESTS["dirichlet"]), table_keys(train), table_keys(test))


def test_a_partition_that_fits_is_not_refused_by_its_space_check(store_path, fake_disk):
    """Its rows were counted at 16 bytes each, uncompressed: 1,680 rows asked for 92 kB, and a disk with less free
    refused a partition that takes a fraction of it."""
    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    fake_disk(store_path, 80_000)
    pid = save_partition(store, "ds", part(REQUESTS["dirichlet"]), table_keys(train), table_keys(test))
    assert load_partition(store, "ds", pid, table_keys(train), table_keys(test)) == part(REQUESTS["dirichlet"])


def test_load_maps_samples_onto_a_reordered_table(store_path):
    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    p = part(REQUESTS["domain-dirichlet"])
    save_partition(store, "ds", p, table_keys(train), table_keys(test))
    shuffled_train = table(TRAIN, np.random.default_rng(5).permutation(len(TRAIN[0])))
    shuffled_test = table(TEST, np.random.default_rng(6).permutation(len(TEST[0])))
    # Same samples in another order: same data hash, so the stored partition is found and mapped.
    found = find_partition(store, "ds", p.request, table_keys(shuffled_train), table_keys(shuffled_test))
    assert found is not None
    assert sample_keys(found, shuffled_train, "train") == sample_keys(p, train, "train")
    assert sample_keys(found, shuffled_test, "test") == sample_keys(p, test, "test")


def test_find_ignores_other_requests_and_other_data(store_path):
    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    assert find_partition(store, "ds", REQUESTS["iid"], table_keys(train), table_keys(test)) is None
    p = part(REQUESTS["iid"])
    save_partition(store, "ds", p, table_keys(train), table_keys(test))
    other = PartitionRequest.of("iid", 6, seed=1)
    assert find_partition(store, "ds", other, table_keys(train), table_keys(test)) is None
    assert find_partition(store, "other-ds", p.request, table_keys(train), table_keys(test)) is None
    fewer = table(tuple(a[1:] for a in TRAIN))
    assert find_partition(store, "ds", p.request, table_keys(fewer), table_keys(test)) is None


def test_load_refuses_a_table_missing_a_sample(store_path):
    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    p = part(REQUESTS["iid"])
    pid = save_partition(store, "ds", p, table_keys(train), table_keys(test))
    fewer = table(tuple(a[1:] for a in TRAIN))
    missing = f"domain {TRAIN[1][0]}, id {TRAIN[2][0]}"
    with pytest.raises(StoreError, match=f"1 train samples missing.*{missing}"):
        load_partition(store, "ds", pid, table_keys(fewer), table_keys(test))
    with pytest.raises(StoreError, match="no partition"):
        load_partition(store, "ds", "0" * 16, table_keys(train), table_keys(test))


def test_loading_a_block_of_keys_at_a_time_gives_the_whole_partition(store_path, monkeypatch):
    import fedcache.federate.partitions.storage as storage

    store = FeatureStore(store_path)
    train, test = table(TRAIN), table(TEST)
    p = part(REQUESTS["dirichlet"])
    pid = save_partition(store, "ds", p, table_keys(train), table_keys(test))
    monkeypatch.setattr(storage, "LOAD_BLOCK", 7)  # blocks that split clients, and a short last block
    assert load_partition(store, "ds", pid, table_keys(train), table_keys(test)) == p
    # Rows 1 and 9 of the table sit in different blocks of the stored (client after client) order, row 1's first:
    # the count adds up over blocks and the example is the first missing key met.
    two_lost = table(tuple(np.r_[a[:1], a[2:9], a[10:]] for a in TRAIN))
    with pytest.raises(StoreError, match=f"2 train samples missing.*domain {TRAIN[1][1]}, id {TRAIN[2][1]}"):
        load_partition(store, "ds", pid, table_keys(two_lost), table_keys(test))


def test_client_rows_are_int32_until_a_row_needs_more():
    from fedcache.federate.partitions.core import compact_rows

    small = compact_rows([np.array([3, 1], np.int64), [], np.array([2**31 - 1])])
    assert [r.dtype for r in small] == [np.int32] * 3 and small[2][0] == 2**31 - 1
    wide = compact_rows([np.array([0]), np.array([2**31])])
    assert [r.dtype for r in wide] == [np.int64] * 2 and wide[1][0] == 2**31


def test_repeated_keys_are_refused(store_path):
    dup = (TRAIN[1].copy(), TRAIN[2].copy())
    dup[1][1] = dup[1][0]
    dup[0][1] = dup[0][0]
    with pytest.raises(StoreError, match="repeated"):
        keys_hash(dup, (TEST[1], TEST[2]))


@pytest.mark.parametrize("scheme", ["dirichlet", "domain-dirichlet"])
def test_plots_are_written(tmp_path, scheme):
    p = part(REQUESTS[scheme])
    paths = plot_partition(p, TRAIN[0], [f"class {i}" for i in range(N_CLASSES)], tmp_path / "plots" / "p", TRAIN[1], ["a", "b", "c"])
    assert [x.name for x in paths] == ["p-bubbles.png", "p-sizes.png"]
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_subsample_keeps_each_clients_label_mix():
    from fedcache.federate.partitions import PartitionRequest, make_partition

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 20000)
    full = make_partition(PartitionRequest.of("dirichlet", 5, alpha=1.0), labels, None, labels, None)
    small = make_partition(PartitionRequest.of("dirichlet", 5, alpha=1.0, subsample=0.05), labels, None, labels, None)
    for a, b in zip(full.train, small.train):
        assert set(b) <= set(a)
        ca, cb = np.bincount(labels[a], minlength=10), np.bincount(labels[b], minlength=10)
        np.testing.assert_array_equal(cb, np.round(0.05 * ca).astype(int))


# ---- class_budget: FedPCL's protocol (a budget of rows per class spread by Dirichlet over all clients) -------
def _budget_counts(p: Partition, labels=TRAIN[0]) -> np.ndarray:
    return np.array([np.bincount(labels[r], minlength=N_CLASSES) for r in p.train])  # (clients, classes)


@pytest.mark.parametrize("scheme", ["dirichlet", "domain-dirichlet"])
def test_class_budget_gives_budget_x_clients_rows_per_class(scheme):
    # 3 clients (one per domain for domain-dirichlet) x budget 10: 30 rows of every class, less up to 2 as each
    # of the 3 shares is floored; 50 rows per (class, domain) are there.
    p = part(PartitionRequest.of(scheme, 3, alpha=1.0, class_budget=10, min_size=1))
    counts = _budget_counts(p)
    assert ((counts.sum(axis=0) >= 28) & (counts.sum(axis=0) <= 30)).all(), counts
    everything = np.concatenate(p.train)
    assert len(np.unique(everything)) == len(everything) == counts.sum()  # disjoint, and only the budget is used
    assert part(PartitionRequest.of(scheme, 3, alpha=1.0, class_budget=10, min_size=1)) == p  # deterministic
    other = part(PartitionRequest.of(scheme, 3, alpha=1.0, class_budget=10, min_size=1, seed=1))
    assert not np.array_equal(_budget_counts(other), counts)


@pytest.mark.parametrize("scheme", ["dirichlet", "domain-dirichlet"])
def test_class_budget_counts_have_the_dirichlet_spread(scheme):
    # A client's share of a class is Beta(alpha, (m - 1) alpha) times B * m rows, floored: mean B - 1/2,
    # variance B^2 (m - 1) / (m alpha + 1) + 1/12. alpha = 1, m = 3, B = 10: 50. Equal shares (no draw)
    # give 0; Dirichlet(100) about 0.7; the draw over the clients of one domain only gives none.
    counts = np.concatenate([_budget_counts(part(PartitionRequest.of(scheme, 3, alpha=1.0, class_budget=10, min_size=1,
                                                                  seed=s))).ravel() for s in range(40)])
    assert 9.3 < counts.mean() < 9.7
    assert 40 < counts.var() < 60, counts.var()


def test_class_budget_under_domain_dirichlet_draws_from_the_clients_own_domain():
    p = part(PartitionRequest.of("domain-dirichlet", 6, alpha=1.0, class_budget=4, min_size=1))
    assert [np.unique(TRAIN[1][r]).tolist() for r in p.train] == [[0], [0], [1], [1], [2], [2]]
    assert ((_budget_counts(p).sum(axis=0) > 24 - 6) & (_budget_counts(p).sum(axis=0) <= 24)).all()


def test_class_budget_larger_than_a_pool_shares_what_there_is():
    # 3 clients x budget 100 = 300 rows of a class, but each domain has 50 of it: the client with the largest
    # share (at least 1/3, so 100 rows) gets all 50 of its domain's; the 2 clients of a domain share its 50.
    p = part(PartitionRequest.of("domain-dirichlet", 3, alpha=1.0, class_budget=100, min_size=1))
    counts = _budget_counts(p)
    assert counts.max() == 50 and (counts.max(axis=0) == 50).all()
    pairs = _budget_counts(part(PartitionRequest.of("domain-dirichlet", 6, alpha=1.0, class_budget=100, min_size=1)))
    assert (pairs.reshape(3, 2, N_CLASSES).sum(axis=1) <= 50).all() and pairs.reshape(3, 2, -1).sum(1).max() == 50
    assert "asks for more rows than there are" in " ".join(p.notes)  # said by each run on it (partition_of)


def test_class_budget_is_ignored_with_a_warning_by_other_schemes(caplog):
    with caplog.at_level(logging.WARNING):
        p = part(PartitionRequest.of("iid", 4, class_budget=5))
    assert "ignores class_budget" in caplog.text and sum(map(len, p.train)) == len(TRAIN[0])


@pytest.mark.parametrize("make, match", [
    (lambda: PartitionRequest.of("dirichlet", 4, class_budget=0), r"--class-budget \(partition.class_budget\)=0: must be >= 1"),
    (lambda: part(PartitionRequest.of("dirichlet", 4, class_budget=1, min_size=30)), "larger class_budget"),
])
def test_bad_class_budgets_are_config_errors(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_class_budget_range_is_declared_in_the_spec():
    from fedcache.spec import RunSpec, option

    assert option("class_budget").key == "partition.class_budget"
    with pytest.raises(ConfigError, match=r"--class-budget \(partition.class_budget\)=0: must be"):
        RunSpec.of(dataset="d", backbones="b", method="fedavg", class_budget=0)
    assert RunSpec.of(dataset="d", backbones="b", method="fedavg", class_budget="7").partition.class_budget == 7


def test_uniform_local_test_mix_tests_every_class_alike_in_the_clients_domains():
    # A client of domain 0 holding 3 classes is tested on all 8 classes of domain 0, 10 rows each
    # (80 of the 20-row cells); with the client's mix only on its 3 classes.
    labels, domains = TRAIN[0], TRAIN[1]
    rows = np.flatnonzero((domains == 0) & (labels < 3))[:30]
    args = ([rows], labels, domains, TEST[0], TEST[1], 80, np.random.default_rng(0))
    uniform = local_test_sets(*args, mix="uniform")[0]
    assert set(TEST[1][uniform].tolist()) == {0}
    np.testing.assert_array_equal(np.bincount(TEST[0][uniform], minlength=N_CLASSES), np.full(N_CLASSES, 10))
    assert classes_of(local_test_sets(*args)[0], TEST[0]) <= {0, 1, 2}


def test_local_test_mix_choices_are_the_specs():
    with pytest.raises(ConfigError, match="local_test_mix\\)='even': must be one of client, uniform"):
        PartitionRequest.of("iid", 4, local_test_mix="even")


def test_partition_ids_of_requests_without_the_later_options_are_unchanged():
    """class_budget and local_test_mix came after partitions were stored: at their defaults they leave the id
    as it was (the literal is the id before they existed), set they give another."""
    from fedcache.federate.partitions.core import PartitionRequest, partition_id

    request = PartitionRequest.of("dirichlet", 10, seed=3, alpha=0.1, few_shot=10)
    assert partition_id(request, "abc") == "5bdc868fa2c81d1a"
    budget = PartitionRequest.of("dirichlet", 10, seed=3, alpha=0.1, few_shot=10, class_budget=10)
    uniform = PartitionRequest.of("dirichlet", 10, seed=3, alpha=0.1, few_shot=10, local_test_mix="uniform")
    assert len({partition_id(r, "abc") for r in (request, budget, uniform)}) == 3


@pytest.mark.parametrize("scheme,given,expected", [
    ("dirichlet", {}, {"alpha": 0.5}),
    ("dirichlet", {"alpha": 0.1}, {"alpha": 0.1}),
    ("shards", {}, {"shards": 2}),
    ("domain", {}, {"clients_per_domain": 2}),
    ("domain-dirichlet", {"clients_per_domain": 1}, {"alpha": 0.5, "clients_per_domain": 1}),
])
def test_effective_options_fill_the_scheme_defaults_the_partition_ran_with(scheme, given, expected):
    """config.json records what ran: an unset alpha is the scheme's 0.5, not null (the request keeps None
    so that its id is unchanged); options the scheme does not read are not recorded as if they were."""
    from fedcache.federate.partitions.core import PartitionRequest, partition_id

    request = PartitionRequest.of(scheme, 4, **given)
    effective = request.effective(n_domains=2)
    assert {k: effective[k] for k in expected} == expected
    assert "shards" not in effective or scheme == "shards"
    assert "alpha" not in effective or "dirichlet" in scheme
    assert partition_id(request, "x") == partition_id(PartitionRequest.of(scheme, 4, **given), "x")


def test_the_scheme_defaults_are_declared_once_and_shown_where_they_are_set():
    """The partition section declares alpha's and shards' defaults; the request reads them, the CLI's help and
    the API's signature show them: no second copy that could drift."""
    import inspect

    import fedcache
    from fedcache.federate.partitions.core import PartitionSpec
    from fedcache.spec import option

    assert option("alpha").default == PartitionSpec().alpha == PartitionRequest.of("dirichlet", 4).alpha == 0.5
    assert option("shards").default == PartitionSpec().shards == PartitionRequest.of("shards", 4).shards == 2
    signature = inspect.signature(fedcache.train).parameters
    assert signature["alpha"].default == 0.5 and signature["shards"].default == 2


def test_uniform_local_test_mix_keeps_every_row_of_a_class_under_its_quota():
    # FedPCL's feature & label shift tests on the first 100 rows per class: on a domain whose test split holds
    # fewer than local_test rows (Office-10's), every class under 100 rows is tested whole, not cut to a tenth
    # of the split (which took 20 of a 40-row class here).
    sizes = [30, 25, 20, 15, 10, 40, 35, 5, 8, 120]
    test_labels = np.concatenate([np.full(n, c) for c, n in enumerate(sizes)])
    got = local_test_sets([np.arange(10)], np.arange(10), np.zeros(10, np.int64), test_labels,
                          np.zeros_like(test_labels), 1000, np.random.default_rng(0), mix="uniform")[0]
    assert np.bincount(test_labels[got], minlength=10).tolist() == [min(n, 100) for n in sizes]


# Digests of whole partitions as fedcache made them before the per-client loops became single sorts (commit
# 0c93000): the same request on the same labels must keep giving the same partition, row for row.
PINNED = {"dirichlet": (PartitionRequest.of("dirichlet", 40, alpha=0.3, seed=3), "f9a0bee4d99955dd"),
          "domain-dirichlet": (PartitionRequest.of("domain-dirichlet", 9, alpha=0.5), "a10ab167c9e40462"),
          "iid-subsample": (PartitionRequest.of("iid", 60, subsample=0.5, local_test=40), "40974564a6ce84a2"),
          "uniform-mix": (PartitionRequest.of("dirichlet", 20, alpha=1.0, local_test_mix="uniform", local_test=60),
                          "02f8e9058067f6f0")}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_partitions_are_the_ones_made_before(name):
    import hashlib

    rng = np.random.default_rng(11)
    y, d = rng.integers(0, 12, 3000), rng.integers(0, 3, 3000)
    yt, dt = rng.integers(0, 12, 600), rng.integers(0, 3, 600)
    request, expected = PINNED[name]
    p = make_partition(request, y, d, yt, dt)
    h = hashlib.sha256()
    for side in (p.train, p.test):
        for r in side:
            h.update(np.int64(len(r)).tobytes())
            h.update(np.asarray(r, np.int64).tobytes())
    assert h.hexdigest()[:16] == expected


@pytest.mark.parametrize("sparse", [False, True], ids=["dense-ids", "sparse-ids"])
def test_stored_keys_map_to_the_same_rows_through_the_table_or_the_search(sparse):
    from fedcache.federate.partitions.storage import KeyIndex

    rng = np.random.default_rng(4)
    domains = np.repeat(np.arange(3), 500)
    ids = np.tile(np.arange(500), 3) * (10_000 if sparse else 1)
    order = rng.permutation(len(ids))
    domains, ids = domains[order], ids[order]
    want = rng.choice(len(ids), 900)
    want_d, want_i = domains[want].copy(), ids[want].copy()
    want_i[:5] = -7  # keys the table lacks
    want_d[5:10] = 9
    by_search = KeyIndex(domains, ids, "train", dense=False).rows(want_d, want_i)
    index = KeyIndex(domains, ids, "train")
    by_lookup = index.rows(want_d, want_i) if index.table is not None else None
    assert (by_lookup is None) == sparse  # sparse ids would need too large a table
    np.testing.assert_array_equal(by_search[10:], want[10:])
    assert (by_search[:10] == -1).all()
    if not sparse:
        np.testing.assert_array_equal(by_lookup, by_search)
        with pytest.raises(StoreError, match="repeated"):
            KeyIndex(np.r_[domains, domains[:1]], np.r_[ids, ids[:1]], "train")


def test_a_few_shot_beyond_what_clients_hold_is_said():
    """--partition domain --few-shot 200 on 80-150 rows per class ran on all of them without a word."""
    from fedcache.federate.partitions.core import Partition, PartitionRequest, PartitionSpec, few_shot_filter, few_shot_short

    labels = np.repeat(np.arange(3), 50)
    clients = [np.arange(0, 150, 2), np.arange(1, 150, 2)]  # 25 rows of each class each
    clients[1] = clients[1][labels[clients[1]] != 2]  # the second holds two classes only

    def said(n):
        kept = few_shot_filter(clients, labels, n, np.random.default_rng(0))
        request = PartitionRequest(PartitionSpec(scheme="iid", few_shot=n), 2, 0)
        return [len(k) for k in kept], few_shot_short(Partition(request, kept, [k[:0] for k in kept]), labels)

    assert said(10) == ([30, 20], "")
    assert said(40) == ([75, 50], "--few-shot 40: 2 of 2 clients hold fewer than 40 training rows of every class "
                                  "they hold (as few as 25) and train on all of them; a smaller --few-shot gives each of "
                                  "them that many rows per class")


def test_classes_in_no_client_are_said_of_a_stored_partition_too(toy_store, caplog):
    """class-disjoint's groups of --classes-per-client leave the other classes out: said (at INFO) only as the
    partition was made, so a run on it never training on them went without a word."""
    import logging

    from fedcache.cli import main

    argv = ["partition", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "--partition",
            "class-disjoint", "--clients", "1", "--classes-per-client", "2", "--seed", "733"]
    for _ in range(2):  # made, then read back: each command says it, in one process too
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert main(argv) == 0
        said = [r.getMessage() for r in caplog.records if "no client's training rows" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("1 of the 3 classes are in no client's training rows (")
        assert said[0].endswith("runs on this partition never train on them; leave --classes-per-client out to deal "
                                "every class"), said


def test_a_few_shot_beyond_what_clients_hold_is_said_of_a_stored_partition_too(toy_store, caplog):
    """Said only as the partition was made: a run on it, or the same `fedcache partition`, said nothing."""
    import logging

    from fedcache.cli import main

    argv = ["partition", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "--partition", "iid",
            "--clients", "2", "--few-shot", "20", "--seed", "731"]
    for _ in range(2):  # made, then read back: each command says it, in one process too
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert main(argv) == 0
        assert "--few-shot 20: 2 of 2 clients hold fewer than 20 training rows of every class" in caplog.text


def test_a_class_budget_fallen_short_of_is_said_by_every_run_on_the_stored_partition(toy_store, tmp_path, caplog):
    """Said only as the partition was made: a later train or grid that found it stored said nothing, and its user
    never learned the clients got fewer rows of a class than class_budget asked."""
    import fedcache

    # test-toy has 20 training rows a class: a budget of 20 for each of 2 clients asks for 40.
    options = dict(partition="dirichlet", clients=2, alpha=1.0, class_budget=20, seed=37)
    runs = [lambda: fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", rounds=1, **options),
            lambda: fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", rounds=1, **options),
            lambda: fedcache.grid(toy_store, "test-toy", "tiny-timm-random", "fedavg", out=tmp_path / "grid", seeds=37,
                                  sweep={**{k: v for k, v in options.items() if k != "seed"}, "rounds": 1,
                                         "lr": [0.01, 0.1]}),
            # its workers said it again, one line each, after the grid had as it made the partition
            lambda: fedcache.grid(toy_store, "test-toy", "tiny-timm-random", "fedavg", out=tmp_path / "grid2", seeds=37,
                                  engine="processes", jobs=2,
                                  sweep={**{k: v for k, v in options.items() if k != "seed"}, "rounds": 1,
                                         "lr": [0.01, 0.1, 0.2, 0.3]})]
    for run in runs:  # made, then found stored thrice, in one process (a notebook): each call says it, a grid once
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            run()
        said = [r.getMessage() for r in caplog.records if "asks for more rows than there are" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("class_budget 20 x 2 clients asks for more rows than there are "
                                                     "of class 0 in the data (20 rows)"), said


def _labelled_npz(path, seed):
    rng = np.random.default_rng(seed)
    centres, arrays = rng.normal(size=(3, 8)) * 2, {}
    for split, n in (("train", 120), ("test", 60)):
        y = rng.integers(0, 3, n)
        arrays[f"{split}__features"] = (centres[y] + rng.normal(size=(n, 8))).astype(np.float32)
        arrays[f"{split}__labels"] = y
    np.savez(path, **arrays)
    return path


def test_a_partition_made_on_other_labels_under_the_same_keys_is_not_reused(tmp_path):
    """Two files of as many rows (so the same ids, 0..N-1) imported in turn under one name: a Dirichlet few-shot run
    on the second equals the run on a store that never held the first (the first's partition was reused: its
    clients' 'five rows per class' were counted on the first file's labels)."""
    import fedcache
    from fedcache.store.interchange import import_file

    first, second = _labelled_npz(tmp_path / "c.npz", 3), _labelled_npz(tmp_path / "d.npz", 4)
    run = lambda store: fedcache.train(store, "ds", "enc", "fedavg", partition="dirichlet", alpha=0.1,  # noqa: E731
                                       clients=3, few_shot=5, rounds=2).summary
    both, alone = tmp_path / "both.zarr", tmp_path / "alone.zarr"
    import_file(both, first, "ds", "enc")
    earlier = run(both)
    import_file(both, second, "ds", "enc")
    import_file(alone, second, "ds", "enc")
    again, fresh = run(both), run(alone)
    assert again["partition_id"] == fresh["partition_id"] != earlier["partition_id"]
    assert again["per_client_accuracy"] == fresh["per_client_accuracy"]


def test_a_run_recorded_with_an_older_partition_id_still_resumes(tmp_path):
    """The id's hash took in the labels later; the request and the entries it hashes are compared themselves."""
    import json

    import fedcache
    from fedcache.store.interchange import import_file

    store, out = tmp_path / "s.zarr", tmp_path / "run"
    import_file(store, _labelled_npz(tmp_path / "c.npz", 3), "ds", "enc")
    first = fedcache.train(store, "ds", "enc", "fedavg", clients=3, rounds=2, out=out)
    config = json.loads((out / "config.json").read_text())
    config["partition"]["partition_id"] = "0123456789abcdef"  # as an older fedcache hashed it
    (out / "config.json").write_text(json.dumps(config))
    # Unfinished (killed after its last checkpoint, before its summary): a finished run's files stay as they were.
    (out / "summary.json").unlink()
    again = fedcache.train(store, "ds", "enc", "fedavg", clients=3, rounds=2, out=out, resume=True)
    assert again.summary["per_client_accuracy"] == first.summary["per_client_accuracy"]
    recorded = json.loads((out / "config.json").read_text())["partition"]["partition_id"]
    assert recorded == again.summary["partition_id"] == first.summary["partition_id"]  # one partition, one id


@pytest.mark.parametrize("call", ["save", "load"])
def test_storing_a_partition_leaves_the_start_method_to_the_caller(call, store_path):
    """Blosc's first use (numcodecs makes a multiprocessing lock) fixed the process's start method, after which the
    caller's own set_start_method raised. In a process of its own: it happens once per process."""
    store = FeatureStore(store_path)
    keys = table_keys(table(TRAIN)), table_keys(table(TEST))
    pid = save_partition(store, "ds", part(REQUESTS["dirichlet"]), *keys) if call == "load" else None
    code = f"""
import multiprocessing
from fedcache.federate.partitions import load_partition, save_partition, table_keys
from fedcache.store.feature_store import FeatureStore
from tests.federate.test_partitions import REQUESTS, TEST, TRAIN, part, table
store, keys = FeatureStore({str(store_path)!r}), (table_keys(table(TRAIN)), table_keys(table(TEST)))
if {call!r} == "save":
    save_partition(store, "other", part(REQUESTS["iid"]), *keys)
else:
    assert load_partition(store, "ds", {pid!r}, *keys) == part(REQUESTS["dirichlet"])
multiprocessing.set_start_method("spawn")  # raised "context has already been set"
print(multiprocessing.get_start_method())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.split() == ["spawn"], out.stderr
