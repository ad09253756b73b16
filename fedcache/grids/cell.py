"""One cell of a grid: its run directory, its run (resumed where it checkpointed), and its row of results."""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from fedcache.disk import PARTIAL, discard, log_lines, read_json, remove_partial_writes, write_text
from fedcache.errors import CellFailedError, DirectoryBusyError, FedcacheError
from fedcache.federate import driver
from fedcache.federate.divergence import DivergedError
from fedcache.federate.rundir import CHECKPOINT, write_json
from fedcache.grids.spec import BATCHES, CELLS, Cell, GridSpec, train_config
from fedcache.ownership import LOCK, hold
from fedcache.partitioning import said_by_the_grid
from fedcache.paths import CELL, CONFIG, DIVERGED, METRICS, RUNGS, SUMMARY
from fedcache.spec import RunSpec
from fedcache.training import train
from fedcache.wording import cell_again, named

log = logging.getLogger(__name__)

DONE = SUMMARY  # written last by a run: a finished cell; DIVERGED marks one finished as NaN (a candidate: it loses)
METRIC_COLUMNS = ("mean_accuracy", "std_accuracy", "global_accuracy", "worst10", "worst20", "worst40", "best10",
                  "variance", "bytes_up", "bytes_down", "params_up_per_round", "params_up_per_client", "bytes_up_per_client",
                  "rounds", "seconds", "random_weights", "worst_client_global_accuracy")


def run_cell(spec: GridSpec, c: Cell, tables, stop: int | None = None) -> dict:
    """One run in its own directory; an interrupted (or paused) one resumes from its checkpoint. ``stop``: pause
    after that round (a rung of successive halving, grids/halving.py), scored there."""
    out = spec.out / CELLS / c.name
    with hold_cell(out):
        cfg = train_config(spec, c, out)
        if last_line_lost(cfg, stop):
            start_again(cfg, stop)
        resume = (out / CHECKPOINT).exists() and (out / CONFIG).exists()
        if not resume:
            discard(p for p in out.iterdir() if p.name != LOCK)  # started but never checkpointed: nothing to keep
        write_cell_json(out, c)
        cfg = cfg.replace(resume=resume)
        try:
            # Its advice names a setting as the grid's caller gave it: not settings['lr'].
            with spec.names.swept(spec.sweep, spec.methods), failing_as(f"the cell {CELLS}/{c.name}"), said_by_the_grid():
                result = train(cfg, tables=tables, run_name=c.name, stop_after=stop)
        except DivergedError as exc:
            # A grid tries values that may diverge (a large lr): that is the cell's result, marked in the table (and
            # a --select candidate that loses, grids/select.py), not the end of the other cells. Its error is kept
            # beside the run, where a re-run reads it as done.
            # Its round too: the rounds it ran (a --prune halving grid's share of the full grid's counts them).
            record = {"error": str(exc).split(" The run in ")[0], "round": exc.in_round}
            write_text(out / DIVERGED, json.dumps(record) + "\n", "the cell's record")
            return diverged_row(c, out)
        return result_row(c, result, out)


def last_line_lost(cfg: RunSpec, stop: int | None, rnd: int | None = None) -> bool:
    """Whether a run directory's own checkpoint (of round ``rnd``, read here where not given) is of its last round
    (``stop``, a rung, where it pauses there), whose metrics line is lost (``lacks``): continued, the run would be
    scored again but lack that line for good (its training loss is not in the checkpoint); trained again, as a
    batched grid trains such a cell's batch again, it has it back. Read only."""
    return lacks(cfg, start_round(cfg.engine.out) if rnd is None else rnd, stop) == LAST_LINE


def start_again(cfg: RunSpec, stop: int | None) -> None:
    """A run directory whose last line is lost (``last_line_lost``) emptied, said, under its lock: it trains from
    round 0."""
    out = cfg.engine.out
    log.warning("%s: its checkpoint is of the round it stops at (%d), whose metrics line in %s is %s; it trains "
                "again from round 0, which writes that line back", out, stop or cfg.schedule.rounds, out / METRICS,
                lost_how(out))
    # The checkpoint first: killed in between, the cell starts afresh next time whatever of the rest is left (a
    # checkpoint left without its config.json would be discarded too, but one left beside a log trimmed otherwise
    # need not read as this again).
    discard([out / CHECKPOINT])
    discard(p for p in out.iterdir() if p.name != LOCK)


def lost_how(out: Path) -> str:
    """How a run directory's lost last metrics line went (``lacks``): ``damaged`` where an unreadable line is left in
    its place, at the end of the log (each round's line is appended after the earlier rounds'), else ``missing``
    (deleted, with its file or alone; a damaged line of an earlier round is another, a gap)."""
    text = (out / METRICS).read_text() if (out / METRICS).exists() else ""
    written = [raw for raw in text.splitlines() if raw.strip()]
    return "damaged" if written and not log_lines(written[-1]) else "missing"


