"""The ServerApp trusts no reply: crafted replies (no processes) for each way a node can lie or break.
Identity comes from the server's node -> client mapping, weights and counts are checked against the
client's row count, uploads against the server's own dry run (names, shapes, dtypes, finiteness), and
a misbehaving client is dropped from the round (recorded, counted against min-clients)."""
from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedcache.federate.driver import RunState, settle
from fedcache.federate.methods.base import weighted_average
from fedcache.flower.client import train_reply
from fedcache.flower.config import FlowerRun, build_method
from fedcache.flower.replies import MAX_LOSSES, accept_eval_replies, accept_train_replies, aggregate_alone, expected_reply
from fedcache.flower.server import FlowerEngine, Roster, TooFewClientsError, _repair, accepted_round
from fedcache.flower.shard import ShardInfo
from tests.federate.conftest import synthetic

SIZES = [30, 20, 10]
NODE = {101: 0, 102: 1, 103: 2}  # the server's node -> client mapping


@dataclass
class Reply:
    """Stands in for a Flower reply Message: what the server reads of it."""

    node: int
    content: RecordDict
    error: SimpleNamespace | None = None  # as Flower's Error: code, reason

    def __post_init__(self) -> None:
        if self.node in NODE and "client" not in self.content:  # what the node's ClientApp says in every reply
            self.content = RecordDict({**self.content, "client": _said(NODE[self.node])})

    @property
    def metadata(self):
        return SimpleNamespace(src_node_id=self.node)

    def has_error(self) -> bool:
        return self.error is not None


def _said(k, partition: str = "p1") -> ConfigRecord:
    return ConfigRecord({"client": k, "partition-id": partition})


CLAIMED = Roster(3, "p1").claimed  # the server's reading of what a reply says its node serves


def _methods(name: str = "fedavg"):
    """(server-side method: no training rows, client-side method: every client's rows)."""
    data = synthetic(n_clients=3, sizes=SIZES)
    run = FlowerRun.of(method=name)
    server_data = dataclasses.replace(data, client_train=[np.zeros(0, np.int64)] * 3)
    return build_method(run, server_data), build_method(run, data)


@pytest.fixture(params=["fedavg", "fedproto"])
def setting(request):
    server, clients = _methods(request.param)
    down = server.broadcast(server.init_server(), 0)
    everyone = clients.init_clients(3)
    honest = {k: clients.local_update(0, [k], down, {n: t[[k]] for n, t in everyone.items()}) for k in range(3)}
    return server, down, honest


def _accept(server, down, replies):
    return accept_train_replies(replies, NODE, CLAIMED, expected_reply(server, 0, down), SIZES)


def _with(result, **uploads):
    """An honest client's result with some uploads (or the weight, as w=) replaced."""
    w = uploads.pop("w", result.weights)
    return dataclasses.replace(result, uploads={**result.uploads, **uploads}, weights=w)


def _honest(honest) -> list[Reply]:
    return [Reply(node, train_reply(honest[k])) for node, k in NODE.items()]


def test_honest_replies_are_accepted_as_sent(setting):
    server, down, honest = setting
    got = _accept(server, down, _honest(honest))
    assert sorted(got.replies) == [0, 1, 2] and got.rejected == {} and got.refused_nodes == []
    for k, (up, w) in got.replies.items():
        assert up.keys() == honest[k].uploads.keys()
        for n in up:
            assert torch.equal(up[n], honest[k].uploads[n])
        assert w.tolist() == [SIZES[k]]


def test_identity_is_the_node_not_what_the_reply_says(setting):
    """Node 103 serves client 2: a reply saying client 0 is never taken for client 0's (refused, as its shard may
    have been replaced); unknown nodes and repeats are refused."""
    server, down, honest = setting
    liar = train_reply(honest[2])
    liar["client"] = _said(0)
    replies = [Reply(101, train_reply(honest[0])), Reply(103, liar), Reply(999, train_reply(honest[1])),
               Reply(101, train_reply(honest[1]))]
    got = _accept(server, down, replies)
    assert sorted(got.replies) == [0] and list(got.rejected) == [2]
    assert "joined as client 2 but now serves client 0's shard" in got.rejected[2]
    assert torch.equal(got.replies[0][0][next(iter(honest[0].uploads))], honest[0].uploads[next(iter(honest[0].uploads))])
    assert [r["node"] for r in got.refused_nodes] == [999, 101]


