"""Per-client shards: one self-contained feature store per client, holding only that client's rows.

``write_shards`` makes, under ``OUT``::

    client-000/ ... client-<N-1>/   the client's training rows, its local test rows, the augmented
                                    views of its training rows (if extracted, and the method trains on
                                    them or is not known: `fedcache shard`), the text embeddings,
                                    and the partition record (client k's rows; every other client empty)
    server/                         no training rows: the global test split (for the global accuracy
                                    of methods with a global model), the text embeddings, and sizes

Each is a normal feature store (``FeatureStore``, ``load_fused``, ``load_partition`` read it); the
root attribute ``fedcache_shard`` says which client it is and which partition it came from. A
client shard keeps the client's global index ``k``: seeds, mini-batch plans and initial states are
derived from ``(seed, round, k)``, so a client trained from its shard draws exactly what it draws
in the in-process engine.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from fedcache import disk
from fedcache.errors import (ConfigError, DamagedEntryError, DiskFullError, EntryNotFoundError, IncompleteEntryError,
                             StoreError)
from fedcache.federate.data import FederatedData
from fedcache.federate.tables import (check_labels, check_same_encoder, check_views_alike, check_whole_view, fused_rows,
                                     keys_as_first, load_fused, load_views, row_positions, sample_keys, unextractable)
from fedcache.federate.partitions import (Partition, PartitionRequest, load_partition, save_partition, stored_partition,
                                          table_keys)
from fedcache.extract.templates import TEMPLATE_SETS, text_key
from fedcache.federate.source import attach_source
from fedcache.federate.text import attach_text
from fedcache.ownership import LOCK, hold
from fedcache.partitioning import say_partition
from fedcache.paths import check_outside, writable_dir
from fedcache.store.feature_store import SHARD_ATTR, EntryInfo, FeatureStore, FeatureTable
from fedcache.store.keys import SHARD_TAG, EntryKey, TextKey
from fedcache.store.tables import closed_on_error
from fedcache.store.writer import open_writer

log = logging.getLogger(__name__)

SERVER = "server"
T = TypeVar("T")
# Attributes of a source entry that describe its rows, not its origin: recomputed for the shard.
_ROW_ATTRS = {"key", "n_rows", "dim", "chunk_rows", "batch_size", "created_at", "complete", "completed_at",
              "n_valid", "n_bad_images"}


def client_dir(out: Path, k: int) -> Path:
    return Path(out) / f"client-{k:03d}"


@dataclass(frozen=True)
class ShardSpec:
    """Which rows to shard: the store, the features, and the partition request (as ``fedcache train`` takes them)."""

    store: Path
    dataset: str
    backbones: list[str]
    request: PartitionRequest
    # The run's method trains on augmented views: a view of some domains only, which a sharding leaves out, is refused
    # before any shard is written (its clients said they found fewer views, or 0). None: the method is not known
    # (`fedcache shard`), and such a view is warned of.
    views: bool | None = False


@dataclass(frozen=True)
class ShardInfo:
    role: str  # "client" or "server"
    client: int  # the client's global index; -1 for the server shard
    n_clients: int
    dataset: str
    backbones: list[str]
    partition_id: str  # of the partition in the source store
    request: dict
    client_train_sizes: list[int]
    # Every client's local test rows: the server checks the row count a client says it evaluated on
    # (empty in shards written before it was recorded: then unchecked).
    client_test_sizes: list[int] = dataclasses.field(default_factory=list)
    # The source store's entries the shards were cut from (train and test, every backbone, and the training split's
    # augmented views): the partition's id is the same for every backbone and every extraction of the same samples
    # (empty in shards written before).
    entries: list[str] = dataclasses.field(default_factory=list)
    # Whether the client shards hold the training split's augmented views: only where the run's method trains on them,
    # or it is not known (`fedcache shard`); a resume then compares the views' entries too. Shards written before
    # this was recorded hold them.
    views: bool = True

    @property
    def source(self) -> dict:
        """What the shards were cut from, beside the partition: a run goes on only on shards of the same."""
        return {"dataset": self.dataset, "backbones": list(self.backbones), "entries": sorted(self.entries)}

    @property
    def sharding(self) -> str:
        """One `fedcache shard` output's mark (its partition and source): every node's shard must carry the server's."""
        text = json.dumps([self.partition_id, self.source], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def read(cls, store: FeatureStore) -> "ShardInfo":
        raw = store.root.attrs.get(SHARD_ATTR)
        if raw is None:
            raise ConfigError(f"{store.path} is a feature store but not a shard; make shards with `fedcache shard ... --out DIR`")
        return cls(**raw)


# ---- writing -----------------------------------------------------------------------------
STAGING = ".partial"  # in --out, under its hold: the shards being written, moved in once all are complete


def write_shards(spec: ShardSpec, out: Path, on_shard: Callable[[int, int], None] | None = None) -> list[Path]:
    """One store per client plus the server's; returns their paths (clients first, server last). They are written
    into ``out``/.partial and moved into ``out`` once all are complete, server/ last: a sharding killed part-way left
    complete-looking client-000/ beside a partial client-001/ and no server/, for a user to copy to a machine. ``out``
    itself is kept ('.', a link, a mount point, its mode), and held: a second sharding into it is refused.
    ``on_shard(done, total)`` before the first shard (done = 0) and after each: a shard takes about a second, 100
    clients minutes."""
    out = writable_dir(out, "--out")
    check_outside(out)  # in a store, its shards were refused as stores inside a store once the partition was made
    with hold(out, f"the shard directory {out}", advice="shard into another --out", resumes="a re-run shards again"):
        staging = out / STAGING
        if staging.exists():  # SIGKILL runs no clean-up; under the hold no other sharding writes it
            log.warning("removing %s, left by an interrupted sharding", staging)
            shutil.rmtree(staging)
        if any(p.name != LOCK for p in out.iterdir()):
            raise ConfigError(f"{out} is not empty; shard into a new directory (or remove the old shards)")
        staging.mkdir()
        moved: list[Path] = []
        try:
            for p in _write_all(spec, staging, on_shard or (lambda done, total: None)):
                moved.append(p.rename(out / p.name))
            staging.rmdir()
        except BaseException as exc:
            for p in [*moved, staging]:
                shutil.rmtree(p, ignore_errors=True)
            if disk.is_full(exc):
                raise _full(exc, staging, out) from None
            raise
    return moved


# Nothing of a sharding that stopped is kept (its staging folder goes), so a re-run starts again: not the advice of
# the store's writers ("the batches written so far are kept"), which holds for an extraction, not here.
AGAIN = "free some space and run the same command again, which shards again from the start"


def _full(exc: BaseException, staging: Path, out: Path) -> DiskFullError:
    """A full disk met while sharding, as one line of ``out``: the path it names is where the shard would have been
    (the staging folder it was written in is gone), and the advice is the sharding's. Zarr's own metadata writes
    (a shard's attributes) fail without saying their file: then the shards in ``out`` are named."""
    if isinstance(exc, DiskFullError):
        return DiskFullError(exc.what.replace(f"{staging}/", f"{out}/"), AGAIN, exc.too_large)
    return disk.full_error(out, "the shards in", advice=AGAIN, exc=exc)


def _write_all(spec: ShardSpec, out: Path, on_shard: Callable[[int, int], None]) -> list[Path]:
    store = FeatureStore(spec.store, create=False)
    # A method known not to train on views has none copied: a resume after `extract --views` ran again goes on.
    with_views = spec.views is not False
    cut = cut_from(store, spec.dataset, spec.backbones, with_views)
    _check_views(store, spec, cut)
    partition, pid = _partition(store, spec, cut)
    tables = {split: _tables(store, spec, split, cut[split, 0]) for split in ("train", "test")}
    views = [_tables(store, spec, "train", found) for (_, view), found in cut.items() if view]
    base = dict(n_clients=partition.n_clients, dataset=spec.dataset, backbones=list(spec.backbones), partition_id=pid,
                request=spec.request.to_dict(), client_train_sizes=[len(r) for r in partition.train],
                client_test_sizes=[len(r) for r in partition.test],
                entries=entry_ids(cut), views=with_views)
    paths, total = [], partition.n_clients + 1
    on_shard(0, total)
    for k in range(partition.n_clients):
        info = ShardInfo(role="client", client=k, **base)
        paths.append(_write_client(store, spec, tables, views, partition, info, client_dir(out, k)))
        on_shard(len(paths), total)
    paths.append(_write_server(store, spec, tables, ShardInfo(role="server", client=-1, **base), out / SERVER))
    on_shard(total, total)
    return paths


def _check_views(store: FeatureStore, spec: ShardSpec, cut: Cut) -> None:
    """Refuse (or, the method not known, warn of) the training views cut where a view was made with another recipe
    or seed for one fused backbone than for another (``check_views_alike``); and the view after them, which the
    sharding leaves out, where a backbone holds it of some domains only (``extract --views K --domains``) or another
    fused backbone holds it and this one none (``check_whole_view``): what lacks it, and the extraction that
    completes it."""
    if spec.views is False:
        return
    view = len(cut) - 1  # the view after the last one cut (train and test are 2 of cut's)
    try:
        for found in (found for (_, v), found in cut.items() if v):
            check_views_alike(store, found)
    except StoreError as err:
        _refused_or_said(spec, err, "the shards' augmented views are not fit for a method that trains on views (%s): %s")
    try:
        check_whole_view(store, spec.dataset, spec.backbones, view)
    except (EntryNotFoundError, IncompleteEntryError) as err:  # some domains lack it, or their extraction is unfinished
        _refused_or_said(spec, err, f"the shards hold no augmented view {view}, which a method that trains on views "
                                    "(%s) needs: %s, then shard again")


def _refused_or_said(spec: ShardSpec, err: Exception, warning: str) -> None:
    """``err`` raised for a method that trains on views; for a method not known, ``warning`` (of the methods that
    do, and ``err``)."""
    if spec.views:
        raise err
    from fedcache.federate.methods import METHODS

    deployed = [n for n, c in METHODS.items() if c.uses_views and not c.not_deployable(c.Settings())]
    if deployed:  # none today: the self-supervised methods evaluate on every client's rows together
        log.warning(warning, ", ".join(deployed), err)


# (split, view) -> backbone -> the entries that backbone's table of the split (or view) reads
Cut = dict[tuple[str, int], dict[str, list[EntryInfo]]]


def _partition(store: FeatureStore, spec: ShardSpec, cut: Cut) -> tuple[Partition, str]:
    """The partition of the training and test entries of ``cut`` (found or made, and stored) and its id, from their
    labels, domains and ids, each backbone's matched to the first's (``fused_rows``): a partition refused is said
    before a feature is read, and reading the features checks them."""
    rows = {s: [store.entry_rows(cut[s, 0][b]) for b in spec.backbones] for s in ("train", "test")}
    with closed_on_error(*rows["train"], *rows["test"]):
        train_t, test_t = (fused_rows(spec.dataset, spec.backbones, s, rows[s]) for s in ("train", "test"))
    for train_b, test_b in zip(rows["train"], rows["test"]):  # clients would train on one encoder's features and be
        check_same_encoder(store, train_b, test_b)  # scored on another's
    partition, pid = stored_partition(store, spec.dataset, spec.request, train_t, test_t)
    say_partition(partition, pid, train_t)  # as a run on it says them: a sharding that found it stored said nothing
    return partition, pid


def cut_from(store: FeatureStore, dataset: str, backbones: list[str], views: bool = True) -> Cut:
    """The entries a sharding of ``dataset``'s ``backbones`` cuts its shards from now: each backbone's train and test
    entries and (``views``) its training views' (1, 2, ... up to the first the store lacks), as a read takes them
    (``FeatureStore.table_entries``), found together under ``between_imports``; metadata only. The one computation of
    them: a sharding reads exactly these and records their ids (``ShardInfo.entries``), a resume compares a cut now."""
    def found(split: str, view: int) -> dict[str, list[EntryInfo]]:
        return {b: store.table_entries(dataset, split, b, view, with_splits=("train", "test")) for b in backbones}

    with store.between_imports(dataset, backbones):
        try:
            cut = {("train", 0): found("train", 0), ("test", 0): found("test", 0)}
        except EntryNotFoundError as exc:  # a name fedcache cannot extract is not advised to be extracted
            raise unextractable(exc) or exc
        if views:
            cut.update({("train", v): t for v, t in enumerate(_each_view(lambda v: found("train", v)), 1)})
    return cut


def entry_ids(cut: Cut) -> list[str]:
    return sorted(e.entry_id for tables in cut.values() for infos in tables.values() for e in infos)


def entries_now(store: FeatureStore, dataset: str, backbones: list[str], views: bool = True) -> list[str]:
    """The ids of the entries a sharding now would cut shards from (``ShardInfo.entries``); metadata only."""
    return entry_ids(cut_from(store, dataset, backbones, views))


def changed_since_cut(info: ShardInfo, store: FeatureStore) -> str:
    """How the store's features of the shards' dataset and backbones differ from those ``info``'s shards were cut
    from (extracted or imported again since: new entries, with new ids), or "" when they do not. Shards cut before
    their entries were recorded are not checked ("")."""
    if not info.entries:
        return ""
    now, had = entries_now(store, info.dataset, info.backbones, info.views), set(info.entries)
    new = [_label(store.info(e)) for e in now if e not in had]
    if new:
        more = f" and {len(new) - 3} more" if len(new) > 3 else ""
        return f"new entries for {', '.join(new[:3])}{more}"
    gone = had - set(now)
    return f"{len(gone)} of the entries they were cut from are no longer the store's current features" if gone else ""


def _label(info: EntryInfo) -> str:
    """``info.label()`` and its view: a new view entry read as new features of the same split."""
    view = info.key.get("view")
    return info.label() + (f" view {view}" if view else "")


def _tables(store: FeatureStore, spec: ShardSpec, split: str, cut: dict[str, list[EntryInfo]]) -> dict[str, FeatureTable]:
    """Each backbone's table of ``split`` read from its entries in ``cut``, its rows put in the order of the first
    backbone's (as ``load_fused`` aligns them)."""
    read = {b: _read(store, cut[b]) for b in spec.backbones}
    first = read[spec.backbones[0]]
    return {b: _take(t, _align(first, t, b, spec.dataset, split)) for b, t in read.items()}


def _read(store: FeatureStore, infos: list[EntryInfo]) -> FeatureTable:
    rows = store.entry_rows(infos)
    return rows.table(store.features(rows))


def _each_view(read: Callable[[int], T]) -> list[T]:
    """``read(v)`` of the augmented views 1, 2, ... up to the first the store lacks or holds unfinished (an
    `extract --views` interrupted or still running): the views a sharding copies, and a resume checks. Whether the
    view stopped at matters is the method's (``_check_views``), not every sharding's and resume's."""
    views, v = [], 1
    while True:
        try:
            views.append(read(v))
        except (EntryNotFoundError, IncompleteEntryError):
            return views
        v += 1


def _align(first: FeatureTable, table: FeatureTable, backbone: str, dataset: str, split: str) -> np.ndarray:
    """The row of ``table`` holding each of ``first``'s samples, domains matched by name (as ``load_fused``)."""
    where = f"the {split} features of {dataset} for {backbone}", "those of the first backbone"
    pos = row_positions(sample_keys(first), keys_as_first(first, table, where), backbone, dataset, split)
    at = np.full(len(table.labels), -1, np.int64)
    at[pos] = np.arange(len(pos))
    check_labels(first, table, at, where)  # refused here, not by every client reading the shards written
    return pos


def _take(t: FeatureTable, rows: np.ndarray) -> FeatureTable:
    """``t``'s ``rows``; ``t`` itself where they are all its rows in order (the first backbone's, and any other read in
    its order): copying its features took another table's memory at once (a memory-mapped table's: read in whole)."""
    if len(rows) == len(t) and np.array_equal(rows, np.arange(len(t))):
        return t
    return dataclasses.replace(t, features=t.features[rows], labels=t.labels[rows], ids=t.ids[rows], domains=t.domains[rows])


def _new_store(path: Path, info: ShardInfo) -> FeatureStore:
    shard = FeatureStore(path, create=True)
    shard.root.attrs.update({SHARD_ATTR: dataclasses.asdict(info)})
    return shard


def _write_client(store, spec, tables, views, partition: Partition, info: ShardInfo, path: Path) -> Path:
    shard = _new_store(path, info)
    k = info.client
    # Rows stay in the source order (the partition lists them sorted), so the client's row list,
    # and with it every shuffled mini-batch, is the one the in-process engine uses.
    train_rows, test_rows = partition.train[k], partition.test[k]
    for split, rows in (("train", train_rows), ("test", test_rows)):
        for b in spec.backbones:
            _copy_rows(store, shard, tables[split][b], rows, info)
    for view in views:
        for b in spec.backbones:
            _copy_rows(store, shard, view[b], train_rows, info)
    _copy_text(store, shard, tables["train"])
    first = spec.backbones[0]
    own = [np.arange(len(train_rows)) if c == k else np.zeros(0, np.int64) for c in range(info.n_clients)]
    own_test = [np.arange(len(test_rows)) if c == k else np.zeros(0, np.int64) for c in range(info.n_clients)]
    keys = [tuple(a[rows] for a in table_keys(tables[s][first])) for s, rows in (("train", train_rows), ("test", test_rows))]
    save_partition(shard, spec.dataset, Partition(partition.request, own, own_test), *keys)  # no feature copied for them
    return path


def _write_server(store, spec, tables, info: ShardInfo, path: Path) -> Path:
    shard = _new_store(path, info)
    n_test = len(tables["test"][spec.backbones[0]])
    for b in spec.backbones:
        _copy_rows(store, shard, tables["train"][b], np.zeros(0, np.int64), info)
        _copy_rows(store, shard, tables["test"][b], np.arange(n_test), info)
    _copy_text(store, shard, tables["train"])
    return path


def _copy_rows(store, shard, table: FeatureTable, rows: np.ndarray, info: ShardInfo) -> None:
    """Write ``table``'s ``rows`` as the shard's entries, one per domain (empty ones too: readers expect every domain)."""
    for d, entry_id in enumerate(table.entry_ids):
        src = store.info(entry_id)
        mine = rows[table.domains[rows] == d]
        # The shard holds other rows than the source entry, so its key (and entry id) must differ.
        tag = f"{src.key['dataset_fingerprint']}{SHARD_TAG}{info.partition_id}:{info.role}{max(info.client, 0)}"
        key = EntryKey(**{**src.key, "dataset_fingerprint": tag})
        attrs = {n: v for n, v in src.attrs.items() if n not in _ROW_ATTRS}
        with open_writer(shard, key, len(mine), table.features.shape[1], 1, {**attrs, "shard_of": entry_id}) as w:
            for c in w.pending():
                lo, hi = w.chunk_range(c)
                r = mine[lo:hi]
                w.write_chunk(c, table.features[r], table.labels[r], table.ids[r], np.ones(len(r), bool))
            w.finish()


def _copy_text(store: FeatureStore, shard: FeatureStore, train: dict[str, FeatureTable]) -> None:
    """The text entries of the backbones of ``train`` (each backbone's training table) for its classes and weights
    (``texts_of``), checked as a run reads them: one damaged or unreadable is named with its backbone. One this user may
    not read, whose backbone is unknown, stops the sharding only where it may be what an extraction of these features'
    weights wrote."""
    weights = {b: store.info(t.entry_ids[0]).key["weights_hash"] for b, t in train.items() if t.entry_ids}
    wanted = [text_key(b, w, train[b].class_names, s).entry_id for b, w in weights.items() for s in TEMPLATE_SETS]
    of = {b: (train[b].class_names, w) for b, w in weights.items()}
    for _, a, embeddings in store.texts_of(of, wanted):
        k = a["key"]
        key = TextKey(**{**k, "classes": tuple(k["classes"]), "templates": tuple(k["templates"])})
        shard.put_text(key, embeddings, bool(a.get("random_weights", False)))


# ---- reading -----------------------------------------------------------------------------
def open_shard(path: Path | str) -> tuple[FeatureStore, ShardInfo]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no shard at {path}; make shards with `fedcache shard --store STORE ... --out DIR` "
                          "and give each client its own directory (client-000, client-001, ...)")
    clients = sorted(p.name for p in path.glob("client-*")) if path.is_dir() else []
    if clients and not (path / "zarr.json").exists():  # the shards' folder, not one of them: "--store" was no advice
        raise ConfigError(f"{path} holds the shards ({', '.join(clients[:3])}{', ...' if len(clients) > 3 else ''}), "
                          f"not one: give each client its own, e.g. {path / clients[0]}")
    store = FeatureStore(path, create=False)
    return store, ShardInfo.read(store)


