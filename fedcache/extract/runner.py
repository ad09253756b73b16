"""The extract stage: every backbone once over every image, into the feature store."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from fedcache.borrowed import handler_kept, start_method_unset
from fedcache.errors import (BadImageError, ConfigError, DecoderDiedError, EntryNotFoundError, NonFiniteFeaturesError,
                             StoreError)
from fedcache.extract.backbones import BACKBONES, LoadedBackbone
from fedcache.extract.config import ExtractConfig
from fedcache.extract.datasets import DATASETS, Dataset, DatasetOptions, Samples
from fedcache.extract.datasets.base import SPLITS, skip_bad_images_named
from fedcache.extract.devices import DevicePlan, plan_device
from fedcache.extract.loading import load_backbone, load_dataset
from fedcache.extract.sizes import image_size
from fedcache.extract.templates import TEMPLATE_SETS, text_key
from fedcache.extract.transforms import Preprocess, ViewSpec
from fedcache.paths import check_new_store, check_store_place
from fedcache.store import lookup
from fedcache.store.entries import newest
from fedcache.store.feature_store import FeatureStore
from fedcache.store.keys import EntryKey, noisy_name
from fedcache.store.writer import EntryWriter, open_writer
from fedcache.wording import count, did_you_mean, named, pasted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProgressEvent:
    kind: str  # "start", "advance", "end", "info"
    label: str
    total: int = 0
    advance: int = 0
    message: str = ""
    # Of an "advance": the rows of its entry this run wrote that an interruption keeps (of an entry begun in store
    # format 1, only its finished chunks': a re-run writes the others' rows again).
    kept: int = 0


ProgressFn = Callable[[ProgressEvent], None]


@dataclass
class EntryReport:
    label: str
    entry_id: str
    status: str  # "extracted", "already complete", "part done"
    rows: int
    seconds: float
    # Of an entry this run completes, the entry's (rows kept before too); of one left partial, this run's (its part);
    # of one found already complete, none.
    bad_images: list[str] = field(default_factory=list)


def extract(cfg: ExtractConfig, progress: ProgressFn | None = None) -> list[EntryReport]:
    emit = _logged(progress)
    _check_image_size(cfg, [BACKBONES.get(name) for name in cfg.backbones])  # a misspelt name too, before slow work
    dataset = load_dataset(cfg.dataset, cfg.dataset_options)
    name = cfg.name or noisy_name(dataset.name, cfg.image_noise)
    if name:
        dataset = dataclasses.replace(dataset, name=name)
    store = _opened(Path(cfg.store))
    if store is not None:
        _check_named_domains(cfg, store, dataset)
    plan = plan_device(cfg.device, cfg.precision)
    if plan.note:
        emit(ProgressEvent("info", "", message=plan.note))
    reports: list[EntryReport] = []
    others: dict[str, str] = {}  # backbone -> what a run on the dataset lacks of it (_other_domains)
    views: dict[str, str] = {}  # backbone -> its views an `extract --views` left unfinished (_unfinished_views)
    jobs = _jobs(cfg, dataset)  # its domains and splits checked before a backbone is loaded
    # The decoding workers' DataLoader fixes the start method and installs a SIGCHLD handler: the caller's to keep.
    with _decoders_said(), start_method_unset(), handler_kept(signal.SIGCHLD):
        for name in cfg.backbones:
            backbone = load_backbone(name, cfg.weights.get(name), cfg.random_init)
            store = store if store is not None else FeatureStore(cfg.store)  # now there is something to write
            backbone.image_encoder.to(plan.device)
            if plan.channels_last:
                backbone.image_encoder.to(memory_format=torch.channels_last)
            _store_text(store, dataset, backbone, emit)
            mine = [_extract_entry(cfg, store, dataset, backbone, plan, split, domain, view, emit)
                    for split, domain, view in jobs]
            reports += mine
            _say_complete(mine, dataset.name, backbone.spec.name, emit)
            backbone.image_encoder.to("cpu")
            views[backbone.spec.name] = _unfinished_views(cfg, store, dataset.name, backbone.spec.name)
            others[backbone.spec.name] = _other_domains(cfg, store, dataset, backbone.spec.name)
    _say_once(views, emit)
    _say_once(others, emit)
    return reports


def _opened(path: Path) -> FeatureStore | None:
    """The feature store at ``path``; None where it is yet to be made (nothing there, or an empty folder), which is
    done once the first backbone is loaded, so that a command refused before then (its weights not on this machine, a
    domain the dataset lacks, no such device) leaves no empty store behind. Where it could not be made, said at once."""
    check_store_place(path)
    if path.exists() and not _empty_folder(path):
        return FeatureStore(path)
    check_new_store(path)
    return None


def _empty_folder(path: Path) -> bool:
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError:  # unreadable: opening it as a store says so
        return False


# What the kernel's signal most likely says of a decoding worker torch found dead.
_DIED_OF = {"Killed": "out of memory? `dmesg` says",
            "Bus error": "out of shared memory? a container's /dev/shm is 64 MB unless `docker run --shm-size` gives more"}


@contextlib.contextmanager
def _decoders_said() -> Iterator[None]:
    """A decoding worker found dead, said in one line (torch raises a RuntimeError, a page of traceback on the command
    line); and an interrupt that also ended the workers (SIGTERM to the process group: `timeout`, a scheduler's
    stop), still an interrupt: torch's SIGCHLD handler raised its RuntimeError over the KeyboardInterrupt."""
    try:
        yield
    except RuntimeError as exc:
        chain = _chain(exc)
        interrupt = next((e for e in chain if isinstance(e, KeyboardInterrupt)), None)
        if interrupt is not None:
            raise interrupt from None
        torch_said = [str(e) for e in chain if isinstance(e, RuntimeError) and str(e).startswith("DataLoader worker")]
        if not torch_said:
            raise
        said = torch_said[-1].split(". ")[0].strip().rstrip(".")  # the first cause: how it ended
        why = next((f" ({w})" for signame, w in _DIED_OF.items() if said.endswith(signame)), "")
        raise DecoderDiedError(
            f"a process decoding the images ended: {said}{why}; the batches written are kept: run the same "
            f"command again to continue after them ({named('--workers 0', 'workers=0')} decodes in this process)") from None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _logged(progress: ProgressFn | None) -> ProgressFn:
    """``progress``, with every "info" event's message logged at INFO too, as the library's other steps are: a
    caller that gives no progress (a script with logging) reads them there."""
    def emit(event: ProgressEvent) -> None:
        if event.kind == "info" and event.message:
            log.info(event.message)
        if progress is not None:
            progress(event)

    return emit


