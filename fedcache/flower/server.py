"""The ServerApp: any registered method's server step, driving clients over Flower messages.

It follows ``federate/loop.py`` round for round (same client sampling, same ``broadcast`` /
``aggregate`` calls, uploads stacked in client order, same byte counting and summary), so a run
gives the in-process engine's numbers. What the network adds: clients are found by asking each
node which client it is, and every later reply is attributed by its node id; a client that does not
answer within ``round-timeout``, or whose reply fails the checks of ``replies.py`` (wrong names,
shapes or dtypes, NaN, a weight beyond its row count), is dropped from the round (recorded in
``rounds.jsonl`` with the reason); a round with fewer usable replies than ``min-clients`` fails with
a FedcacheError; a node that (re)connects is asked who it is and rejoins from the next round.
Where the server reads and writes comes from ``ServerPaths`` (the SuperLink's environment), never
from the run config.
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
from fedcache.flower.config import SERVER_ENV, FlowerRun, ServerPaths, build_method
from fedcache.flower.protocol import to_record
from fedcache.flower.replies import (Accepted, BadReply, accept_eval_replies, accept_train_replies, aggregate_alone,
                                     claimed_client, expected_reply)
from fedcache.flower.shard import ShardInfo, load_server
from fedcache.heads import Params

log = logging.getLogger(__name__)

app = ServerApp()
SERVER_STATE = "server_state.pt"


class TooFewClientsError(FedcacheError, RuntimeError):
    """Fewer clients answered than the run's min-clients."""


@dataclass
class Roster:
    """Which node serves which client. A node says which client it serves once, when it connects; from
    then on every reply is attributed by its node id, never by what the reply says. A claim is refused
    when the client is out of range, the node's shard is of another partition, or another connected
    node already serves it; refused nodes and nodes that failed to answer are not asked again (a node
    refused for a served client is, once that client's node is dropped)."""

    n: int  # the federation's clients: 0..n-1
    partition_id: str  # the partition of the server's shard; every node's shard must be of it
    node_of: dict[int, int] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    refused: list[dict] = field(default_factory=list)  # nodes refused, with why (for the summary)
    contested: dict[int, int] = field(default_factory=dict)  # refused node -> the served client it claimed

    @property
    def client_of(self) -> dict[int, int]:
        return {node: k for k, node in self.node_of.items()}

    def refresh(self, grid: Grid, timeout: float) -> list[int]:
        """Ask new nodes who they are; returns the clients that (re)joined."""
        connected = set(grid.get_node_ids())
        known = set(self.node_of.values()) | self.dead
        new = sorted(connected - known)
        if not new:
            return []
        msgs = [Message(RecordDict({"q": ConfigRecord({"who": 1})}), dst_node_id=x, message_type="query") for x in new]
        return self.admit(grid.send_and_receive(msgs, timeout=timeout), new, connected)

    def admit(self, replies, asked: list[int], connected: set[int]) -> list[int]:
        """Bind each asked node that answered to the client it claims, if the claim stands."""
        joined = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in asked or node in self.node_of.values() or reply.has_error():
                continue
            try:
                k = claimed_client(reply.content, self.n, self.partition_id)
            except BadReply as e:
                self._refuse(node, str(e))
                continue
            old = self.node_of.get(k)
            if old is not None and old in connected:
                self._refuse(node, f"claims client {k}, which connected node {old} serves")
                self.contested[node] = k
                continue
            if old is not None:
                self.dead.add(old)  # the client's node was restarted: the old node id is gone
            self.node_of[k] = node
            joined.append(k)
        self.dead.update(set(asked) - set(self.node_of.values()))  # silent, failing or refused nodes
        return sorted(joined)

    def _refuse(self, node: int, reason: str) -> None:
        log.warning("node %d refused: %s", node, reason)
        self.refused.append({"node": node, "reason": reason})

    def rejoin(self, grid: Grid, wait: float, timeout: float) -> list[int]:
        """Refresh, then keep refreshing for up to ``wait`` seconds while some client has no node."""
        deadline = time.monotonic() + wait
        joined = self.refresh(grid, timeout)
        while len(self.node_of) < self.n and time.monotonic() < deadline:
            time.sleep(0.5)
            joined += self.refresh(grid, timeout)
        return sorted(joined)

    def drop(self, k: int) -> None:
        node = self.node_of.pop(k, None)
        if node is not None:
            self.dead.add(node)
        # A node refused for claiming k may be its restarted SuperNode: ask it again.
        for other in [x for x, c in self.contested.items() if c == k]:
            del self.contested[other]
            self.dead.discard(other)