def load_client(path: Path | str, views: bool = False) -> tuple[FederatedData, ShardInfo]:
    """Client k's data as the engine sees it: N clients, of which only k holds rows."""
    store, info = open_shard(path)
    if info.role != "client":
        raise ConfigError(f"{path} is the server's shard, not a client's; point the client at a client-NNN directory")
    with _damaged_shard(path, info):
        return _load_client(store, info, path, views)


def _load_client(store: FeatureStore, info: ShardInfo, path, views: bool) -> tuple[FederatedData, ShardInfo]:
    train_t, test_t = (load_fused(store, info.dataset, info.backbones, s) for s in ("train", "test"))
    keys = (table_keys(train_t), table_keys(test_t))
    pid = _only_partition(store, info.dataset, path)
    part = load_partition(store, info.dataset, pid, *keys)
    data = FederatedData.from_tables(train_t, test_t, part.train, part.test)
    if views:
        aug = load_views(store, info.dataset, info.backbones, train_t)
        data.views = None if aug is None else torch.from_numpy(aug)
    return _attached(data, store, info, train_t, test_t), info


def load_server(path: Path | str) -> tuple[FederatedData, ShardInfo]:
    """What the server knows: class names, feature size, N clients (no rows), the global test split."""
    store, info = open_shard(path)
    if info.role != "server":
        raise ConfigError(f"{path} is client {info.client}'s shard; the server reads the 'server' directory of the shards")
    with _damaged_shard(path, info):
        train_t, test_t = (load_fused(store, info.dataset, info.backbones, s) for s in ("train", "test"))
    empty = [np.zeros(0, np.int64)] * info.n_clients
    data = FederatedData.from_tables(train_t, test_t, empty, empty)
    return _attached(data, store, info, train_t, test_t), info