BEHIND, LAST_LINE = "behind", "last line"  # what a run's directory lacks of a checkpoint (lacks)


def lacks(cfg: RunSpec, rnd: int, stop: int | None = None) -> str | None:
    """What a run's directory lacks of what a checkpoint of round ``rnd`` (its own, or a batch's) implies, or None:
    its config.json or its metrics lines up to the last round evaluated by then (``BEHIND``: fewer lines than rounds
    evaluated, a damaged line counted as one), or the line of its last round, ``stop`` where it pauses at a rung
    (``LAST_LINE``: damaged, deleted, or its whole file deleted; training again writes it back, where continued the
    run is scored again but lacks that line for good; a lost line of an earlier round is only a gap in its history).
    Read only: resuming trims the log."""
    out = cfg.engine.out
    if rnd <= 0:  # none yet, or unreadable (the resume says so)
        return None
    if not (out / CONFIG).exists():
        return BEHIND
    due = [k + 1 for k in range(rnd) if driver.evaluation_due(cfg.schedule, k)]
    text = (out / METRICS).read_text() if (out / METRICS).exists() else ""
    lines = log_lines(text)
    read = [line["round"] for line in lines if line["round"] <= rnd]
    if not due or due[-1] in read:
        return None
    # Of the round it stops at, and only where that round logs a line (--eval-every: a rung may log none, and a
    # lost earlier line is then only a gap).
    if rnd == (stop or cfg.schedule.rounds) == due[-1]:
        return LAST_LINE
    damaged = sum(1 for raw in text.splitlines() if raw.strip()) - len(lines)
    return BEHIND if len(read) + damaged < len(due) else None


def start_round(out: Path) -> int:
    """The round of a run directory's own checkpoint (a cell paused, or interrupted by itself), or of a batch's
    folder, 0 without one, -1 unreadable: a stack continues runs of one round. Memory-mapped, so only the round
    number is read."""
    path = out / CHECKPOINT
    if not path.exists():
        return 0
    try:
        ck = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception:  # unreadable: the run itself says so when it resumes
        return -1
    return int(ck["runs"][0]["rnd"] if "runs" in ck else ck["rnd"])


@contextlib.contextmanager
def failing_as(what: str) -> Iterator[None]:
    """An error of the block that is not one of fedcache's (a bug, an exhausted resource; an OSError is said in one
    line already) raised as one line naming ``what`` (a cell, a batch): of a grid of hundreds of cells, a traceback
    said neither which cell failed nor that the finished ones are kept."""
    try:
        yield
    except (FedcacheError, OSError):
        raise
    except Exception as exc:
        said = (str(exc).strip().splitlines() or [""])[0]
        where = named("FEDCACHE_DEBUG=1 shows where it happened", "the error's cause shows where it happened")
        raise CellFailedError(f"{what} failed: {type(exc).__name__}{': ' + said if said else ''} ({where}); "
                              f"finished cells are kept, and the same grid {named('command', 'call')} run again "
                              "trains this one again") from exc


# Seconds a cell's live holder is waited for: a worker of a grid killed outright leaves within a tenth of a second
# (ownership.on_orphaned) unless it is stopped (Ctrl-Z) or the machine is swamped; then the grid refuses, naming it.
CELL_WAIT = 5.0


@contextlib.contextmanager
def hold_cell(folder: Path, what: str = "the run directory") -> Iterator[None]:
    """``folder`` (a cell's, or a batch's) locked while this process writes it, with the temporary files of writes
    cut short there removed: a grid trains its cells under its own lock, but a worker of a grid killed outright
    may still be writing one (two writers of one checkpoint), and a cell's lock is what says so."""
    with hold(folder, f"{what} {folder}", wait=CELL_WAIT, inside=True):
        remove_partial_writes(folder)
        yield


def clear_killed(grid: Path) -> None:
    """What a grid or its workers killed in their cells and batches left there (stopped by their grid too late, a
    kill -9 of the grid): each cell's lock, said as a worker taking the cell over says it, and the temporary files
    of the writes they were cut short in (an empty checkpoint.pt.tmp), also in a cell that finished or a batch no
    cell continues. A cell whose lock is still held is left as it is: its holder lives, and may be writing; the
    grid waits for it, or refuses, as it trains the cell. A batch still held is waited for, then refused
    (DirectoryBusyError): its cells are locked only as it starts, and a re-run grouping them otherwise (or running
    each alone) would train them under its holder."""
    for folder in _left_in(grid / CELLS):
        with contextlib.suppress(DirectoryBusyError), hold(folder, f"the run directory {folder}", inside=True):
            remove_partial_writes(folder)
    for folder in _left_in(grid / BATCHES):
        with hold_cell(folder, "the batch"):
            pass


