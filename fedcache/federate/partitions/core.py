"""The partition request, the partition itself, and the steps every scheme shares.

``make_partition`` runs one registered scheme (which only splits training rows among
clients), then the optional few-shot filter, then draws each client's local test set.
Each step has its own random stream derived from ``(seed, scheme)``, so the same request
on the same labels and domains always gives the same partition.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, fields
from typing import Annotated, Callable, Literal

import numpy as np

from fedcache.config import Checked, Choices, Fraction, NonNegativeInt, Positive, PositiveInt, Share, opt
from fedcache.errors import ConfigError
from fedcache.federate.partitions.sampling import choice_sets
from fedcache.registry import Registry
from fedcache.store.keys import short_hash
from fedcache.wording import named

log = logging.getLogger(__name__)

Partitioner = Callable[[np.ndarray, np.ndarray, "PartitionRequest", np.random.Generator], list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry("partition scheme")

# Every scheme accepts these; any other option belongs to the schemes that declare it.
COMMON_OPTIONS = frozenset({"scheme", "n_clients", "seed", "few_shot", "subsample", "local_test", "local_test_mix"})
# Stream numbers: adding a stage later must not change the streams of the existing ones.
_FEW_SHOT_STREAM, _LOCAL_TEST_STREAM, _SUBSAMPLE_STREAM = 1, 2, 3


def register_scheme(name: str, options: tuple[str, ...] = ()) -> Callable[[Partitioner], Partitioner]:
    """Register a partitioner and record which request options it reads (others are warned about)."""

    def deco(fn: Partitioner) -> Partitioner:
        fn.options = frozenset(options)  # type: ignore[attr-defined]
        return PARTITIONERS.register(name)(fn)

    return deco


def _schemes() -> tuple[str, ...]:
    return tuple(PARTITIONERS.names())


def readers(option_field: str) -> list[str]:
    """The schemes that read a scheme's own option (``alpha``: dirichlet, domain-dirichlet); every scheme reads the
    common ones and the client count."""
    if option_field in COMMON_OPTIONS | {"clients"}:
        return list(PARTITIONERS.names())
    return [s for s in PARTITIONERS.names() if option_field in PARTITIONERS.get(s).options]


@dataclass(frozen=True)
class PartitionSpec(Checked):
    """The partition options of a run (the run spec's ``partition`` section): each declared here once, with
    its default and range. A scheme reads the options it declares (``register_scheme``) and the common ones;
    another one given is refused by ``train``, ``partition``, ``shard`` (``spec.refuse_unread_options``) and a new
    grid, and warned about where a partition is made from Python."""

    section = "partition"

    # The help names the schemes as text, so that reading it imports nothing; a test keeps it equal to the registry.
    scheme: Annotated[str, Choices(_schemes)] = opt(
        "iid", name="partition", help="iid, dirichlet, shards, domain, domain-dirichlet, class-disjoint.")
    clients: PositiveInt | None = opt(
        None, help="Number of clients (default: one per domain for domain partitions, else 10).")
    alpha: Positive = opt(0.5, help="Dirichlet concentration (dirichlet, domain-dirichlet); 0.1 gives strong label "
                                    "skew, 100 nearly IID.")
    shards: PositiveInt = opt(2, help="Shards per client (shards).")
    few_shot: PositiveInt | None = opt(None, help="N training samples per class per client (default: every row; a "
                                                  "client with fewer of each class keeps all of them).")
    class_budget: PositiveInt | None = opt(
        None, help="dirichlet, domain-dirichlet: spread only N x clients rows of each class by Dirichlet(alpha) over "
                   "all clients (about N per class per client; domain-dirichlet: each from its own domain), "
                   "FedPCL's protocol; default: every row.")
    subsample: Share = opt(1.0, help="Keep this fraction of each client's rows of each class (keeps its label mix).")
    clients_per_domain: PositiveInt | None = opt(
        None, help="Clients per domain (domain partitions; default: clients / domains).")
    classes_per_client: PositiveInt | None = opt(
        None, help="Classes per client (class-disjoint; default: every class, dealt in groups of sizes that differ by "
                   "at most one; classes left over are in no client).")
    repeat_rate: Fraction = opt(0.0, help="Share of extra classes from other clients (class-disjoint).")
    local_test: PositiveInt = opt(1000, help="Local test rows per client, about: each (class, domain) share is rounded "
                                             "half up (one row per (class, domain) pair if every share rounds to none).")
    local_test_mix: Literal["client", "uniform"] = opt(
        "client", help="client: a client's local test rows follow its (class, domain) mix; uniform: every class "
                       "alike, from the domains it holds (FedPCL's feature & label shift test sets).")
    min_size: NonNegativeInt = 10  # Dirichlet schemes redraw until every client has this many rows

    def __post_init__(self) -> None:
        PARTITIONERS.get(self.scheme)  # an unknown scheme says what is close and what exists
        # Plain Python numbers, so that numpy scalars from a script or config hash the same.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (np.integer, np.floating)):
                object.__setattr__(self, f.name, value.item())
        for name in ("alpha", "repeat_rate", "subsample"):
            if isinstance(getattr(self, name), int):
                object.__setattr__(self, name, float(getattr(self, name)))
        super().__post_init__()

    def n_clients(self, n_domains: int) -> int:
        """The client count on data of ``n_domains`` domains: ``clients``, else one per domain
        (``clients_per_domain`` each) for domain partitions, else DEFAULT_CLIENTS."""
        if self.clients is not None:
            return self.clients
        if self.scheme in DOMAIN_SCHEMES:
            return n_domains * (self.clients_per_domain or 1)
        return DEFAULT_CLIENTS


DEFAULT_CLIENTS = 10
DOMAIN_SCHEMES = ("domain", "domain-dirichlet")
# Options that had no default before they were declared in PartitionSpec: a partition at their default keeps
# the id it had when they were left unset (stored partitions, and the runs that name them, stay valid).
UNSET_BEFORE = ("alpha", "shards")


@dataclass(frozen=True)
class PartitionRequest:
    """What partition to make: the partition options, the number of clients they come to on the data, and
    the seed. It reads as its options (``request.alpha``)."""

    options: PartitionSpec
    n_clients: int
    seed: int  # the run's (schedule.seed)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_clients", int(self.n_clients))
        object.__setattr__(self, "seed", int(self.seed))
        _require(self.n_clients >= 1, f"n_clients must be at least 1 (got {self.n_clients})")
        _require(self.seed >= 0, f"the partition seed must be >= 0 (got {self.seed})")

    def __getattr__(self, name: str):
        if name == "options":  # not yet set (unpickling)
            raise AttributeError(name)
        return getattr(self.options, name)

    @classmethod
    def of(cls, scheme: str, n_clients: int, seed: int | None = None, **options) -> "PartitionRequest":
        """A request in one line (scripts, tests); the seed defaults as a run's does."""
        from fedcache.federate.schedule import Schedule

        return cls(PartitionSpec(scheme=scheme, **options), n_clients, Schedule().seed if seed is None else seed)

    def to_dict(self) -> dict:
        """The request as partitions are stored and identified (the layout ids have always hashed)."""
        o = self.options
        d = {"scheme": o.scheme, "n_clients": self.n_clients, "seed": self.seed, **{
            f.name: getattr(o, f.name) for f in fields(o) if f.name not in ("scheme", "clients")}}
        defaults = PartitionSpec()
        for name in UNSET_BEFORE:
            if d[name] == getattr(defaults, name):
                d[name] = None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PartitionRequest":
        d = dict(d)
        scheme, n_clients, seed = d.pop("scheme"), d.pop("n_clients"), d.pop("seed")
        options = {k: v for k, v in d.items() if not (k in UNSET_BEFORE and v is None)}
        return cls(PartitionSpec(scheme=scheme, **options), n_clients, seed)

    def effective(self, n_domains: int) -> dict:
        """What the scheme ran with: the options it reads, ``clients_per_domain`` filled in."""
        reads = COMMON_OPTIONS | PARTITIONERS.get(self.scheme).options
        given = {k: v for k, v in self.to_dict().items() if k in reads}
        defaults = PartitionSpec()
        filled = {k: getattr(defaults, k) if v is None and k in UNSET_BEFORE else v for k, v in given.items()}
        if "clients_per_domain" in filled and filled["clients_per_domain"] is None:
            filled["clients_per_domain"] = self.n_clients // max(n_domains, 1)
        return filled

    def rng(self, stream: int | None = None) -> np.random.Generator:
        """The scheme's generator; ``stream`` picks an independent one for a later step."""
        # A stable per-scheme constant (Python's hash() of a str changes between runs).
        const = int.from_bytes(hashlib.sha256(self.scheme.encode()).digest()[:4], "little")
        words = [self.seed, const] if stream is None else [self.seed, const, stream]
        return np.random.default_rng(np.random.SeedSequence(words))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# Options added after partitions were first stored: they enter the id only when set, so a store's existing
# partitions keep their ids (and the runs that name them stay resumable).
LATER_OPTIONS = {"class_budget": None, "local_test_mix": "client"}


def compact_rows(clients: list, sort: bool = False) -> list[np.ndarray]:
    """Each client's row indices as int32 where every row fits it (int64 beyond 2**31 rows), sorted if asked: the
    10 million local-test indices of 10,000 clients are among the largest arrays a run holds beside the features
    (docs/performance.md, "A million rows and 100,000 clients")."""
    arrays = [np.asarray(r).reshape(-1) for r in clients]
    top = max((int(a.max()) for a in arrays if a.size), default=0)
    dtype = np.int32 if top < 2**31 else np.int64
    if not sort:
        return [a.astype(dtype, copy=False) for a in arrays]
    out = [a.astype(dtype) for a in arrays]  # a copy each, sorted in place: never the caller's array
    for a in out:
        a.sort()
    return out


def partition_id(request: PartitionRequest, data_hash: str) -> str:
    d = {k: v for k, v in request.to_dict().items() if k not in LATER_OPTIONS or v != LATER_OPTIONS[k]}
    return short_hash({"request": d, "data": data_hash})


class Dealt(list):
    """A scheme's clients (their row arrays) with what it fell short of the request (a class budget larger than a
    pool): kept with the partition, and said wherever it is used, as a stored one is read back without its scheme."""

    def __init__(self, clients: list[np.ndarray], notes: tuple[str, ...] = ()) -> None:
        super().__init__(clients)
        self.notes = tuple(notes)


@dataclass(eq=False)
class Partition:
    request: PartitionRequest
    train: list[np.ndarray]  # per client, sorted rows of the train table (compact_rows' dtype)
    test: list[np.ndarray]  # per client, sorted rows of the test table
    # Warnings of its making (``Dealt.notes``), stored with it: a run that finds it stored says them again.
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.train = compact_rows(self.train, sort=True)
        self.test = compact_rows(self.test, sort=True)

    @property
    def n_clients(self) -> int:
        return len(self.train)

    def partition_id(self, data_hash: str) -> str:
        """Id of this request on this data; ``data_hash`` comes from ``keys_hash(train_keys, test_keys)``."""
        return partition_id(self.request, data_hash)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        same = lambda a, b: len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))  # noqa: E731
        return self.request == other.request and same(self.train, other.train) and same(self.test, other.test)


