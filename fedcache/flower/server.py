"""The ServerApp: any registered method's server step, driving clients over Flower messages.

The round driver (``federate/driver.py``) runs the rounds as for the in-process engine (same client
sampling, ``broadcast`` / ``aggregate`` calls, byte counting, metrics, checkpoints, resumption and
summary), so a run gives the in-process engine's numbers; ``FlowerEngine`` is the engine that moves the
payloads. What the network adds: clients are found by asking each node which client it is, and every
later reply is attributed by its node id; a client that does not answer within ``round-timeout``, or
whose reply fails the checks of ``replies.py`` (wrong names, shapes or dtypes, NaN, a weight beyond its
row count), is dropped from the round (recorded in ``rounds.jsonl`` with the reason); a round with fewer
usable replies than ``min-clients`` fails with a FedcacheError; a node that (re)connects is asked who
it is and rejoins from the next round. Where the server reads and writes comes from ``ServerPaths``
(the SuperLink's environment), never from the run config; ``deploy.resume_run`` names only the Flower
run id whose directory under it a run continues.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedcache import disk
from fedcache.errors import ConfigError, FedcacheError
from fedcache.federate import driver
from fedcache.federate.driver import Engine, Round, Run, RunState
from fedcache.federate.inprocess import OnRound, for_one_run
from fedcache.federate.rundir import CONFIG, RunDir
from fedcache.federate.methods import LocalResult, Method
from fedcache.federate.methods.base import tensor_size
from fedcache.flower.config import (SERVER_ENV, SUBMIT_ANEW, FlowerRun, ServerPaths, build_method, deployed,
                                     refuse_resume_with_client_state)
from fedcache.flower.protocol import to_record
from fedcache.flower.replies import (CLIENTAPP_FAILED, OTHER_SHARD, UNSAID, Accepted, BadReply, accept_eval_replies,
                                     accept_train_replies, aggregate_alone, claimed_client, expected_reply)
from fedcache.flower.shard import ShardInfo, load_server
from fedcache.heads import Params
from fedcache.ownership import Holder, hold
from fedcache.paths import CHECKPOINT, SUMMARY

log = logging.getLogger(__name__)

app = ServerApp()
SERVER_STATE = "server_state.pt"
ROUNDS = "rounds.jsonl"  # per round: sampled, accepted, dropped and rejected clients, who rejoined, wall time


class TooFewClientsError(FedcacheError, RuntimeError):
    """Fewer clients answered than the run's min-clients."""


