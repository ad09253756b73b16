"""A real deployment on 127.0.0.1: a SuperLink and 3 SuperNodes as separate processes, each with
its own shard, driven by `flwr run`. Numbers equal the in-process engine's; a killed SuperNode is
dropped from its round and rejoins when restarted; too few clients is a clear error; TLS with
SuperNode authentication works and refuses a node whose key was not registered."""
import json
import subprocess
import time

import pytest
import torch

from fedcache.errors import FedcacheError
from fedcache.training import train
from fedcache.flower.config import FlowerRun
from fedcache.flower.local import CONNECTION, LocalDeployment, self_signed
from fedcache.flower.project import write_app
from fedcache.flower.server import SERVER_STATE
from fedcache.flower.shard import client_dir, write_shards
from fedcache.flower.sim import shard_spec

from .conftest import assert_same_run, toy_config

pytestmark = pytest.mark.slow
RUN_TIMEOUT = 240  # seconds for one `flwr run`; each message starts a fresh ClientApp process


@pytest.fixture(scope="module")
def deployment(flower_store, tmp_path_factory):
    work = tmp_path_factory.mktemp("deploy")
    write_shards(shard_spec(toy_config(flower_store)), work / "shards")
    write_app(work / "app")
    with LocalDeployment(work, [client_dir(work / "shards", k) for k in range(3)]) as d:
        yield d


def _run(method: str, **kw) -> FlowerRun:
    return FlowerRun.of(**{**dict(method=method, rounds=3, seed=1, eval_every=3, connect_timeout=120), **kw})


@pytest.mark.parametrize("method", ["fedavg", "fedpcl"])
def test_loopback_deployment_equals_in_process(deployment, flower_store, method):
    # Two rounds: the second starts from the first's aggregate (and FedPCL's stored client prototypes);
    # every round costs about 12 s here, as each message starts a fresh ClientApp process.
    run = _run(method, rounds=2, eval_every=2)
    flower, out = deployment.run(deployment.workdir / "app", run, RUN_TIMEOUT)
    assert out.parent == deployment.runs  # where the SuperLink's environment says, not the run config
    state = torch.load(out / SERVER_STATE, weights_only=True)
    assert_same_run(flower, state, train(toy_config(flower_store, method, rounds=2, eval_every=2)))
    assert flower["dropped"] == {}