def _rows(labels, domains, split: str) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    domains = np.zeros_like(labels) if domains is None else np.asarray(domains, dtype=np.int64).reshape(-1)
    _require(len(labels) == len(domains), f"{split} labels ({len(labels)}) and domains ({len(domains)}) differ in length")
    return labels, domains


def make_partition(request: PartitionRequest, train_labels, train_domains, test_labels, test_domains) -> Partition:
    """Split the train rows among clients with the request's scheme, then draw local test sets."""
    labels, domains = _rows(train_labels, train_domains, "train")
    test_labels, test_domains = _rows(test_labels, test_domains, "test")
    _require(
        request.n_clients <= len(labels),
        f"{request.n_clients} clients but only {len(labels)} training rows; use at most {len(labels)} clients",
    )
    _check_few_shot(request, labels)
    scheme = PARTITIONERS.get(request.scheme)
    _warn_unused_options(request, scheme)
    dealt = scheme(labels, domains, request, request.rng())
    clients = [np.sort(np.asarray(c, dtype=np.int64)) for c in dealt]
    _check_clients(request, clients)
    if request.subsample < 1.0:
        clients = subsample_filter(clients, labels, request.subsample, request.rng(_SUBSAMPLE_STREAM))
        _check_clients(request, clients, subsampled=True)
    if request.few_shot is not None:
        clients = few_shot_filter(clients, labels, request.few_shot, request.rng(_FEW_SHOT_STREAM))
    test = local_test_sets(clients, labels, domains, test_labels, test_domains, request.local_test,
                           request.rng(_LOCAL_TEST_STREAM), request.local_test_mix)
    return Partition(request, clients, test, getattr(dealt, "notes", ()))