@dataclass
class Roster:
    """Which node serves which client. A node says which client it serves when it connects; from then on
    every reply is attributed by its node id, never by what the reply says (a reply naming another client than
    its node's is refused: ``replies.serves``). A claim is refused
    when the client is out of range, the node's shard is of another partition, or another connected
    node already serves it; refused nodes and nodes that failed to answer are not asked again while their
    SuperNode stays as it was (a node refused for a served client is, once that client's node is dropped). One
    that left the SuperLink, or came online again since (``last_activated_at``), is asked as a new node: with
    SuperNode authentication a restarted SuperNode keeps its node id, and was never taken back."""

    n: int  # the federation's clients: 0..n-1
    partition_id: str  # the partition of the server's shard; every node's shard must be of it
    sharding: str | None = None  # the server's shards' mark (ShardInfo.sharding); every node's must be the same
    node_of: dict[int, int] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    # serving or dead node -> when its SuperNode had come online as it was admitted or taken for gone
    came_online: dict[int, str] = field(default_factory=dict)
    online: dict[int, str] = field(default_factory=dict)  # connected node -> when it came online, as last seen
    refused: list[dict] = field(default_factory=list)  # nodes refused, with why (for the summary)
    contested: dict[int, int] = field(default_factory=dict)  # refused node -> the served client it claimed

    @property
    def client_of(self) -> dict[int, int]:
        return {node: k for k, node in self.node_of.items()}

    def claimed(self, content: RecordDict) -> int:
        """The client a node's message says it serves (BadReply unless a client of this federation, on a shard of
        the server's partition and sharding)."""
        return claimed_client(content, self.n, self.partition_id, self.sharding)

    def refresh(self, grid: Grid, timeout: float) -> list[int]:
        """Ask new nodes who they are; returns the clients that (re)joined."""
        self._seen(_online(grid))
        connected = set(self.online)
        known = set(self.node_of.values()) | self.dead
        new = sorted(connected - known)
        if not new:
            return []
        # Each message lives as long as the server waits for it: one left queued for a lost node's id (kept by a
        # SuperNode started again with its key) was the first its new process ran.
        msgs = [Message(RecordDict({"q": ConfigRecord({"who": 1})}), dst_node_id=x, message_type="query", ttl=timeout)
                for x in new]
        return self.admit(grid.send_and_receive(msgs, timeout=timeout), new, connected)

    def admit(self, replies, asked: list[int], connected: set[int]) -> list[int]:
        """Bind each asked node that answered to the client it claims, if the claim stands."""
        joined = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if node not in asked or node in self.node_of.values():
                continue
            if reply.has_error():  # said here: else the operator sees only "missing clients" after connect_timeout
                self._refuse(node, f"{CLIENTAPP_FAILED} {reply.error.reason}")
                continue
            try:
                k = self.claimed(reply.content)
            except BadReply as e:
                self._refuse(node, str(e))
                continue
            old = self.node_of.get(k)
            if old is not None and old in connected:
                self._refuse(node, f"claims client {k}, which connected node {old} serves")
                self.contested[node] = k
                continue
            if old is not None:
                self._bury(old)  # the client's node was restarted: the old node id is gone
            self.node_of[k] = node
            self.came_online[node] = self.online.get(node, "")
            joined.append(k)
        for node in set(asked) - set(self.node_of.values()):  # silent, failing or refused nodes
            self._bury(node)
        return sorted(joined)

    def _bury(self, node: int) -> None:
        self.dead.add(node)
        self.came_online[node] = self.online.get(node, "")

    def _seen(self, online: dict[int, str]) -> None:
        """The nodes connected now. A dead one that left, or came online again, is forgotten (asked when seen); so
        is a serving one that came online again: started again between rounds under its id, its client's state
        is a fresh context's, which the round it rejoins says ("joined")."""
        def again(x: int) -> bool:
            return x in online and online[x] != self.came_online.get(x, online[x])

        for node in [x for x in self.dead if x not in online or again(x)]:
            self.dead.discard(node)
            self.came_online.pop(node, None)
        for k, node in [(k, x) for k, x in self.node_of.items() if again(x)]:
            del self.node_of[k]
            self.came_online.pop(node, None)
        self.online = online

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
            self._bury(node)
        # A node refused for claiming k may be its restarted SuperNode: ask it again.
        for other in [x for x, c in self.contested.items() if c == k]:
            del self.contested[other]
            self.dead.discard(other)
            self.came_online.pop(other, None)


def _online(grid: Grid) -> dict[int, str]:
    """The nodes connected to the SuperLink, each with when its SuperNode last came online ("" where the grid does
    not say: a simulation's)."""
    return {n.node_id: getattr(n, "last_activated_at", "") or "" for n in grid.get_nodes()}


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
        refused = "".join(f"; node {r['node']} refused: {r['reason']}" for r in roster.refused)
        raise TooFewClientsError(
            f"only {len(roster.node_of)} of {n} clients connected within deploy.connect_timeout={run.deploy.connect_timeout:g}s "
            f"(deploy.min_clients={run.deploy.min_clients}); missing clients {missing}: start one SuperNode per client with "
            f"--node-config \"shard='<shards>/client-NNN'\"{refused}"
        )


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        run = FlowerRun.from_config(dict(context.run_config))
        resume = run.deploy.resume_run
        paths = ServerPaths.from_env(int(resume) if resume else context.run_id).checked()
        if paths.out is None and not resume:  # said of a deployment only: a simulation without --out is asked so
            log.warning("%s is not set: this run's metrics and summary are written nowhere", SERVER_ENV["deploy.out"])
        serve(grid, run, paths, resume=bool(resume), resume_as=f"deploy.resume_run='{resume}'",
              run_id=context.run_id)
    except FedcacheError as err:
        # Flower (1.41) logs whatever a ServerApp raises with its whole traceback into the run's log stream, marks
        # the run finished:failed, and `flwr run --stream` exits 0 all the same; no public API changes that. So the
        # reason comes first, as one line (stderr is streamed too), and the error is raised again from here, so
        # that Flower's traceback is its own few frames ending in the same line, not fedcache's call stack.
        log.error("fedcache: the run stopped: %s", err)
        raise err.with_traceback(None) from None


