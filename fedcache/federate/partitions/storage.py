"""Partitions kept in the feature store, by sample key rather than row position.

Rows are identified by (domain index, sample id): tables of different backbones may order
or filter rows differently, so a stored partition is mapped back onto whatever table it is
loaded for. Layout::

    <store>/partitions/<dataset>/<partition_id>/
        train_domain, train_id   (n,) int64   the clients' rows, client after client
        train_offsets            (n_clients + 1,) int64   client k is [offsets[k], offsets[k+1])
        test_domain, test_id, test_offsets   the same for the local test sets
        attrs: request, dataset, data_hash, n_clients, created_at, notes (its warnings, said on every use),
               then complete = true, written last

The id hashes the request and ``data_hash`` (the sorted train and test keys and their labels), so a
partition made on other data is never reused.
"""
from __future__ import annotations

import hashlib
import logging

import numpy as np
import zarr
from zarr.codecs import BloscCodec

from fedcache import disk
from fedcache.borrowed import start_method_unset
from fedcache.errors import EntryNotFoundError, IncompleteEntryError, StoreError
from fedcache.paths import is_denied
from fedcache.federate.partitions.core import Partition, PartitionRequest, make_partition, partition_id
from fedcache.store.feature_store import SHARD_ATTR, FeatureStore, FeatureTable, now_iso
from fedcache.store.keys import canonical_json
from fedcache.wording import named

log = logging.getLogger(__name__)

PARTITIONS = "partitions"
_SPLITS = ("train", "test")