@pytest.mark.parametrize("said, why", [
    (None, "it does not say which client's shard it used (its node runs an older fedcache than the server's"),
    (_said(1), "the shard it used is not its node's client's: its node joined as client 0 but now serves client 1's "
               "shard (its shard directory was replaced during the run): give it client 0's directory again"),
    (_said(0, "p2"), "the shard it used is not its node's client's: serves a shard of partition 'p2'"),
    (_said(7), "the shard it used is not its node's client's: claims client 7, but the federation has clients 0..2")])
def test_a_reply_whose_node_no_longer_serves_its_client_is_refused_for_the_round(setting, said, why):
    """Its shard directory replaced during the run (a process the node starts for a message loads it again): it
    trains and scores another client's rows, which the server took for its client's."""
    server, down, honest = setting
    replies = _honest(honest)
    scores = [Reply(node, RecordDict({"metrics": MetricRecord({"hits": 1, "n": SIZES[k]})})) for node, k in NODE.items()]
    for reply in (replies[0], scores[0]):
        del reply.content["client"]
        if said is not None:
            reply.content["client"] = said
    got = _accept(server, down, replies)
    assert sorted(got.replies) == [1, 2] and why in got.rejected[0], got.rejected
    acc, rejected = accept_eval_replies(scores, NODE, CLAIMED, SIZES)
    assert sorted(acc) == [1, 2] and why in rejected[0], rejected
    advice = "install the server's fedcache on their nodes" if said is None else "give their nodes their own shard directories back"
    assert _repair([0], got.rejected) == advice  # a restarted SuperNode would load the same shard again


@pytest.mark.parametrize("weight, why", [(1e9, "between 1 and"), (0.0, "between 1 and"), (-5.0, "between 1 and"),
                                         (float("nan"), "NaN"), (float("inf"), "NaN")])
def test_a_weight_beyond_the_clients_rows_is_rejected(setting, weight, why):
    server, down, honest = setting
    replies = _honest(honest)
    replies[1] = Reply(102, train_reply(_with(honest[1], w=torch.tensor([weight]))))
    got = _accept(server, down, replies)
    assert sorted(got.replies) == [0, 2] and why in got.rejected[1]


def test_weight_must_be_one_float32_number(setting):
    server, down, honest = setting
    replies = _honest(honest)
    replies[0] = Reply(101, train_reply(_with(honest[0], w=torch.tensor([10.0, 10.0]))))
    replies[1] = Reply(102, train_reply(_with(honest[1], w=torch.tensor([20.0], dtype=torch.float64))))
    got = _accept(server, down, replies)
    assert sorted(got.rejected) == [0, 1] and all("weight 'w'" in why for why in got.rejected.values())


def _first(result) -> str:
    return next(iter(result.uploads))


@pytest.mark.parametrize("bad, why", [("nan", "NaN or inf"), ("inf", "NaN or inf"), ("shape", "expected"),
                                      ("dtype", "expected"), ("missing", "names"), ("extra", "names")])
def test_a_malformed_upload_is_rejected_by_name(setting, bad, why):
    server, down, honest = setting
    r = honest[2]
    name = _first(r)
    t = r.uploads[name]
    changed = {
        "nan": lambda: _with(r, **{name: t.clone().index_fill_(-1, torch.tensor([0]), float("nan"))}),
        "inf": lambda: _with(r, **{name: t.clone().index_fill_(-1, torch.tensor([0]), float("inf"))}),
        "shape": lambda: _with(r, **{name: torch.zeros(*t.shape[:-1], t.shape[-1] + 1)}),
        "dtype": lambda: _with(r, **{name: t.double()}),
        "missing": lambda: dataclasses.replace(r, uploads={n: v for n, v in r.uploads.items() if n != name}),
        "extra": lambda: _with(r, smuggled=torch.zeros(3)),
    }[bad]()
    replies = _honest(honest)
    replies[2] = Reply(103, train_reply(changed))
    got = _accept(server, down, replies)
    assert sorted(got.replies) == [0, 1] and why in got.rejected[2]


