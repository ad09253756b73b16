"""The registered partition schemes: each splits training rows among clients.

Every function takes ``(labels, domains, request, rng)`` and returns one array of row
indices per client. Schemes never share a training row between clients.
"""
from __future__ import annotations

import numpy as np

from fedcache.errors import ConfigError
from fedcache.federate.partitions.core import Dealt, PartitionRequest, register_scheme
from fedcache.wording import named

# Dirichlet draws are cheap; this many failures means the request cannot be met in practice.
MAX_DIRICHLET_TRIES = 1000


@register_scheme("iid")
def iid(labels: np.ndarray, domains: np.ndarray, request: PartitionRequest, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and split into near-equal parts."""
    return np.array_split(rng.permutation(len(labels)), request.n_clients)


@register_scheme("dirichlet", ("alpha", "min_size", "class_budget"))
def dirichlet(labels: np.ndarray, domains: np.ndarray, request: PartitionRequest, rng: np.random.Generator) -> list[np.ndarray]:
    """Label shift: each class is spread over clients by proportions drawn from Dirichlet(alpha).

    The usual LDA partition: classes are dealt in order; a client already holding its fair
    share (N / n_clients rows) gets nothing more, which keeps client sizes from running away.
    The whole draw is repeated until every client has at least ``min_size`` rows.
    With ``class_budget``, only a budget of rows per class is spread (``budget_split``).
    """
    alpha = request.alpha
    if request.class_budget is not None:
        return budget_split(labels, [np.arange(len(labels))], np.zeros(request.n_clients, np.int64), alpha,
                            request, rng, ["the data"])
    return dirichlet_split(np.arange(len(labels)), labels, request.n_clients, alpha, request.min_size, rng, "the data")


def budget_split(labels, pools: list[np.ndarray], owner: np.ndarray, alpha: float, request: PartitionRequest,
                 rng: np.random.Generator, names: list[str]) -> Dealt:
    """FedPCL's protocol: for each class, p ~ Dirichlet(alpha) over all clients, and client i takes
    ``floor(p_i * budget * n_clients)`` rows of the class (``budget = class_budget``) from its pool.

    ``pools[g]`` are the rows the clients with ``owner == g`` draw from (one pool for ``dirichlet``,
    one per domain for ``domain-dirichlet``). Flooring each share, as the official code does, leaves
    a class up to n_clients - 1 rows short of ``budget * n_clients``. A pool with fewer rows of a class
    than its clients ask for shares what it has in the same proportions, noted (``Dealt.notes``) for every
    run on the partition to say. Redrawn until every client has ``min_size`` rows. No fair-share cap: the official feature & label shift
    functions have none; its label-shift ones (prepare_data_{mnistm,caltech,real}_noniid) give no more rows
    to a client holding N / n_clients of the whole file, which binds where the pool is the whole file
    (Caltech; MNIST-M with 40 or 80 clients): docs/methods/fedpcl.md.
    """
    classes = np.unique(labels)
    avail = np.array([np.bincount(np.searchsorted(classes, labels[pool]), minlength=len(classes)) for pool in pools])
    total = request.class_budget * len(owner)
    for _ in range(MAX_DIRICHLET_TRIES):
        want = np.floor(rng.dirichlet(np.full(len(owner), alpha), size=len(classes)) * total).astype(np.int64)
        counts, short = _fit(want, avail, owner)
        if counts.sum(axis=0).min() >= request.min_size:
            break
    else:
        raise ConfigError(
            f"no Dirichlet({alpha}) draw of class_budget {request.class_budget} in {MAX_DIRICHLET_TRIES} tries gave "
            f"every one of {len(owner)} clients {request.min_size} rows; use a larger class_budget or alpha"
        )
    # Not logged here: said by each run on the partition (partitioning.partition_of), made now or found stored.
    notes = [f"class_budget {request.class_budget} x {len(owner)} clients asks for more rows than there are of "
             + ", ".join(f"class {classes[k]} in {names[g]} ({avail[g, k]} rows)" for g, k in short[:10])
             + ": those rows are shared in the drawn proportions"] if short else []
    parts: list[list[np.ndarray]] = [[] for _ in owner]
    for g, pool in enumerate(pools):
        clients = np.flatnonzero(owner == g)
        for k, c in enumerate(classes):
            members = rng.permutation(pool[labels[pool] == c])[: counts[k, clients].sum()]
            for i, piece in zip(clients, np.split(members, np.cumsum(counts[k, clients])[:-1])):
                parts[i].append(piece)
    return Dealt([np.concatenate(p) for p in parts], tuple(notes))


def _fit(want: np.ndarray, avail: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``want`` cut down where a pool lacks rows of a class, keeping the proportions; and the (pool, class) cut."""
    counts, short = want.copy(), []
    for g in range(avail.shape[0]):
        clients = np.flatnonzero(owner == g)
        for k in np.flatnonzero(want[:, clients].sum(axis=1) > avail[g]):
            need = want[k, clients].sum()
            counts[k, clients] = np.diff(np.cumsum(want[k, clients]) * avail[g, k] // need, prepend=0)
            short.append((g, int(k)))
    return counts, short


def dirichlet_split(rows, labels, n_clients: int, alpha: float, min_size: int, rng: np.random.Generator, what: str) -> list[np.ndarray]:
    """Split ``rows`` among ``n_clients`` by per-class Dirichlet(alpha) proportions."""
    classes, y = np.unique(labels[rows], return_inverse=True)
    y = y.reshape(-1)
    if min_size * n_clients > len(rows):
        raise ConfigError(
            f"{n_clients} clients of at least {min_size} rows each need {min_size * n_clients} training rows but "
            f"{what} has {len(rows)}; use fewer clients"
        )
    for _ in range(MAX_DIRICHLET_TRIES):
        counts = _dirichlet_counts(np.bincount(y, minlength=len(classes)), n_clients, alpha, rng)
        if counts.sum(axis=0).min() >= min_size:
            break
    else:
        raise ConfigError(
            f"no Dirichlet({alpha}) draw in {MAX_DIRICHLET_TRIES} tries gave every one of {n_clients} clients "
            f"{min_size} rows of {what} (the least a Dirichlet partition gives a client); use a larger alpha or fewer clients"
        )
    # Client k holds, class after class, the next counts[c, k] of the class's shuffled rows: every row's client
    # is worked out at once and the rows grouped by client (stable: in class order, then shuffled order).
    members = np.concatenate([rng.permutation(rows[y == c]) for c in range(len(classes))])
    owner = np.concatenate([np.repeat(np.arange(n_clients), counts[c]) for c in range(len(classes))])
    grouped = members[np.argsort(owner, kind="stable")]
    return np.split(grouped, np.cumsum(np.bincount(owner, minlength=n_clients))[:-1])


def _dirichlet_counts(class_sizes: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """(classes, clients) row counts of one draw."""
    fair = class_sizes.sum() / n_clients
    held = np.zeros(n_clients)
    counts = np.zeros((len(class_sizes), n_clients), dtype=np.int64)
    for c, p in enumerate(rng.dirichlet(np.full(n_clients, alpha), size=len(class_sizes))):
        open_ = held < fair
        p = p * open_
        # A tiny alpha can put all the mass on full clients; spread evenly over open ones then.
        p = p / p.sum() if p.sum() > 0 else open_ / open_.sum()
        cuts = (np.cumsum(p)[:-1] * class_sizes[c]).astype(np.int64)
        counts[c] = np.diff(np.r_[0, cuts, class_sizes[c]])
        held += counts[c]
    return counts


@register_scheme("shards", ("shards",))
def shards(labels: np.ndarray, domains: np.ndarray, request: PartitionRequest, rng: np.random.Generator) -> list[np.ndarray]:
    """Pathological label skew: rows sorted by label, cut into equal shards, ``shards`` random ones per client."""
    per_client = request.shards
    n_shards = per_client * request.n_clients
    if n_shards > len(labels):
        raise ConfigError(
            f"{request.n_clients} clients x {per_client} shards = {n_shards} shards but only {len(labels)} training rows; "
            "use fewer shards per client or fewer clients"
        )
    order = rng.permutation(len(labels))  # random order within a class, so shards do not follow id order
    order = order[np.argsort(labels[order], kind="stable")]
    pieces = np.array_split(order, n_shards)
    dealt = rng.permutation(n_shards).reshape(request.n_clients, per_client)
    return [np.concatenate([pieces[i] for i in hand]) for hand in dealt]


def _domain_clients(domains: np.ndarray, request: PartitionRequest) -> tuple[np.ndarray, int]:
    """The domains present and how many clients each gets (clients are numbered domain by domain)."""
    present = np.unique(domains)
    if len(present) < 2:
        raise ConfigError(
            f"the {request.scheme} scheme gives each client one domain, but this data has {len(present)} domain; "
            "use dirichlet or iid, or a multi-domain dataset"
        )
    per_domain = request.clients_per_domain or request.n_clients // len(present)
    if per_domain < 1 or per_domain * len(present) != request.n_clients:
        each = named("--clients-per-domain", "clients_per_domain")
        if request.clients_per_domain is not None:
            right = per_domain * len(present)
            fix = f"use {named(f'--clients {right}', f'clients={right}')}, or leave {each} out"
        else:
            fix = f"use a multiple of {len(present)} clients"
        raise ConfigError(
            f"the {request.scheme} scheme needs the same number of clients in each of the {len(present)} domains, "
            f"so {each} x {len(present)} must equal {named('--clients', 'clients')} ({request.n_clients}); {fix}"
        )
    return present, per_domain


@register_scheme("domain", ("clients_per_domain",))
def domain(labels: np.ndarray, domains: np.ndarray, request: PartitionRequest, rng: np.random.Generator) -> list[np.ndarray]:
    """Feature shift: clients ``[d*m, (d+1)*m)`` split the rows of the d-th domain present, IID."""
    present, per_domain = _domain_clients(domains, request)
    out: list[np.ndarray] = []
    for d in present:
        out += np.array_split(rng.permutation(np.flatnonzero(domains == d)), per_domain)
    return out


@register_scheme("domain-dirichlet", ("clients_per_domain", "alpha", "min_size", "class_budget"))
def domain_dirichlet(labels: np.ndarray, domains: np.ndarray, request: PartitionRequest, rng: np.random.Generator) -> list[np.ndarray]:
    """Feature and label shift: as ``domain``, but each domain is split by Dirichlet(alpha) label proportions.

    With ``class_budget`` (FedPCL's protocol, ``budget_split``) the Dirichlet draw is over all clients,
    each taking its share of a class from its own domain: with one client per domain there is label
    skew between domains, where splitting each domain's rows has none to add.
    """
    present, per_domain = _domain_clients(domains, request)
    alpha = request.alpha
    if request.class_budget is not None:
        pools = [np.flatnonzero(domains == d) for d in present]
        return budget_split(labels, pools, np.repeat(np.arange(len(present)), per_domain), alpha, request, rng,
                            [f"domain {d}" for d in present])
    out: list[np.ndarray] = []
    for d in present:
        rows = np.flatnonzero(domains == d)
        out += dirichlet_split(rows, labels, per_domain, alpha, request.min_size, rng, f"domain {d}")
    return out


@register_scheme("class-disjoint", ("classes_per_client", "repeat_rate"))
def class_disjoint(labels: np.ndarray, domains: np.ndarray, request: PartitionRequest, rng: np.random.Generator) -> list[np.ndarray]:
    """Disjoint class groups per client (PromptFL), optionally with repeated classes.

    The classes are shuffled and dealt into ``n_clients`` groups: of ``classes_per_client``
    classes each (classes left over are unused), or, when unset, all classes in groups whose
    sizes differ by at most one. With ``repeat_rate`` r, a client whose group has g classes
    also holds ``round(r * g)`` classes drawn at random from the other clients' groups. The
    rows of a class are shuffled and split evenly among all clients holding it, so training
    rows stay disjoint; a repeated class takes rows away from its owner.
    """
    held = _class_groups(np.unique(labels), request, rng)
    holders: dict[int, list[int]] = {}
    for k, group in enumerate(held):
        for c in group:
            holders.setdefault(int(c), []).append(k)
    parts: list[list[np.ndarray]] = [[] for _ in range(request.n_clients)]
    for c in sorted(holders):
        rows = rng.permutation(np.flatnonzero(labels == c))
        for k, piece in zip(holders[c], np.array_split(rows, len(holders[c]))):
            parts[k].append(piece)
    return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]


def _class_groups(classes: np.ndarray, request: PartitionRequest, rng: np.random.Generator) -> list[np.ndarray]:
    """Each client's classes: its own group, then its repeats."""
    n, per_client = request.n_clients, request.classes_per_client
    needed = n * (per_client or 1)
    if needed > len(classes):
        raise ConfigError(
            f"class-disjoint with {n} clients x {per_client or 1} classes needs {needed} classes but the data has "
            f"{len(classes)}; use fewer clients, fewer classes_per_client, or another scheme"
        )
    shuffled = rng.permutation(classes)
    if per_client is None:
        groups = np.array_split(shuffled, n)
    else:
        groups = list(shuffled[:needed].reshape(n, per_client))
        # The classes left out are said where the partition is used (partitioning.partition_of), made or stored.
    used = np.concatenate(groups)
    held = []
    for group in groups:
        extra = int(np.floor(request.repeat_rate * len(group) + 0.5))
        others = np.setdiff1d(used, group)
        if extra > len(others):
            raise ConfigError(
                f"repeat_rate {request.repeat_rate} asks for {extra} repeated classes per client but other clients "
                f"hold only {len(others)}; use a smaller repeat_rate or more clients"
            )
        held.append(np.concatenate([group, rng.choice(others, size=extra, replace=False)]))
    return held