def _unfinished_views(cfg: ExtractConfig, store: FeatureStore, dataset: str, backbone: str) -> str:
    """A plain extraction (no --views) of a backbone whose `extract --views` was interrupted: it finds its own entries
    complete and leaves the views unfinished without a word, which a train on the views then refuses. The line that
    says them, with their command; "" where there is nothing to say."""
    return "" if cfg.views else lookup.unfinished_views(store.path, store.entries(), dataset, backbone)


def _say_complete(reports: list[EntryReport], dataset: str, backbone: str, emit: ProgressFn) -> None:
    """The entries of ``backbone`` found complete, in one line: a re-run of a finished extraction said a line per
    entry (dozens, with their ids, which `store ls` lists)."""
    done = sum(r.status == "already complete" for r in reports)
    if not done:
        return
    found = (f"its {'entry' if done == 1 else count(done, 'entry', 'entries')}" if done == len(reports)
             else f"{done:,} of its {count(len(reports), 'entry', 'entries')}")
    emit(ProgressEvent("info", "", message=f"{backbone}: {found} of {dataset} already complete, nothing to do for "
                                            f"{'it' if done == 1 else 'them'}"))


def _other_domains(cfg: ExtractConfig, store: FeatureStore, dataset: Dataset, backbone: str) -> str:
    """`--domains` of some of a dataset's domains, without --name: a run on the dataset reads every domain of it, and
    was refused once the store lacked the others (minutes after this command, which said nothing). Said as the run
    will say it, with its two ways on: extract the others, or store these under a --name of their own. Of each
    split a run reads (train and test) that the store holds: `--splits train` of the last domains beside a test split
    of the others said nothing, and the run was refused for the test split (one it lacks whole is not this line's).
    "" where there is nothing to say."""
    if not cfg.domains or _is_subset(cfg) or set(cfg.domains) >= set(dataset.domains):
        return ""
    held = {split for name, split, _domain, made_by, view in store.current()
            if (name, made_by, view) == (dataset.name, backbone, 0)}
    try:
        for split in [s for s in SPLITS if s in held]:
            store.table_entries(dataset.name, split, backbone, with_splits=SPLITS)
    except EntryNotFoundError as exc:
        return f"a run on {dataset.name} reads every domain of it: {exc}"
    except StoreError:  # entries a run refuses otherwise (mixed makings, unfinished): its read says so, not this
        pass
    return ""