def test_records_of_the_wrong_kind_are_rejected(setting):
    server, down, honest = setting
    no_weight = train_reply(honest[0])
    del no_weight["weight"]
    wrong_kind = RecordDict({"up": ConfigRecord({"weight": 1.0}), "weight": train_reply(honest[1])["weight"]})
    got = _accept(server, down, [Reply(101, no_weight), Reply(102, wrong_kind), Reply(103, train_reply(honest[2]))])
    assert "no 'weight'" in got.rejected[0] and "ConfigRecord" in got.rejected[1] and sorted(got.replies) == [2]


class _Bomb:
    """Unpickling it would record that it ran: a pickled payload must never be loaded."""

    ran = False

    def __reduce__(self):
        return (_explode, ())


def _explode():
    _Bomb.ran = True
    return 0


def test_a_pickled_object_array_is_refused_and_never_unpickled(setting):
    server, down, honest = setting
    buf = io.BytesIO()
    np.save(buf, np.array([_Bomb()], dtype=object), allow_pickle=True)
    assert b"_explode" in buf.getvalue()  # the payload does carry a pickle
    name = _first(honest[0])
    up = ArrayRecord({n: Array(dtype="object", shape=(1,), stype="numpy.ndarray", data=buf.getvalue()) if n == name
                      else Array(t.numpy()) for n, t in honest[0].uploads.items()})
    content = RecordDict({"up": up, "weight": train_reply(honest[0])["weight"]})
    replies = _honest(honest)
    replies[0] = Reply(101, content)
    got = _accept(server, down, replies)
    assert "not a readable numeric array" in got.rejected[0] and not _Bomb.ran