def table_keys(table: FeatureTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``(domains, ids)`` keys of a table's rows, and their labels (hashed with them, never matched)."""
    return table.domains, table.ids, table.labels


def _keys(keys, split: str) -> tuple[np.ndarray, np.ndarray]:
    domains, ids = (np.asarray(a, dtype=np.int64).reshape(-1) for a in keys[:2])
    if len(domains) != len(ids):
        raise StoreError(f"{split} keys: {len(domains)} domains but {len(ids)} ids")
    return domains, ids


def _sorted_keys(domains: np.ndarray, ids: np.ndarray, split: str) -> np.ndarray:
    """Row order sorting by (domain, id); refuses tables whose rows are not uniquely keyed."""
    order = np.lexsort((ids, domains))
    d, i = domains[order], ids[order]
    dup = np.flatnonzero((d[1:] == d[:-1]) & (i[1:] == i[:-1]))
    if len(dup):
        raise StoreError(
            f"the {split} table has {len(dup)} repeated (domain, id) keys, e.g. (domain {d[dup[0]]}, id {i[dup[0]]}); "
            "rows must be uniquely identified: read each domain once"
        )
    return order


def keys_hash(train_keys, test_keys) -> str:
    """A hash of the train and test row keys, and of their labels where the keys carry them (``table_keys``),
    independent of row order. With the labels: other data imported under the same keys (ids default to row
    numbers) gave the same hash, and a partition made on its labels (Dirichlet, few-shot) was reused."""
    h = hashlib.sha256()
    for split, keys in zip(_SPLITS, (train_keys, test_keys)):
        domains, ids = _keys(keys, split)
        order = _sorted_keys(domains, ids, split)
        h.update(f"{split}:{len(ids)}:".encode())
        h.update(domains[order].tobytes())
        h.update(ids[order].tobytes())
        if len(keys) > 2:
            h.update(b"labels:" + np.asarray(keys[2], dtype=np.int64).reshape(-1)[order].tobytes())
    return h.hexdigest()[:16]


def _parent(store: FeatureStore, dataset: str) -> zarr.Group:
    return store.root.require_group(PARTITIONS).require_group(dataset)


def save_partition(store: FeatureStore, dataset: str, partition: Partition, train_keys, test_keys,
                   data_hash: str | None = None) -> str:
    """Write ``partition`` (whose rows index the tables keyed by ``train_keys``/``test_keys``); return its id.
    ``data_hash``: their ``keys_hash``, when the caller has it already.

    A complete partition already stored under the same id is kept as it is: it was made by
    the same request on the same samples.
    """
    data_hash = data_hash or keys_hash(train_keys, test_keys)
    pid = partition.partition_id(data_hash)
    stored = _lookup(store, dataset, pid)
    if stored is not None and stored.attrs.get("complete", False):  # no lock needed (a read-only store works)
        log.info("partition %s of %s is already stored", pid, dataset)
        return pid
    # Two runs making the same new partition at once: the second waits, then finds it complete.
    try:
        # Its advice is not the extraction's (--wait): a run has no such option, and waited two minutes already.
        with store.lock(PARTITIONS, f"the partitions of {store.path}", advice="run again once it has finished"):
            return _save(store, dataset, partition, pid, data_hash, train_keys, test_keys)
    except OSError as exc:  # a store another user owns, or a read-only mount (EROFS, no PermissionError): stored
        if not is_denied(exc):  # partitions still work
            raise
        raise StoreError(f"cannot store the new partition {pid} of {dataset} in {store.path} ({exc.strerror}: "
                         f"{exc.filename}): use a store you can write to, or have its owner make the partition once "
                         "(`fedcache partition` with this run's partition options and seed)") from None


SMALL_FILES = 16 * 4096  # a stored partition's metadata and offsets: small files of a block each


def _save(store: FeatureStore, dataset: str, partition: Partition, pid: str, data_hash: str, train_keys, test_keys) -> str:
    folder = store.path / PARTITIONS / dataset / pid
    what = f"partition {pid} of {dataset} in"
    # Only what it surely takes: its row arrays are compressed (by 4x to 10x: they were counted at 16 bytes a row,
    # and a partition that fitted was refused); a disk that fills as they are written is said as it happens.
    need = SMALL_FILES
    with disk.on_full_disk(folder.parent, what, need):
        parent = _parent(store, dataset)
    if pid in parent and parent[pid].attrs.get("complete", False):
        log.info("partition %s of %s is already stored", pid, dataset)
        return pid
    if pid in parent:
        del parent[pid]  # left incomplete by an interrupted save
    _refuse_a_second_in_a_shard(store, parent)
    disk.check_space(folder, need, what)
    # No size in the message: only a lower bound is known. Half written, it would only be made again.
    with disk.on_full_disk(folder, what, remove=[folder]):
        _write(parent.create_group(pid), partition, data_hash, dataset, train_keys, test_keys)
    return pid


def _refuse_a_second_in_a_shard(store: FeatureStore, parent: zarr.Group) -> None:
    """A client's shard holds its one partition record, which its Flower client reads: a second (``train``,
    ``partition`` or ``shard`` given the shard as --store) left that client failing every round."""
    shard = store.root.attrs.get(SHARD_ATTR)
    if shard is not None and len(list(parent.group_keys())):
        who = f"client {shard['client']}'s" if shard.get("client", -1) >= 0 else "the server's"
        raise StoreError(f"{store.path} is {who} shard (written by `fedcache shard` for a Flower client), not a feature "
                         f"store to partition: give the feature store the shards were made from as {named('--store', 'store')}")


# Clients' sorted row ids compress as well byte-shuffled with LZ4 as with Zarr's default zstd, in about a third of
# its writing time and half its reading time (`benchmarks/partition_codec.py`, results/partition_codec.json).
# Partitions stored with zstd read as they are.
_ROWS_CODEC = [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle")]


def _write(g: zarr.Group, partition: Partition, data_hash: str, dataset: str, train_keys, test_keys) -> None:
    for split, clients, keys in zip(_SPLITS, (partition.train, partition.test), (train_keys, test_keys)):
        domains, ids = _keys(keys, split)
        rows = np.concatenate(clients) if clients else np.zeros(0, np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(ids)):
            raise StoreError(f"the partition's {split} rows do not fit a table of {len(ids)} rows: pass the keys of the table it was made on")
        with start_method_unset():  # Blosc's first use makes a multiprocessing lock, which fixes the start method
            g.create_array(f"{split}_domain", data=domains[rows], compressors=_ROWS_CODEC)
            g.create_array(f"{split}_id", data=ids[rows], compressors=_ROWS_CODEC)
            g.create_array(f"{split}_offsets", data=np.r_[0, np.cumsum([len(c) for c in clients])].astype(np.int64),
                           compressors=_ROWS_CODEC)
    g.attrs.update({
        "request": partition.request.to_dict(), "dataset": dataset, "data_hash": data_hash,
        "n_clients": partition.n_clients, "created_at": now_iso(), "notes": list(partition.notes),
    })
    g.attrs.update({"complete": True})


def _lookup(store: FeatureStore, dataset: str, pid: str) -> zarr.Group | None:
    """The stored group, without creating anything (readers may not write)."""
    root = store.root
    if PARTITIONS not in root or dataset not in root[PARTITIONS] or pid not in root[PARTITIONS][dataset]:
        return None
    return root[PARTITIONS][dataset][pid]


def _stored(store: FeatureStore, dataset: str, pid: str) -> zarr.Group:
    g = _lookup(store, dataset, pid)
    if g is None:
        raise EntryNotFoundError(f"no partition {pid!r} of {dataset} in {store.path}")
    if not g.attrs.get("complete", False):
        raise IncompleteEntryError(f"partition {pid} of {dataset} in {store.path} was not saved completely; make it again")
    return g


def load_partition(store: FeatureStore, dataset: str, partition_id: str, train_keys, test_keys,
                   data_hash: str | None = None) -> Partition:
    """A stored partition, with rows of the tables keyed by ``train_keys`` / ``test_keys`` (whose
    ``keys_hash`` is ``data_hash``, when the caller has it already)."""
    g = _stored(store, dataset, partition_id)
    if g.attrs.get("data_hash") != (data_hash or keys_hash(train_keys, test_keys)):
        log.info("partition %s was made on other rows of %s; mapping its samples onto these tables", partition_id, dataset)
    per_split = []
    with start_method_unset():  # Blosc's first use makes a multiprocessing lock, which fixes the start method
        for split, keys in zip(_SPLITS, (train_keys, test_keys)):
            rows = _rows_of(KeyIndex(*_keys(keys, split), split), g[f"{split}_domain"], g[f"{split}_id"], partition_id)
            offsets = g[f"{split}_offsets"][:]
            per_split.append([rows[lo:hi] for lo, hi in zip(offsets[:-1], offsets[1:])])
    # A partition stored before its notes were kept has none: what it fell short of is unknown without remaking it.
    return Partition(PartitionRequest.from_dict(dict(g.attrs["request"])), per_split[0], per_split[1],
                     tuple(g.attrs.get("notes", ())))


LOAD_BLOCK = 1 << 20  # stored keys mapped at once: 10,000 clients' local test sets hold about 10 million


def _rows_of(index: KeyIndex, want_domains, want_ids, pid: str) -> np.ndarray:
    """Row index of each wanted (domain, id) key in the table, the stored keys read a block at a time (so a
    large partition's keys and their temporaries are never all in memory at once)."""
    n = want_ids.shape[0]
    rows = np.empty(n, np.int32 if len(index.ids) < 2**31 else np.int64)
    missing, example = 0, None
    for lo in range(0, n, LOAD_BLOCK):
        d, i = (np.asarray(a[lo:lo + LOAD_BLOCK], np.int64) for a in (want_domains, want_ids))
        found = index.rows(d, i)
        lost = np.flatnonzero(found < 0)
        if len(lost) and example is None:
            example = (d[lost[0]], i[lost[0]])
        missing += len(lost)
        rows[lo:lo + len(found)] = found
    if missing:
        raise StoreError(
            f"partition {pid} holds {missing} {index.split} samples missing from the given table, e.g. "
            f"(domain {example[0]}, id {example[1]}); the table was read with other domains or filtered "
            f"differently (e.g. {named('--skip-bad-images', 'skip_bad_images=True')}): make a new partition for it"
        )
    return rows


LOOKUP_SLACK = 4  # a dense table of (domain, id) -> row is used while it has at most this many slots per row


class KeyIndex:
    """Where each (domain, id) key sits in a table: a dense table indexed by (domain, id) when ids are
    usually 0..n-1 per domain (a gather of every wanted key costs far less than searching for each), else a
    search of the sorted keys. Built once, asked a block of keys at a time; refuses tables whose keys repeat."""

    def __init__(self, domains: np.ndarray, ids: np.ndarray, split: str, dense: bool = True) -> None:
        self.domains, self.ids, self.split = domains, ids, split
        self.table = _dense_table(domains, ids, split) if dense else None
        if self.table is not None:
            self.width, self.n_domains = int(ids.max()) + 1, int(domains.max()) + 1
        else:
            self.order = _sorted_keys(domains, ids, split)
            self.sorted_domains, self.sorted_ids = domains[self.order], ids[self.order]

    def rows(self, want_domains: np.ndarray, want_ids: np.ndarray) -> np.ndarray:
        """Row of each wanted key, -1 where the table lacks it."""
        if self.table is not None:
            return self._by_table(want_domains, want_ids)
        return self._by_search(want_domains, want_ids)

    def _by_table(self, want_domains, want_ids) -> np.ndarray:
        width, n_domains = self.width, self.n_domains
        fits = (want_domains >= 0) & (want_domains < n_domains) & (want_ids >= 0) & (want_ids < width)
        rows = np.full(len(want_ids), -1, self.table.dtype)
        rows[fits] = self.table[want_domains[fits] * width + want_ids[fits]]
        return rows

    def _by_search(self, want_domains, want_ids) -> np.ndarray:
        order, sorted_d, sorted_i = self.order, self.sorted_domains, self.sorted_ids
        rows = np.full(len(want_ids), -1, dtype=np.int64)
        for d in np.unique(want_domains):
            lo, hi = np.searchsorted(sorted_d, d, "left"), np.searchsorted(sorted_d, d, "right")
            q = np.flatnonzero(want_domains == d)
            if hi == lo:
                continue
            pos = np.minimum(lo + np.searchsorted(sorted_i[lo:hi], want_ids[q]), hi - 1)
            found = sorted_i[pos] == want_ids[q]
            rows[q[found]] = order[pos[found]]
        return rows


def _dense_table(domains: np.ndarray, ids: np.ndarray, split: str) -> np.ndarray | None:
    """(domain * width + id) -> row, or None when the ids are too sparse for it."""
    if not len(ids):
        return None
    width, n_domains = int(ids.max()) + 1, int(domains.max()) + 1
    if ids.min() < 0 or domains.min() < 0 or width * n_domains > LOOKUP_SLACK * len(ids) + 1024:
        return None
    table = np.full(width * n_domains, -1, np.int32 if len(ids) < 2**31 else np.int64)
    slot = domains * width + ids
    table[slot] = np.arange(len(ids))
    if not np.array_equal(table[slot], np.arange(len(ids))):
        _sorted_keys(domains, ids, split)  # a key written twice: refused there, naming it
    return table


def stored_partition(store: FeatureStore, dataset: str, request: PartitionRequest, train, test) -> tuple[Partition, str]:
    """The partition ``request`` makes of the ``train`` and ``test`` tables (or their rows: labels, domains and ids
    only), found in ``store`` or made and stored there, and its id: what a run and a sharding partition by."""
    keys = (table_keys(train), table_keys(test))
    data_hash = keys_hash(*keys)  # once: each use sorts every key
    partition = find_partition(store, dataset, request, *keys, data_hash=data_hash)
    if partition is None:
        partition = make_partition(request, train.labels, train.domains, test.labels, test.domains)
    return partition, save_partition(store, dataset, partition, *keys, data_hash=data_hash)


def find_partition(store: FeatureStore, dataset: str, request: PartitionRequest, train_keys, test_keys,
                   data_hash: str | None = None) -> Partition | None:
    """The stored partition for this request on exactly these samples, or None."""
    data_hash = data_hash or keys_hash(train_keys, test_keys)
    pid = partition_id(request, data_hash)
    g = _lookup(store, dataset, pid)
    if g is None:
        return None
    attrs = g.attrs
    if not attrs.get("complete", False) or attrs.get("data_hash") != data_hash:
        return None
    if canonical_json(dict(attrs.get("request", {}))) != canonical_json(request.to_dict()):
        return None
    return load_partition(store, dataset, pid, train_keys, test_keys, data_hash)
