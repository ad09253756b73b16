"""The ClientApp: any registered method's client step, run on the client's own shard.

A node finds its shard in its node config (``--node-config "shard='/data/client-003'"``) or, in
simulation, at ``<shard-dir>/client-<partition-id>``. Its personal state (personal heads,
prototypes, pseudo-labels) lives in the node's Flower context between rounds; the method object
itself holds no round-to-round state, so it is rebuilt whenever a process starts.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedcache.errors import ConfigError
from fedcache.federate.clients import ClientStates
from fedcache.federate.local import recording_losses
from fedcache.federate.methods import METHODS, LocalResult, Method
from fedcache.flower.config import FlowerRun, build_method
from fedcache.flower.protocol import STATE, from_record, to_record
from fedcache.flower.shard import ShardInfo, client_dir, load_client

app = ClientApp()


def shard_path(context: Context, run: FlowerRun) -> Path:
    node = context.node_config
    if "shard" in node:
        return Path(str(node["shard"]))
    if run.deploy.shard_dir and "partition-id" in node:
        return client_dir(Path(run.deploy.shard_dir), int(node["partition-id"]))
    raise ConfigError("this SuperNode has no shard: start it with --node-config \"shard='/path/to/client-NNN'\" "
                      "(the directory `fedcache shard` wrote for this client)")


@lru_cache(maxsize=64)  # a simulation process serves many clients; each loads its shard once
def _client(path: str, run_json: str) -> tuple[Method, ShardInfo]:
    run = FlowerRun.from_config(json.loads(run_json))
    data, info = load_client(path, views=getattr(METHODS.get(run.method.name), "uses_views", False))
    return build_method(run, data), info


def _setup(context: Context) -> tuple[Method, ShardInfo]:
    run = FlowerRun.from_config(dict(context.run_config))
    return _client(str(shard_path(context, run)), json.dumps(run.to_config(), sort_keys=True))


def _state(method: Method, info: ShardInfo, context: Context) -> dict[str, torch.Tensor]:
    """This client's personal state: from the context, or the in-process engine's initial state of client k."""
    if STATE in context.state:
        return from_record(context.state[STATE])
    return ClientStates.of(method, info.n_clients).take([info.client])


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """Which client this node is, so the server can sample by client id as the in-process engine does."""
    _, info = _setup(context)
    return Message(RecordDict({"client": claim(info)}), reply_to=msg)


def claim(info: ShardInfo) -> ConfigRecord:
    """Which client this node's shard is, said in every reply: a shard directory replaced during the run (a
    process the node starts for a message loads it again) would otherwise train another client's rows unseen."""
    return ConfigRecord({"client": info.client, "partition-id": info.partition_id, "shards": info.sharding})


@app.train()
def train(msg: Message, context: Context) -> Message:
    method, info = _setup(context)
    rnd = int(msg.content["config"]["round"])
    down = from_record(msg.content["down"])
    with recording_losses() as losses:
        result = method.local_update(rnd, [info.client], down, _state(method, info, context))
    context.state[STATE] = to_record(result.states)
    return Message(RecordDict({**train_reply(result, losses), "client": claim(info)}), reply_to=msg)


def train_reply(result: LocalResult, losses: list[torch.Tensor] = ()) -> RecordDict:
    """What a client sends after its local update: uploads, weight and its mean loss of each local-training
    call (for the run's train_loss), arrays only. The server knows which client a node serves (it asked in
    ``identify``); the ``claim`` the ClientApp adds is only checked against it."""
    loss = torch.cat(list(losses)).float() if losses else torch.zeros(0)
    return RecordDict({"up": to_record(result.uploads), "weight": to_record({"w": result.weights}),
                       "loss": to_record({"loss": loss})})


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy on this client's local test rows, as the in-process engine scores client k."""
    method, info = _setup(context)
    server = from_record(msg.content["server"])
    data, k = method.ctx.data, info.client
    rows = torch.from_numpy(data.client_test[k]).long()  # int32 on the host; long indexes on every device
    # A shard's test rows are all its client's: the split itself, which a method that re-reads images knows by name.
    whole = torch.equal(rows, torch.arange(len(data.x_test)))
    x, y = (data.x_test, data.y_test) if whole else (data.x_test[rows], data.y_test[rows])
    with torch.no_grad():
        if method.personalized:
            logits = method.client_logits(server, _state(method, info, context), [k], x.unsqueeze(0))[0]
        else:
            logits = method.global_logits(server, x)
    hits = int((logits.argmax(-1) == y).sum())
    metrics = MetricRecord({"hits": hits, "n": len(rows)})
    return Message(RecordDict({"metrics": metrics, "client": claim(info)}), reply_to=msg)
