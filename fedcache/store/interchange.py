"""Import your own embeddings as normal entries (their export: fedcache/store/exporting.py).

File layout (both formats): per split ``S`` in the file, ``S/features`` (N, D), ``S/labels`` (N,),
optional ``S/domains`` (N,) integer domain index and ``S/ids`` (N,); attributes (HDF5) or
0-d string arrays (NPZ) ``classes`` and ``domains`` as JSON lists. In NPZ the ``/`` is ``__``.
A flat file with just ``features``/``labels`` (and optional ``domains``) is read as one split.

Import checks every field before writing anything (fedcache/store/importing.py): nothing is
truncated, coerced or dropped; a bad file is one error naming the field and the fix. It holds the
features at most once (memory-mapped where the file allows) and writes them chunk by chunk.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from fedcache import disk
from fedcache.errors import DiskFullError
from fedcache.paths import check_name
from fedcache.progress import StepCallback, said_step
from fedcache.store.feature_store import ENTRIES, FeatureStore, import_lock, superseded_partials
from fedcache.store.importing import Checked, Split, read_checked
from fedcache.store.keys import EntryKey
from fedcache.store.writer import Part, open_writer
from fedcache.wording import count

log = logging.getLogger(__name__)

OnRows = Callable[[int, int], None]  # (rows written, rows of the file): as the writing starts, then after each chunk


@dataclass(frozen=True)
class Imported:
    """What an import did, as the store was while it held the import's lock (a second import queued behind a
    first finds the first's entries there)."""

    ids: list[str]  # every entry of the file, in the file's split and domain order
    written: list[str]  # those this import wrote (absent, or left partial by an interrupted import)
    were_current: bool  # nothing written and every entry the one runs read already
    superseded: list[str]  # other entries under the same names that runs no longer read


def import_file(store: FeatureStore | Path, path: Path, dataset: str, backbone: str, split: str | None = None,
                on_step: StepCallback | None = None, on_rows: OnRows | None = None) -> Imported:
    """Write each split of the file as complete store entries, one per named domain.

    Every field is checked first (fedcache/store/importing.py): a bad file writes nothing, not even a new store.
    ``on_step``: the check, where it took a while (``progress.said_step``); ``on_rows(done, total)``: the rows
    written, as the writing starts and after each chunk (a million rows took seconds to check and to write)."""
    check_name(dataset, "--dataset")  # a folder of the store (its partitions), and named in comma lists
    check_name(backbone, "--backbone")
    t0 = time.perf_counter()
    # The digest (a pass over the file) runs beside the checks (another): hashlib lets go of the GIL.
    with ThreadPoolExecutor(1) as pool:
        digesting = pool.submit(file_digest, Path(path))
        checked = read_checked(Path(path), split)
        digest = digesting.result()[:16]
    seconds = time.perf_counter() - t0
    said_step(log, on_step, f"{path} checked in {seconds:.1f} s: {_rows_text(checked)}", seconds)
    where = Path(store.path if isinstance(store, FeatureStore) else store)
    new_store = not where.exists()
    what, advice = f"the import of {path} into", "free some space and import again: nothing of this import was kept"
    need = sum(len(s.features) * (4 * s.features.shape[1] + 17) for s in checked.splits.values())
    disk.check_space(where, need, what, advice)
    made: list[str] = []
    try:
        store = store if isinstance(store, FeatureStore) else FeatureStore(store)
        with _one_import(store, dataset, backbone):
            infos = store.entries()
            complete = {e.entry_id for e in infos if e.complete}
            now = store.current(infos)
            current = {e.entry_id for e in now.values()}
            stale_before = (complete - current) | {e.entry_id for e in superseded_partials(infos, now)}
            ids = _write_entries(store, checked, EntryKey(dataset=dataset, dataset_fingerprint=digest, split="",
                                                          domain="", backbone=backbone, weights_hash=f"imported:{digest}",
                                                          preprocess={}, dtype="float32"), made, _Rows(checked, on_rows))
            return Imported(ids, [i for i in ids if i not in complete], set(ids) <= current,
                            sorted({e.entry_id for e in store.stale()} - stale_before))
    except DiskFullError:
        # An import is all or nothing (a bad file writes nothing either): what it wrote goes, and the space with it.
        disk.discard([where] if new_store else [where / ENTRIES / eid for eid in made])
        raise disk.full_error(where, what, need, advice) from None


