"""Why a read finds nothing, and the command that makes or finishes what it asked for.

Free functions of the store's path and entries, not methods: they only word errors, and need nothing else of
the store (``FeatureStore.find`` and ``rows`` raise what they return). Every argument of a command they give is
said by ``wording.pasted``: the store's path absolute, a value quoted where the shell needs it (a path given as a
``str`` is a placeholder such as ``STORE``, said as it is).
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Sequence

from fedcache.errors import DamagedEntryError, EntryNotFoundError, IncompleteEntryError, StoreError
from fedcache.store.entries import EntryInfo, newest
from fedcache.store.keys import canonical_json, noisy_name
from fedcache.store.parts import Part
from fedcache.wording import Placeholder, did_you_mean, pasted


def damaged_in(infos: list[EntryInfo], want: tuple, domains: set | None) -> EntryInfo | None:
    """A damaged entry that may fill a slot asked for (or whose slot is unknown): it stops the read."""
    dataset, split, backbone, view = want

    def may_fill(e: EntryInfo) -> bool:
        s = e.slot
        return s[:2] == (dataset, split) and s[3:] == (backbone, view) and (domains is None or s[2] in domains)

    hit = [e for e in infos if e.damaged and (not e.key or may_fill(e))]
    return hit[0] if hit else None


def misplaced_entries(infos: list[EntryInfo]) -> dict[str, str]:
    """{entry id: what is wrong} of each table's (dataset, split, backbone, view) newest complete entry whose
    recorded ``domains``, which a read takes for the table's, lack its own domain: no read can place its rows. An
    older entry's own list is never read. One pass: `store ls` and `store verify` ask it of every entry."""
    tables: dict[tuple, list[EntryInfo]] = {}
    for e in infos:
        if e.complete:
            slot = e.slot
            tables.setdefault(slot[:2] + slot[3:], []).append(e)
    found = {}
    for table in tables.values():
        last = newest(table)
        names, domain = last.attrs.get("domains"), last.slot[2]
        if isinstance(names, list) and domain not in names:
            found[last.entry_id] = (f"it is of domain {domain} but records the domains of its dataset as "
                                    f"{','.join(map(str, names)) or 'none'}, so no read can place its rows")
    return found


def misplaced_in(path: Path, infos: list[EntryInfo], want: tuple) -> DamagedEntryError | None:
    """The newest complete entry of (dataset, split, backbone, view) where :func:`misplaced_entries`: damaged, or of
    another store. A read then kept none of the entries, and said them not complete yet; its extraction finds it
    complete (its checksums hold) and changes nothing."""
    dataset, split, backbone, view = want
    done = [e for e in infos if e.complete and e.slot[:2] == (dataset, split) and e.slot[3:] == (backbone, view)]
    bad = misplaced_entries(done)
    if not bad:
        return None
    last = next(e for e in done if e.entry_id in bad)
    return DamagedEntryError(
        f"entry {last.entry_id} ({last.label()}) in {path} is damaged or of another store: {bad[last.entry_id]}; "
        f"remove it with `fedcache store rm {last.entry_id} {pasted('--store', path)}` and run the extraction (or "
        "import) that made it again", bad[last.entry_id])


def nothing_found(path: Path, infos: list[EntryInfo], cur: dict, want: tuple) -> StoreError:
    """No current entry of (dataset, split, backbone, view): an unfinished one is said as such, with the command
    that finishes it; else what the store lacks (:func:`not_found`)."""
    dataset, split, backbone, view = want
    pending = [e for e in infos if e.slot[:2] == (dataset, split) and e.slot[3:] == (backbone, view)]
    if pending:
        return unfinished(path, infos, pending, f"{split} features of {dataset} for {backbone}")
    return not_found(path, cur, dataset, split, backbone)