def _rounds(path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_supernode_is_dropped_and_rejoins_after_restart(deployment):
    """Kill client 2's SuperNode (and its running ClientApp) as round 2 starts: round 2 completes with
    clients 0 and 1 after round-timeout and records the drop; the restarted node rejoins for round 3."""
    run = _run("fedavg", min_clients=2, round_timeout=30, rejoin_wait=120)
    before = deployment.run_dirs()
    with open(deployment.log("flwr-run-failure"), "wb") as log:  # the ServerApp's log, if the test fails
        flwr = subprocess.Popen(deployment.flwr_run_command(deployment.workdir / "app", run), env=deployment.env,
                                cwd=deployment.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for(lambda: deployment.run_dirs() - before, RUN_TIMEOUT, "the run's directory")
        out = next(iter(deployment.run_dirs() - before))
        rounds = out / "rounds.jsonl"
        _wait_for(lambda: len(_rounds(rounds)) >= 1, RUN_TIMEOUT, "round 1")
        deployment.kill_node(2)
        _wait_for(lambda: len(_rounds(rounds)) >= 2, RUN_TIMEOUT, "round 2")
        deployment.start_node(2)
        flwr.wait(timeout=RUN_TIMEOUT)
    finally:
        if flwr.poll() is None:
            flwr.kill()
    log = _rounds(rounds)
    assert [r["clients"] for r in log] == [[0, 1, 2], [0, 1], [0, 1, 2]]
    assert log[1]["dropped"] == [2] and log[2]["joined"] == [2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dropped"] == {"2": [2]} and len(summary["per_client_accuracy"]) == 3


def test_too_few_clients_fails_with_a_clear_message(deployment):
    """min-clients above the live clients: the run stops with a message that names the fix, and leaves no run
    directory (it had left run-<id>/config.json, which nothing could continue)."""
    deployment.kill_node(1)
    before = deployment.run_dirs()
    try:
        run = _run("fedavg", rounds=1, min_clients=3, round_timeout=20, connect_timeout=20)
        with pytest.raises(FedcacheError, match=r"^only [0-2] of 3 clients connected.*deploy\.min_clients=3.*start one SuperNode"):
            deployment.run(deployment.workdir / "app", run, RUN_TIMEOUT)
    finally:
        deployment.start_node(1)
    assert deployment.run_dirs() == before


def test_a_resume_of_a_finished_run_says_so_in_the_stream_and_ends_well(deployment):
    """deploy.resume_run naming a run that had finished went on in silence (scoring its last round again); the stream
    says it had finished and where its results are, and the resume ends as completed."""
    _, out = deployment.run(deployment.workdir / "app", _run("fedavg", rounds=1, eval_every=1), RUN_TIMEOUT)
    summary = (out / "summary.json").read_bytes()
    again = _run("fedavg", rounds=1, eval_every=1, resume_run=out.name.removeprefix("run-"))
    ids = lambda: {r["run-id"]: r for r in json.loads(deployment.flwr(["ls", CONNECTION, "--format", "json"]))["runs"]}
    earlier = ids()
    proc = subprocess.run(deployment.flwr_run_command(deployment.workdir / "app", again), env=deployment.env,
                          cwd=deployment.workdir, capture_output=True, text=True, timeout=RUN_TIMEOUT, start_new_session=True)
    assert (f"fedcache: nothing to train: the run in {out} had finished all its rounds (1), and its results are kept "
            "there; submit the run anew without deploy.resume_run to train it again") in proc.stdout, proc.stdout
    [resumed] = [r for run_id, r in ids().items() if run_id not in earlier]
    assert resumed["status"] == "finished:completed", resumed
    assert (out / "summary.json").read_bytes() == summary


def test_tls_and_supernode_authentication_refuse_an_unregistered_node(flower_store, tmp_path):
    """The documented setup on loopback: TLS with a throw-away CA and SuperNode authentication, keys made
    here with `cryptography`. The registered node serves the run; a node whose key was never registered
    (pointing at the same shard, so it would claim the same client) is refused by the SuperLink."""
    pytest.importorskip("cryptography")
    cfg = toy_config(flower_store, clients=1, partition="iid", rounds=1, eval_every=1)
    write_shards(shard_spec(cfg), tmp_path / "shards")
    write_app(tmp_path / "app")
    shard = client_dir(tmp_path / "shards", 0)
    with LocalDeployment(tmp_path, [shard], certs=self_signed(tmp_path / "certs"), auth=True) as d:
        assert "--insecure" not in d.superlink_command() + d.supernode_command(shard, 1)
        assert "--enable-supernode-auth" in d.superlink_command()
        d.start_unregistered_node("intruder", shard)
        flower, out = d.run(tmp_path / "app", FlowerRun.of(method="fedavg", rounds=1, seed=1), RUN_TIMEOUT)
        intruder = d.procs["intruder"]
        _wait_for(lambda: intruder.poll() is not None, 60, "the SuperLink to refuse the unregistered node")
        assert intruder.returncode != 0 and "Failed to activate SuperNode" in d.log("intruder").read_text()
        nodes = json.loads(d.flwr(["supernode", "list", CONNECTION, "--format", "json"]))["nodes"]
        assert len(nodes) == 1  # the registered one
    state = torch.load(out / SERVER_STATE, weights_only=True)
    assert_same_run(flower, state, train(cfg))
    assert flower["refused_nodes"] == [] and flower["dropped"] == {}


def test_a_registered_supernode_started_again_with_its_key_takes_its_client_back(flower_store, tmp_path):
    """With SuperNode authentication a SuperNode started again keeps its node id: the server had that id dead and
    never asked it again (every later round "dropped": [1], "joined": []). Killed after round 1 and started again
    with its key once the SuperLink has it offline, it rejoins under the same id."""
    pytest.importorskip("cryptography")
    write_shards(shard_spec(toy_config(flower_store, clients=2, partition="iid")), tmp_path / "shards")
    write_app(tmp_path / "app")
    run = _run("fedavg", rounds=4, eval_every=4, min_clients=1, round_timeout=30, rejoin_wait=150)
    shards = [client_dir(tmp_path / "shards", k) for k in range(2)]
    with LocalDeployment(tmp_path, shards, certs=self_signed(tmp_path / "certs"), auth=True) as d:
        def nodes() -> list[dict]:  # in the order they were registered: node0's, node1's
            return json.loads(d.flwr(["supernode", "list", CONNECTION, "--format", "json"]))["nodes"]

        with open(d.log("flwr-run"), "wb") as log:  # the ServerApp's log, if the test fails
            flwr = subprocess.Popen(d.flwr_run_command(tmp_path / "app", run), env=d.env, cwd=d.workdir,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_for(lambda: d.run_dirs(), RUN_TIMEOUT, "the run's directory")
            rounds = next(iter(d.run_dirs())) / "rounds.jsonl"
            _wait_for(lambda: len(_rounds(rounds)) >= 1, RUN_TIMEOUT, "round 1")
            first = nodes()[1]["node-id"]
            d.kill_node(1)
            _wait_for(lambda: nodes()[1]["status"] == "offline", 120, "the SuperLink to have node 1 offline")
            d.start_node(1)
            flwr.wait(timeout=RUN_TIMEOUT)
        finally:
            if flwr.poll() is None:
                flwr.kill()
        assert nodes()[1]["node-id"] == first and len(nodes()) == 2  # the same id: no new node
    log = _rounds(rounds)
    assert [1] in [r["dropped"] for r in log] and [1] in [r["joined"] for r in log], log
    assert log[-1]["clients"] == [0, 1], log


def test_a_failed_run_is_its_one_line_in_the_stream_and_in_flwr_ls(tmp_path):
    """What docs/deploy.md tells a submitter, on the Flower this project pins: `flwr run --stream` exits 0 however
    the run ended (it streams the log and never asks the run's status, flwr/cli/run/run.py); the stream shows
    fedcache's one line before Flower's traceback, and `flwr ls --format json` says finished:failed with that line in
    its status-details. A Flower that exits otherwise fails this test: update the docs then. No SuperNode is needed:
    a refused run config stops the ServerApp before it asks for any."""
    write_app(tmp_path / "app")
    with LocalDeployment(tmp_path, [], server_shard=tmp_path / "server") as d:
        cmd = d.flwr_run_command(tmp_path / "app", FlowerRun.of(method="fedavg", rounds=1))
        cmd = [a.replace('method.name="fedavg"', 'method.name="fedavgg"') for a in cmd]  # FlowerRun.of refuses it
        proc = subprocess.run(cmd, env=d.env, cwd=d.workdir, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                              start_new_session=True)
        [run] = json.loads(d.flwr(["ls", CONNECTION, "--format", "json"]))["runs"]
    line = "run config refused: method.name='fedavgg': unknown method 'fedavgg'"
    assert proc.returncode == 0, proc.stderr
    ours, flowers = proc.stdout.find(f"fedcache: the run stopped: {line}"), proc.stdout.find("ServerApp raised an exception")
    assert 0 <= ours < flowers and f"fedcache.errors.ConfigError: {line}" in proc.stdout[flowers:], proc.stdout
    assert run["status"] == "finished:failed" and line in run["status-details"], run