def _rows_text(checked: Checked) -> str:
    """``1,100,000 rows of 256 features in 2 splits (train, test)``"""
    rows = sum(len(s.features) for s in checked.splits.values())
    dim = next(iter(checked.splits.values())).features.shape[1]
    return f"{count(rows, 'row')} of {count(dim, 'feature')} in {count(len(checked.splits), 'split')} ({', '.join(checked.splits)})"


class _Rows:
    """The rows written so far, said to ``on_rows`` (those an interrupted import had written count as written)."""

    def __init__(self, checked: Checked, on_rows: OnRows | None) -> None:
        self.done, self.total = 0, sum(len(s.features) for s in checked.splits.values())
        self.on_rows = on_rows  # told first as the first entry starts: with the rows an interrupted import kept
        self.told = False

    def wrote(self, rows: int) -> None:
        self.done += rows
        if self.on_rows is not None and (rows or not self.told):
            self.told = True
            self.on_rows(self.done, self.total)


def _write_entries(store: FeatureStore, checked: Checked, base: EntryKey, made: list[str], rows_done: _Rows) -> list[str]:
    """One entry per split and named domain, keyed as ``base`` but for those; ``made`` collects the ids that were
    not in the store before (what a full disk deletes)."""
    rows = {(name, d): domain_rows(s, d) for name, s in checked.splits.items() for d in range(len(checked.domain_names))}
    # The entries of a file whose rows were put in id order are other entries than an older fedcache made of it;
    # all of them, as every entry of one import must have one key but for its split and domain.
    how = {"imported": True, **({"rows": "in id order"} if any(r for _, r in rows.values()) else {})}
    ids = []
    for split_name, s in checked.splits.items():
        for d, domain in enumerate(checked.domain_names):
            key = dataclasses.replace(base, split=split_name, domain=domain, preprocess=how)
            made += [] if key.entry_id in store.entry_ids() else [key.entry_id]
            ids.append(_import_domain(store, key, s, rows[split_name, d][0], checked, rows_done))
    return ids


READERS_WAIT = 5.0  # seconds: a run that reads the pair holds it shared while it finds its entries, well under this


@contextlib.contextmanager
def _one_import(store: FeatureStore, dataset: str, backbone: str) -> Iterator[None]:
    """One import at a time under a (dataset, backbone): two at once interleaved their entries, each slot went to
    whichever finished it last, and every run refused the mix of the two files that both imports said they wrote."""
    with store.lock(import_lock(dataset, backbone), f"dataset {dataset!r}, backbone {backbone!r} of {store.path}",
                    wait=READERS_WAIT, advice="another import writes it (or a run finds its entries): let it finish, then import again"):
        yield


def file_digest(path: Path) -> str:
    """sha256 of the file, read a block at a time."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        while block := fh.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def domain_rows(s: Split, d: int) -> tuple[np.ndarray, bool]:
    """The file's rows of domain ``d`` in id order, and whether that is another order than the file's. A table's
    row order decides its partitions (and so the numbers) under a partition id that does not: the same samples
    imported in another order must make the same store, as an extraction (in id order) does."""
    rows = np.flatnonzero(s.domains == d)
    ids = s.ids[rows]
    if len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return rows, False
    return rows[np.argsort(ids, kind="stable")], True


def _import_domain(store: FeatureStore, key: EntryKey, s: Split, rows: np.ndarray, checked: Checked, rows_done: _Rows) -> str:
    # Every named domain gets an entry, an empty one too: readers ask for all of a dataset's domains.
    attrs = {"classes": checked.classes, "domains": checked.domain_names, "random_weights": checked.random_weights,
             "backbone_source": "imported", "file_splits": sorted(checked.splits)}  # what a run checks its splits against
    # The features are gathered a chunk at a time (a slice, no copy, when the domain's rows are consecutive).
    consecutive = len(rows) > 0 and rows[-1] - rows[0] == len(rows) - 1 and bool(np.all(rows[1:] > rows[:-1]))
    with open_writer(store, key, len(rows), s.features.shape[1], 1, attrs, Part()) as w:
        pending = w.pending()
        before = len(rows) - sum(hi - lo for lo, hi in map(w.chunk_range, pending))  # by an interrupted import
        rows_done.wrote(before)  # 0 too: the first entry's start is the progress's
        for c in pending:
            lo, hi = w.chunk_range(c)
            take = slice(rows[0] + lo, rows[0] + hi) if consecutive else rows[lo:hi]
            w.write_chunk(c, s.features[take], s.labels[take], s.ids[take], np.ones(hi - lo, bool))
            rows_done.wrote(hi - lo)
        w.finish()
    return key.entry_id