def _left_in(parent: Path) -> list[Path]:
    """The folders in ``parent`` with a lock file or a temporary file in them, the only ones a killed writer left
    anything in: a lock taken on each of thousands of finished cells, on every rung, took seconds on NFS."""
    found = {p.parent for pattern in (f"*/{LOCK}", f"*/*{PARTIAL}") for p in parent.glob(pattern)}
    return sorted(p for p in found if p.is_dir())


def result_row(c: Cell, result, out: Path) -> dict:
    """A finished run's row; a paused run's, its summary at that round recorded in rungs.json (one per round it
    paused at), which marks the cell done up to that round as summary.json marks it finished."""
    if result.paused:
        path = out / RUNGS
        rungs = read_json(path, _again(out)) if path.exists() else {}
        write_json(path, {**rungs, str(result.summary["rounds"]): result.summary})
    return row(c, result.summary, out)


def mark_continued(out: Path, at: int) -> None:
    """The cell in ``out``, paused at round ``at``, was kept there (or revived) and trains on: its rung says so
    (``continues``). Stopped before it trains past it, a report told it from a candidate cut there only where
    another seed of it had gone past; with every seed waiting, it showed the kept candidate as cut."""
    path = out / RUNGS
    rungs = read_json(path, _again(out)) if path.exists() else {}
    if str(at) in rungs and rungs[str(at)].get("continues") is not True:  # once: a re-run replays every cut
        write_json(path, {**rungs, str(at): {**rungs[str(at)], "continues": True}})


def read_diverged(cell: Path) -> str:
    """The error a diverged cell's diverged.json keeps (its run's DivergedError, as run_cell wrote it)."""
    return read_json(cell / DIVERGED, _again(cell), _diverged_problem)["error"]


def diverged_round(cell: Path) -> int | None:
    """The round a diverged cell diverged in (None: a record of an older fedcache, which kept no round)."""
    at = read_json(cell / DIVERGED, _again(cell), _diverged_problem).get("round")
    return at if isinstance(at, int) else None


def _diverged_problem(value) -> str:
    if not isinstance(value, dict):
        return "not a JSON object"
    return "" if isinstance(value.get("error"), str) else "no \"error\" text in it"


def diverged_row(c: Cell, out: Path) -> dict:
    # No summary: every figure is None, but a swept key that is also a figure (rounds) keeps its value. The round it
    # diverged in tells a value that blew up at once from one that drifted there late.
    return {**row(c, {}, out), **dict(c.setting), "diverged": True, "diverged_round": diverged_round(out)}


def write_cell_json(out: Path, c: Cell) -> None:
    write_text(out / CELL, json.dumps(cell_record(c)) + "\n", "the cell's record")


def cell_record(c: Cell) -> dict:
    """A cell as plain JSON fields (its cell.json, a batch's runs.json): its method, seed and swept settings, in
    the grid's axis order."""
    return {"method": c.method, "seed": c.seed, "setting": dict(c.setting)}


def row(c: Cell, summary: dict, out: Path) -> dict:
    """The cell's line of results.csv: its method, axes and seed, the summary's figures and its directory."""
    return {"method": c.method, **dict(c.setting), "seed": c.seed, **{k: summary.get(k) for k in METRIC_COLUMNS},
            "run_dir": str(Path(CELLS) / out.name)}


def read_done(spec: GridSpec, c: Cell, stop: int | None = None) -> dict | None:
    """The row of a cell that finished (or ``stop``: paused at that round, or finished), or None."""
    path = spec.out / CELLS / c.name / DONE
    rungs = path.parent / RUNGS
    # The row at a rung first: a cell that paused there and diverged on its way to the next had not diverged yet
    # (read as diverged at that rung, a re-run made other cuts than the run it continues).
    if stop is not None and rungs.exists():
        paused = read_json(rungs, _again(path.parent)).get(str(stop))
        if paused is not None:
            return row(c, paused, path.parent)
    if (path.parent / DIVERGED).exists():
        return diverged_row(c, path.parent)
    if not path.exists():
        return None
    for record in (CONFIG, CELL):  # read by the report: damaged, it is said now, not as "nothing to train" first
        if (path.parent / record).exists():
            read_json(path.parent / record, _again(path.parent))
    return row(c, read_json(path, _again(path.parent)), path.parent)


def _again(cell: Path) -> str:
    return f"{cell_again(cell)}, which trains that cell again"