# A deployment scores the clients whose nodes answer: per_client_accuracy (and std_accuracy) are theirs.
EVALUATED = ("the clients the last evaluation scored, in the order of per_client_accuracy, over which std_accuracy "
             "is taken: those whose nodes answered, which may be fewer than the run's")


@dataclass
class FlowerEngine(Engine):
    """The Flower engine on the server: moves the round's payloads over Flower messages to the nodes
    serving the sampled clients and back; the round driver does the rest. One federation: its run."""

    grid: Grid
    method: Method
    run: FlowerRun
    info: ShardInfo
    out: RunDir | None
    roster: Roster = field(init=False)
    dropped: dict[str, list[int]] = field(default_factory=dict)  # round -> clients dropped from it
    rejected: dict[str, dict[str, str]] = field(default_factory=dict)  # round -> client -> why its reply was refused
    # The server state sent for evaluation, over every message: real traffic that the run's bytes_down (what
    # training downloads, the same on every engine) does not count.
    evaluation_bytes_down: int = 0
    resume_as: str = "--resume"  # the option that resumed the run, for advice (serve's)

    def __post_init__(self) -> None:
        self.roster = Roster(self.info.n_clients, self.info.partition_id, self.info.sharding)

    def start(self, states: list[RunState]) -> None:
        if self.out is not None and states[0].rnd:
            self.out.history(states[0].rnd, ROUNDS)  # rounds after the checkpoint are run again
        wait_for_clients(self.grid, self.roster, self.run)

    def round(self, states: list[RunState], rnd: int, picks: list[list[int]], downs: list[Params]) -> list[Round]:
        """Let (re)connected nodes in, run the round, append it to rounds.jsonl with its wall time."""
        (state,), (clients,), (down,) = states, picks, downs
        t0 = time.perf_counter()
        joined = self.roster.rejoin(self.grid, self.run.deploy.rejoin_wait, self.run.deploy.round_timeout) if rnd else []
        record, got = accepted_round(self, rnd, clients, self.exchange(state, rnd, clients, down))
        if record["dropped"]:
            self.dropped[str(rnd + 1)] = record["dropped"]
        if record["rejected"]:
            self.rejected[str(rnd + 1)] = record["rejected"]
        if self.out is not None:
            self.out.append({**record, "joined": joined, "seconds": round(time.perf_counter() - t0, 3)}, ROUNDS)
        return [got]

    def exchange(self, state: RunState, rnd: int, sampled: list[int], down: Params) -> Accepted:
        """Send ``down`` to the sampled clients' nodes; the replies that pass every check."""
        method, roster = self.method, self.roster
        content = lambda: RecordDict({"down": to_record(down), "config": ConfigRecord({"round": rnd})})
        asked = {roster.node_of[k]: k for k in sampled if k in roster.node_of}
        wait = self.run.deploy.round_timeout
        msgs = [Message(content(), dst_node_id=node, message_type="train", group_id=str(rnd + 1), ttl=wait)
                for node in asked]
        replies = self.grid.send_and_receive(msgs, timeout=wait)
        got = accept_train_replies(replies, asked, roster.claimed, expected_reply(method, rnd, down),
                                   self.info.client_train_sizes, aggregate_alone(method, state.server, rnd))
        for k in sorted(set(sampled) - set(got.replies) - set(got.rejected)):
            roster.drop(k)  # no answer: its node is gone (a restarted one is asked who it is)
        return got

    def evaluate(self, i: int, state: RunState, glob: torch.Tensor | None) -> dict:
        """Every connected client scores its local test rows (the server scores the global split)."""
        record = to_record(state.server)
        client_of = self.roster.client_of
        wait = self.run.deploy.round_timeout
        msgs = [Message(RecordDict({"server": record}), dst_node_id=node, message_type="evaluate", ttl=wait)
                for node in client_of]
        self.evaluation_bytes_down += len(msgs) * tensor_size(state.server)[1]
        replies = self.grid.send_and_receive(msgs, timeout=wait)
        acc, rejected = accept_eval_replies(replies, client_of, self.roster.claimed, self.info.client_test_sizes)
        for k, why in rejected.items():
            log.warning("client %d's evaluation refused: %s", k, why)
        per_client = np.array([acc[k] for k in sorted(acc)])
        out = {"accuracy": float(per_client.mean()) if len(acc) else float("nan"),
               "per_client": [round(float(a), 4) for a in per_client], "evaluated": sorted(acc)}
        if rejected:
            out["eval_rejected"] = {str(k): why for k, why in rejected.items()}
        return out

    def facts(self, i: int) -> dict:
        return {"engine": "flower", "partition_id": self.info.partition_id, "dropped": self.dropped,
                "rejected": self.rejected, "refused_nodes": self.roster.refused,
                "evaluation_bytes_down": self.evaluation_bytes_down, "definitions": {"evaluated_clients": EVALUATED}}

    def start_again(self) -> str:
        return _start_again(self.out.path, self.resume_as)  # a run resumed has its directory

    def state_dict(self) -> dict:
        return {"dropped": self.dropped, "rejected": self.rejected, "refused_nodes": self.roster.refused,
                "evaluation_bytes_down": self.evaluation_bytes_down}

    def load_state_dict(self, saved: dict) -> None:
        self.dropped, self.rejected = dict(saved.get("dropped", {})), dict(saved.get("rejected", {}))
        self.roster.refused = list(saved.get("refused_nodes", []))
        self.evaluation_bytes_down = int(saved.get("evaluation_bytes_down", 0))