def missing_domains(path: Path, infos: list[EntryInfo], cur: dict, found: list[EntryInfo], slot: tuple,
                    missing: list[str], splits: Sequence[str] = ()) -> StoreError:
    """Domains of a table the store lacks: an extraction of them left unfinished is said as such, with the
    command that finishes it; else the extraction that makes them as the other domains were made (another
    --dtype or --image-size would make entries the table then refuses to mix), and the --name that makes the others
    a dataset of their own. ``splits``: those read with this one (a run's train and test): the command makes what
    the store lacks of each (:func:`_lacking`), so that it is run once, not once a split."""
    dataset, split, backbone, view = slot
    pending = [e for e in infos if not e.complete and e.slot == (dataset, split, e.slot[2], backbone, view)
               and e.slot[2] in missing]
    where = f"{split} features of {dataset}/{','.join(missing)} for {backbone}"
    needed = list(dict.fromkeys([*splits, split]))
    if found and _domains_unrecorded(found[0]):
        return _named_before_domains(path, infos, found, where, needed)
    known = found[0].attrs.get("domains") if found else None
    unknown = [d for d in missing if isinstance(known, list) and d not in known]
    if unknown:  # no extraction makes a domain the dataset does not have
        return EntryNotFoundError(f"{dataset} has no domain {unknown[0]!r}{did_you_mean(unknown[0], known)}; its "
                                  f"domains: {', '.join(known)}")
    lack_splits, lack_domains = _lacking(cur, slot, {e.key["domain"] for e in found} | set(missing), needed)
    if pending:
        return unfinished(path, infos, pending, where, lack_domains, lack_splits)
    if view:  # `extract --views K --domains ...`: the plain extraction of the missing domains hinted makes no view
        have = ",".join(e.key["domain"] for e in found)
        return EntryNotFoundError(
            f"augmented view {view} of the {split} features of {dataset} for {backbone} is of {have} only "
            f"({','.join(missing)} lack it); complete it with {views_said(path, infos, found[0])}")
    return EntryNotFoundError(f"the store has no {where}; run {extract_said(path, found[:1], lack_domains, lack_splits)}"
                              + _named_said(path, found, needed))


def _domains_unrecorded(e: EntryInfo) -> bool:
    """An entry of a --name extracted before its --domains were recorded (``made_from`` without them): its ``domains``
    name every domain of the source whatever --domains made it, so no command can say which domains the name is of.
    Not the noisy dataset's own name (every domain, noised); a --name given with --image-noise is a --name."""
    made = e.attrs.get("made_from")
    return (isinstance(made, dict) and "domains" not in made
            and e.key["dataset"] != noisy_name(made.get("dataset"), made.get("image_noise")))


def _named_before_domains(path: Path, infos: list[EntryInfo], found: list[EntryInfo], where: str,
                          splits: list[str]) -> EntryNotFoundError:
    """Missing domains of such a --name (:func:`_domains_unrecorded`): an extraction of them would make a dataset of
    those alone (--domains) or keep the ones it holds beside them (none), either perhaps not what it was. The safe way
    on remakes it of the domains it holds, which a user who wanted the others can extend in the same command."""
    like, name = found[0], found[0].key["dataset"]
    mine = [e for e in infos if e.key and e.key.get("dataset") == name]
    held = ",".join(e.key["domain"] for e in found)
    backbones = ",".join(sorted({e.key["backbone"] for e in mine}))
    splits = ",".join(sorted({e.key["split"] for e in mine} | set(splits)))
    return EntryNotFoundError(
        f"the store has no {where}; {name} was extracted under --name before fedcache recorded its --domains, so no "
        f"command can say whether it is of {held} only: remove its entries with `fedcache store rm "
        f"{pasted('--store', path)} {' '.join(e.entry_id for e in mine)}` and extract it again with --domains listing "
        f"those it should hold, such as the ones it has: `fedcache extract {pasted('--store', path)}{_dataset(like)} {pasted('--domains', held)} "
        f"{pasted('--backbones', backbones)} --splits {splits}{_made_as(like)}`" + _unsaid(like))