def _forged(shape: tuple, extra: bytes = b"\0" * 16) -> Array:
    """A float32 .npy whose header declares ``shape`` but whose data is ``extra``."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return Array(dtype="float32", shape=shape, stype="numpy.ndarray", data=buf.getvalue() + extra)


def test_a_forged_npy_header_is_refused_before_anything_is_allocated(setting):
    """np.load allocates the array a header declares before reading its data: 36 TiB declared in a 16-byte upload
    raised MemoryError in the server (the ServerApp ended), instead of dropping the client for the round."""
    server, down, honest = setting
    name = _first(honest[0])
    huge = RecordDict({**train_reply(honest[0]), "up": ArrayRecord({**train_reply(honest[0])["up"], name: _forged((10**13,))})})
    short = train_reply(honest[1])
    shape = tuple(honest[1].uploads[name].shape)
    short["up"] = ArrayRecord({**short["up"], name: _forged(shape, b"\0" * 4)})  # the right header, too few bytes
    losses = train_reply(honest[2])
    losses["loss"] = ArrayRecord({"loss": _forged((10**13,))})
    got = _accept(server, down, [Reply(101, huge), Reply(102, short), Reply(103, losses)])
    assert not got.replies and sorted(got.rejected) == [0, 1, 2]
    assert "declares (10000000000000,) float32 but carries 16 bytes" in got.rejected[0]
    assert "carries 4 bytes" in got.rejected[1] and "loss declares (10000000000000,)" in got.rejected[2]


@pytest.mark.parametrize("counts, why", [("inflated", "summing to at most"), ("negative", "non-negative"),
                                         ("fraction", "whole")])
def test_per_class_counts_cannot_outweigh_the_clients_rows(counts, why):
    server, clients = _methods("fedproto")
    down = server.broadcast(server.init_server(), 0)
    everyone = clients.init_clients(3)
    honest = {k: clients.local_update(0, [k], down, {n: t[[k]] for n, t in everyone.items()}) for k in range(3)}
    c = honest[0].uploads["counts"].clone()
    c[0, 0] = {"inflated": 1e6, "negative": -1.0, "fraction": 0.5}[counts]
    replies = _honest(honest)
    replies[0] = Reply(101, train_reply(_with(honest[0], counts=c)))
    got = _accept(server, down, replies)
    assert sorted(got.replies) == [1, 2] and why in got.rejected[0]


def test_a_finite_upload_that_would_overflow_the_aggregate_is_rejected():
    """A 3e38 prototype is finite, but FedProto's count-weighted mean of it overflows: the server's own
    aggregation, tried on each reply alone, refuses it before it can poison the server state."""
    server, clients = _methods("fedproto")
    state = server.init_server()
    down = server.broadcast(state, 0)
    everyone = clients.init_clients(3)
    honest = {k: clients.local_update(0, [k], down, {n: t[[k]] for n, t in everyone.items()}) for k in range(3)}
    replies = _honest(honest)
    big = torch.full_like(honest[1].uploads["protos"], 3e38)
    replies[1] = Reply(102, train_reply(_with(honest[1], protos=big)))
    got = accept_train_replies(replies, NODE, CLAIMED, expected_reply(server, 0, down), SIZES,
                               aggregate_alone(server, state, 0))
    assert sorted(got.replies) == [0, 2] and "NaN or inf" in got.rejected[1]
    assert not _accept(server, down, replies).rejected  # well-formed: only the probe catches it


def _federation(method, min_clients: int) -> FlowerEngine:
    info = ShardInfo(role="server", client=-1, n_clients=3, dataset="synthetic", backbones=[], partition_id="p",
                     request={}, client_train_sizes=SIZES, client_test_sizes=SIZES)
    return FlowerEngine(None, method, FlowerRun.of(method=method.name, min_clients=min_clients), info, None)


def test_a_bad_client_is_dropped_for_the_round_and_the_rest_aggregated():
    """One NaN upload and one 1e9 weight: the round aggregates the honest client alone, as FedAvg of it."""
    server, clients = _methods("fedavg")
    fed, state = _federation(server, min_clients=1), RunState(0, server.init_server(), {})
    down = server.broadcast(state.server, 0)
    honest = {k: clients.local_update(0, [k], down, {}) for k in range(3)}
    name = _first(honest[0])
    replies = _honest(honest)
    replies[0] = Reply(101, train_reply(_with(honest[0], **{name: torch.full_like(honest[0].uploads[name], float("nan"))})))
    replies[1] = Reply(102, train_reply(_with(honest[1], w=torch.tensor([1e9]))))
    record, got = accepted_round(fed, 0, [0, 1, 2], _accept(server, down, replies))
    assert record["clients"] == got.clients == [2] and record["dropped"] == [0, 1] and set(record["rejected"]) == {"0", "1"}
    settle(server, state, 0, got.clients, down, got.result)  # what the round driver does with them
    want = weighted_average(honest[2].uploads, honest[2].weights)
    for n, t in want.items():
        torch.testing.assert_close(state.server[n], t)


def test_rejected_clients_count_against_min_clients():
    server, clients = _methods("fedavg")
    fed = _federation(server, min_clients=3)
    down = server.broadcast(server.init_server(), 0)
    honest = {k: clients.local_update(0, [k], down, {}) for k in range(3)}
    replies = _honest(honest)
    replies[2] = Reply(103, train_reply(_with(honest[2], w=torch.tensor([1e9]))))
    with pytest.raises(TooFewClientsError, match=r"only 2 of 3 .*client 2: aggregation weight \[1000000000.0\] is not between 1"):
        accepted_round(fed, 0, [0, 1, 2], _accept(server, down, replies))


# ---- identity -------------------------------------------------------------------------------------
def _claim(node: int, k, partition: str = "p1") -> Reply:
    return Reply(node, RecordDict({"client": ConfigRecord({"client": k, "partition-id": partition})}))


def test_a_node_cannot_take_over_a_connected_client_or_name_one_that_does_not_exist():
    roster = Roster(3, "p1")
    assert roster.admit([_claim(1, 0), _claim(2, 1)], [1, 2], {1, 2}) == [0, 1]
    claims = [_claim(3, 0), _claim(4, -7), _claim(5, 99), _claim(6, "2"), _claim(7, True), _claim(8, 2, "p2"),
              Reply(9, RecordDict({"client": ConfigRecord({"client": 2})}))]
    joined = roster.admit(claims, [3, 4, 5, 6, 7, 8, 9], {1, 2, 3, 4, 5, 6, 7, 8, 9})
    assert joined == [] and roster.node_of == {0: 1, 1: 2}
    assert [r["node"] for r in roster.refused] == [3, 4, 5, 6, 7, 8, 9]
    reasons = [r["reason"] for r in roster.refused]
    assert "connected node 1 serves" in reasons[0] and "0..2" in reasons[1] and "partition 'p2'" in reasons[5]
    assert {3, 4, 5, 6, 7, 8, 9} <= roster.dead  # never asked again ...
    roster.drop(0)  # ... except node 3, once client 0's node stops answering: it may be its restarted SuperNode
    assert 3 not in roster.dead and {4, 5, 6, 7, 8, 9} <= roster.dead


def test_a_node_whose_clientapp_failed_is_refused_with_its_reason():
    """A SuperNode given a bad shard path answers with an error: dropped without a word, the operator saw only
    'missing clients [k]' after connect_timeout, the cause in the SuperNode's own log."""
    roster = Roster(2, "p1")
    failed = Reply(5, RecordDict(), SimpleNamespace(code=1, reason="shard /nonexistent does not exist"))
    assert roster.admit([_claim(1, 0), failed], [1, 5], {1, 5}) == [0]
    assert roster.refused == [{"node": 5, "reason": "its ClientApp failed: shard /nonexistent does not exist"}]
    assert 5 in roster.dead


