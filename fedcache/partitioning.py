"""A run's partition: the one its spec asks for (``partition_request``), found in the store or made of its tables
(``partition_of``), or of their labels, domains and ids alone (``partition_only``). No torch: `fedcache partition`
imports this module and a ``spec.DataPartition`` (no method), not training.py, whose run loads torch (seconds)."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar

from fedcache.federate.partitions import (Partition, PartitionRequest, classes_left_out, few_shot_short,
                                          stored_partition)
from fedcache.federate.tables import check_same_encoder, check_same_source, load_split_rows
from fedcache.progress import StepCallback, said_step
from fedcache.spec import DataPartition, RunSpec
from fedcache.store.feature_store import FeatureStore, FeatureTable, TableRows
from fedcache.wording import count

log = logging.getLogger(__name__)

# What the current call (a run, a grid, the demo) has said of each partition: its few-shot shortfall, its notes ...
# Per call, not per process: a notebook's second run on a partition heard none of its warnings.
_SAID: ContextVar[set[tuple[str, str]] | None] = ContextVar("fedcache_partition_said", default=None)
Spec = RunSpec | DataPartition  # what a partition reads of a spec: its data, partition and schedule sections
Rows = FeatureTable | TableRows  # a table, or its rows before (or without) its features


def partition_of(spec: Spec, store: FeatureStore, train_t: Rows, test_t: Rows) -> tuple[Partition, dict]:
    """The partition ``spec`` asks for of the tables (or their rows: only labels, domains and ids are read), found
    in the store or made and stored there, and what config.json records of it."""
    check_same_source(train_t, test_t)  # before a partition is made of them
    check_same_encoder(store, train_t, test_t)
    request = partition_request(spec, len(train_t.domain_names))
    partition, pid = stored_partition(store, spec.data.dataset, request, train_t, test_t)
    say_partition(partition, pid, train_t)
    info = {"partition_id": pid, "request": request.to_dict(), "effective": request.effective(len(train_t.domain_names)),
            "entries": list(train_t.entry_ids + test_t.entry_ids),
            "scored_on": "validation (spare training rows)" if spec.schedule.validation else "test split"}
    return partition, info


def say_partition(partition: Partition, pid: str, train_t: Rows) -> None:
    """Warn of what ``partition`` (id ``pid``, of ``train_t``'s training rows) fell short of or left out, once per
    partition and call (``said_once``: a grid's cells share theirs): every run on it and every sharding of it says the
    same (a sharding that said less handed its clients a partition they would have been warned of)."""
    with said_once() as said_before:
        for said in (*partition.notes, few_shot_short(partition, train_t.labels),
                     classes_left_out(partition, train_t.labels, train_t.class_names)):
            if said and (pid, said) not in said_before:
                said_before.add((pid, said))
                log.warning("%s", said)


@contextlib.contextmanager
def said_once() -> Iterator[set[tuple[str, str]]]:
    """A call (a run, a grid, the demo; also a decorator) within which each partition's warnings are said once, by
    the first of its runs to use it; the next call says them again. Within another such call, that call's."""
    said = _SAID.get()
    if said is not None:
        yield said
        return
    token = _SAID.set(set())
    try:
        yield _SAID.get()
    finally:
        _SAID.reset(token)


class _Everything(set):
    def __contains__(self, item) -> bool:
        return True


@contextlib.contextmanager
def said_by_the_grid() -> Iterator[None]:
    """A grid's cell, which says none of its partition's warnings: the grid said them as it made the partitions of
    its cells (grids/run.py), before any cell ran; each worker of `--engine processes` said them again, a line each."""
    token = _SAID.set(_Everything())
    try:
        yield
    finally:
        _SAID.reset(token)


def partition_only(spec: Spec, on_step: StepCallback | None = None) -> tuple[Partition, dict, TableRows]:
    """The partition of ``spec`` as ``training.load_data`` finds or makes it, from the labels, domains and ids of the
    store's tables alone (``load_split_rows``): the features are neither read nor checked (`fedcache partition`;
    a run that reads them checks them). Also the training rows, whose labels and domains a plot shows."""
    t0 = time.perf_counter()
    d = spec.data
    store = FeatureStore(d.store, create=False)
    train_r, test_r = load_split_rows(store, d.dataset, list(d.backbones))
    partition, info = partition_of(spec, store, train_r, test_r)
    seconds = time.perf_counter() - t0
    said_step(log, on_step, f"partition ready in {seconds:.1f} s: the labels of {count(len(train_r) + len(test_r), 'row')} "
                            f"of {d.dataset} on {'+'.join(d.backbones)} read from {d.store}, partition {info['partition_id']}",
              seconds)
    return partition, info, train_r


def partition_request(spec: Spec, n_domains: int) -> PartitionRequest:
    """The partition ``spec`` asks for on data of ``n_domains`` domains, seeded by the run's seed."""
    return PartitionRequest(spec.partition, spec.partition.n_clients(n_domains), spec.schedule.seed)