def _lacking(cur: dict, slot: tuple, wanted: set[str], splits: list[str]) -> tuple[list[str], list[str]]:
    """Of ``splits``, those of which the store lacks a domain of ``wanted`` (for ``slot``'s dataset, backbone and
    view), and the domains they lack together: one extraction of those makes them all (it finds the entries it
    holds complete and keeps them)."""
    dataset, _, backbone, view = slot
    held = lambda split: {s[2] for s in cur if (s[0], s[1], s[3], s[4]) == (dataset, split, backbone, view)}  # noqa: E731
    lack = {split: wanted - held(split) for split in splits}
    return [s for s in lack if lack[s]], sorted(set().union(*lack.values()))


def _named_said(path: Path, found: list[EntryInfo], splits: list[str]) -> str:
    """The other way on for a dataset fedcache knows, read for every domain: ``found``'s domains stored under a
    --name of their own (a dataset of those domains, which runs on that name read); "" for one stored so already, or
    imported, or noisy (its hints name its --name)."""
    like = found[0]
    if isinstance(like.attrs.get("made_from"), dict) or (like.key.get("preprocess") or {}).get("imported"):
        return ""
    held = [d for d in like.attrs.get("domains") or () if d in {e.key["domain"] for e in found}]
    name = "-".join([like.key["dataset"], *held])
    return (f", or store {','.join(held)} as a dataset of its own with `fedcache extract "
            f"{pasted('--store', path, '--dataset', like.key['dataset'])}{_read_with(like)} "
            f"{pasted('--name', name, '--domains', ','.join(held))} "
            f"{pasted('--backbones', like.key['backbone'])} --splits {','.join(splits)}{_made_as(like)}` and run on "
            f"{name}")


def unfinished(path: Path, infos: list[EntryInfo], pending: list[EntryInfo], what: str,
               domains: list[str] | None = None, splits: list[str] | None = None) -> IncompleteEntryError:
    """``what`` (``pending``'s features) is not complete, and the command that finishes it (and makes ``domains`` of
    ``splits``, where given: what the read lacks beside them). An augmented view is said as one, and finished by an
    `extract --views` (the plain extraction of its split and domains hinted before finds them complete and leaves
    the view unfinished)."""
    view = pending[0].key.get("view") or 0
    if not view:
        return IncompleteEntryError(f"the {what} are not complete yet (interrupted or still running); finish them with "
                                    f"{extract_said(path, pending, domains, splits)}")
    return IncompleteEntryError(f"augmented view {view} of the {what} is not complete yet (an `extract --views` "
                                f"interrupted or still running); finish the views with {views_said(path, infos, pending[0])}")


def unfinished_views(path: Path, infos: list[EntryInfo], dataset: str, backbone: str) -> str:
    """The first unfinished augmented view of ``dataset``'s ``backbone`` (an `extract --views` interrupted or still
    running), as :func:`unfinished` says it, with the command that finishes the views; "" when none is. A plain
    extraction finds its own entries complete and leaves them unfinished: it says so."""
    pending = sorted((e for e in infos if not e.complete and not e.damaged and e.key.get("view")
                      and (e.key["dataset"], e.key["backbone"]) == (dataset, backbone)), key=lambda e: e.key["view"])
    if not pending:
        return ""
    first = [e for e in pending if e.key["view"] == pending[0].key["view"]]
    domains = [e.key["domain"] for e in first]
    of = "" if set(domains) >= set(first[0].attrs.get("domains") or ()) else "/" + ",".join(domains)
    return str(unfinished(path, infos, first, f"{first[0].key['split']} features of {dataset}{of} for {backbone}"))


def finish_hint(path: Path, infos: list[EntryInfo], pending: EntryInfo, part: Part | None = None) -> str:
    """The command that finishes the unfinished entry ``pending``, and the others its extraction left (`store ls`),
    in backticks and with what it cannot say (:func:`extract_said`); ``part``: that part of them only (another
    part's writer runs)."""
    if pending.key.get("view"):
        return views_said(path, infos, pending, part=part)
    but_domain = lambda k: {**k, "domain": None}  # noqa: E731
    return extract_said(path, [e for e in infos if not e.complete and not e.damaged
                               and but_domain(e.key) == but_domain(pending.key)], part=part)


