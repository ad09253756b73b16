"""The one round loop: sampling, local updates (batched or per client), aggregation,
exact byte accounting, evaluation, a checkpoint every round, and resumption."""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fedcache.errors import ConfigError, FedcacheError
from fedcache.federate.local import recording_losses, rng_for
from fedcache.federate.methods.base import LocalResult, Method
from fedcache.federate.metrics import summarize
from fedcache.heads import Params

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


class DivergedError(FedcacheError, FloatingPointError):
    """A client's update became NaN or infinite."""


@dataclass
class RunConfig:
    rounds: int = 50
    fraction: float = 1.0
    eval_every: int = 1
    batched: bool = True
    out: Path | None = None
    resume: bool = False
    keep_checkpoints: str = "last"  # last | none (deleted at the end) | all (one per round besides the last)

    def __post_init__(self) -> None:
        if self.rounds < 1 or not 0 < self.fraction <= 1 or self.eval_every < 1:
            raise ConfigError(f"need rounds >= 1, 0 < fraction <= 1, eval_every >= 1 (got {self})")


@dataclass
class RunState:
    rnd: int
    server: Params
    clients: Params
    bytes_up: int = 0
    bytes_down: int = 0
    params_up: list[int] = field(default_factory=list)  # per round, summed over the clients that sent
    seconds: float = 0.0
    senders: list[int] = field(default_factory=list)  # per round: how many clients sent (0 for unfederated methods)


@dataclass
class RunResult:
    summary: dict
    history: list[dict]
    server: Params
    clients: Params


RoundCallback = Callable[[int, int, dict | None], None]


def run(method: Method, cfg: RunConfig, on_round: RoundCallback | None = None) -> RunResult:
    state = _initial_state(method, cfg)
    history = _read_history(cfg) if cfg.resume else []
    t0 = time.perf_counter() - state.seconds
    losses: list[torch.Tensor] = []
    for rnd in range(state.rnd, cfg.rounds):
        with recording_losses() as round_losses:
            _one_round(method, cfg, state, rnd)
        losses += round_losses
        line = None
        if (rnd + 1) % cfg.eval_every == 0 or rnd + 1 == cfg.rounds:
            line = {"round": rnd + 1, **evaluate(method, state), "train_loss": train_loss(losses),
                    "bytes_up": state.bytes_up, "bytes_down": state.bytes_down}
            history.append(line)
            losses = []
        state.rnd, state.seconds = rnd + 1, time.perf_counter() - t0
        _persist(cfg, state, line)
        if on_round:
            on_round(rnd + 1, cfg.rounds, line)
    if cfg.out is not None and cfg.keep_checkpoints == "none":
        (cfg.out / CHECKPOINT).unlink(missing_ok=True)
    return RunResult(run_summary(method, cfg, state, history), history, state.server, state.clients)


def train_loss(losses: list[torch.Tensor]) -> float | None:
    """Mean over the rounds since the last metrics line, over sampled clients and over each local-training
    call, of a client's mean loss over its local steps; None for methods that train nothing locally."""
    return round(float(torch.cat(losses).mean()), 6) if losses else None


def sample_clients(method: Method, cfg: RunConfig, rnd: int) -> list[int]:
    n = method.ctx.data.n_clients
    if method.all_clients or cfg.fraction >= 1:
        return list(range(n))
    m = max(1, round(cfg.fraction * n))
    return sorted(int(k) for k in rng_for(method.ctx.seed, rnd, 0, 0, 2).choice(n, m, replace=False))


def _one_round(method: Method, cfg: RunConfig, state: RunState, rnd: int) -> None:
    clients = sample_clients(method, cfg, rnd)
    down = method.broadcast(state.server, rnd)
    result = _local(method, cfg, rnd, clients, down, _gather(state.clients, clients))
    settle(method, state, rnd, clients, down, result)
    _scatter(state.clients, result.states, clients)


def settle(method: Method, state: RunState, rnd: int, clients: list[int], down: Params, result: LocalResult) -> None:
    """The server's half of a round, shared by every engine: check, count the bytes, aggregate."""
    _check_finite(method, result, clients, rnd, down)
    if method.federated:
        up = [method.upload_size(result.uploads, i) for i in range(len(clients))]
        state.bytes_up += sum(b for _, b in up)
        state.bytes_down += method.download_size(down)[1] * len(clients)
        state.params_up.append(sum(p for p, _ in up))
        state.senders.append(len(clients))
    else:
        state.params_up.append(0)
        state.senders.append(0)
    state.server = method.aggregate(state.server, result, clients, rnd)


