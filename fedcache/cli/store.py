"""`fedcache store ...`: inspect, check, export and import the entries of a feature store."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from fedcache.cli.common import HELP_FLAGS, Command, Group, StoreOpt, _csv, _progress, console, err, print_table, step_printer
from fedcache.errors import ConfigError, EntryLockedError, UnreadableEntryError
from fedcache.wording import count, pasted

store_app = typer.Typer(no_args_is_help=True, context_settings=HELP_FLAGS, cls=Group, help="Inspect and manage a feature store.")


def _open_store(store: Path):
    from fedcache.store.feature_store import FeatureStore

    return FeatureStore(store, create=False)


@store_app.command("ls", cls=Command)
def store_ls(store: Path = StoreOpt) -> None:
    """List the entries of a store (stale: superseded by a newer extraction or import of the same data)."""
    from fedcache.store.feature_store import superseded_partials
    from fedcache.store.lookup import misplaced_entries

    fs = _open_store(store)
    infos = fs.entries()
    now = fs.current(infos)
    current, misplaced = {e.entry_id for e in now.values()}, misplaced_entries(infos)
    superseded = {e.entry_id for e in superseded_partials(infos, now)}
    # Who writes each partial entry, asked once (a glob of its lock files): its status and the lines below say it.
    writing = {e.entry_id: fs.writers(e.entry_id) for e in infos
               if not e.complete and not e.damaged and e.entry_id not in superseded}
    table = Table(box=None)
    table.add_column("id", no_wrap=True, min_width=16)
    for col in ("dataset", "split", "domain", "backbone", "view", "rows", "dim", "disk", "memory", "status"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("disk", "memory") else "left")
    for e in infos:
        k = {f: "?" for f in ("dataset", "split", "domain", "backbone", "view")} | e.key
        name = str(k["backbone"]) + (" [yellow]RANDOM[/]" if e.random_weights else "")
        disk, memory = fs.sizes(e)
        table.add_row(e.entry_id, str(k["dataset"]), str(k["split"]), str(k["domain"]), name, str(k["view"]), str(e.n_rows),
                      str(e.dim), human_bytes(disk), human_bytes(memory),
                      _status(fs, e, misplaced, current, superseded, writing))
    texts = fs.text_entries()
    if infos:
        print_table(table, optional=("view", "memory", "dim", "disk"))
    else:  # an extraction interrupted after its class texts holds those alone: no "empty store"
        console.print(f"{store}: " + ("no image features" if texts else "empty store"), highlight=False)
    if texts:
        console.print(_texts_said(texts), highlight=False)
    _say_unfinished(fs, infos, superseded, store, writing)
    old = sum(1 for e in infos if e.complete and e.format < 2)
    if old:
        console.print(f"{count(old, 'entry', 'entries')} in store format 1 (compressed, read through Zarr): `fedcache store upgrade "
                      f"{pasted('--store', store)}` rewrites them to be read at the speed of memory", highlight=False,
                      soft_wrap=True)


def _texts_said(texts: list[tuple[str, dict]]) -> str:
    """``2 sets of class-text embeddings: clip-rn50 text embeddings, single templates, 10 classes; ...``: what the
    table of image features leaves out (`store verify` checks them)."""
    from fedcache.store.text import text_label

    said = [text_label(a) + (f", {count(len(a['key']['classes']), 'class', 'classes')}"
                             if isinstance(a.get("key"), dict) and isinstance(a["key"].get("classes"), list) else "")
            for _, a in texts]
    return f"{count(len(texts), 'set')} of class-text embeddings: " + "; ".join(sorted(said))


def _say_unfinished(fs, infos, superseded: set, store: Path, writing: dict) -> None:
    """The partial entries' commands: the table says which are partial, not how to finish them (an augmented view's
    is an `extract --views`, which the plain extraction of its split is not). Those an entry completed since
    superseded are stale: their command would make another entry, not finish them. ``writing``: entry id -> its
    running writers by part (``FeatureStore.writers``)."""
    from fedcache.store import lookup

    if superseded:
        console.print(f"{count(len(superseded), 'partial entry', 'partial entries')} superseded by an entry completed "
                      f"since (runs read that one): `fedcache store rm --stale {pasted('--store', store)}` removes "
                      f"{'it' if len(superseded) == 1 else 'them'} (one an extraction still writes is kept)",
                      highlight=False, soft_wrap=True)
    partial = [e for e in infos if not e.complete and not e.damaged and e.entry_id not in superseded]
    written = _say_writing(fs, infos, partial, writing)
    partial = [e for e in partial if e.entry_id not in written]
    if partial:
        hints = dict.fromkeys(lookup.finish_hint(fs.path, infos, e) for e in partial)
        console.print(f"{count(len(partial), 'partial entry', 'partial entries')} (an extraction or import interrupted, or "
                      f"still running): finish {'it' if len(partial) == 1 else 'them'} with "
                      + " and ".join(hints), highlight=False, soft_wrap=True)


def _say_writing(fs, infos, partial: list, writing: dict) -> set[str]:
    """The partial entries a running command is writing, said with who writes them: the command that finishes an
    entry, offered for one being written, was refused as busy. An entry with a part no writer runs (interrupted, or
    not started) is finished by that part's command, beside the running writers: "let it finish" left it partial,
    with no command. Their ids."""
    by: dict[str, list] = {}
    for e in partial:
        for holder in list(writing.get(e.entry_id, {}).values())[:1]:
            by.setdefault(holder.describe(), []).append(e)
    for who, entries in by.items():
        idle = {e.entry_id: fs.idle_parts(e, writing[e.entry_id]) for e in entries}
        whole = [e for e in entries if not idle[e.entry_id]]
        if whole:
            console.print(f"{count(len(whole), 'partial entry', 'partial entries')} being written by {who}: let it "
                          f"finish (`fedcache store ls` then lists {'it' if len(whole) == 1 else 'them'} complete)",
                          highlight=False, soft_wrap=True, markup=False)
        if len(whole) < len(entries):
            _say_idle_parts(fs, infos, [e for e in entries if idle[e.entry_id]], idle, who)
    return {e.entry_id for entries in by.values() for e in entries}


def _say_idle_parts(fs, infos, entries: list, idle: dict, who: str) -> None:
    """Partial entries being written by ``who`` whose other parts (``idle``: entry id -> parts) no writer runs, with
    the command of each such part."""
    from fedcache.store import lookup

    parts = sorted({p for e in entries for p in idle[e.entry_id]}, key=lambda p: (p.count, p.index))
    hints = dict.fromkeys(lookup.finish_hint(fs.path, infos, e, p) for e in entries for p in idle[e.entry_id])
    console.print(f"{count(len(entries), 'partial entry', 'partial entries')} being written by {who}, but not "
                  f"{'its' if len(entries) == 1 else 'their'} part{'s' if len(parts) > 1 else ''} "
                  f"{', '.join(map(str, parts))} (interrupted, or not started yet): finish "
                  f"{'it' if len(parts) == 1 else 'them'} with " + " and ".join(hints),
                  highlight=False, soft_wrap=True, markup=False)


def human_bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


_SEE_VERIFY = " (see `store verify`)"


def _status(fs, e, misplaced: dict, current: set, superseded: set, writing: dict) -> str:
    if e.damaged or e.entry_id in misplaced:  # the latter: no read can place its rows
        return f"[red]{'unreadable' if e.denied else 'damaged'}[/]{_SEE_VERIFY}"
    if not e.complete:
        try:
            done = fs.chunks_done(e)
        except UnreadableEntryError:  # its flags are another user's: not damage, nor to be removed
            return f"[red]unreadable[/]{_SEE_VERIFY}"
        if done is None:
            return f"[red]damaged[/]{_SEE_VERIFY}"
        if e.entry_id in superseded:
            return "[dim]stale (partial)[/]"
        if writing.get(e.entry_id):
            return f"[yellow]being written: {_kept(fs, e, done)}[/]" if done[1] else "[yellow]being written: no chunk yet[/]"
        return f"[yellow]partial {_kept(fs, e, done)}[/]" if done[1] else "[yellow]partial (no chunk written)[/]"
    return "complete" if e.entry_id in current else "[dim]stale[/]"


def _kept(fs, e, done: tuple[int, int]) -> str:
    """How far a partial entry got: its rows kept (a domain of one chunk keeps its batches), or, where its row files
    cannot be read for that, its chunks done."""
    from fedcache.store.writer import rows_written

    try:
        return f"{rows_written(fs, e)}/{e.n_rows} rows"
    # A key of another fedcache, attributes or row files `store verify` says what is wrong with, or an entry a
    # `store rm` removed since it was listed: the flags read still say how far. Zarr and json raise many types.
    except Exception:
        return f"{done[0]}/{done[1]} chunks"


@store_app.command("info", cls=Command)
def store_info(entry: str = typer.Argument(..., help="Entry id (a unique prefix is enough)."), store: Path = StoreOpt) -> None:
    """Show an entry's full key and attributes, its format and its size on disk and in memory."""
    fs = _open_store(store)
    e = fs.info(entry)
    damaged = {"unreadable" if e.denied else "damaged": e.damaged, "key": e.key} if e.damaged else {}
    disk, memory = fs.sizes(e)
    # In memory: what a read of the entry holds (float32 features, labels, ids, domain index), whatever its dtype on disk.
    size = {"format": e.format, "on_disk": human_bytes(disk), "in_memory": human_bytes(memory),
            "on_disk_bytes": disk, "in_memory_bytes": memory}
    console.print_json(json.dumps({"entry_id": e.entry_id, **damaged, "size": size, **e.attrs}, default=str))