def views_hint(path: Path, infos: list[EntryInfo], pending: EntryInfo, like: EntryInfo | None = None,
               part: Part | None = None) -> str:
    """The `extract --views` that finishes the views ``pending`` is one of: every domain (a table of a view needs
    them all), as many views as its extraction asked for (its entries' ``views``; else the highest begun), of its
    recipe and seed (another would make other views). ``like``: an entry of another backbone, which lacks the
    views: the command makes them for it, as its own features were made (its --dtype and --image-size)."""
    k, made = pending.key, like or pending
    same = [e for e in infos if e.key.get("augmentation") == k.get("augmentation")
            and (e.slot[0], e.slot[1], e.slot[3]) == (k["dataset"], k["split"], k["backbone"])]
    hint = (f"fedcache extract {pasted('--store', path)}{_dataset(pending, seed=False)} "
            f"{pasted('--backbones', made.key['backbone'])}")
    hint += f" --splits {k['split']}"
    hint += f" --views {max(max(e.key.get('view') or 0, int(e.attrs.get('views') or 0)) for e in same)}"
    aug = k.get("augmentation") or {}
    hint += f" --view-recipe {aug['recipe']}" if aug.get("recipe", "simclr") != "simclr" else ""
    hint += f" --view-seed {aug['seed']}" if aug.get("seed", 0) else ""
    return hint + _made_as(made) + _part(part)


def view_lacking(path: Path, infos: list[EntryInfo], have: EntryInfo, like: EntryInfo) -> EntryNotFoundError:
    """Augmented view of ``have`` (an entry of it) held for its backbone, none of it for ``like``'s (an entry of that
    backbone's features), fused beside it: a run on the views the backbones share would train on fewer views than
    were extracted. The `extract --views` that makes them for ``like``'s backbone."""
    k = have.key
    return EntryNotFoundError(
        f"augmented view {k['view']} of the {k['split']} features of {k['dataset']} is extracted for {k['backbone']} "
        f"but not for {like.key['backbone']} (fused backbones train on the views of each); extract it with "
        f"{views_said(path, infos, have, like)}")


def views_differ(path: Path, infos: list[EntryInfo], have: EntryInfo, other: EntryInfo) -> StoreError:
    """Augmented view of ``have`` (an entry of it) made with another recipe or seed than ``other``'s, of the same
    domain for another backbone fused beside it: each fused row would join two different augmentations of its
    image. The `extract --views` that makes it for ``other``'s backbone as it was made for ``have``'s."""
    k, o = have.key, other.key
    aug, oaug = k.get("augmentation") or {}, o.get("augmentation") or {}
    said = _view_options(view_differences([have, other]))
    return StoreError(
        f"augmented view {k['view']} of the {k['split']} features of {k['dataset']}/{k['domain']} was made with "
        f"{said(aug)} for {k['backbone']} but {said(oaug)} for {o['backbone']} (fused backbones join each image's "
        f"view {k['view']}: these would be different augmentations of it); re-extract it for {o['backbone']} as for "
        f"{k['backbone']} with {views_said(path, infos, have, other)}")


def view_differences(entries: Iterable[EntryInfo]) -> list[str]:
    """What of their augmentation (recipe, seed) differs among ``entries`` of one augmented view: [] where it is
    one. Entries of another augmentation hold other crops of their images, whether of one domain for fused backbones
    (:func:`views_differ`) or of a backbone's domains side by side in its table (:func:`views_mixed`)."""
    augs = [e.key.get("augmentation") or {} for e in entries]
    names = dict.fromkeys(n for a in augs for n in a)
    return [n for n in names if len({canonical_json(a.get(n)) for a in augs}) > 1]