def _local(method: Method, cfg: RunConfig, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
    if cfg.batched or not method.splittable:
        return method.local_update(rnd, clients, down, states)
    parts = [method.local_update(rnd, [k], down, _gather(states, [i])) for i, k in enumerate(clients)]
    cat = lambda dicts: {n: torch.cat([d[n] for d in dicts]) for n in dicts[0]} if dicts and dicts[0] else {}
    return LocalResult(cat([p.states for p in parts]), cat([p.uploads for p in parts]), torch.cat([p.weights for p in parts]))


def _gather(stacked: Params, idx: list[int]) -> Params:
    if stacked and idx == list(range(len(next(iter(stacked.values()))))):
        # Every client trains: hand over the stored tensors themselves instead of copying all client
        # state out and back; local training updates weights in place, so _scatter copies only the
        # tensors a method replaced (BatchNorm's running statistics, say).
        return dict(stacked)
    return {n: t[idx] for n, t in stacked.items()}


def _scatter(stacked: Params, part: Params, idx: list[int]) -> None:
    for n, t in part.items():
        if not _same_memory(stacked[n], t):
            stacked[n][idx] = t


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def _check_finite(method: Method, result: LocalResult, clients: list[int], rnd: int, down: Params) -> None:
    for tensors in (result.uploads, result.states):
        for name, t in tensors.items():
            # NaN and inf survive a sum: one reduction per client instead of a mask over every parameter.
            # Summed in float32: a float16 upload (e.g. quantised similarities) would overflow a float16 sum.
            bad = ~torch.isfinite(t.flatten(1).sum(1, dtype=torch.float32))
            if bad.any():
                k = clients[int(bad.nonzero()[0, 0])]
                raise DivergedError(f"round {rnd + 1}, client {k}: '{name}' became NaN/inf; {_cause(method, k, name, down)}")


def _cause(method: Method, k: int, name: str, down: Params) -> str:
    """What is non-finite: the client's inputs, what the server sent, or the method's own result.
    Only the last is a divergence that a smaller learning rate may cure."""
    d = method.ctx.data
    rows = torch.as_tensor(d.client_train[k] if k < len(d.client_train) else [], dtype=torch.long)
    inputs = [("cached training features", d.x_train[rows].flatten(1))]
    if d.views is not None:
        inputs.append(("cached augmented views", d.views[rows].flatten(1)))
    for what, x in inputs:
        bad = (~torch.isfinite(x)).any(1).nonzero().flatten()
        if len(bad):
            return (f"the client's {what} are not finite ({len(bad)} of its {len(rows)} training rows, e.g. rows "
                    f"{rows[bad[:5]].tolist()} of the training table): re-extract them (fedcache extract refuses "
                    "non-finite features since it checks them)")
    sent = [n for n, t in down.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if sent:
        return f"what the server sent this round was already not finite ({', '.join(sent)}): resume from an earlier checkpoint"
    h = method.head
    if name in (*h.body_keys, *h.head_keys, *getattr(h, "buffer_keys", ())):
        return "training diverged from finite inputs: lower the learning rate (--set lr=...)"
    return (f"'{name}' is not a weight of the {getattr(h, 'name', '')} head but something {method.name} computes or trains itself, "
            "from finite features and a finite received model: check the method's settings (learning rate, "
            "noise scale, ...)")


# ---- evaluation -----------------------------------------------------------------------
EVAL_CHUNK = 16  # clients per batched evaluation, to bound the (K, T, D) gather


def evaluate(method: Method, state: RunState) -> dict:
    d = method.ctx.data
    with torch.no_grad():
        glob = method.global_logits(state.server, d.x_test) if method.has_global_model else None
        if method.personalized:
            per_client = _personal_accuracy(method, state)
        else:
            correct = (glob.argmax(1) == d.y_test).numpy()
            per_client = np.array([100.0 * correct[rows].mean() for rows in d.client_test])
    out = {"accuracy": float(per_client.mean()), "per_client": [round(float(a), 4) for a in per_client]}
    if glob is not None:
        out["global_accuracy"] = 100.0 * float((glob.argmax(1) == d.y_test).float().mean())
    return out


def _personal_accuracy(method: Method, state: RunState) -> np.ndarray:
    d = method.ctx.data
    acc = []
    for start in range(0, d.n_clients, EVAL_CHUNK):
        clients = list(range(start, min(d.n_clients, start + EVAL_CHUNK)))
        x, y, mask = d.rows_of("test", clients)
        states = {n: t[clients[0] : clients[-1] + 1] for n, t in state.clients.items()}  # views: read only
        logits = method.client_logits(state.server, states, clients, x)
        hit = (logits.argmax(-1) == y) & mask
        acc.extend((100.0 * hit.sum(1) / mask.sum(1)).tolist())
    return np.array(acc)


def run_summary(method: Method, cfg: RunConfig, state: RunState, history: list[dict]) -> dict:
    last = history[-1]
    per_client = np.array(last["per_client"])
    return {
        "method": method.name, **summarize(per_client),
        "global_accuracy": last.get("global_accuracy"),
        "per_client_accuracy": last["per_client"],
        "bytes_up": state.bytes_up, "bytes_down": state.bytes_down,
        "params_up_per_round": int(np.mean(state.params_up)) if state.params_up else 0,
        **_per_client(state),
        "rounds": state.rnd, "seconds": round(state.seconds, 4),
        "random_weights": bool(method.ctx.data.random_weights),
        **method.summary_extra(),
        "definitions": DEFINITIONS,
    }


# Written into every summary, so that a number read from summary.json says what it is.
DEFINITIONS = {
    "std_accuracy": "std over clients of their accuracies at the last evaluation, population std (ddof=0): "
                    "every client of the run is counted, and std_accuracy**2 == variance. Not a std over seeds "
                    "(a grid's report gives that, sample std ddof=1)",
    "params_up_per_client": "parameters one client sends in one round, averaged over rounds and the clients that "
                            "sent (the FedPCL paper's '# of Comm Params')",
    "bytes_up_per_client": "bytes one client sends in one round, averaged likewise",
    "params_up_per_round": "parameters all clients that sent in a round send together, averaged over rounds",
    "bytes_up": "bytes sent by all clients over all rounds",
}


def _per_client(state: RunState) -> dict:
    sent = sum(state.senders)
    return {"params_up_per_client": round(sum(state.params_up) / sent, 1) if sent else 0,
            "bytes_up_per_client": round(state.bytes_up / sent, 1) if sent else 0}


# ---- persistence -------------------------------------------------------------------------
def _initial_state(method: Method, cfg: RunConfig) -> RunState:
    fresh = RunState(0, method.init_server(), method.init_clients(method.ctx.data.n_clients))
    if not cfg.resume:
        return fresh
    path = cfg.out / CHECKPOINT if cfg.out else None
    if path is None or not path.exists():
        raise ConfigError(f"--resume: no checkpoint in {cfg.out}; start the run without --resume")
    ck = torch.load(path, weights_only=True)  # tensors, dicts and numbers only: nothing executable
    log.info("resuming %s after round %d", method.name, ck["rnd"])
    # A checkpoint written before senders were recorded: the sampled clients of those rounds sent.
    senders = ck.get("senders") or [len(sample_clients(method, cfg, r)) if method.federated else 0 for r in range(ck["rnd"])]
    return RunState(ck["rnd"], ck["server"], ck["clients"], ck["bytes_up"], ck["bytes_down"], list(ck["params_up"]),
                    ck["seconds"], list(senders))


def _persist(cfg: RunConfig, state: RunState, line: dict | None) -> None:
    if cfg.out is None:
        return
    if line is not None:
        with open(cfg.out / METRICS, "a") as fh:
            fh.write(json.dumps(line) + "\n")
    ck = {"rnd": state.rnd, "server": state.server, "clients": state.clients, "bytes_up": state.bytes_up,
          "bytes_down": state.bytes_down, "params_up": state.params_up, "seconds": state.seconds, "senders": state.senders}
    tmp = cfg.out / (CHECKPOINT + ".tmp")
    torch.save(ck, tmp)
    os.replace(tmp, cfg.out / CHECKPOINT)  # a crash mid-write leaves the previous checkpoint intact
    if cfg.keep_checkpoints == "all":
        shutil.copyfile(cfg.out / CHECKPOINT, cfg.out / f"checkpoint-round{state.rnd:04d}.pt")


def _read_history(cfg: RunConfig) -> list[dict]:
    """Metrics lines up to the checkpoint; a line written after it (crash before the checkpoint) is dropped."""
    path = cfg.out / METRICS
    if not path.exists():
        return []
    ck_round = torch.load(cfg.out / CHECKPOINT, weights_only=True)["rnd"]
    kept = [l for l in map(_parse_line, path.read_text().splitlines()) if l is not None and l["round"] <= ck_round]
    path.write_text("".join(json.dumps(l) + "\n" for l in kept))
    return kept


def _parse_line(text: str) -> dict | None:
    """A metrics line, or None for a blank or torn one: a crash while appending leaves the last line torn,
    and its round is after the checkpoint's, so it is re-run and written again."""
    try:
        line = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return line if isinstance(line, dict) and isinstance(line.get("round"), int) else None