def accepted_round(fed: FlowerEngine, rnd: int, sampled: list[int], got: Accepted) -> tuple[dict, Round]:
    """The round record and the accepted uploads (stacked in client order, as the in-process engine
    stacks them), or a TooFewClientsError if fewer than min-clients are left."""
    clients = sorted(got.replies)
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
            f"and deploy.min_clients is {fed.run.deploy.min_clients}; {_repair(dropped, got.rejected)}, or lower "
            "deploy.min_clients to continue without them"
        )
    if dropped:
        log.warning("round %d: clients %s dropped; continuing with %s", rnd + 1, dropped, clients)
    record = {"round": rnd + 1, "sampled": sampled, "clients": clients, "dropped": dropped, "rejected": rejected}
    if not clients:
        return record, Round([], LocalResult({}, {}, torch.zeros(0)))
    ups = [got.replies[k][0] for k in clients]
    stacked = {n: torch.cat([u[n] for u in ups]) for n in ups[0]}
    losses = [got.losses[k] for k in clients if len(got.losses.get(k, ()))]
    return record, Round(clients, LocalResult({}, stacked, torch.cat([got.replies[k][1] for k in clients])), losses)


# Refused replies a restart does not mend, by how their reason starts: a failing ClientApp starts again as it was
# (missing weights, another data_root); a replaced shard directory is loaded again by the next message's process.
_MEND = {CLIENTAPP_FAILED: "fix what their ClientApps report", OTHER_SHARD: "give their nodes their own shard directories back",
         UNSAID: "install the server's fedcache on their nodes"}


def _repair(dropped: list[int], rejected: dict[int, str]) -> str:
    """What brings the clients of a round back: a silent node, or one whose replies were malformed, is restarted;
    the others are mended as their reasons say (``_MEND``)."""
    mends = {k: next((m for start, m in _MEND.items() if why.startswith(start)), None) for k, why in rejected.items()}
    silent = [k for k in dropped if k not in rejected]
    said = ["restart their SuperNodes"] if silent or None in mends.values() else []
    return " and ".join(said + [m for m in _MEND.values() if m in mends.values()])