def views_mixed(path: Path, entries: list[EntryInfo]) -> StoreError:
    """The domains of an augmented view of one backbone (``entries``: its table's) made with other recipes or seeds
    (`extract --views K --domains D --view-seed S`): its table would train on other augmentations of some domains
    than of the others, as one view. The `extract --views` that makes every domain as the newest was made."""
    k, last = entries[0].key, newest(entries)
    said = _view_options(view_differences(entries))
    groups: dict[str, list[EntryInfo]] = {}
    for e in entries:
        groups.setdefault(canonical_json(e.key.get("augmentation")), []).append(e)
    mine = groups.pop(canonical_json(last.key.get("augmentation")))  # said last: the making the command repeats
    made = [f"{said(es[0].key.get('augmentation') or {})} for {','.join(e.key['domain'] for e in es)}"
            for es in [*groups.values(), mine]]
    return StoreError(
        f"augmented view {k['view']} of the {k['split']} features of {k['dataset']} for {k['backbone']} was made with "
        f"{', '.join(made[:-1])} but {made[-1]} (one view of its domains: these would be different augmentations); "
        f"re-extract every domain as {last.key['domain']} was with {views_said(path, entries, last)}")


def _view_options(differ: list[str]):
    """How an augmentation is said by the options of ``differ`` that make it: ``--view-seed 1``."""
    return lambda aug: " ".join(f"--view-{n} {aug.get(n)}" for n in differ)


def views_said(path: Path, infos: list[EntryInfo], pending: EntryInfo, like: EntryInfo | None = None,
               part: Part | None = None) -> str:
    """:func:`views_hint` in backticks, to paste, and after them what it cannot say (:func:`_unsaid`)."""
    return f"`{views_hint(path, infos, pending, like, part)}`" + _unsaid(like or pending)


def extract_said(path: Path | Placeholder, pending: list[EntryInfo], domains: list[str] | None = None,
                 splits: list[str] | None = None, part: Part | None = None) -> str:
    """:func:`extract_hint` in backticks, to paste, and after them what it cannot say (:func:`_unsaid`): a plain
    extraction of an augmented view's entries does not say the options (--views ...) it was started with."""
    k = pending[0].key
    started = "and any other option it was started with" if k.get("view") or k.get("augmentation") else ""
    every = (f"it extracts every domain of {pending[0].attrs['made_from']['dataset']}, which the entries of "
             f"{k['dataset']} record" if _domains_unrecorded(pending[0]) else "")
    return f"`{extract_hint(path, pending, domains, splits, part)}`" + _unsaid(pending[0], started, every)


def _unsaid(made: EntryInfo, *more: str) -> str:
    """What a command pasted from backticks cannot carry, said after them: in them, a "(" stops the shell."""
    notes = [n for n in (_unrecorded(made), *more) if n]
    return f" ({'; '.join(notes)})" if notes else ""


def _made_as(e: EntryInfo) -> str:
    """The options ``e``'s extraction was made with that are not the defaults: another would write new entries (the
    pretrained weights for --random-init's or a checkpoint's: another weights hash)."""
    k = e.key
    hint = f" --dtype {k['dtype']}" if k.get("dtype", "float16") != "float16" else ""
    size = (k.get("preprocess") or {}).get("size")
    # The size its extraction would have made without --image-size (``extract.sizes.image_size``, recorded: the store
    # sits below extract); an entry made before it was recorded says its size.
    size_said = f" --image-size {size}" if size and size != e.attrs.get("default_image_size") else ""
    return hint + size_said + _precision(e) + (" --random-init" if e.random_weights else "") + _weights(e)


# The key's record of a reduced-precision forward pass (``extract.runner``: torch's dtype name) -> its --precision.
PRECISIONS = {"bfloat16": "bf16", "float16": "fp16"}


def _precision(e: EntryInfo) -> str:
    """``--precision`` of an entry whose forward pass ran in reduced precision: another precision is another entry.
    A float32 pass (none recorded) is what --precision auto gives on a CPU, and says nothing: on a CUDA GPU, where
    auto is reduced, finishing one takes --precision fp32, which the store (torch-free) cannot tell it runs on."""
    forward = (e.key.get("preprocess") or {}).get("forward")
    return f" --precision {PRECISIONS.get(forward, forward)}" if forward else ""


def _weights(e: EntryInfo) -> str:
    """``--weights NAME=PATH`` of an entry extracted from a checkpoint (its metadata's ``weights_file``). An entry of
    a backbone that takes only a checkpoint, made before the file was recorded, names none: no one can say which."""
    backbone, file = e.key["backbone"], e.attrs.get("weights_file")
    if file:
        return f" {pasted('--weights', f'{backbone}={file}')}"
    return f" {pasted('--weights', f'{backbone}=CHECKPOINT')}" if _unrecorded(e) else ""


