"""Removing an entry: under the locks its writers take, and out of every reader's sight in one rename.

A mixin of ``FeatureStore``, so that ``store.remove(...)`` and ``store.discard(...)`` stay the store's own methods
with no forwarding; it uses only the store's ``path``, ``locks_dir``, ``info`` and ``bad_images_path``.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from fedcache.store.entries import ENTRIES, REMOVING, EntryInfo
from fedcache.store.locks import exclusive_lock


class Removal:
    """Removal of entries (``fedcache store rm``, repairs, a writer replacing a damaged entry)."""

    path: Path
    locks_dir: Path

    def remove(self, entry_id: str) -> EntryInfo:
        info = self.info(entry_id)
        with self._no_writer(info):
            self.discard(info.entry_id)
        return info

    @contextlib.contextmanager
    def _no_writer(self, info: EntryInfo) -> Iterator[None]:
        """Hold the locks an extraction or import of the entry takes: removed under a running writer, the entry came
        back as files without metadata, which stopped every read of the store as a damaged entry of unknown slot."""
        with contextlib.ExitStack() as held:
            # The create lock first, then the part locks found while holding it: a writer takes its part lock before
            # it lets the create lock go, so none can start writing between the look and the removal.
            what, advice = f"entry {info.entry_id} ({info.label()})", "let it finish (or stop it), then remove the entry"
            held.enter_context(exclusive_lock(self.create_lock(info.entry_id), what, advice=advice))
            for path in sorted(self.locks_dir.glob(f"{info.entry_id}.part*.lock")):
                held.enter_context(exclusive_lock(path, what, advice=advice))
            yield

    def discard(self, entry_id: str, kind: str = ENTRIES) -> None:
        # Deleted in place, an entry went file by file in directory order: stopped midway (Ctrl-C, kill), it was
        # left without its rows while its zarr.json still said complete. One rename out of its folder takes it from
        # every reader at once; the files are deleted after, and what a stopped removal left, by the next one.
        # Renamed straight to a name of its own: a folder made first to rename into was empty for a moment, and a
        # concurrent removal's sweep below deleted it, so this rename failed (FileNotFoundError).
        trash = self.path / REMOVING
        trash.mkdir(exist_ok=True)
        os.rename(self.path / kind / entry_id, trash / f"{entry_id}.{secrets.token_hex(8)}")
        self.bad_images_path(entry_id).unlink(missing_ok=True)
        for left in trash.iterdir():
            shutil.rmtree(left, ignore_errors=True)  # another process's removal may be deleting it too