def _say_once(lines: dict[str, str], emit: ProgressFn) -> None:
    """Each backbone's line (``lines``: backbone -> line), said once for the backbones whose lines differ only by
    their name: `-b a,b --domains x` said the same line twice, each with its own command, where one command
    (``--backbones a,b``) makes what both lack. Only the line's own places of the name are merged (``for a``,
    ``--backbones a``): a path that holds it is left as it is."""
    alike: dict[str, list[str]] = {}
    for backbone, line in lines.items():
        if line:
            alike.setdefault(_names_backbone(backbone).sub(lambda m: m[1] + "\0", line), []).append(backbone)
    for line, backbones in alike.items():
        emit(ProgressEvent("info", "", message=line.replace("\0", ",".join(backbones))))


def _names_backbone(backbone: str) -> re.Pattern:
    """Where a line names ``backbone`` as the one it is of (``for NAME``, ``--backbones NAME``), not inside a word."""
    return re.compile(rf"((?:^|\s)for |--backbones ){re.escape(backbone)}(?![\w.-])")


def _check_image_size(cfg: ExtractConfig, specs: list) -> None:
    """``--image-size`` that no backbone of the command can take is refused; one that the CNNs take beside a
    fixed-size backbone (``-b efficientnet-lite0,clip-rn50 --image-size 64``) applies to them, as said here."""
    fixed = [s for s in specs if s.fixed_size and cfg.image_size and cfg.image_size != s.input_size]
    if fixed and len(fixed) == len(specs):
        sizes = ", ".join(f"{s.name} {s.input_size}x{s.input_size}" for s in fixed)
        raise ConfigError(f"fixed-size backbones take their own input size only ({sizes}: positional embeddings), not "
                          f"{named(f'--image-size {cfg.image_size}', f'image_size={cfg.image_size}')}; drop "
                          f"{named('--image-size', 'image_size')}")
    for s in fixed:
        log.warning("%s takes %dx%d images only: %s applies to the other backbones", s.name, s.input_size,
                    s.input_size, named(f"--image-size {cfg.image_size}", f"image_size={cfg.image_size}"))


def _made_from(cfg: ExtractConfig, dataset: Dataset) -> dict:
    """What an entry stored under a name of its own (``--name``, ``--image-noise``) was extracted from: the command
    that makes or finishes it names the dataset fedcache knows, not the store's name, and the domains a --name
    holds (``store.lookup.extract_hint``)."""
    if dataset.name == cfg.dataset:
        return {}
    # Every domain without --domains, recorded too: an entry of a --name without them was of an old subset or not.
    subset = {"domains": _domains(cfg, dataset)} if _named(cfg) else {}
    return {"made_from": {"dataset": cfg.dataset, "image_noise": list(cfg.image_noise) if cfg.image_noise else None,
                          **subset}}


def _is_subset(cfg: ExtractConfig) -> bool:
    """A --name given with --domains names a dataset of those domains (``-d digits5-offline --domains mnist-m --name
    digits5-offline-mnist-m``): a read of it is of them. A noisy dataset's own name (given as --name by the hints
    that complete it) is the whole dataset's, noised."""
    return bool(cfg.domains) and _named(cfg)