def _unrecorded(e: EntryInfo) -> str:
    """What the placeholder CHECKPOINT of :func:`_weights` stands for, where it names one; else ""."""
    if e.attrs.get("backbone_source") == "checkpoint" and not e.random_weights and not e.attrs.get("weights_file"):
        return "CHECKPOINT: the file these were extracted from, which the store does not record"
    return ""


def extract_hint(path: Path | Placeholder, pending: list[EntryInfo], domains: list[str] | None = None,
                 splits: list[str] | None = None, part: Part | None = None) -> str:
    """The extraction that finishes ``pending`` (or makes ``domains`` of ``splits``, default its split, as ``pending``
    were made): its store, dataset, backbone, and the options in its key that are not the defaults (another --dtype
    would write new entries instead of finishing these). The command alone, to be put in backticks: :func:`extract_said`."""
    k = pending[0].key
    if (k.get("preprocess") or {}).get("imported"):  # an import's entries: no extraction can make or finish them
        return "fedcache store import FILE " + pasted("--store", path, "--dataset", k["dataset"], "--backbone", k["backbone"])
    hint = (f"fedcache extract {pasted('--store', path)}{_dataset(pending[0])} {pasted('--backbones', k['backbone'])} "
            f"--splits {','.join(splits or [k['split']])}")
    # A --name's --domains are all of them: fewer would make a dataset of those. One made before they were recorded
    # records every domain of its source, and any --domains is refused beside them: without, it makes those.
    if not _subset(pending[0]) and not _domains_unrecorded(pending[0]):
        hint += f" {pasted('--domains', ','.join(sorted(domains or {e.key['domain'] for e in pending})))}"
    return hint + _made_as(pending[0]) + _part(part)


def _part(part: Part | None) -> str:
    """``--part i/n`` of a command that writes one part of an entry beside the writers of its others."""
    return f" --part {part}" if part is not None else ""


def backbone_said(path: Path | Placeholder, like: EntryInfo, backbone: str) -> str:
    """The extraction of ``backbone``'s features of the dataset ``like`` (an entry) is of, as it was made (its
    --name, --domains, noise), in backticks: another backbone for that dataset in that store."""
    return f"`fedcache extract {pasted('--store', path)}{_dataset(like)} {pasted('--backbones', backbone)}`"


def _dataset(e: EntryInfo, seed: bool = True) -> str:
    """The dataset options that make ``e``'s: a noisy or renamed dataset's store name is no dataset fedcache knows,
    and a dataset stored under --name of some domains is of those (:func:`_subset`). ``seed``: with the noise's seed
    (--view-seed; False where the hint says the views' own)."""
    made = e.attrs.get("made_from")
    if not isinstance(made, dict):
        return f" {pasted('--dataset', e.key['dataset'])}" + _read_with(e)
    noise = made.get("image_noise")
    noise_seed = ((e.key.get("preprocess") or {}).get("noise") or {}).get("seed")  # the noise's seed is --view-seed's
    subset = _subset(e)
    return (f" {pasted('--dataset', made['dataset'])}{_read_with(e)} {pasted('--name', e.key['dataset'])}"
            + (f" {pasted('--domains', ','.join(subset))}" if subset else "")
            + (f" --image-noise {','.join(f'{x:g}' if not isinstance(x, str) else x for x in noise)}" if noise else "")
            + (f" --view-seed {noise_seed}" if seed and noise_seed else ""))


# The dataset options an extraction records where not the defaults (its entries' ``dataset_options``), as flags in
# this order: without them a command reads no images (imagefolder's --path) or another seeded split of them.
READ_WITH = ("path", "data_root", "seed", "test_fraction")