@store_app.command("verify", cls=Command)
def store_verify(
    repair: bool = typer.Option(False, help="Remove the damaged entries (then re-extract or re-import them)."),
    store: Path = StoreOpt,
) -> None:
    """Check every entry against its checksums (exit 1 if any is damaged or unreadable).

    Names the damaged entries, and those this user cannot read; --repair removes the damaged ones."""
    from rich.markup import escape

    from fedcache.store.feature_store import ENTRIES, TEXT
    from fedcache.store.lookup import misplaced_entries
    from fedcache.store.text import text_label

    fs = _open_store(store)
    infos = fs.entries()
    misplaced = misplaced_entries(infos)
    checks = [(ENTRIES, e.entry_id, e.label(), *fs.verify(e, misplaced)) for e in infos]
    attrs = dict(fs.text_entries())  # readable ones: each named by its backbone and template set
    checks += [(TEXT, eid, text_label(attrs.get(eid, {})), *fs.verify_text(eid)) for eid in fs.entry_ids(TEXT)]
    damaged = unreadable = 0
    for kind, eid, label, status, why in checks:
        colour = {"ok": "green", "damaged": "red"}.get(status, "yellow")
        console.print(f"{eid} {escape(label)}: [{colour}]{status}[/]" + (f" ({escape(why)})" if why else ""), highlight=False)
        if status == "damaged" and repair:
            fs.discard(eid, kind)
            console.print("  removed; re-run the `fedcache extract` or `fedcache store import` that made it")
        damaged += status == "damaged" and not repair
        unreadable += status == "unreadable"
    if repair:
        _repair_newly_misplaced(fs)
    if unreadable:  # not checked, and not to be repaired: another user's permissions, not damage
        err.print(f"[red]{count(unreadable, 'entry', 'entries')} not readable by this user[/]: have the store's owner make "
                  f"them readable (chmod -R a+rX {pasted(store)}), or verify it as its owner", highlight=False)
    if damaged:
        err.print(f"[red]{count(damaged, 'damaged entry', 'damaged entries')}[/]: re-run the extraction (or import) that made "
                  f"each, which replaces it, or remove {'it' if damaged == 1 else 'them'} with `fedcache store verify --repair "
                  f"{pasted('--store', store)}`", highlight=False)
    if damaged or unreadable:
        raise typer.Exit(1)
    # a repaired entry is counted as what became of it: "1 damaged" after its removal read as damage left
    statuses = ["damaged and removed" if repair and c[3] == "damaged" else c[3] for c in checks]
    console.print(f"checked {count(len(checks), 'entry', 'entries')}: " + ", ".join(
        f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)) if checks else "the store holds no entries")