def _named(cfg: ExtractConfig) -> bool:
    """A --name of the user's: not the dataset's own, nor the noisy dataset's (which the hints that complete it give)."""
    return cfg.name not in (None, cfg.dataset, noisy_name(cfg.dataset, cfg.image_noise))


def _check_named_domains(cfg: ExtractConfig, store: FeatureStore, dataset: Dataset) -> None:
    """A --name whose entries (any split, backbone) are of other domains than this command makes: the name's tables
    would mix them (a read wanted the newest entry's domains of entries recording others), or a fewer --domains found
    the others complete and kept them. Refused before any work, with both ways on."""
    if not _named(cfg):
        return
    mine = _domains(cfg, dataset)
    held = [e for e in store.entries() if e.key and e.key.get("dataset") == dataset.name]
    other = [e for e in held if e.attrs.get("domains") is not None and set(e.attrs["domains"]) != set(mine)]
    if not other:
        return
    asked = (named(f"--domains {','.join(cfg.domains)}", f"domains={list(cfg.domains)!r}") if cfg.domains
             else f"without {named('--domains', 'domains')}")
    raise ConfigError(
        f"{named(f'--name {dataset.name}', f'name={dataset.name!r}')} {asked} makes a dataset of {','.join(mine)}, but "
        f"the store's entries of {dataset.name} are of {','.join(newest(other).attrs['domains'])} (a name's domains are "
        f"one for all its splits and backbones); extract under another {named('--name', 'name')}, or remove its "
        f"entries first with `fedcache store rm {pasted('--store', store.path)} {' '.join(e.entry_id for e in held)}`")


def _domains(cfg: ExtractConfig, dataset: Dataset) -> list[str]:
    """The domains of the dataset an entry is one domain of (its attrs' ``domains``, what a read of it wants),
    in the dataset's order: the --domains of a --name (:func:`_is_subset`), else every domain."""
    if _is_subset(cfg):
        return [d for d in dataset.domains if d in cfg.domains]
    return list(dataset.domains)


def _weights_file(cfg: ExtractConfig, backbone: str) -> dict:
    """The checkpoint an entry was extracted from (``--weights NAME=PATH``), absolute: the command that finishes or
    completes it names it (``store.lookup``); its hash alone cannot say which file to load again."""
    path = cfg.weights.get(backbone)
    return {"weights_file": str(Path(path).resolve())} if path is not None else {}


def _read_with(cfg: ExtractConfig) -> dict:
    """The dataset options an entry's images were read with that are not the defaults (``--path`` and
    ``--data-root`` absolute): the command that finishes or completes it names them (``store.lookup``), since
    without them it reads no images (imagefolder needs its folder) or another seeded split of them. Absolute as
    the entry's key makes them (``FileSource.fingerprint``: links kept, not resolved), so that the command reads
    the same images under the same key. Only those its dataset reads: an embedded dataset's entries recorded the
    --data-root it ignored (`fedcache reproduce` gives one to every dataset), and their commands named the folder."""
    given, default, reads = cfg.dataset_options, DatasetOptions(), DATASETS.get(cfg.dataset).reads
    said = {f: getattr(given, f) for f in lookup.READ_WITH if f in reads and getattr(given, f) != getattr(default, f)}
    said = {f: os.path.abspath(Path(v).expanduser()) if f in _FOLDERS else v for f, v in said.items()}
    return {"dataset_options": said} if said else {}


_FOLDERS = ("path", "data_root")  # the dataset options that name a folder


def _jobs(cfg: ExtractConfig, dataset: Dataset) -> list[tuple[str, str, ViewSpec]]:
    domains = cfg.domains or list(dataset.domains)
    unknown = [d for d in domains if d not in dataset.domains]
    if unknown:
        raise ConfigError(f"dataset {dataset.name} has no domain(s) {unknown}; its domains: {list(dataset.domains)}")
    _check_splits(cfg.splits, dataset, domains)
    jobs = []
    for split in cfg.splits:
        for domain in domains:
            # Augmented views are for training-time contrastive methods only.
            n_views = cfg.views if split == "train" else 0
            for v in range(n_views + 1):
                jobs.append((split, domain, ViewSpec(v, cfg.view_recipe, cfg.view_seed)))
    return jobs