def _read_with(e: EntryInfo) -> str:
    """``--path ROOT --test-fraction 0.5 ...``: where and how ``e``'s images were read (``READ_WITH``), and
    ``--skip-bad-images`` where its extraction was given it or skipped one (an entry made before fedcache recorded
    the flag): without, the command stops at the first bad image."""
    given = e.attrs.get("dataset_options")
    given = given if isinstance(given, dict) else {}
    said = "".join(" " + pasted("--" + f.replace("_", "-"), str(given[f])) for f in READ_WITH if f in given)
    skipped = e.attrs.get("skip_bad_images") or (e.attrs.get("n_bad_images") or 0) > 0
    return said + (" --skip-bad-images" if skipped else "")


def _subset(e: EntryInfo) -> list[str]:
    """The domains of a dataset stored under --name with --domains (its ``made_from``'s): every command that makes
    more of it names them all, as a --name with fewer (or none: every domain) makes a dataset of those."""
    made = e.attrs.get("made_from")
    return list(made.get("domains") or []) if isinstance(made, dict) else []


def not_found(path: Path, cur: dict, dataset: str, split: str, backbone: str) -> EntryNotFoundError:
    """What the store lacks, and the likeliest way on: a close name it does hold (a typo), the split it lacks
    (an import of one split), or the extraction."""
    where = f"the store {path} has no {split} features of {dataset} for {backbone}"
    extract = f"; or extract them: `fedcache extract {pasted('--store', path, '--dataset', dataset, '--backbones', backbone)}`"
    datasets = sorted({s[0] for s in cur})
    if dataset not in datasets:
        found = where + _close(dataset, datasets, "datasets")
        return EntryNotFoundError(found + extract, ("dataset", dataset), found)
    backbones = sorted({s[3] for s in cur if s[0] == dataset})
    if backbone not in backbones:
        found = where + _close(backbone, backbones, f"backbones for {dataset}")
        like = newest(e for s, e in cur.items() if s[0] == dataset)  # a renamed one's store name is no dataset
        return EntryNotFoundError(found + f"; or extract them: `fedcache extract {pasted('--store', path)}{_dataset(like)} "
                                  f"{pasted('--backbones', backbone)}`", ("backbone", backbone), found)
    held = [e for s, e in cur.items() if s[0] == dataset and s[3] == backbone]
    splits = sorted({e.key["split"] for e in held})
    typo = did_you_mean(split, splits)
    if typo:  # `--splits trian` was told to extract the split trian; one of another name is an import's
        return EntryNotFoundError(
            where + f"{typo}; its splits: {', '.join(splits)}; a split of another name comes of an import "
            f"(`fedcache store import FILE {pasted('--store', path, '--dataset', dataset, '--backbone', backbone)} "
            f"{pasted('--split', split)}`)")
    imported = f"`fedcache store import FILE {pasted('--store', path, '--dataset', dataset, '--backbone', backbone)} " \
               f"{pasted('--split', split)}`"
    if all(e.attrs.get("backbone_source") == "imported" for e in held):  # no backbone here to extract it with
        return EntryNotFoundError(where + f" (only {', '.join(splits)}, imported): import that split too ({imported})")
    return EntryNotFoundError(
        where + f" (only {', '.join(splits)}): extract that split, as the others were "
        f"made ({made_as_said(path, newest(held), split)}), or import it if these are imported embeddings ({imported})")


def made_as_said(path: Path, like: EntryInfo, split: str | None = None) -> str:
    """The extraction of ``like``'s backbone (of ``split`` only, where given) made as ``like`` was, in backticks, and
    what it cannot say: its dataset options and making (--dtype, --weights ...; the defaults would make features
    that the table of ``like``'s domains refuses beside its others, or load weights a checkpoint-only backbone lacks)."""
    splits = f" --splits {split}" if split else ""
    return (f"`fedcache extract {pasted('--store', path)}{_dataset(like)} {pasted('--backbones', like.key['backbone'])}"
            f"{splits}"
            f"{_made_as(like)}`" + _unsaid(like))


def _close(name: str, names: list[str], what: str) -> str:
    """ "; did you mean 'x'? It holds: ..." """
    import difflib

    near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    listed = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return (f"; did you mean {near[0]!r}?" if near else "") + f" (its {what}: {listed or 'none'})"