def wait_for_clients(grid: Grid, roster: Roster, run: FlowerRun) -> None:
    n, deadline = roster.n, time.monotonic() + run.deploy.connect_timeout
    while len(roster.node_of) < n and time.monotonic() < deadline:
        roster.refresh(grid, run.deploy.round_timeout)
        if len(roster.node_of) < n:
            time.sleep(0.5)
    missing = sorted(set(range(n)) - set(roster.node_of))
    if missing:
        log.warning("clients %s did not connect within %.0fs", missing, run.deploy.connect_timeout)
    if len(roster.node_of) < min(run.deploy.min_clients, n):
        raise TooFewClientsError(
            f"only {len(roster.node_of)} of {n} clients connected within deploy.connect_timeout={run.deploy.connect_timeout:g}s "
            f"(deploy.min_clients={run.deploy.min_clients}); missing clients {missing}: start one SuperNode per client with "
            "--node-config \"shard='<shards>/client-NNN'\""
        )


@app.main()
def main(grid: Grid, context: Context) -> None:
    run = FlowerRun.from_config(dict(context.run_config))
    serve(grid, run, ServerPaths.from_env(context.run_id))


@dataclass
class Federation:
    """One run on the server: what it knows (method, shard facts, paths) and where it stands."""

    grid: Grid
    method: Method
    run: FlowerRun
    info: ShardInfo
    out: Path | None
    cfg: RunConfig = field(init=False)
    state: RunState = field(init=False)
    roster: Roster = field(init=False)

    def __post_init__(self) -> None:
        self.roster = Roster(self.info.n_clients, self.info.partition_id)
        s = self.run.schedule
        self.cfg = RunConfig(s.rounds, s.fraction, s.eval_every, True, None, False)
        self.state = RunState(0, self.method.init_server(), {})


