"""The ServerApp: any registered method's server step, driving clients over Flower messages.

It follows ``federate/loop.py`` round for round (same client sampling, same ``broadcast`` /
``aggregate`` calls, uploads stacked in client order, same byte counting and summary), so a run
gives the in-process engine's numbers. What the network adds: clients are found by asking each
node which client it is; a client that does not answer within ``round-timeout`` is dropped from
the round (recorded in ``rounds.jsonl``); a round with fewer replies than ``min-clients`` fails
with a FedcacheError; a node that (re)connects is asked who it is and rejoins from the next round.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedcache.errors import FedcacheError
from fedcache.federate.loop import RunConfig, RunState, run_summary, sample_clients, settle
from fedcache.federate.methods import LocalResult, Method
from fedcache.flower.config import FlowerRun, build_method
from fedcache.flower.protocol import from_record, to_record
from fedcache.flower.shard import load_server

log = logging.getLogger(__name__)

app = ServerApp()
SERVER_STATE = "server_state.pt"


class TooFewClientsError(FedcacheError, RuntimeError):
    """Fewer clients answered than the run's min-clients."""


@dataclass
class Roster:
    """Which node serves which client; nodes that failed to answer are never asked again."""

    node_of: dict[int, int] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)

    def refresh(self, grid: Grid, timeout: float) -> list[int]:
        """Ask new nodes who they are; returns the clients that (re)joined."""
        known = set(self.node_of.values()) | self.dead
        new = [n for n in grid.get_node_ids() if n not in known]
        if not new:
            return []
        msgs = [Message(RecordDict({"q": ConfigRecord({"who": 1})}), dst_node_id=n, message_type="query") for n in new]
        joined = []
        for reply in grid.send_and_receive(msgs, timeout=timeout):
            if reply.has_error():
                continue
            k, node = int(reply.content["client"]["client"]), reply.metadata.src_node_id
            old = self.node_of.get(k)
            if old is not None and old != node:
                self.dead.add(old)  # the client's node was restarted: the old node id is gone
            self.node_of[k] = node
            joined.append(k)
        self.dead.update(set(new) - set(self.node_of.values()))  # silent or failing nodes
        return sorted(joined)

    def rejoin(self, grid: Grid, n: int, wait: float, timeout: float) -> list[int]:
        """Refresh, then keep refreshing for up to ``wait`` seconds while some of the n clients have no node."""
        deadline = time.monotonic() + wait
        joined = self.refresh(grid, timeout)
        while len(self.node_of) < n and time.monotonic() < deadline:
            time.sleep(0.5)
            joined += self.refresh(grid, timeout)
        return sorted(joined)

    def drop(self, k: int) -> None:
        node = self.node_of.pop(k, None)
        if node is not None:
            self.dead.add(node)


def wait_for_clients(grid: Grid, roster: Roster, run: FlowerRun, n: int) -> None:
    d = run.deploy
    deadline = time.monotonic() + d.connect_timeout
    while len(roster.node_of) < n and time.monotonic() < deadline:
        roster.refresh(grid, d.round_timeout)
        if len(roster.node_of) < n:
            time.sleep(0.5)
    missing = sorted(set(range(n)) - set(roster.node_of))
    if missing:
        log.warning("clients %s did not connect within %.0fs", missing, d.connect_timeout)
    if len(roster.node_of) < min(d.min_clients, n):
        raise TooFewClientsError(
            f"only {len(roster.node_of)} of {n} clients connected within deploy.connect_timeout={d.connect_timeout:g}s "
            f"(deploy.min_clients={d.min_clients}); missing clients {missing}: start one SuperNode per client with "
            "--node-config \"shard='<shards>/client-NNN'\""
        )


@app.main()
def main(grid: Grid, context: Context) -> None:
    run = FlowerRun.from_config(dict(context.run_config))
    serve(grid, run)