def _repair_newly_misplaced(fs) -> None:
    """A table's newest entry removed as misplaced makes the next newest the one whose domains a read takes: checked
    again, and removed where they lack its own too, until a read can place every table's rows."""
    from rich.markup import escape

    from fedcache.store.feature_store import ENTRIES
    from fedcache.store.lookup import misplaced_entries

    while left := misplaced_entries(fs.entries()):
        for eid, why in left.items():
            console.print(f"{eid}, now the newest of its table: [red]damaged[/] ({escape(why)})", highlight=False)
            fs.discard(eid, ENTRIES)
            console.print("  removed; re-run the `fedcache extract` or `fedcache store import` that made it")


@store_app.command("upgrade", cls=Command)
def store_upgrade(store: Path = StoreOpt) -> None:
    """Rewrite the entries of an older store format in the current one, bit for bit.

    Checked chunk by chunk. Run it while nothing else writes to the store."""
    from fedcache.store.upgrade import upgrade_store

    colours = {"upgraded": "green", "skipped": "yellow"}

    def said(r) -> None:
        if r.status == "current":  # counted at the end: a current store's upgrade was a line per entry, all "current"
            return
        console.print(f"{r.entry_id} {escape(r.label)}: [{colours[r.status]}]{r.status}[/]"
                      + (f" ({escape(r.detail)})" if r.detail else ""), highlight=False)

    results = upgrade_store(_open_store(store), said)
    n = {status: sum(r.status == status for r in results) for status in ("upgraded", "skipped", "current")}
    console.print(f"{count(n['upgraded'], 'entry', 'entries')} upgraded, {n['skipped']} skipped, {n['current']} in the "
                  "current format already", highlight=False)
    if n["skipped"]:
        raise typer.Exit(1)


