"""What the ServerApp accepts from a node. A reply is checked against what the server itself knows
before anything in it is used, because anyone holding a SuperNode can send anything:

- who a reply is from is the server's own node -> client mapping, never a client id the reply names; a reply
  saying it used another client's shard than its node's (its shard directory replaced) is refused (``serves``);
- an upload must have exactly the names, shapes and dtypes the server's own dry run of the client
  step gives (``expected_reply``), and only finite values;
- an aggregation weight is a row count: between 1 and the client's training-row count as the server's
  shard records it (0 for a client without rows), so no client can outweigh its data; per-class counts
  a method aggregates with (``Method.count_uploads``) are whole, non-negative and sum to at most it;
- the server's own aggregation, run on one client's upload alone, must not fail or turn its state
  non-finite (``aggregate_alone``);
- an evaluation reply's hits and test-row count must be whole, 0 <= hits <= n, n the client's test rows;
- the losses a client reports (for the run's train_loss, never used to train) are at most ``MAX_LOSSES``
  finite numbers.

A reply that fails is rejected with a reason (the server drops that client for the round and records
why) instead of stopping or crashing the run. Arrays are read with numpy's ``allow_pickle=False``
(Flower's ``Array.numpy``): an object array is refused, never unpickled; and only once their .npy header declares
the expected shape and dtype and the bytes they carry are that many (``declared``), as np.load allocates what a
header declares.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from numpy.lib import format as npy

from fedcache.federate.methods import LocalResult, Method
from fedcache.heads import Params


class BadReply(ValueError):
    """A node's reply that the server refuses; the message says why (it goes into rounds.jsonl)."""


@dataclass(frozen=True)
class Expected:
    """One client's train reply as the server expects it this round."""

    uploads: dict[str, tuple[tuple[int, ...], torch.dtype]]
    weight: tuple[tuple[int, ...], torch.dtype]
    counts: tuple[str, ...] = ()  # uploads that are per-class row counts


def expected_reply(method: Method, rnd: int, down: Params) -> Expected:
    """Names, shapes and dtypes of a client's upload, from the server running the client step itself for
    a client without rows (the server's data holds none); it is the same code every client runs."""
    state = {n: t[:1] for n, t in method.init_clients(1).items()}
    result = method.local_update(rnd, [0], down, state)
    uploads = {n: (tuple(t.shape), t.dtype) for n, t in result.uploads.items()}
    return Expected(uploads, (tuple(result.weights.shape), result.weights.dtype), tuple(method.count_uploads))


# ---- identity ---------------------------------------------------------------------------------
def claimed_client(content: RecordDict, n_clients: int, partition_id: str, sharding: str | None = None) -> int:
    """The client an identifying node says it serves: one of this federation's, from shards of the
    server's partition (a node started on another sharding's shard would train on other rows) and, given
    ``sharding``, of the server's own `fedcache shard` output (another backbone's or extraction's features are
    of the same partition)."""
    k = _field(content, "client", "client", ConfigRecord)
    if not _is_int(k) or not 0 <= k < n_clients:
        raise BadReply(f"claims client {k!r}, but the federation has clients 0..{n_clients - 1}")
    theirs = _field(content, "client", "partition-id", ConfigRecord)
    if theirs != partition_id:
        raise BadReply(f"serves a shard of partition {theirs!r}, but the server's shard is of {partition_id!r}: "
                       "give every SuperNode a client directory from the same `fedcache shard` output as the server's")
    if sharding is not None and (theirs := _field(content, "client", "shards", ConfigRecord)) != sharding:
        raise BadReply(f"serves a shard of the same partition cut from other features (shards {theirs!r}, the server's "
                       f"{sharding!r}: another backbone or extraction): give every SuperNode a client directory from "
                       "the same `fedcache shard` output as the server's")
    return int(k)


Claimed = Callable[[RecordDict], int]  # the client a reply says its node serves (``claimed_client``), or BadReply


UNSAID = "it does not say which client's shard it used"  # refused reasons, by which _repair advises
OTHER_SHARD = "the shard it used is not its node's client's:"


def serves(content: RecordDict, k: int, claimed: Claimed) -> None:
    """BadReply unless the reply of client ``k``'s node says it still used client ``k``'s shard: replies are the
    node's client's by the node's id, and a shard directory replaced during the run is another client's rows (a
    fresh ClientApp process loads the shard for each message)."""
    if "client" not in content:
        raise BadReply(f"{UNSAID} (its node runs an older fedcache than the server's: install the server's there)")
    try:
        said = claimed(content)
    except BadReply as e:
        raise BadReply(f"{OTHER_SHARD} {e}") from None
    if said != k:
        raise BadReply(f"{OTHER_SHARD} its node joined as client {k} but now serves client {said}'s shard (its shard "
                       f"directory was replaced during the run): give it client {k}'s directory again")