def _warn_unused_options(request: PartitionRequest, scheme: Partitioner) -> None:
    used = COMMON_OPTIONS | getattr(scheme, "options", frozenset()) | {"clients"}
    defaults = PartitionSpec()
    ignored = [f.name for f in fields(request.options) if f.name not in used
               and getattr(request.options, f.name) != getattr(defaults, f.name)]
    if ignored:
        log.warning("partition scheme %r ignores %s", request.scheme, ", ".join(ignored))


def _check_few_shot(request: PartitionRequest, labels: np.ndarray) -> None:
    if request.few_shot is None:
        return
    classes, sizes = np.unique(labels, return_counts=True)
    smallest = int(np.argmin(sizes))
    if request.few_shot > sizes[smallest]:
        raise ConfigError(
            f"few-shot {request.few_shot} is larger than a class: class {classes[smallest]} has only "
            f"{sizes[smallest]} training rows in the whole dataset; use {named('--few-shot', 'few_shot')} <= {sizes[smallest]}"
        )


def _check_clients(request: PartitionRequest, clients: list[np.ndarray], subsampled: bool = False) -> None:
    """Every client holds a training row; else what left one empty, and only the changes the request can make."""
    if len(clients) != request.n_clients:
        raise AssertionError(f"scheme {request.scheme} returned {len(clients)} clients, not {request.n_clients}")
    empty = [k for k, rows in enumerate(clients) if len(rows) == 0]
    if not empty:
        return
    where = f"client {empty[0]} got no training rows ({len(empty)} empty of {request.n_clients}, scheme {request.scheme})"
    if subsampled:  # the scheme gave every client rows; subsample kept none of some client's
        raise ConfigError(f"{where} once subsample={request.subsample:g} kept that share of each class a client "
                          "holds (rounded: a class of fewer rows keeps none); use a larger subsample or fewer clients")
    alpha = ", or a larger alpha" if request.scheme in readers("alpha") else ""
    raise ConfigError(f"{where}; use fewer clients{alpha}")