RM_PREFIX = 4  # characters of an entry id that `store rm` needs (as git asks of an abbreviated commit)


@store_app.command("rm", cls=Command)
def store_rm(
    entries: List[str] = typer.Argument(None, help="Entry ids to remove (each a unique prefix of 4 or more characters)."),
    stale: bool = typer.Option(False, help="Remove every stale entry."),
    store: Path = StoreOpt,
) -> None:
    """Remove entries (by id, or all stale ones)."""
    if not entries and not stale:
        raise ConfigError("name entry ids to remove, or pass --stale")
    short = [e for e in entries or [] if e.strip() and len(e) < RM_PREFIX]
    if short:  # one character named any of a sixteenth of the entries
        raise ConfigError(f"{short[0]!r}: give at least {RM_PREFIX} characters of an entry id to remove it (see "
                          f"`fedcache store ls {pasted('--store', store)}`)")
    fs = _open_store(store)
    # Every id is found before any entry goes: a typo in the third left the first two removed.
    named_ones = [fs.info(e).entry_id for e in entries or []]
    stale_ones = [e.entry_id for e in fs.stale()] if stale else []
    targets = list(dict.fromkeys(named_ones + stale_ones))
    if not targets:  # --stale on a store with none: nothing to do, which is no error
        console.print(f"no stale entries in {store}: nothing removed", soft_wrap=True, highlight=False)
    read_before = {e.entry_id: slot for slot, e in fs.current().items()}
    for eid in targets:
        try:
            info = fs.remove(eid)
        except EntryLockedError as exc:
            if eid in named_ones:  # asked for by name: the refusal is the answer
                raise
            # A stale partial entry that an extraction is writing after all: it goes on, and so does the clean-up.
            console.print(f"kept {eid}: {exc}", soft_wrap=True, highlight=False)
            continue
        console.print(f"removed {info.entry_id} ({info.key.get('dataset')}/{info.key.get('split')}/{info.key.get('domain')} {info.key.get('backbone')})")
    _say_read_instead(fs, [read_before[e] for e in targets if e in read_before], store)


def _say_read_instead(fs, slots: list, store: Path) -> None:
    """The entries runs read now where the ones they read were removed: an older entry of the same data (another
    --image-size, seed, precision, or an import) took their place without a word."""
    now = fs.current()
    for slot in slots:
        if slot in now:
            e = now[slot]
            console.print(f"runs of {e.key.get('dataset')}/{e.key.get('split')}/{e.key.get('domain')} "
                          f"{e.key.get('backbone')} now read {e.entry_id}, an earlier entry of that data "
                          f"(`fedcache store info {e.entry_id} {pasted('--store', store)}` shows how it was made)",
                          soft_wrap=True, highlight=False)


