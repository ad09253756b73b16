"""A run directory's round-by-round files: the checkpoint and the JSON-lines logs (metrics.jsonl, and
any log an engine keeps per round), written so that a crash at any point leaves a resumable run."""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from fedcache.errors import ConfigError

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


def load_checkpoint(out: Path | None, what: str) -> dict:
    path = Path(out) / CHECKPOINT if out else None
    if path is None or not path.exists():
        raise ConfigError(f"--resume: no checkpoint in {out}; start the run without --resume")
    ck = torch.load(path, weights_only=True)  # tensors, dicts and numbers only: nothing executable
    log.info("resuming %s after round %d", what, ck["rnd"])
    return ck


def save_checkpoint(out: Path, ck: dict, keep_round_copy: bool) -> None:
    tmp = out / (CHECKPOINT + ".tmp")
    torch.save(ck, tmp)
    os.replace(tmp, out / CHECKPOINT)  # a crash mid-write leaves the previous checkpoint intact
    if keep_round_copy:
        shutil.copyfile(out / CHECKPOINT, out / f"checkpoint-round{ck['rnd']:04d}.pt")


def append_line(path: Path, line: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def read_history(out: Path, upto: int) -> list[dict]:
    """The metrics lines of a resumed run: those up to the checkpoint's round (see ``trim_log``)."""
    return trim_log(out / METRICS, upto)


def trim_log(path: Path, upto: int) -> list[dict]:
    """Keep the lines of rounds up to ``upto`` (the checkpoint's) and return them: a line written after
    the checkpoint (a crash between the two) is dropped, as is a blank or torn one."""
    if not path.exists():
        return []
    kept = [l for l in map(_parse_line, path.read_text().splitlines()) if l is not None and l["round"] <= upto]
    path.write_text("".join(json.dumps(l) + "\n" for l in kept))
    return kept


def _parse_line(text: str) -> dict | None:
    """A log line, or None for a blank or torn one: a crash while appending leaves the last line torn,
    and its round is after the checkpoint's, so it is re-run and written again."""
    try:
        line = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return line if isinstance(line, dict) and isinstance(line.get("round"), int) else None