def test_a_restarted_node_takes_its_client_back_once_the_old_node_is_gone():
    roster = Roster(2, "p1")
    roster.admit([_claim(1, 0)], [1], {1})
    assert roster.admit([_claim(8, 0)], [8], {8}) == [0]  # node 1 no longer connected
    assert roster.node_of == {0: 8} and 1 in roster.dead and roster.refused == []


@pytest.fixture
def server_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):  # a ServerApp process has them set
        monkeypatch.setattr(TaskIdentity, name, value)


class Link:
    """The SuperLink as a ServerApp's grid sees it: the connected nodes, when each came online, and the answers of
    those asked who they are."""

    def __init__(self, nodes: dict[int, str], claims: dict[int, int]) -> None:
        self.nodes, self.claims, self.asked = nodes, claims, []

    def get_nodes(self):
        return [SimpleNamespace(node_id=x, last_activated_at=at) for x, at in self.nodes.items()]

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, timeout=None):
        self.asked += [m.metadata.dst_node_id for m in messages]
        return [_claim(m.metadata.dst_node_id, self.claims[m.metadata.dst_node_id]) for m in messages]


def test_a_supernode_restarted_under_its_own_node_id_takes_its_client_back(server_identity):
    """With SuperNode authentication a restarted SuperNode keeps its node id: dropped, it was never asked again
    (rounds 2-6 "dropped": [2], "joined": []). Asked again once it left the SuperLink or came online again since."""
    link = Link({1: "t0", 2: "t0"}, {1: 0, 2: 1})
    roster = Roster(2, "p1")
    assert roster.refresh(link, 1) == [0, 1]
    roster.drop(1)  # its SuperNode was killed: it missed a round
    assert roster.refresh(link, 1) == [] and link.asked == [1, 2]  # still online, as it was: not asked
    link.nodes[2] = "t5"  # restarted after the SuperLink had it offline: online again, the same id
    assert roster.refresh(link, 1) == [1] and roster.node_of == {0: 1, 1: 2} and link.asked == [1, 2, 2]
    roster.drop(1)
    del link.nodes[2]  # stopped: the SuperLink no longer lists it
    assert roster.refresh(link, 1) == [] and 2 not in roster.dead
    link.nodes[2] = "t5"  # started again before its activation was seen to change
    assert roster.refresh(link, 1) == [1] and link.asked == [1, 2, 2, 2]


