"""CLIP class-text embeddings: per backbone and class list, one (T, C, D) array per template set, written whole.

A mixin of ``FeatureStore``, so that ``store.put_text(...)`` and the rest stay the store's own methods with no
forwarding; it uses only the store's ``root``, ``path`` and ``entry_ids``.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Iterable

import numpy as np
import zarr

from fedcache import disk
from fedcache.errors import DamagedEntryError, EntryNotFoundError, IncompleteEntryError, StoreError, UnreadableEntryError
from fedcache.paths import denied_problem, is_denied, unreadable_store
from fedcache.store.entries import TEXT, now_iso
from fedcache.store.integrity import CRC_ATTR, crc
from fedcache.store.keys import TextKey
from fedcache.wording import Placeholder, pasted

UNKNOWN = Placeholder("DATASET")  # a dataset a message cannot name

log = logging.getLogger(__name__)


class TextEmbeddings:
    """The store's ``text/`` group (docs/store.md)."""

    path: Path
    root: zarr.Group

    def put_text(self, key: TextKey, embeddings: np.ndarray, random_weights: bool) -> str:
        """Store per-template class-text embeddings (T, C, D); written whole, then marked complete."""
        group = self.root[TEXT]
        eid = key.entry_id
        folder = self.path / TEXT / eid
        shutil.rmtree(folder, ignore_errors=True)
        emb = np.asarray(embeddings, dtype=np.float32)
        what = f"the text embeddings of {key.backbone} in"
        disk.check_space(folder, emb.nbytes, what)
        with disk.on_full_disk(folder, what, emb.nbytes, remove=[folder]):  # a text entry is written whole or not at all
            g = group.create_group(eid)
            g.create_array("embeddings", data=emb)
            g.attrs.update({"key": key.to_dict(), "random_weights": random_weights, CRC_ATTR: crc(emb)})
            g.attrs.update({"complete": True, "completed_at": now_iso()})
        return eid

    def has_text(self, key: TextKey) -> bool:
        """True if the text entry is complete and intact (a damaged one is written again); UnreadableEntryError
        where this user may not read it (another user's permissions: not damage to write over)."""
        try:
            self._text(key.entry_id)
        except UnreadableEntryError:
            raise
        except StoreError:
            return False
        return True

    def _text(self, entry_id: str) -> np.ndarray:
        a: dict = {}
        try:
            g = self.root[TEXT][entry_id]
            a = dict(g.attrs)
            if not a.get("complete"):
                raise IncompleteEntryError(f"text entry {entry_id} ({text_label(a)}) in {self.path} is not complete")
            emb = g["embeddings"][:]
        except StoreError:
            raise
        except Exception as exc:
            if is_denied(exc):  # another user's entry, made under a strict umask: unreadable here, not damaged
                raise self._unreadable_text(entry_id, denied_problem(exc)[1], a) from None
            problem = f"{type(exc).__name__}: {exc}"
        else:
            if CRC_ATTR not in a or crc(emb) == a[CRC_ATTR]:
                return emb
            problem = "its embeddings do not hold what was written"
        backbone = _key(a).get("backbone")
        again = f"the `fedcache extract ... --backbones {backbone}` that made it" if backbone else "`fedcache extract` for its backbone"
        raise DamagedEntryError(f"text entry {entry_id} ({text_label(a)}) in {self.path} is damaged ({problem}); re-run "
                                f"{again}, which writes it again", problem)

    def _unreadable_text(self, entry_id: str, problem: str, attrs: dict | None = None) -> UnreadableEntryError:
        """As ``FeatureStore.refused`` says a feature entry this user may not read: its owner's to make readable."""
        return UnreadableEntryError(unreadable_store(self.path, f"text entry {entry_id} ({text_label(attrs or {})}): "
                                                                f"{problem}"), problem)

    def verify_text(self, entry_id: str) -> tuple[str, str]:
        """(status, detail) of a text entry, as :meth:`verify`."""
        try:
            self._text(entry_id)
        except IncompleteEntryError:
            return "partial", "not complete: written again by the next extraction of its backbone"
        except DamagedEntryError as exc:
            return "damaged", exc.problem
        except UnreadableEntryError as exc:
            return "unreadable", exc.problem
        return "ok", ""

    def text_entries(self) -> list[tuple[str, dict]]:
        """(entry id, attributes) of every readable text entry; damaged ones, and those this user may not read, are
        left out (`store verify` names them)."""
        return self._text_attrs()[0]

    def _text_attrs(self) -> tuple[list[tuple[str, dict]], dict[str, UnreadableEntryError]]:
        """:meth:`text_entries`, and why each text entry this user may not read is not among them, by id."""
        out, refused = [], {}
        for eid in self.entry_ids(TEXT):
            try:
                out.append((eid, dict(self.root[TEXT][eid].attrs)))
            except Exception as exc:
                if is_denied(exc):
                    refused[eid] = self._unreadable_text(eid, denied_problem(exc)[1])
                else:
                    log.warning("text entry %s in %s is damaged; `fedcache store verify` names it", eid, self.path)
        return out, refused

    def texts_of(self, of: dict[str, tuple[Iterable[str], str | None]],
                 wanted: Iterable[str] | None = None) -> list[tuple[str, dict, np.ndarray]]:
        """(id, attributes, embeddings) of every complete text entry of each backbone of ``of`` for its (classes,
        weights hash): of those weights where the store has any, as :meth:`read_text` reads. Each is checked
        (DamagedEntryError, UnreadableEntryError naming it); another dataset's text on the same backbone is not read.
        One this user may not read, whose key is unknown, is refused only where it may be theirs: ``wanted``, the ids
        an extraction of theirs writes (:func:`unrelated`), where given."""
        entries, refused = self._text_attrs()
        for eid, exc in refused.items():
            if not unrelated(eid, wanted):
                raise exc
        theirs = []
        for backbone, (classes, weights_hash) in of.items():
            mine = [(eid, a) for eid, a in entries if a.get("complete") and _key(a).get("backbone") == backbone
                    and _key(a).get("classes") == list(classes)]
            theirs += [(eid, a) for eid, a in mine if _key(a).get("weights_hash") == weights_hash] or mine
        return [(eid, a, self._text(eid)) for eid, a in theirs]

    def read_text(self, backbone: str, classes: Iterable[str], template_set: str = "single",
                  weights_hash: str | None = None, wanted: Iterable[str] | None = None) -> np.ndarray:
        """Class-text embeddings (T, C, D) of the newest complete text entry matching the request; of the weights
        ``weights_hash`` (those of the image features they go with) where the store has them. ``wanted``: the ids of
        the entries that would be the one asked for (an extraction's, ``fedcache.federate.text``), so that a text
        entry this user may not read, of unknown key, is said instead of "not extracted" only where it may be it."""
        best, refused = self._newest_text(backbone, list(classes), template_set, weights_hash)
        maybe = [exc for eid, exc in refused.items() if not unrelated(eid, wanted)]
        if best is None and maybe:  # it may be the one asked for: not to be extracted again, nor said missing
            raise maybe[0]
        if best is None:
            dataset = self._dataset_of(list(classes))
            raise EntryNotFoundError(
                f"no '{template_set}' text embeddings for {backbone} and these classes; run `fedcache extract "
                f"{pasted('--store', self.path, '--dataset', dataset, '--backbones', backbone)}` (only CLIP-style "
                "backbones have them)" + ("" if dataset != UNKNOWN else f", {UNKNOWN} being a dataset of these classes"))
        return self._text(best)

    def _dataset_of(self, classes: list[str]) -> str:
        """The dataset whose features in this store have ``classes`` (UNKNOWN where none does): the one the text
        embeddings are extracted with."""
        datasets = sorted({e.key["dataset"] for e in self.entries() if list(e.attrs.get("classes") or ()) == classes})
        return datasets[0] if datasets else UNKNOWN

    def _newest_text(self, backbone: str, classes: list[str], template_set: str,
                     weights_hash: str | None = None) -> tuple[str | None, dict[str, UnreadableEntryError]]:
        """The id of the newest text entry matching the request (None: none does), and the text entries this user
        may not read (whose keys are unknown)."""
        found = []
        entries, refused = self._text_attrs()
        for eid, a in entries:
            k = _key(a)
            if a.get("complete") and k.get("backbone") == backbone and k.get("classes") == classes and k.get("template_set") == template_set:
                found.append((a["completed_at"], k.get("weights_hash") == weights_hash, eid))
        same = [f for f in found if f[1]]
        return (max(same or found)[2] if found else None), refused


def unrelated(entry_id: str, wanted: Iterable[str] | None) -> bool:
    """Whether a text entry of unknown key (this user may not read it) cannot be one of ``wanted`` (None: any may be)."""
    return wanted is not None and entry_id not in set(wanted)


def _key(attrs: dict) -> dict:
    """A text entry's key from its attributes; {} where damaged attributes hold something else there."""
    k = attrs.get("key")
    return k if isinstance(k, dict) else {}


def text_label(attrs: dict) -> str:
    """What a text entry holds, from its attributes, as ``EntryInfo.label`` says a feature entry's."""
    k = attrs.get("key")
    if not isinstance(k, dict) or not k.get("backbone"):
        return "text embeddings, backbone unknown"
    return f"{k['backbone']} text embeddings, {k.get('template_set', '?')} templates"