@store_app.command("export", cls=Command)
def store_export(
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dataset name in the store (see `fedcache store ls`)."),
    backbone: str = typer.Option(..., "--backbone", "--backbones", "-b", help="Backbone whose features to export (see `fedcache store ls`)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output file (.h5 or .npz)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="h5 or npz (default: from the file suffix)."),
    splits: str = typer.Option("train,test", help="Comma-separated splits to export."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the file --out names if it exists, instead of refusing."),
    store: Path = StoreOpt,
) -> None:
    """Export the features of a dataset and backbone to HDF5 or NPZ."""
    from fedcache.store.exporting import check_format, check_target, export_tables

    if not _csv(splits):
        raise typer.BadParameter("name at least one split, e.g. train,test", param_hint="--splits")
    fmt = check_format(fmt or _format_of(out))  # before the store is read (a while, for a large dataset)
    check_target(out, overwrite)
    fs = _open_store(store)
    tables = fs.read_splits(dataset, _csv(splits), backbone)
    export_tables(tables, out, fmt, overwrite)
    console.print(f"wrote {out} ({', '.join(f'{s}: {len(t)} rows' for s, t in tables.items())})")


def _format_of(out: Path) -> str:
    """The export's format from the file's suffix (``--format`` left out)."""
    fmt = {".h5": "h5", ".hdf5": "h5", ".npz": "npz"}.get(out.suffix.lower())
    if fmt is None:
        raise ConfigError(f"{out}: cannot tell the format from {repr(out.suffix) if out.suffix else 'a name without a suffix'}"
                          "; name a .h5 or .npz file with --out, or give --format h5 or --format npz")
    return fmt


@store_app.command("import", cls=Command)
def store_import(
    file: Path = typer.Argument(..., help="An .h5 or .npz file with features and labels (see docs/store.md)."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="Name to give the dataset in the store."),
    backbone: str = typer.Option(..., "--backbone", "--backbones", "-b", help="Name to give the encoder in the store."),
    split: Optional[str] = typer.Option(None, help="Split name, for a file with flat arrays."),
    store: Path = StoreOpt,
) -> None:
    """Bring your own embeddings: import them as normal store entries."""
    done = _import_with_progress(store, file, dataset, backbone, split)
    named, ids = f"as dataset {dataset!r}, backbone {backbone!r}", done.ids
    if done.written:
        console.print(f"imported {count(len(ids), 'entry', 'entries')} {named}")
    elif done.were_current:  # the same file again: its entries were there and complete
        console.print(f"nothing to import: the store already holds {file}'s {count(len(ids), 'entry', 'entries')} {named}",
                      soft_wrap=True)
    else:
        console.print(f"the store already held {file}'s {count(len(ids), 'entry', 'entries')} {named}; runs read them "
                      "again instead of the ones imported after them", soft_wrap=True)
    superseded = done.superseded
    if superseded:  # other data under the same names: runs read this file's entries from now on
        console.print(f"{count(len(superseded), 'other entry', 'other entries')} {named} "
                      f"{'is' if len(superseded) == 1 else 'are'} now stale; "
                      f"`fedcache store rm --stale {pasted('--store', store)}` deletes them", soft_wrap=True)


def _import_with_progress(store: Path, file: Path, dataset: str, backbone: str, split: Optional[str]):
    """The import under a bar over the rows written, drawn once the file is checked: a file refused is its error
    alone. A check that took a while is said above it (a million rows take seconds to check, and to write)."""
    from fedcache.store.interchange import import_file

    with _progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()) as progress:
        task = None

        def on_rows(done: int, total: int) -> None:
            nonlocal task
            if task is None:
                # a re-import starts from the rows kept, said in its first line (not 0 of them)
                task = progress.add_task("rows in the store", total=total, completed=done)
            progress.update(task, completed=done)

        return import_file(store, file, dataset, backbone, split, on_step=step_printer(progress.console), on_rows=on_rows)