def serve(grid: Grid, run: FlowerRun, paths: ServerPaths) -> dict:
    """The whole run; returns the summary (as ``fedcache train`` writes it)."""
    if paths.server_shard is None:
        raise FedcacheError(f"the server has no shard: set {SERVER_ENV['deploy.server_shard']} to the server/ directory "
                            "`fedcache shard` wrote, in the environment flower-superlink starts in")
    if paths.out is None:
        log.warning("%s is not set: this run's metrics and summary are written nowhere", SERVER_ENV["deploy.out"])
    data, info = load_server(paths.server_shard)
    fed = Federation(grid, build_method(run, data), run, info, paths.out)
    if fed.out is not None:
        fed.out.mkdir(parents=True, exist_ok=True)
    wait_for_clients(grid, fed.roster, run)
    history, dropped, rejected = [], {}, {}
    t0 = time.perf_counter()
    for rnd in range(run.schedule.rounds):
        record = _logged_round(fed, rnd)
        if record["dropped"]:
            dropped[rnd + 1] = record["dropped"]
        if record["rejected"]:
            rejected[rnd + 1] = record["rejected"]
        if (rnd + 1) % run.schedule.eval_every == 0 or rnd + 1 == run.schedule.rounds:
            line = {"round": rnd + 1, **_evaluate(fed), "bytes_up": fed.state.bytes_up, "bytes_down": fed.state.bytes_down}
            history.append(line)
            _append(fed.out, "metrics.jsonl", line)
        fed.state.rnd, fed.state.seconds = rnd + 1, time.perf_counter() - t0
    summary = run_summary(fed.method, fed.state, history)
    summary.update(engine="flower", partition_id=info.partition_id, dropped=dropped, rejected=rejected,
                   refused_nodes=fed.roster.refused)
    if fed.out is not None:
        # The final server state, for comparing engines: tensors only (read back with weights_only=True).
        torch.save(fed.state.server, fed.out / SERVER_STATE)
        (fed.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _logged_round(fed: Federation, rnd: int) -> dict:
    """Let (re)connected nodes in, run the round, append it to rounds.jsonl with its wall time."""
    t0 = time.perf_counter()
    joined = fed.roster.rejoin(fed.grid, fed.run.deploy.rejoin_wait, fed.run.deploy.round_timeout) if rnd else []
    record = {**_round(fed, rnd), "joined": joined}
    _append(fed.out, "rounds.jsonl", {**record, "seconds": round(time.perf_counter() - t0, 3)})
    return record


def _round(fed: Federation, rnd: int) -> dict:
    method, roster = fed.method, fed.roster
    sampled = sample_clients(method, fed.cfg, rnd)
    down = method.broadcast(fed.state.server, rnd)
    content = lambda: RecordDict({"down": to_record(down), "config": ConfigRecord({"round": rnd})})
    asked = {roster.node_of[k]: k for k in sampled if k in roster.node_of}
    msgs = [Message(content(), dst_node_id=node, message_type="train", group_id=str(rnd + 1)) for node in asked]
    replies = fed.grid.send_and_receive(msgs, timeout=fed.run.deploy.round_timeout)
    got = accept_train_replies(replies, asked, expected_reply(method, rnd, down), fed.info.client_train_sizes,
                               aggregate_alone(method, fed.state.server, rnd))
    for k in sorted(set(sampled) - set(got.replies) - set(got.rejected)):
        roster.drop(k)  # no answer: its node is gone (a restarted one is asked who it is)
    return settle_round(fed, rnd, sampled, down, got)


def settle_round(fed: Federation, rnd: int, sampled: list[int], down: Params, got: Accepted) -> dict:
    """Aggregate the accepted replies, or stop if fewer than min-clients are left; returns the round record."""
    clients = sorted(got.replies)  # the in-process engine stacks clients in id order
    dropped = sorted(set(sampled) - set(clients))
    rejected = {str(k): why for k, why in got.rejected.items()}
    refused = "; ".join(f"client {k}: {why}" for k, why in got.rejected.items()) or "none"
    for k, why in got.rejected.items():
        log.warning("round %d: client %d's reply refused: %s", rnd + 1, k, why)
    need = min(fed.run.deploy.min_clients, len(sampled))
    if len(clients) < need:
        raise TooFewClientsError(
            f"round {rnd + 1}: only {len(clients)} of {len(sampled)} sampled clients gave a usable reply within "
            f"deploy.round_timeout={fed.run.deploy.round_timeout:g}s (clients {dropped} dropped; refused replies: {refused}) "
            f"and deploy.min_clients is {fed.run.deploy.min_clients}; restart their SuperNodes, or lower deploy.min_clients to continue "
            "without them"
        )
    if dropped:
        log.warning("round %d: clients %s dropped; continuing with %s", rnd + 1, dropped, clients)
    if clients:
        ups = [got.replies[k][0] for k in clients]
        stacked = {n: torch.cat([u[n] for u in ups]) for n in ups[0]}
        weights = torch.cat([got.replies[k][1] for k in clients])
        settle(fed.method, fed.state, rnd, clients, down, LocalResult({}, stacked, weights))
    return {"round": rnd + 1, "sampled": sampled, "clients": clients, "dropped": dropped, "rejected": rejected}


def _evaluate(fed: Federation) -> dict:
    """Every connected client scores its local test rows; the server scores the global test split."""
    record = to_record(fed.state.server)
    client_of = fed.roster.client_of
    msgs = [Message(RecordDict({"server": record}), dst_node_id=node, message_type="evaluate") for node in client_of]
    replies = fed.grid.send_and_receive(msgs, timeout=fed.run.deploy.round_timeout)
    acc, rejected = accept_eval_replies(replies, client_of, fed.info.client_test_sizes)
    for k, why in rejected.items():
        log.warning("client %d's evaluation refused: %s", k, why)
    per_client = np.array([acc[k] for k in sorted(acc)])
    out = {"accuracy": float(per_client.mean()) if len(acc) else float("nan"),
           "per_client": [round(float(a), 4) for a in per_client], "evaluated": sorted(acc)}
    if rejected:
        out["eval_rejected"] = {str(k): why for k, why in rejected.items()}
    method, d = fed.method, fed.method.ctx.data
    if method.has_global_model:
        glob = method.global_logits(fed.state.server, d.x_test)
        out["global_accuracy"] = 100.0 * float((glob.argmax(1) == d.y_test).float().mean())
    return out


def _append(out: Path | None, name: str, line: dict) -> None:
    if out is not None:
        with open(out / name, "a") as fh:
            fh.write(json.dumps(line) + "\n")