def _attached(data: FederatedData, store: FeatureStore, info: ShardInfo, train: FeatureTable,
              test: FeatureTable) -> FederatedData:
    """What ``train.load_data`` attaches, of the shard: the class texts, and where the rows came from (their entries'
    keys name the backbone and weights, whose towers prompt learning runs)."""
    return attach_text(attach_source(data, store, train, test), store, info.backbones, train)


@contextlib.contextmanager
def _damaged_shard(path, info: ShardInfo):
    """A damaged entry of a shard said as the shard's: the store's advice (extract it again, `store rm` it) would
    break a shard further; a shard is copied again, or cut again by the same `fedcache shard` (the same shards)."""
    try:
        yield
    except DamagedEntryError as err:
        who = "the server's shard" if info.role == "server" else f"client {info.client}'s shard"
        raise DamagedEntryError(f"{who} {path} is damaged: {err.problem}; copy that directory again from the "
                                "`fedcache shard` output it came from, or run the same `fedcache shard` command again "
                                "into a new --out and use its directory", err.problem) from None


def _only_partition(store: FeatureStore, dataset: str, path) -> str:
    from fedcache.federate.partitions import PARTITIONS

    ids = list(store.root[PARTITIONS][dataset].group_keys()) if PARTITIONS in store.root else []
    if len(ids) != 1:
        raise StoreError(f"the shard {path} should hold exactly one partition record, found {len(ids)}; make the shards again")
    return ids[0]


def describe(paths: list[Path]) -> str:
    """One line per shard, for the CLI."""
    lines = []
    for p in paths:
        info = ShardInfo.read(FeatureStore(p, create=False))
        rows = "no training rows" if info.role == "server" else f"{info.client_train_sizes[info.client]} training rows"
        lines.append(f"{p}: {info.role}{'' if info.client < 0 else ' ' + str(info.client)}, {rows}")
    return "\n".join(lines)
