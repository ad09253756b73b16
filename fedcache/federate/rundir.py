"""A run's directory: one layout for every engine (in-process, stacked, Flower) and every caller
(``fedcache train``, grid cells, the demo, the Flower server)::

    config.json            what the run computes, written first; a resumed or reused run must compute the same
    metrics.jsonl          one line per evaluated round, appended as the run goes
    checkpoint.pt          the run's state after its last finished round, replaced atomically every round
                           (checkpoint-roundNNNN.pt beside it with keep="all")
    summary.json           written last: its presence marks the run finished

A crash at any point leaves a run that continues: the checkpoint is never half-written, a metrics line of a
round after the checkpoint (or a torn one) is dropped and that round runs again.

The checkpoint format is one for every engine: ``{"format": 4, "rnd", "seconds", "runs": [state per run],
"engine": {...}}``; a run by itself has one state, a stack of F runs F, each as its run alone would keep it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedcache import disk
from fedcache.errors import ConfigError, DamagedCheckpointError
from fedcache.paths import CHECKPOINT, CONFIG, METRICS, SUMMARY
from fedcache.wording import named

log = logging.getLogger(__name__)

ROUND_COPIES = "checkpoint-round*.pt"
# 4: fedpcl's server holds the sets of the clients that have sent one, by ``local_ids`` (an older fedcache would index
# them by client id); 3: a run's ``clients`` are the rows of its trained clients, with their ``client_ids``; 2: every
# client's. 2 and 3 read as 4.
FORMAT = 4
DIGEST = "sha256"  # the checkpoint's key holding the digest of everything else in it


def digest(obj: Any) -> str:
    """SHA-256 of a checkpoint's contents: every tensor's dtype, shape and bytes, and every key, list and value."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # its buffer, not a copy
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k in sorted(obj, key=repr):
            h.update(f"K{k!r}".encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"V{obj!r}".encode())
KEEP = ("last", "none", "all")  # the latest checkpoint | none once finished | also one per round