CLIENTAPP_FAILED = "its ClientApp failed:"  # a refused reply's reason, where Flower's is an error


def from_known_nodes(replies: Iterable[Any], client_of: dict[int, int]) -> tuple[dict[int, Any], list[dict], dict[int, str]]:
    """Error-free replies keyed by the client the server sent the message to (by its node id); replies from other
    nodes, and a second reply from one node, refused (listed with reasons); and the clients whose ClientApp failed,
    with Flower's reason. A failed ClientApp is one message's process: its node answered, and is asked again."""
    by_client: dict[int, Any] = {}
    refused, failed = [], {}
    for reply in replies:
        node = reply.metadata.src_node_id
        k = client_of.get(node)
        if reply.has_error():
            if k is not None:
                failed[k] = f"{CLIENTAPP_FAILED} {reply.error.reason}"
            continue
        if k is None or k in by_client:
            refused.append({"node": node, "reason": "a reply from a node that was not asked, or a second one"})
            continue
        by_client[k] = reply
    return by_client, refused, failed


# ---- a round's replies -------------------------------------------------------------------------
@dataclass
class Accepted:
    """What the server keeps of a round's replies."""

    replies: dict[int, tuple[Params, torch.Tensor]]  # client -> (uploads, weight)
    rejected: dict[int, str]  # client -> why its reply was refused
    refused_nodes: list[dict]  # replies from nodes the server did not ask
    losses: dict[int, torch.Tensor] = field(default_factory=dict)  # client -> its mean loss of each local-training call


def accept_train_replies(replies: Iterable[Any], client_of: dict[int, int], claimed: Claimed, expected: Expected,
                         train_sizes: list[int], probe: Callable[[int, Params, torch.Tensor], None] | None = None) -> Accepted:
    """Check every reply of a round; ``client_of`` maps the node ids asked to their clients, ``claimed`` reads the
    client a reply says its node serves (``serves``). ``probe`` (see ``aggregate_alone``) raises BadReply for a
    well-formed reply the server's own step cannot digest."""
    by_client, refused, failed = from_known_nodes(replies, client_of)
    ok, rejected, losses = {}, dict(failed), {}
    for k, reply in sorted(by_client.items()):
        try:
            serves(reply.content, k, claimed)
            ok[k] = read_train_reply(reply.content, expected, train_sizes[k])
            losses[k] = read_losses(reply.content)
            if probe is not None:
                probe(k, *ok[k])
        except BadReply as e:
            ok.pop(k, None)
            losses.pop(k, None)
            rejected[k] = str(e)
    return Accepted(ok, dict(sorted(rejected.items())), refused, losses)