def serve(grid: Grid, run: FlowerRun, paths: ServerPaths, resume: bool = False, keep_checkpoints: str = "last",
          resume_as: str = "--resume", on_round: OnRound | None = None, run_id: int = 0) -> dict:
    """The whole run (continued from the checkpoint in ``paths.out`` with ``resume``); returns the
    summary (as ``fedcache train`` writes it). ``resume_as`` names the option that asked to resume, in messages:
    a deployment's submitter gave ``deploy.resume_run``, not ``--resume``. ``on_round``: called as the in-process
    engine calls it (``fedcache.train``'s). ``run_id``: a deployment's Flower run id (0 for the simulation, whose user
    stops it with Ctrl-C and whose --out a re-run starts again): a ServerApp refused its directory is told to `flwr
    stop` this run, a resume of a run that had finished trains nothing (``_nothing_to_train``), and a run refused
    before its first round ended leaves no directory (``_kept_once_started``)."""
    _check_paths(paths, resume, resume_as)
    with _owned(paths.out, resume_as, run_id):
        data, info = load_server(paths.server_shard)
        method = build_method(run, data)
        if paths.out is not None:
            _record_config(paths.out, run, info, method, resume, resume_as)
        out = RunDir(paths.out, keep_checkpoints) if paths.out is not None else None
        if run_id and resume and out.finished():
            return _nothing_to_train(out, run)
        engine = FlowerEngine(grid, method, run, info, out, resume_as=resume_as)
        with _kept_once_started(out if run_id and not resume else None):
            (result,) = driver.run([Run(method, run.schedule, out)], engine, for_one_run(on_round), resume=resume)
        if paths.out is not None:
            # The final server state, for comparing engines: tensors only (read back with weights_only=True);
            # through a temporary file, as a checkpoint: a full disk leaves none rather than a part.
            buf = io.BytesIO()
            torch.save(result.server, buf)
            disk.write_atomic(paths.out / SERVER_STATE, buf.getbuffer(), "the server's final state", check=True)
        return result.summary


def _check_paths(paths: ServerPaths, resume: bool, resume_as: str) -> None:
    if paths.server_shard is None:
        raise FedcacheError(f"the server has no shard: set {SERVER_ENV['deploy.server_shard']} to the server/ directory "
                            "`fedcache shard` wrote, in the environment flower-superlink starts in")
    if paths.out is None and resume:
        raise ConfigError(f"resuming needs the run's directory: set {SERVER_ENV['deploy.out']}")
    if paths.out is not None and resume and not paths.out.exists():
        # said before the folder is held (made): as train's check_resumable, a mistyped run id most often
        raise ConfigError(f"{resume_as}: {paths.out} does not exist; {_again(resume_as)}")


def _owned(out: Path | None, resume_as: str, run_id: int):
    """The run's directory held while this ServerApp writes it: a ServerApp left running by a stopped SuperLink
    and a resumed run of the same id (deploy.resume_run) would otherwise both write it. Held as Flower run
    ``run_id``: the ServerApp refused names the run to stop, as its submitter stops runs."""
    if out is None:
        return contextlib.nullcontext()
    holder = replace(Holder.me(), flower_run=run_id) if run_id else None
    return hold(out, f"the Flower run directory {out}", advice="start the resumed run once the other ServerApp "
                "of this run has ended (a stopped SuperLink may leave its flwr-serverapp process running)",
                resumes=f"{resume_as} continues it", holder=holder)


def _nothing_to_train(out: RunDir, run: FlowerRun) -> dict:
    """A deployment's resume of a run that had finished, said as a finished grid's re-run says it: it went on in
    silence, waited for the nodes and scored the last round again. A warning: `flwr run --stream` shows no info.
    Nothing is sent or written; the run's summary."""
    log.warning("fedcache: nothing to train: the run in %s had finished all its rounds (%d), and its results are kept "
                "there; %s to train it again", out.path, run.schedule.rounds, SUBMIT_ANEW)
    return out.summary()


@contextlib.contextmanager
def _kept_once_started(out: RunDir | None):
    """A deployment's new run stopped by its error (too few clients, a round of refused replies) before its first
    round ended leaves no folder: it has no checkpoint to resume from, and no later run writes there (each has its
    own run id). Once it has a checkpoint it is kept, for deploy.resume_run; an interrupted run keeps its config.json,
    so that a resume of it says it has no checkpoint."""
    try:
        yield
    except FedcacheError:
        if out is not None and not out.has_checkpoint():
            out.clear()
            (out.path / ROUNDS).unlink(missing_ok=True)
        raise