def _check_splits(splits: tuple[str, ...], dataset: Dataset, domains: list[str]) -> None:
    """Said before any image is read: a typo in --splits was found at its first domain, once the splits before it
    were extracted (minutes)."""
    have = sorted({s for s, _ in dataset.splits})
    for split in splits:
        lacking = [d for d in domains if (split, d) not in dataset.splits]
        if len(lacking) == len(domains):
            raise ConfigError(f"dataset {dataset.name} has no split {split!r}{did_you_mean(split, have)}; its splits: "
                              f"{', '.join(have)} (--splits)")
        if lacking:
            raise ConfigError(f"dataset {dataset.name} has no split {split!r} for domain(s) {', '.join(lacking)}; "
                              f"leave {split} out of --splits, or those domains out of --domains")


def _store_text(store: FeatureStore, dataset: Dataset, bb: LoadedBackbone, emit: ProgressFn) -> None:
    if bb.encode_text is None:
        return
    for set_name, templates in TEMPLATE_SETS.items():
        key = text_key(bb.spec.name, bb.weights_hash, dataset.classes, set_name)
        if store.has_text(key):
            continue
        with torch.inference_mode():
            emb = np.stack([bb.encode_text([t.format(c) for c in dataset.classes]).float().cpu().numpy() for t in templates])
        store.put_text(key, emb, bb.spec.random_weights)
        emit(ProgressEvent("info", "", message=f"{bb.spec.name}: stored {set_name} text embeddings ({len(templates)} templates)"))


def entry_key(cfg: ExtractConfig, dataset: Dataset, samples: Samples, bb: LoadedBackbone, split: str, domain: str, view: ViewSpec,
              autocast: torch.dtype | None = None) -> EntryKey:
    """``autocast``: the reduced precision of the forward pass (None: float32)."""
    pre = Preprocess.for_backbone(bb.spec, image_size(cfg.image_size, dataset, bb.spec), _backend(samples, view))
    if cfg.image_noise and split == "train":  # the paper (and its code) noises the images it trains on, not the test images
        kind, scale, p = cfg.image_noise
        pre = dataclasses.replace(pre, noise=kind, noise_scale=float(scale), noise_perturb=float(p), noise_seed=cfg.view_seed)
    preprocess = pre.to_dict()
    if autocast is not None:  # bf16/fp16 features differ from float32 ones; float32 keys stay as they were
        preprocess["forward"] = str(autocast).removeprefix("torch.")
    return EntryKey(
        dataset=dataset.name, dataset_fingerprint=samples.fingerprint(), split=split, domain=domain,
        backbone=bb.spec.name, weights_hash=bb.weights_hash, preprocess=preprocess,
        view=view.index, augmentation=view.key(), dtype=cfg.dtype,
    )