def test_a_node_refused_for_its_shard_is_asked_again_once_restarted_with_another(server_identity):
    """Refused at connect time (a shard of another partition), restarted with the right one under the same node id:
    the server waited out connect_timeout and stopped with "missing clients [1]"."""
    link = Link({1: "t0", 2: "t0"}, {1: 0, 2: 1})

    def answers(messages, timeout=None):  # node 2's shard is of another partition until it is started again
        link.asked += [m.metadata.dst_node_id for m in messages]
        return [_claim(m.metadata.dst_node_id, link.claims[m.metadata.dst_node_id],
                       "p2" if m.metadata.dst_node_id == 2 and link.nodes[2] == "t0" else "p1") for m in messages]

    link.send_and_receive = answers
    roster = Roster(2, "p1")
    assert roster.refresh(link, 1) == [0] and 2 in roster.dead and len(roster.refused) == 1
    assert roster.refresh(link, 1) == [] and link.asked == [1, 2]  # not asked again while it stays as it was
    link.nodes[2] = "t9"
    assert roster.refresh(link, 1) == [1] and roster.node_of == {0: 1, 1: 2} and link.asked == [1, 2, 2]


def test_a_serving_supernode_started_again_between_rounds_rejoins_as_it_is(server_identity):
    """Stopped and started again between two rounds under its node id, it answered the next round from a fresh
    context (its client's personal state gone) with no "joined" said: it is asked who it is, and rejoins."""
    link = Link({1: "t0", 2: "t0"}, {1: 0, 2: 1})
    roster = Roster(2, "p1")
    assert roster.refresh(link, 1) == [0, 1]
    assert roster.refresh(link, 1) == [] and link.asked == [1, 2]  # as they were: not asked
    link.nodes[2] = "t7"
    assert roster.refresh(link, 1) == [1] and roster.node_of == {0: 1, 1: 2} and link.asked == [1, 2, 2]


def test_evaluation_replies_are_attributed_by_node_and_checked():
    def ev(node, hits, n, **extra):
        return Reply(node, RecordDict({"metrics": MetricRecord({"hits": hits, "n": n, **extra})}))

    acc, rejected = accept_eval_replies([ev(101, 15, 30, client=2), ev(102, 25, 20), ev(103, 5, 7)], NODE, CLAIMED, SIZES)
    assert acc == {0: 50.0} and sorted(rejected) == [1, 2]
    assert "0 <= hits <= n" in rejected[1] and "holds 10" in rejected[2]
    acc, rejected = accept_eval_replies([ev(101, 1.5, 30)], NODE, CLAIMED, SIZES)
    assert acc == {} and "whole numbers" in rejected[0]


@pytest.mark.parametrize("local_protos", ["after", "last-epoch", "every-epoch"])
def test_honest_fedproto_epoch_prototypes_pass_the_count_check(local_protos):
    """FedProto's prototypes from the local epochs' steps, with 2 epochs: an honest client's class counts
    stay within its rows, so the server accepts every reply."""
    data = synthetic(n_clients=3, sizes=SIZES)
    run = FlowerRun.of(method="fedproto", settings=f"local_protos={local_protos}", local_epochs=2)
    server = build_method(run, dataclasses.replace(data, client_train=[np.zeros(0, np.int64)] * 3))
    clients = build_method(run, data)
    down = server.broadcast(server.init_server(), 0)
    everyone = clients.init_clients(3)
    honest = {k: clients.local_update(0, [k], down, {n: t[[k]] for n, t in everyone.items()}) for k in range(3)}
    got = _accept(server, down, _honest(honest))
    assert sorted(got.replies) == [0, 1, 2] and not got.rejected


def test_reported_losses_must_be_a_few_finite_numbers(setting):
    server, down, honest = setting
    replies = _honest(honest)
    replies[0] = Reply(101, train_reply(honest[0], [torch.tensor([float("nan")])]))
    replies[1] = Reply(102, train_reply(honest[1], [torch.ones(MAX_LOSSES + 1)]))
    replies[2] = Reply(103, train_reply(honest[2], [torch.tensor([0.7, 0.5])]))
    got = _accept(server, down, replies)
    assert sorted(got.replies) == [2] and sorted(got.rejected) == [0, 1] and "finite float32" in got.rejected[0]
    assert got.losses == {2: pytest.approx(torch.tensor([0.7, 0.5]))}