def subsample_filter(clients: list[np.ndarray], labels: np.ndarray, frac: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Keep a random round(frac * held) rows of each class each client holds."""
    out = []
    for rows in clients:
        keep = [rng.permutation(rows[labels[rows] == c])[: int(round(frac * np.sum(labels[rows] == c)))]
                for c in np.unique(labels[rows])]
        out.append(np.sort(np.concatenate(keep)) if keep else rows[:0])
    return out


def few_shot_filter(clients: list[np.ndarray], labels: np.ndarray, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Keep a random ``min(n, held)`` rows of each class each client holds (``few_shot_short`` says where ``n`` is
    more than the data)."""
    out = []
    for rows in clients:
        shuffled = rng.permutation(rows)
        order = np.argsort(labels[shuffled], kind="stable")  # stable: keeps the shuffled order within a class
        y = labels[shuffled][order]
        starts = np.flatnonzero(np.r_[True, y[1:] != y[:-1]])
        held = np.diff(np.r_[starts, len(y)])
        rank = np.arange(len(y)) - np.repeat(starts, held)
        out.append(np.sort(shuffled[order[rank < n]]))
    return out


def classes_left_out(partition: Partition, labels: np.ndarray, class_names: tuple[str, ...]) -> str:
    """The classes of the training rows that no client trains on (class-disjoint's groups of --classes-per-client
    leave the rest out): said wherever the partition is used, as a run never sees them. "" where every class is in."""
    # Counts, not np.unique: it runs for every run on the partition (a grid's every cell); 6x faster at a million rows.
    present = np.bincount(labels) > 0
    rows = np.concatenate(partition.train) if partition.train else np.zeros(0, np.int64)
    out = np.flatnonzero(present & ~(np.bincount(labels[rows], minlength=len(present)) > 0)).tolist()
    if not out:
        return ""
    names = ", ".join(str(class_names[c]) if c < len(class_names) else str(c) for c in out[:5])
    more = ", ..." if len(out) > 5 else ""
    said = (f"{len(out)} of the {int(present.sum())} classes are in no client's training rows ({names}{more}): "
            "runs on this partition never train on them")
    if partition.request.options.scheme == "class-disjoint" and partition.request.options.classes_per_client:
        said += f"; leave {named('--classes-per-client', 'classes_per_client')} out to deal every class"
    return said


def few_shot_short(partition: Partition, labels: np.ndarray) -> str:
    """What a few-shot partition's clients lack, said where it is made and where a stored one is read again (said
    once, where it was made, a run on it trained on every row without a word): a client holding fewer than the
    few-shot number of every class it holds kept all its rows, the number being more than its data (a label-skewed
    client short of its rare classes only is what a few-shot split of it means). "" where none is short."""
    n = partition.request.few_shot
    if n is None:
        return ""
    most = [np.bincount(labels[rows]) for rows in partition.train if len(rows)]
    short = [held[held > 0] for held in most if held.max() < n]
    if not short:
        return ""
    flag = named("--few-shot", "few_shot")
    return (f"{flag} {n}: {len(short)} of {partition.n_clients} clients hold fewer than {n} training rows of every "
            f"class they hold (as few as {min(int(h.min()) for h in short)}) and train on all of them; a smaller "
            f"{flag} gives each of them that many rows per class")


def cells(labels: np.ndarray, domains: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Rows of each (class, domain) cell."""
    keys, rows, starts = _cell_table(labels, domains)
    return {(int(c), int(d)): rows[lo:hi] for (c, d), lo, hi in zip(keys.tolist(), starts[:-1], starts[1:])}


def _cell_table(labels: np.ndarray, domains: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (class, domain) cells in sorted order, every row grouped by cell, and where each cell's rows start."""
    pairs, inverse = np.unique(np.stack([labels, domains], axis=1).reshape(-1, 2), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    return pairs.reshape(-1, 2), order, np.r_[0, np.cumsum(np.bincount(inverse, minlength=len(pairs)))]


def local_test_sets(clients, labels, domains, test_labels, test_domains, budget: int, rng: np.random.Generator,
                    mix: str = "client") -> list[np.ndarray]:
    """Per client, test rows with the (class, domain) mix of its training rows.

    A cell holding ``n_kcd`` of the client's ``n_k`` training rows gets ``round(T * n_kcd / n_k)``
    test rows, capped by what the cell has in the test split, where ``T = min(budget, rows of
    the test split in the client's cells)``. Should rounding leave nothing, each cell gets one
    row. Cells absent from the test split are skipped (with a warning) and ``n_k`` counts only
    the cells that remain. Clients may share test rows; within a client they are distinct.
    With ``mix="uniform"`` the cells are every class of the training split in each domain the
    client holds, weighted alike: a client is also tested on the classes it has no rows of, each cell
    on ``min(budget / cells, rows of the cell)`` rows (FedPCL's "the first 100 rows per class"), T
    being ``budget`` whatever the test split holds.

    The rows are those one ``rng.choice`` call per cell (clients in order, a client's cells in order) draws, drawn
    at a fraction of those calls' cost (partitions/sampling.py).
    """
    keys, test_rows, test_starts = _cell_table(test_labels, test_domains)
    held = _held_table(clients, labels, domains)
    if mix == "uniform":
        held = _every_class(held, np.unique(labels))
    owner, label, domain, count = held
    cell = _find_cells(keys, label, domain)
    present = cell >= 0
    if not present.all():
        missing = sorted(set(zip(label[~present].tolist(), domain[~present].tolist())))
        log.warning(
            "%d (class, domain) cells held by clients have no test rows and are left out of local test sets: %s",
            len(missing), ", ".join(f"class {c}/domain {d}" for c, d in missing[:10]),
        )
    owner, count, cell = owner[present], count[present], cell[present]
    available = np.diff(test_starts)[cell]
    bounds = np.searchsorted(owner, np.arange(len(clients) + 1))
    per_client = lambda x: np.diff(np.r_[0, np.cumsum(x)][bounds])  # noqa: E731
    n_k = per_client(count)
    total = np.full(len(clients), budget, np.int64) if mix == "uniform" else np.minimum(budget, per_client(available))
    # The client's mix scales to the rows there are, keeping its proportions; a uniform quota does not shrink
    # (a small test split would otherwise cut its larger classes to its smaller ones' share).
    take = np.minimum(np.floor(total[owner] * count / n_k[owner] + 0.5).astype(np.int64), available)
    none = per_client(take) == 0
    take[none[owner]] = 1
    drawing = take > 0
    at = choice_sets(rng, available[drawing], take[drawing])
    at += np.repeat(test_starts[cell][drawing], take[drawing])
    rows = test_rows[at].astype(np.int64, copy=False)
    del at  # 10,000 clients hold 10 million of these: one array of them at a time besides the rows
    clients_rows = np.split(rows, np.cumsum(per_client(take))[:-1]) if len(clients) else []
    for r in clients_rows:
        r.sort()
    return clients_rows


def _held_table(clients: list[np.ndarray], labels: np.ndarray, domains: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per client in order, its (class, domain) cells in sorted order with how many of its rows each holds, as
    arrays (client, class, domain, rows): one sort of every client's rows, not one per client."""
    sizes = np.array([len(r) for r in clients], dtype=np.int64)
    rows = np.concatenate(clients).astype(np.int64) if len(clients) else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(len(clients)), sizes)
    lab, dom = labels[rows], domains[rows]
    order = np.lexsort((dom, lab, owner))
    o, lab, dom = owner[order], lab[order], dom[order]
    starts = np.flatnonzero(np.r_[True, (o[1:] != o[:-1]) | (lab[1:] != lab[:-1]) | (dom[1:] != dom[:-1])]) if len(o) \
        else np.zeros(0, np.int64)
    return o[starts], lab[starts], dom[starts], np.diff(np.r_[starts, len(o)])


def _every_class(held: tuple[np.ndarray, ...], classes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Uniform mix: every class in each domain a client holds, domain by domain, one row's weight each."""
    owner, _, domain, _ = held
    pairs = np.unique(np.stack([owner, domain], axis=1).reshape(-1, 2), axis=0)
    n = len(classes)
    return (np.repeat(pairs[:, 0], n), np.tile(classes, len(pairs)), np.repeat(pairs[:, 1], n),
            np.ones(len(pairs) * n, np.int64))


def _find_cells(keys: np.ndarray, label: np.ndarray, domain: np.ndarray) -> np.ndarray:
    """Index of each (class, domain) among the sorted cell ``keys``, or -1 where the cell is not there."""
    if not len(keys):
        return np.full(len(label), -1, np.int64)
    # Ranks among the values that occur: codes sorted as the keys are, and small whatever the labels and domains.
    _, label_rank = np.unique(np.r_[keys[:, 0], label], return_inverse=True)
    domains, domain_rank = np.unique(np.r_[keys[:, 1], domain], return_inverse=True)
    code = label_rank.reshape(-1).astype(np.int64) * len(domains) + domain_rank.reshape(-1)
    codes, wanted = code[:len(keys)], code[len(keys):]
    at = np.minimum(np.searchsorted(codes, wanted), len(codes) - 1)
    return np.where(codes[at] == wanted, at, -1)