@dataclass
class RunDir:
    path: Path
    keep: str = "last"

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if self.keep not in KEEP:
            raise ConfigError(f"keep_checkpoints={self.keep!r}: must be one of {', '.join(KEEP)}")

    # ---- what the run computes --------------------------------------------------------------
    def config(self) -> dict | None:
        path = self.path / CONFIG
        return disk.read_json(path, self._again) if path.exists() else None

    def made_by(self) -> str | None:
        """Which engine's run its config.json records: ``in-process`` (a spec), ``flower`` (a Flower run's config and
        shards, flower/server.py), None (none yet). A resume on the other engine is refused as such, not compared."""
        saved = self.config()
        if not isinstance(saved, dict):
            return None
        if "spec" in saved:
            return "in-process"
        return "flower" if {"run", "shards"} <= saved.keys() else None

    @property
    def _again(self) -> str:
        return f"delete the folder {self.path} and run the same command again, which starts that run again"

    def write_config(self, config: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json(self.path / CONFIG, config)

    # ---- as it goes ---------------------------------------------------------------------------
    def started(self) -> bool:
        return (self.path / METRICS).exists() or self.has_checkpoint()

    def append(self, line: dict, log_name: str = METRICS) -> None:
        append_line(self.path / log_name, line)

    def history(self, upto: int, log_name: str = METRICS) -> list[dict]:
        """The log's lines of rounds up to ``upto`` (the checkpoint's): later or torn lines are dropped."""
        return trim_log(self.path / log_name, upto)

    def has_checkpoint(self) -> bool:
        return (self.path / CHECKPOINT).exists()

    def save_checkpoint(self, ck: dict) -> None:
        save_checkpoint(self.path / CHECKPOINT, ck)
        if self.keep == "all":
            copy = self.path / f"checkpoint-round{ck['rnd']:04d}.pt"
            with disk.on_full_disk(copy, "the copy of the checkpoint", (self.path / CHECKPOINT).stat().st_size,
                                   remove=[copy]):
                shutil.copyfile(self.path / CHECKPOINT, copy)

    def load_checkpoint(self) -> dict:
        if not self.has_checkpoint():
            raise no_checkpoint(self.path)
        return load_checkpoint(self.path / CHECKPOINT)

    # ---- the end ------------------------------------------------------------------------------
    def finished(self) -> bool:
        return (self.path / SUMMARY).exists()

    def summary(self) -> dict:
        return disk.read_json(self.path / SUMMARY, self._again)

    def finish(self, summary: dict, final: dict | None = None) -> None:
        """summary.json, last. ``final``: the finished run's own checkpoint where it trained in a stack (whose
        checkpoint lives with the stack), so that the run directory continues like any other."""
        if final is not None and self.keep != "none":
            self.save_checkpoint(final)
        write_json(self.path / SUMMARY, summary)
        if self.keep == "none":
            (self.path / CHECKPOINT).unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove the run's files (and nothing else in the directory): --overwrite, or a restart from round 0. The
        mark of a finished run goes first and config.json last: a clear cut short (a kill) never leaves a summary
        without its metrics, nor a checkpoint without the config it continues."""
        for pattern in (SUMMARY, CHECKPOINT, ROUND_COPIES, CHECKPOINT + disk.PARTIAL, METRICS, CONFIG):
            for path in self.path.glob(pattern):
                path.unlink()


def same_config(saved: dict, mine: dict) -> list[str]:
    """The keys (``section.field`` paths) where ``mine`` disagrees with the recorded ``saved``; empty when it is
    the same run. A key only ``mine`` has is no difference: a later fedcache may record more (a new setting
    whose default is the old behaviour), and every run made before it must stay resumable."""
    saved, mine = json.loads(json.dumps(saved)), json.loads(json.dumps(mine))
    out: list[str] = []
    _compare(saved, mine, "", out)
    return out


def _compare(saved: Any, mine: Any, at: str, out: list[str]) -> None:
    if isinstance(saved, dict) and isinstance(mine, dict):
        for k, v in saved.items():
            if k not in mine:
                out.append(f"{at}{k}")
            else:
                _compare(v, mine[k], f"{at}{k}.", out)
    elif saved != mine:
        out.append(at.rstrip("."))


# ---- files ---------------------------------------------------------------------------------------
def write_json(path: Path, doc: Any) -> None:
    disk.write_text(path, json.dumps(doc, indent=2) + "\n", "the run file")


def save_checkpoint(path: Path, ck: dict) -> None:
    """Written through a temporary file (a crash mid-write leaves the previous checkpoint), streamed: serialised in
    memory first, it raised the peak by its own size (a 1.86 GB checkpoint for fedproto at 1,000 clients a round).
    Its size, checked against the free space before a byte is written, is estimated. It carries a digest of
    what it holds: torch reads a file with flipped bytes without a word, and a run resumed from it would go on from
    other numbers."""
    body = {"format": FORMAT, **ck}
    whole = {**body, DIGEST: digest(body)}
    disk.save_atomic(path, lambda f: torch.save(whole, f), _stored_bytes(whole), "the checkpoint", check=True)


def _stored_bytes(obj: Any) -> int:
    """About what torch.save writes of ``obj``: its tensors' storages (each whole, once, with ~320 bytes of zip
    record each), and the pickle of the rest (~16 bytes a value: a run's per-round lists grow with its rounds)."""
    storages: dict[int, int] = {}
    values = [0]

    def visit(o: Any) -> None:
        if isinstance(o, torch.Tensor) and o.layout == torch.strided:
            s = o.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        elif isinstance(o, dict):
            for v in o.values():
                visit(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                visit(v)
        values[0] += 1
    visit(obj)
    return sum(storages.values()) + 320 * len(storages) + 16 * values[0] + 4096


def resume_named() -> str:
    """The resume as the caller asked for it: the flag, or the API's keyword."""
    return named("--resume", "resume=True")


def check_resumable(out: Path | str) -> None:
    """A resume of a folder that does not exist, refused before it is made (held) and the data is read: said of
    the folder, not as a run folder without a config.json or a checkpoint (a mistyped --out, most often)."""
    if not Path(out).exists():
        resume = resume_named()
        raise ConfigError(f"{resume}: {out} does not exist; start the run without {resume}")


def no_checkpoint(where: Path | str) -> ConfigError:
    """A resume with nothing to resume from, named as the caller asked for it."""
    resume = resume_named()
    return ConfigError(f"{resume}: no checkpoint in {where}; start the run without {resume}")


def load_checkpoint(path: Path) -> dict:
    """A checkpoint in the one format (one written by fedcache before it, a run's state at the top level, is
    read as a run by itself); DamagedCheckpointError when it no longer holds what was written."""
    # Tensors, dicts, lists, numbers and text only: nothing executable. Read onto the CPU whatever device wrote it;
    # the driver moves a resumed run's state to the run's device.
    try:
        ck = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # truncated or garbled: torch's own error names neither the file nor a way on
        raise DamagedCheckpointError(path, f"it cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None
    written = ck.pop(DIGEST, None)  # checkpoints of fedcache before digests have none
    if written is not None and written != digest(ck):
        raise DamagedCheckpointError(path, "what it holds no longer matches the digest written with it")
    if ck.get("format") in (2, 3, FORMAT):  # 2: every client's state (no client_ids); 2-3: fedpcl's sets a row per client
        return {**ck, "format": FORMAT}
    if isinstance(ck.get("format"), int) and ck["format"] > FORMAT:
        raise ConfigError(f"{path} was written by a newer fedcache (format {ck['format']}; this one reads up to {FORMAT}): "
                          "continue it with that version, or delete it to start over")
    if "server" in ck and "rnd" in ck:
        engine = ck.pop("engine", {})
        return {"format": FORMAT, "rnd": ck["rnd"], "seconds": ck["seconds"], "runs": [ck], "engine": engine}
    raise ConfigError(f"{path} is a checkpoint of an older fedcache that this one cannot continue "
                      "(a grid's batch: it trains from round 0 when the grid is run again); delete it to start over")


def append_line(path: Path, line: dict) -> None:
    disk.append(path, (json.dumps(line) + "\n").encode(), "the metrics log")


def trim_log(path: Path, upto: int) -> list[dict]:
    """Keep the lines of rounds up to ``upto`` (the checkpoint's) and return them: a line written after
    the checkpoint (a crash between the two) is dropped, as is a blank or torn one."""
    if not path.exists():
        return []
    text = path.read_text()
    kept = [l for l in disk.log_lines(text) if l["round"] <= upto]
    trimmed = "".join(json.dumps(l) + "\n" for l in kept)
    if trimmed != text:  # a log with nothing to drop is left as it was (a finished run's, resumed)
        disk.write_text(path, trimmed, "the metrics log")
    return kept


