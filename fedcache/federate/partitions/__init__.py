"""Client partitions: which training rows (and which local test rows) each client holds.

Schemes (registered in ``PARTITIONERS``): ``iid``, ``dirichlet``, ``shards``, ``domain``,
``domain-dirichlet``, ``class-disjoint``; ``few_shot`` filters any of them. See
``core.make_partition`` for the steps and ``storage`` for how partitions are kept in the
feature store, keyed by (domain, id) so that every backbone's table maps onto the same split.
"""
from fedcache.federate.partitions import schemes as _schemes  # noqa: F401  (registers the schemes)
from fedcache.federate.partitions.core import (
    PARTITIONERS,
    Partition,
    PartitionRequest,
    PartitionSpec,
    classes_left_out,
    few_shot_filter,
    few_shot_short,
    local_test_sets,
    make_partition,
    partition_id,
    register_scheme,
)

# Imported when first named: the store's module imports zarr, which the run spec (and so the CLI's start-up)
# does not need for the partition options.
_STORAGE = ("PARTITIONS", "find_partition", "keys_hash", "load_partition", "save_partition", "stored_partition",
            "table_keys")


def __getattr__(name: str):
    if name in _STORAGE:
        from fedcache.federate.partitions import storage

        return getattr(storage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PARTITIONERS",
    "Partition",
    "PartitionRequest",
    "PartitionSpec",
    "classes_left_out",
    "few_shot_filter",
    "few_shot_short",
    "local_test_sets",
    "make_partition",
    "partition_id",
    "register_scheme",
    *_STORAGE,
]
