"""What an entry of the store is: the store's format numbers and folder names, and one entry's metadata.

Apart from ``feature_store`` so that the modules the store is built of (lookup, text, tables) can name these
without importing the store itself, which imports them.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Iterable

# 1: zstd-compressed chunks (Zarr's default codec), zlib CRC-32 checksums.
# 2: new entries uncompressed, CRC-32C checksums (docs/store.md says why); format-1 entries still read.
STORE_FORMAT = 2
ENTRY_FORMAT = STORE_FORMAT  # what new entries are written in
FORMAT_ATTR = "format"  # an entry's format; absent: 1
ENTRIES = "entries"
TEXT = "text"
REMOVING = ".removing"  # entries being deleted (``discard``), out of every reader's sight
SHARD_ATTR = "fedcache_shard"  # a root attribute: this store is one client's (or the server's) shard, `fedcache shard`
SLOT_FIELDS = ("dataset", "split", "domain", "backbone", "view")


@dataclass(frozen=True)
class EntryInfo:
    entry_id: str
    key: dict
    n_rows: int
    dim: int
    complete: bool
    completed_at: str | None
    attrs: dict
    damaged: str | None = None  # why its metadata cannot be read (then complete is False)
    denied: bool = False  # what ``damaged`` says is a permission this user lacks, not damage: never removed for it
    owner: str | None = None  # whose folder it is, where ``denied`` (the user who can make it readable)

    @property
    def slot(self) -> tuple:
        k = self.key
        return tuple(k.get(f) for f in SLOT_FIELDS)

    def label(self) -> str:
        k = self.key
        if not k:  # its metadata and its features' both unread: what it holds is not known
            if self.denied:  # the messages around it say to have its owner make it readable: say who that is
                return f"data unknown, owned by {self.owner}" if self.owner else "data unknown, not readable by this user"
            return "data unknown, metadata damaged"
        return f"{k.get('dataset')}/{k.get('split')}/{k.get('domain')} {k.get('backbone')}"

    @property
    def random_weights(self) -> bool:
        return bool(self.attrs.get("random_weights", False))

    @property
    def format(self) -> int:
        return int(self.attrs.get(FORMAT_ATTR, 1))



def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def newest(infos: Iterable[EntryInfo]) -> EntryInfo:
    """The entry completed last (the first of those completed at once): the extraction or import last asked for."""
    return max(infos, key=lambda e: e.completed_at or "")
