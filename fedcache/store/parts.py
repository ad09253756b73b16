"""Which chunks of an entry one writer fills: ``--part i/n`` splits them among several (GPUs, machines).
Here, apart from the writer (zarr), so that extract's settings, which hold a Part, import fast."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from fedcache.errors import ConfigError


@dataclass(frozen=True)
class Part:
    """The ``index``-th of ``count`` disjoint slices of an entry's chunks."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ConfigError(f"part {self}: need 0 <= i < n (the i-th of n parts, --part i/n)")

    @classmethod
    def parse(cls, text: str) -> "Part":
        """``i/n``, as ``--part`` gives it; ValueError saying what it expected."""
        i, _, n = str(text).partition("/")
        try:
            return cls(int(i), int(n))
        except ValueError:  # ConfigError is one: a part out of range reads the same as one misspelt
            raise ValueError("expected i/n, the i-th of n parts with 0 <= i < n, such as 0/4") from None

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def lock_name(self, entry_id: str) -> str:
        """The file its writer of ``entry_id`` holds (in the store's locks folder) while it writes."""
        return f"{entry_id}.part{self.index}of{self.count}.lock"

    @classmethod
    def of_lock(cls, name: str) -> "Part | None":
        """The part whose lock file is named ``name`` (:meth:`lock_name`); None for another file."""
        found = _LOCK.search(name)
        return cls(int(found[1]), int(found[2])) if found and int(found[1]) < int(found[2]) else None

    def chunks(self, n_chunks: int) -> list[int]:
        # Contiguous ranges keep each writer's reads and writes local.
        return [int(c) for c in np.array_split(np.arange(n_chunks), self.count)[self.index]]


_LOCK = re.compile(r"\.part(\d+)of(\d+)\.lock$")