def _record_config(out: Path, run: FlowerRun, info: ShardInfo, method: Method, resume: bool,
                   resume_as: str = "--resume") -> None:
    """config.json: what the run computes (the run sections and the shards' partition, not the
    deployment's timeouts); a resumed run must compute the same."""
    path = out / CONFIG
    if not resume:
        if path.exists():
            raise ConfigError(f"{out} already holds a run; resume it or start a new one elsewhere")
        out.mkdir(parents=True, exist_ok=True)
        disk.write_text(path, json.dumps(_computes(run, info), indent=2) + "\n", "the run's config.json")
        return
    refuse_resume_with_client_state(method, out, resume_as)
    check_resumed(out, run, info, resume_as)


def _computes(run: FlowerRun, info: ShardInfo) -> dict:
    computes = {k: v for k, v in run.to_config().items() if not k.startswith("deploy.")}
    return {"run": computes, "partition_id": info.partition_id, "shards": info.source}


def check_resumed(out: Path, run: FlowerRun, info: ShardInfo, resume_as: str = "--resume") -> None:
    """A resume of the run in ``out`` refused where it has nothing to continue from or computes otherwise (other
    settings or shards), as ``resume_as`` asked for it."""
    config, path = _computes(run, info), out / CONFIG
    again = _again(resume_as)
    if not path.exists():
        raise ConfigError(f"{resume_as}: {out} has no config.json; {again}")
    # Checked here, not by the round driver, whose message names --resume: a run stopped before its first round
    # ended has its config.json but nothing to continue from.
    if not (out / CHECKPOINT).exists():
        if (out / SUMMARY).exists():  # keep_checkpoints=none removes it once the run is done
            raise ConfigError(f"{resume_as}: the run in {out} finished (its {SUMMARY} is there) and kept no checkpoint; "
                              "nothing is left to run")
        raise ConfigError(f"{resume_as}: {out} has no checkpoint (the run stopped before its first round ended); {again}")
    saved = disk.read_json(path, _start_again(out, resume_as), _not_a_run_config)
    _known_to_both(saved, config)
    if saved != json.loads(json.dumps(config)):
        differ = sorted(k for k in {**saved.get("run", {}), **config["run"]} if saved.get("run", {}).get(k) != config["run"].get(k))
        if saved.get("partition_id") != config["partition_id"]:
            differ.append("partition_id (the shards)")
        differ += _other_source(saved.get("shards"), config.get("shards"))
        raise ConfigError(f"{resume_as}: the run in {out} was made with other settings ({', '.join(differ)}); use the same "
                          "settings and shards, or start a new run")


def _known_to_both(saved: dict, config: dict) -> None:
    """What one side recorded before fedcache recorded it is unknown there, not different: a run recorded before the
    shards' source was is compared by their partition only, shards cut before their entries were by their dataset
    and backbones."""
    if "shards" not in saved:
        config.pop("shards")
    elif isinstance(saved["shards"], dict) and not (saved["shards"].get("entries") and config["shards"]["entries"]):
        saved["shards"].pop("entries", None)
        config["shards"] = {k: v for k, v in config["shards"].items() if k != "entries"}


def _again(resume_as: str) -> str:
    """What to do when the run to resume is not there to continue (no folder, no config.json, no checkpoint)."""
    if deployed(resume_as):
        return f"check the run id (`flwr run` printed it), or {SUBMIT_ANEW}"
    return f"start the run without {resume_as}"


def _start_again(out: Path, resume_as: str) -> str:
    """What to do when a resumed run's config.json is damaged: without it nothing says what the checkpoint computes."""
    if deployed(resume_as):
        return f"{SUBMIT_ANEW}, which starts it again under a new run id"
    return f"delete the folder {out} and run the same command without {resume_as}, which starts that run again"


def _not_a_run_config(value) -> str:
    """What is wrong with a Flower run's config.json read back (a hand edit), or ""."""
    ok = isinstance(value, dict) and isinstance(value.get("run", {}), dict)
    return "" if ok else 'not a JSON object with a "run" object'


def _other_source(saved: dict | None, now: dict | None) -> list[str]:
    """How the server's shards now differ from those the run was made with, beyond the partition (a re-shard of the
    same partition of another backbone, or of features extracted again), as the refusal names it."""
    if saved is None or now is None or saved == json.loads(json.dumps(now)):
        return []
    named = [f"the shards' {k} ({saved.get(k)} there, {now[k]} here)" for k in ("dataset", "backbones") if saved.get(k) != now[k]]
    return named or ["the features the shards were cut from (the store's entries)"]
