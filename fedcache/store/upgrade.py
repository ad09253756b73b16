"""``fedcache store upgrade``: format-1 entries rewritten in the current format, bit for bit.

Format-1 entries (zstd chunks through Zarr, CRC-32) still read, only slower and never memory-mapped.
Upgrading one reads it chunk by chunk, each chunk checked against its CRC-32, writes the same rows in
the current format beside the store (``<store>/.upgrade/<entry id>``, outside ``entries`` so that no
reader lists it), then swaps the two folders. A damaged entry is left as it is and named; a partial one
is left to the extraction that began it (which finishes it in format 1). An upgrade interrupted between
the two renames of the swap is finished by the next one. Entry ids, keys and completion times are
kept, so every run, partition and grid that names an entry still finds it.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable

import numpy as np
import zarr

from fedcache.errors import DamagedEntryError, UnreadableEntryError
from fedcache.store.feature_store import ENTRIES, ENTRY_FORMAT, EntryInfo, FeatureStore
from fedcache.store.integrity import ROW_ARRAYS
from fedcache.store.keys import EntryKey
from fedcache.store.locks import exclusive_lock
from fedcache.store.writer import EntryWriter, _create_entry
from fedcache.wording import pasted

STAGING = ".upgrade"
UPGRADE_LOCK = "upgrade"  # <store>/.locks/upgrade.lock, held for a whole upgrade
# Attributes the new entry computes itself (the rest, such as classes and domains, are copied).
_OWN = ("key", "n_rows", "dim", "chunk_rows", "batch_size", "complete", "completed_at", "n_valid", "n_bad_images")


@dataclass(frozen=True)
class Upgraded:
    entry_id: str
    label: str
    status: str  # upgraded, current (already the current format), skipped
    detail: str = ""


def upgrade_store(store: FeatureStore, on_entry: Callable[[Upgraded], None] | None = None) -> list[Upgraded]:
    """Every format-1 entry rewritten in the current format (the first one written raises the store's format,
    so that an older fedcache refuses the store rather than misreads it). One upgrade of a store at a time: a second
    rewrote the entries the first had just upgraded, from the format it had listed them in, and each one's last step
    (removing the staging folder) took the other's entries being swapped in with it."""
    with store.lock(UPGRADE_LOCK, f"the store {store.path}", wait=0.0,
                    advice="another `fedcache store upgrade` is upgrading it; let it finish (a second has nothing "
                           "left to do)"):
        _finish_interrupted(store)
        done = []
        for info in store.entries():
            result = _upgrade(store, info)
            done.append(result)
            if on_entry:
                on_entry(result)
        shutil.rmtree(store.path / STAGING, ignore_errors=True)
    return done


def _upgrade(store: FeatureStore, info: EntryInfo) -> Upgraded:
    eid, label = info.entry_id, info.label()
    if info.damaged:
        return _skipped(store, info, store.refused(info, info.damaged, info.denied))
    if info.format >= ENTRY_FORMAT:
        return Upgraded(eid, label, "current")
    if not info.complete:
        return Upgraded(eid, label, "skipped", "partial: finish it with the extraction that began it, then upgrade")
    key = EntryKey(**info.key)
    if key.entry_id != eid:
        return Upgraded(eid, label, "skipped", "its key no longer hashes to its id (made by a much older fedcache)")
    with exclusive_lock(store.create_lock(eid), f"entry {key.label()}", wait=30.0,
                        advice="upgrade again once it has finished"):
        try:
            _rewrite(store, info, key)
        except (DamagedEntryError, UnreadableEntryError) as exc:
            shutil.rmtree(store.path / STAGING / eid, ignore_errors=True)
            return _skipped(store, info, exc)
        _swap(store, eid)
    return Upgraded(eid, label, "upgraded")


def _skipped(store: FeatureStore, info: EntryInfo, why: DamagedEntryError | UnreadableEntryError) -> Upgraded:
    if isinstance(why, UnreadableEntryError):  # another user's permissions: removing it would be wrong
        return Upgraded(info.entry_id, info.label(), "skipped", f"not readable by this user ({why.problem}); have its "
                        "owner make it readable (chmod -R a+rX)")
    return Upgraded(info.entry_id, info.label(), "skipped", f"damaged ({why.problem}); `fedcache store verify --repair "
                    f"{pasted('--store', store.path)}` removes it")


def _rewrite(store: FeatureStore, info: EntryInfo, key: EntryKey) -> None:
    """The entry's rows, each chunk checked as it is read, written again into the staging folder."""
    stage = store.path / STAGING
    shutil.rmtree(stage / info.entry_id, ignore_errors=True)
    parent = zarr.open_group(store=str(stage), mode="a", zarr_format=3)
    a = info.attrs
    attrs = {k: v for k, v in a.items() if k not in _OWN}
    group = _create_entry(store, key, info.n_rows, info.dim, int(a["batch_size"]), attrs, int(a["chunk_rows"]),
                          ENTRY_FORMAT, parent)
    writer = EntryWriter(store, key, group, stage / info.entry_id, locked=True)  # _upgrade holds it
    reader = store.reader(info)
    try:
        for c in range(writer.n_chunks):
            lo, hi = writer.chunk_range(c)
            # An empty entry has one empty chunk, which the reader does not read.
            rows = [reader.chunk(name, c) for name in ROW_ARRAYS] if hi > lo else [np.zeros((0, info.dim))] + [[]] * 3
            if reader.problem:
                raise store.refused(info, reader.problem, bool(reader.denied))
            writer.write_chunk(c, *rows)
    finally:
        reader.close()
    writer.finish()
    writer.group.attrs.update({"completed_at": info.completed_at})  # which entry of a slot is current must not change


def _swap(store: FeatureStore, eid: str) -> None:
    live, new, old = store.path / ENTRIES / eid, store.path / STAGING / eid, store.path / STAGING / f"{eid}.old"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(live, old)
    os.rename(new, live)
    shutil.rmtree(old)


def _finish_interrupted(store: FeatureStore) -> None:
    """A staged entry whose live folder was already moved aside is moved in (the swap's second rename)."""
    stage = store.path / STAGING
    for new in sorted(stage.iterdir()) if stage.is_dir() else []:
        live = store.path / ENTRIES / new.name
        if new.is_dir() and not new.name.endswith(".old") and not live.exists() and (stage / f"{new.name}.old").is_dir():
            os.rename(new, live)
            shutil.rmtree(stage / f"{new.name}.old")
