"""A run's files (metrics.jsonl, summary.json, every checkpoint) are those recorded in
``outputs_golden.json``, bit for bit: refactoring the round driver must not change a number.

The record was made before the driver was split from the in-process engine. Regenerate it only for an
intended change of numbers (or a torch whose kernels round differently), and say why in the commit:
``FEDCACHE_REGENERATE_GOLDEN=1 pytest tests/federate/test_outputs_unchanged.py``.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from fedcache.federate.loop import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig

from .conftest import synthetic

GOLDEN = Path(__file__).with_name("outputs_golden.json")
REGENERATE = os.environ.get("FEDCACHE_REGENERATE_GOLDEN") == "1"

# name -> (method, head, RunConfig fields): partial participation, eval cadence, BatchNorm heads,
# personal state, the per-client path, and every checkpoint kept.
CASES = {
    "fedavg-fraction": ("fedavg", "linear", dict(rounds=5, fraction=0.6, eval_every=2)),
    "fedproto-mlp-fraction": ("fedproto", "mlp", dict(rounds=4, fraction=0.6, eval_every=1)),
    "solo-mlp": ("solo", "mlp", dict(rounds=3)),
    "fedpcl": ("fedpcl", "projection", dict(rounds=3, eval_every=2)),
    "fedntd-mlp-fraction": ("fedntd", "mlp", dict(rounds=3, fraction=0.6)),
    "perfedavg-mlp": ("perfedavg", "mlp", dict(rounds=2, fraction=0.6)),
    "fedrep-fraction-loop": ("fedrep", "mlp", dict(rounds=3, fraction=0.4, batched=False)),
    "pfedme": ("pfedme", "linear", dict(rounds=2)),
}


def _digest(value):
    """Tensors by their exact bytes; containers element-wise; plain numbers as they are."""
    if isinstance(value, torch.Tensor):
        t = value.detach().contiguous()
        return f"{t.dtype} {tuple(t.shape)} " + hashlib.sha256(t.numpy().tobytes()).hexdigest()[:24]
    if isinstance(value, dict):
        return {str(k): _digest(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_digest(v) for v in value]
    return value


def _files(out: Path) -> dict:
    """Every file a run wrote, with what varies from run to run (wall time) left out."""
    files = {"metrics.jsonl": [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]}
    for ck in sorted(out.glob("checkpoint*.pt")):
        files[ck.name] = _digest({k: v for k, v in torch.load(ck, weights_only=True).items() if k != "seconds"})
    return files


def outputs(case: str, out: Path) -> dict:
    name, head, fields = CASES[case]
    data = synthetic(sizes=[37, 80, 12, 64, 51], seed=3)
    ctx = MethodContext(data, head, OptimConfig("adam", 1e-2), local_epochs=2, batch_size=16, seed=5, rounds=fields["rounds"])
    r = run(METHODS.get(name)(ctx), RunConfig(**fields, out=out, keep_checkpoints="all"))
    summary = {k: v for k, v in r.summary.items() if k != "seconds"}
    return {"summary": summary, "history": r.history, **_files(out),
            "final": _digest({"server": r.server, "clients": r.clients})}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_writes_the_recorded_numbers(case, tmp_path):
    got = json.loads(json.dumps(outputs(case, tmp_path)))
    if REGENERATE:
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.write_text(json.dumps({**golden, case: got}, indent=1, sort_keys=True) + "\n")
        return
    want = json.loads(GOLDEN.read_text())[case]
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == want[key], key