def serve(grid: Grid, run: FlowerRun) -> dict:
    """The whole run; returns the summary (as ``fedcache train`` writes it)."""
    deploy, s = run.deploy, run.schedule
    if not deploy.server_shard:
        raise FedcacheError("run config deploy.server_shard is empty: set it to the server/ directory `fedcache shard` wrote")
    data, info = load_server(deploy.server_shard)
    method = build_method(run, data)
    out = Path(deploy.out) if deploy.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(s.rounds, s.fraction, s.eval_every, True, None, False)
    state, roster = RunState(0, method.init_server(), {}), Roster()
    wait_for_clients(grid, roster, run, data.n_clients)
    history, dropped = [], {}
    t0 = time.perf_counter()
    for rnd in range(s.rounds):
        record = _logged_round(grid, method, cfg, run, roster, state, rnd, out)
        if record["dropped"]:
            dropped[rnd + 1] = record["dropped"]
        if (rnd + 1) % s.eval_every == 0 or rnd + 1 == s.rounds:
            line = {"round": rnd + 1, **_evaluate(grid, method, run, roster, state), "bytes_up": state.bytes_up,
                    "bytes_down": state.bytes_down}
            history.append(line)
            _append(out, "metrics.jsonl", line)
        state.rnd, state.seconds = rnd + 1, time.perf_counter() - t0
    summary = run_summary(method, cfg, state, history)
    summary.update(engine="flower", partition_id=info.partition_id, dropped=dropped)
    if out is not None:
        # The final server state, for comparing engines: tensors only (read back with weights_only=True).
        torch.save(state.server, out / SERVER_STATE)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _logged_round(grid: Grid, method: Method, cfg: RunConfig, run: FlowerRun, roster: Roster, state: RunState,
                  rnd: int, out: Path | None) -> dict:
    """Let (re)connected nodes in, run the round, append it to rounds.jsonl with its wall time."""
    t0 = time.perf_counter()
    n = method.ctx.data.n_clients
    joined = roster.rejoin(grid, n, run.deploy.rejoin_wait, run.deploy.round_timeout) if rnd else []
    record = {**_round(grid, method, cfg, run, roster, state, rnd), "joined": joined}
    _append(out, "rounds.jsonl", {**record, "seconds": round(time.perf_counter() - t0, 3)})
    return record


def _round(grid: Grid, method: Method, cfg: RunConfig, run: FlowerRun, roster: Roster, state: RunState, rnd: int) -> dict:
    sampled = sample_clients(method, cfg, rnd)
    down = method.broadcast(state.server, rnd)
    content = lambda: RecordDict({"down": to_record(down), "config": ConfigRecord({"round": rnd})})
    targets = [k for k in sampled if k in roster.node_of]
    msgs = [Message(content(), dst_node_id=roster.node_of[k], message_type="train", group_id=str(rnd + 1)) for k in targets]
    replies = {}
    for reply in grid.send_and_receive(msgs, timeout=run.deploy.round_timeout):
        if not reply.has_error():
            replies[int(reply.content["client"]["client"])] = reply
    clients = sorted(replies)  # the in-process engine stacks clients in id order
    dropped = sorted(set(sampled) - set(clients))
    for k in dropped:
        roster.drop(k)
    need = min(run.deploy.min_clients, len(sampled))
    if len(clients) < need:
        raise TooFewClientsError(
            f"round {rnd + 1}: only {len(clients)} of {len(sampled)} sampled clients answered within deploy.round_timeout="
            f"{run.deploy.round_timeout:g}s (clients {dropped} dropped) and deploy.min_clients is {run.deploy.min_clients}; "
            "restart their SuperNodes, or lower deploy.min_clients to continue without them"
        )
    if dropped:
        log.warning("round %d: clients %s dropped; continuing with %s", rnd + 1, dropped, clients)
    if clients:
        _apply(method, state, rnd, clients, down, [replies[k] for k in clients])
    return {"round": rnd + 1, "sampled": sampled, "clients": clients, "dropped": dropped}


def _apply(method: Method, state: RunState, rnd: int, clients: list[int], down, replies: list[Message]) -> None:
    ups = [from_record(r.content["up"]) for r in replies]
    stacked = {n: torch.cat([u[n] for u in ups]) for n in ups[0]}
    weights = torch.cat([from_record(r.content["weight"])["w"] for r in replies])
    settle(method, state, rnd, clients, down, LocalResult({}, stacked, weights))


def _evaluate(grid: Grid, method: Method, run: FlowerRun, roster: Roster, state: RunState) -> dict:
    """Every connected client scores its local test rows; the server scores the global test split."""
    record = to_record(state.server)
    msgs = [Message(RecordDict({"server": record}), dst_node_id=node, message_type="evaluate")
            for node in roster.node_of.values()]
    acc = {}
    for reply in grid.send_and_receive(msgs, timeout=run.deploy.round_timeout):
        if not reply.has_error():
            m = reply.content["metrics"]
            acc[int(m["client"])] = 100.0 * int(m["hits"]) / max(1, int(m["n"]))
    per_client = np.array([acc[k] for k in sorted(acc)])
    out = {"accuracy": float(per_client.mean()) if len(acc) else float("nan"),
           "per_client": [round(float(a), 4) for a in per_client], "evaluated": sorted(acc)}
    d = method.ctx.data
    if method.has_global_model:
        glob = method.global_logits(state.server, d.x_test)
        out["global_accuracy"] = 100.0 * float((glob.argmax(1) == d.y_test).float().mean())
    return out


def _append(out: Path | None, name: str, line: dict) -> None:
    if out is not None:
        with open(out / name, "a") as fh:
            fh.write(json.dumps(line) + "\n")