def _extract_entry(cfg, store, dataset, bb, plan, split, domain, view, emit) -> EntryReport:
    samples = dataset.samples(split, domain)
    key = entry_key(cfg, dataset, samples, bb, split, domain, view, plan.autocast_dtype)
    attrs = {"classes": list(dataset.classes), "domains": _domains(cfg, dataset),
             "random_weights": bb.spec.random_weights, "backbone_source": bb.spec.source,
             "default_image_size": image_size(None, dataset, bb.spec),  # a hint says --image-size where not this
             **({"views": cfg.views} if view.index else {}),  # an interrupted --views N is finished by --views N
             **({"skip_bad_images": True} if cfg.skip_bad_images else {}),  # and --skip-bad-images by one that says it
             **_weights_file(cfg, bb.spec.name), **_made_from(cfg, dataset), **_read_with(cfg)}
    t0 = time.perf_counter()
    with open_writer(store, key, len(samples), bb.embed_dim, cfg.batch_size, attrs, cfg.part, cfg.wait, cfg.chunk_rows) as writer:
        if writer.replaced:
            emit(ProgressEvent("info", key.label(), message=f"{key.label()}: entry {key.entry_id} was damaged "
                               f"({writer.replaced}); extracting it again"))
        if writer.complete:
            if store.make_current(key.entry_id):  # said of this entry: the others found complete, in one line a backbone
                emit(ProgressEvent("info", key.label(), message=f"{key.label()}: already complete (entry "
                                   f"{key.entry_id}), nothing to do; runs read it again instead of the newer one"))
            return EntryReport(key.label(), key.entry_id, "already complete", 0, 0.0)
        pending = writer.pending(cfg.part)
        rows = writer.rows_to_write(pending)
        # Of this part's rows (another part's are another process's): those a run before wrote.
        mine = sum(hi - lo for lo, hi in map(writer.chunk_range, cfg.part.chunks(writer.n_chunks)))
        if pending and mine - rows:  # the count below starts at 0 of the rows left: said, or it looked begun anew
            emit(ProgressEvent("info", key.label(), message=f"{key.label()}: resuming entry {key.entry_id}, "
                               f"{mine - rows} of {mine} rows kept from an interrupted extraction"))
        emit(ProgressEvent("start", key.label(), total=rows))
        bad = _fill_chunks(cfg, writer, samples, dataset.domains.index(domain), bb, plan, view, pending, emit, key)
        done = writer.finish(samples.source.describe)  # lists every bad image, also of the rows a run before kept
        emit(ProgressEvent("end", key.label()))
    # Chunks written by this run: none when it queued (--wait) behind a writer that finished them.
    status = ("extracted" if pending else "already complete") if done else "part done"
    # Completed by this run: the entry's bad images (also of rows a run before kept), as listed beside it.
    bad = writer.bad_images if done else bad
    return EntryReport(key.label(), key.entry_id, status, rows, time.perf_counter() - t0, bad)


def _backend(samples: Samples, view: ViewSpec) -> str:
    # Augmented views need per-image randomness, so only the plain view resizes per batch.
    return "torch" if view.index == 0 and getattr(samples.source, "uniform", False) else "pil"


class _Rows(torch.utils.data.Dataset):
    """Decodes and transforms the images of the given rows; a bad image yields ok=False."""

    def __init__(self, samples: Samples, rows: np.ndarray, pre: Preprocess, view: ViewSpec, domain_index: int) -> None:
        self.samples, self.rows, self.view, self.domain_index = samples, rows, view, domain_index
        self.transform = view.transform(pre)
        self.size = pre.size
        self.batch_resize = pre.backend == "torch"

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int):
        i = int(self.rows[k])
        if self.batch_resize:
            return torch.from_numpy(np.array(self.samples.source.load_array(i), copy=True)).permute(2, 0, 1), i, True
        try:
            image = self.samples.source.load(i)
        except BadImageError:
            return torch.zeros(3, self.size, self.size, dtype=torch.uint8), i, False
        if self.view.index == 0:
            return self.transform(image), i, True
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.view.sample_seed(self.samples.ids[i], self.domain_index))
            return self.transform(image), i, True


def default_workers(plan: DevicePlan) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # On the CPU the forward pass needs the cores; one decoder process keeps it fed. On a GPU (CUDA, MPS) they decode.
    return min(8, max(1, cpus - 1)) if plan.device.type != "cpu" else (1 if cpus > 1 else 0)


def _loader(samples, rows, pre: Preprocess, view, domain_index, batch_size: int, workers: int | None, plan) -> DataLoader:
    if workers is None:
        # Starting a worker costs more than decoding a few batches in-process.
        workers = default_workers(plan) if len(rows) > 8 * batch_size else 0
    return DataLoader(
        _Rows(samples, rows, pre, view, domain_index), batch_size=batch_size, shuffle=False,
        num_workers=workers, pin_memory=plan.device.type == "cuda", prefetch_factor=4 if workers else None,
        worker_init_fn=_one_thread if workers else None,
        # Its own generator: iterating a loader draws worker seeds from the global torch RNG otherwise, which is
        # the caller's (views are seeded per image, so nothing extracted depends on it).
        generator=torch.Generator(),
    )