def aggregate_alone(method: Method, server: Params, rnd: int) -> Callable[[int, Params, torch.Tensor], None]:
    """A probe that aggregates one client's upload alone, on a copy of the server state: finite inputs
    can still break it (a 3e38 prototype times its count overflows to inf), and one client's reply
    must not crash the server or poison its state."""
    def probe(k: int, uploads: Params, weight: torch.Tensor) -> None:
        copy = {n: t.clone() for n, t in server.items()}
        try:
            new = method.aggregate(copy, LocalResult({}, uploads, weight), [k], rnd)
        except (RuntimeError, ValueError, IndexError) as e:
            raise BadReply(f"the server's aggregation fails on it ({type(e).__name__}: {e})") from None
        bad = [n for n, t in new.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:
            raise BadReply(f"aggregated alone it turns the server's {bad} into NaN or inf")
    return probe


def accept_eval_replies(replies: Iterable[Any], client_of: dict[int, int], claimed: Claimed,
                        test_sizes: list[int]) -> tuple[dict[int, float], dict[int, str]]:
    """(client -> accuracy %, client -> why refused) of an evaluation's replies."""
    by_client, _, failed = from_known_nodes(replies, client_of)
    acc, rejected = {}, dict(failed)
    for k, reply in sorted(by_client.items()):
        try:
            serves(reply.content, k, claimed)
            acc[k] = read_eval_reply(reply.content, test_sizes[k] if k < len(test_sizes) else None)
        except BadReply as e:
            rejected[k] = str(e)
    return acc, rejected


# ---- one train reply --------------------------------------------------------------------------------
def read_train_reply(content: RecordDict, expected: Expected, n_rows: int) -> tuple[Params, torch.Tensor]:
    """(uploads, weight) of one client's train reply, or BadReply saying what is wrong."""
    uploads = _tensors(_field(content, "up", None, ArrayRecord), expected.uploads, "upload")
    weights = _tensors(_field(content, "weight", None, ArrayRecord), {"w": expected.weight}, "weight")
    w = weights["w"]
    low = 1.0 if n_rows > 0 else 0.0
    if not bool(((w >= low) & (w <= n_rows)).all()):
        raise BadReply(f"aggregation weight {w.tolist()} is not between {low:g} and the client's {n_rows} training rows")
    for name in expected.counts:
        c = uploads[name]
        if bool((c < 0).any()) or not torch.equal(c, c.round()) or float(c.sum()) > n_rows:
            raise BadReply(f"'{name}' must hold whole non-negative per-class counts summing to at most the "
                           f"client's {n_rows} training rows (sums to {float(c.sum()):g})")
    return uploads, w


MAX_LOSSES = 1024  # local-training calls a client may report a loss of in one round


def read_losses(content: RecordDict) -> torch.Tensor:
    """A client's mean loss of each local-training call: finite float32 numbers. Only reported (the
    run's train_loss), never used to train, so their count is bounded but not checked against a dry run."""
    record = _field(content, "loss", None, ArrayRecord)
    if set(record) != {"loss"}:
        raise BadReply(f"loss names {sorted(record)}; expected ['loss']")
    shape, dtype = declared(record["loss"], "loss")
    if len(shape) != 1 or dtype != torch.float32 or shape[0] > MAX_LOSSES:
        raise BadReply(f"loss must be at most {MAX_LOSSES} finite float32 numbers (got {shape} {dtype})")
    t = _loaded(record["loss"], "loss")
    if not bool(torch.isfinite(t).all()):
        raise BadReply(f"loss must be at most {MAX_LOSSES} finite float32 numbers (got NaN or inf)")
    return t


def _tensors(record: ArrayRecord, expected: dict[str, tuple[tuple[int, ...], torch.dtype]], what: str) -> Params:
    if set(record) != set(expected):
        raise BadReply(f"{what} names {sorted(record)}; expected {sorted(expected)}")
    out = {}
    for name, (shape, dtype) in expected.items():
        got = declared(record[name], f"{what} '{name}'")
        if got != (shape, dtype):
            raise BadReply(f"{what} '{name}' is {got[0]} {got[1]}; expected {shape} {dtype}")
        t = _loaded(record[name], f"{what} '{name}'")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise BadReply(f"{what} '{name}' holds NaN or inf")
        out[name] = t
    return out


def declared(array: Array, what: str) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype an array's .npy bytes declare, read from their header alone. np.load allocates the
    array the header declares before it reads the data: a forged header (36 TiB in 16 bytes) would make it raise
    MemoryError and end the ServerApp, so the header is checked first and the data must be exactly that size."""
    fp = io.BytesIO(array.data)
    try:
        version = npy.read_magic(fp)
        if version not in ((1, 0), (2, 0)):  # what np.save writes for numeric arrays
            raise ValueError(f".npy format version {version}")
        shape, _, dtype = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(fp)
        as_torch = torch.from_numpy(np.empty(0, dtype)).dtype  # object, structured, byte-swapped: TypeError/ValueError
    except (ValueError, TypeError, OSError, EOFError) as e:
        raise BadReply(f"{what} is not a readable numeric array ({type(e).__name__}: {e})") from None
    carried = len(array.data) - fp.tell()
    if carried != dtype.itemsize * math.prod(shape):
        raise BadReply(f"{what} declares {tuple(shape)} {dtype} but carries {carried} bytes of data")
    return tuple(shape), as_torch


def _loaded(array: Array, what: str) -> torch.Tensor:
    """The array whose header ``declared`` checked; np.load(..., allow_pickle=False): an object array raises."""
    try:
        return torch.from_numpy(array.numpy().copy())
    except (ValueError, TypeError, OSError, EOFError) as e:
        raise BadReply(f"{what} is not a readable numeric array ({type(e).__name__}: {e})") from None


# ---- evaluation replies -----------------------------------------------------------------------
def read_eval_reply(content: RecordDict, n_test: int | None) -> float:
    """A client's accuracy (%) on its local test rows; ``n_test`` is their count if the server knows it."""
    hits = _field(content, "metrics", "hits", MetricRecord)
    n = _field(content, "metrics", "n", MetricRecord)
    if not (_is_int(hits) and _is_int(n) and 0 <= hits <= n):
        raise BadReply(f"evaluation hits={hits!r} of n={n!r} is not 0 <= hits <= n in whole numbers")
    if n_test is not None and n != n_test:
        raise BadReply(f"evaluated {n} test rows; the client holds {n_test}")
    return 100.0 * hits / max(1, n)


# ---- helpers ----------------------------------------------------------------------------------
def _field(content: RecordDict, record: str, key: str | None, kind: type) -> Any:
    try:
        rec = content[record]
    except (KeyError, TypeError):
        raise BadReply(f"the reply has no '{record}' record") from None
    if not isinstance(rec, kind):
        raise BadReply(f"'{record}' is a {type(rec).__name__}, expected a {kind.__name__}")
    if key is None:
        return rec
    if key not in rec:
        raise BadReply(f"'{record}' has no '{key}'")
    return rec[key]


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)