def _one_thread(_: int) -> None:
    # Decoders must not compete with the forward pass for the cores.
    torch.set_num_threads(1)


def _forward(bb: LoadedBackbone, plan: DevicePlan, pre: Preprocess, x: torch.Tensor, ids: np.ndarray, domain_index: int) -> np.ndarray:
    x = pre.add_noise(pre.per_batch(x.to(plan.device, non_blocking=True)), ids, domain_index)
    if plan.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    amp = (torch.autocast(plan.device.type, dtype=plan.autocast_dtype)
           if plan.autocast_dtype is not None else contextlib.nullcontext())
    with torch.inference_mode(), amp:
        return bb.image_encoder(x).float().cpu().numpy()


def _fill_chunks(cfg, writer: EntryWriter, samples: Samples, domain_index: int, bb, plan, view, pending, emit, key) -> list[str]:
    """Run the backbone over the rows of the pending chunks not yet written, writing each batch as it comes (an
    interruption keeps them: a re-run resumes after them)."""
    if not pending:
        return []
    rows = np.concatenate([np.arange(writer.resume_row(c), writer.chunk_range(c)[1]) for c in pending])
    pre = Preprocess.from_dict(key.preprocess)
    # The batch size recorded at creation fixes batch boundaries (chunks and the rows kept of one are whole
    # batches), so a resumed run computes the same bits.
    loader = _loader(samples, rows, pre, view, domain_index, writer.batch_size, cfg.workers, plan)
    bad: list[str] = []
    chunks = iter(pending)
    c = next(chunks)
    for x, idx, ok in loader:
        ok = ok.numpy().astype(bool)
        idx = idx.numpy()
        _check_bad(samples, idx, ok, cfg.skip_bad_images, bad)
        feats = _forward(bb, plan, pre, x, samples.ids[idx], domain_index)
        _check_finite(feats, samples, idx, ok, key.dtype, key)
        if writer.write_rows(c, int(idx[0]), feats, samples.labels[idx], samples.ids[idx], ok):
            c = next(chunks, None)
        emit(ProgressEvent("advance", key.label(), advance=len(idx), kept=writer.rows_written))
    return bad


def _check_bad(samples: Samples, idx: np.ndarray, ok: np.ndarray, skip: bool, bad: list[str]) -> None:
    for i in idx[~ok]:
        name = samples.source.describe(int(i))
        if not skip:
            raise BadImageError(
                f"cannot decode image {name}; fix or remove it, or pass {skip_bad_images_named()} "
                "to skip bad images "
                "(they are counted and listed next to the entry)"
            )
        bad.append(name)


SHOWN = 10  # images named in an error; the count says how many more


def _check_finite(feats: np.ndarray, samples: Samples, idx: np.ndarray, ok: np.ndarray, dtype, key: EntryKey) -> None:
    """Refuse NaN / inf features before they reach the store, in float32 and in the stored dtype.

    Rows of undecodable images (ok False, skipped and marked invalid) are not checked."""
    finite32 = np.isfinite(feats).all(1)
    with np.errstate(over="ignore"):  # an overflowing cast is what is being checked for
        stored = np.isfinite(feats.astype(dtype, copy=False)).all(1)
    bad = ok & ~stored
    if not bad.any():
        return
    names = [samples.source.describe(int(i)) for i in idx[bad]]
    listing = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    if (ok & ~finite32).any():
        why = ("the backbone's output is NaN/inf for these images (a corrupt image, image noise that overflows, "
               f"or reduced precision: try {named('--precision fp32', 'precision=' + repr('fp32'))})")
    else:
        why = (f"the features exceed the range of the store's {np.dtype(dtype).name} "
               f"(largest |value| {float(np.abs(feats[bad]).max()):.4g}): extract with "
               f"{named('--dtype float32', 'dtype=' + repr('float32'))}")
    raise NonFiniteFeaturesError(
        f"{key.label()}: non-finite features for {len(names)} image(s): {listing}; {why}. Nothing of this batch "
        "was stored; the entry stays incomplete and a re-run resumes it"
    )
