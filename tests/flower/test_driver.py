"""The Flower engine under the round driver, in this process: the ServerApp's ``serve`` drives the
ClientApp's own functions through a Grid that hands each message to them directly (no Ray, no
network), so the server side is tested in seconds. It gives the in-process numbers, writes
checkpoints, and an interrupted run resumed from its checkpoint equals an uninterrupted one."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedcache.errors import ConfigError
from fedcache.training import train
from fedcache.flower import client, server
from fedcache.flower.config import FlowerRun, ServerPaths
from fedcache.flower.shard import SERVER, client_dir, write_shards
from fedcache.flower.sim import shard_spec

from .conftest import BACKBONE, assert_same_run, toy_config

HANDLERS = {"query": client.identify, "train": client.train, "evaluate": client.evaluate}


class Interrupted(Exception):
    pass


class DirectGrid:
    """One node per client shard, each with its own Flower context; ``stop_before`` a round number
    interrupts the run as that round's training messages are sent."""

    def __init__(self, shards, run: FlowerRun, stop_before: int | None = None) -> None:
        self.contexts = {100 + k: Context(run_id=1, node_id=100 + k, node_config={"shard": str(p)}, state=RecordDict(),
                                          run_config=run.to_config()) for k, p in enumerate(shards)}
        self.stop_before = stop_before

    def get_node_ids(self):
        return list(self.contexts)

    def get_nodes(self):  # a SuperLink's NodeInfo says when each SuperNode came online
        return [SimpleNamespace(node_id=x, last_activated_at="") for x in self.contexts]

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for m in messages:
            if m.metadata.message_type == "train" and m.metadata.group_id == str(self.stop_before):
                raise Interrupted
            replies.append(HANDLERS[m.metadata.message_type](m, self.contexts[m.metadata.dst_node_id]))
        return replies


@pytest.fixture(autouse=True)
def server_identity(monkeypatch):
    # What a ServerApp process has set before its main runs; messages are stamped with it.
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


@pytest.fixture(scope="module")
def shards(flower_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("direct") / "shards"
    write_shards(shard_spec(toy_config(flower_store, clients=3)), out)
    return out


def _serve(shards, out, run: FlowerRun, stop_before=None, resume=False, on_round=None) -> dict:
    grid = DirectGrid([client_dir(shards, k) for k in range(3)], run, stop_before)
    client._client.cache_clear()  # each run's nodes start fresh, as new ClientApp processes would
    return server.serve(grid, run, ServerPaths(shards / SERVER, out), resume=resume, on_round=on_round)


def _run(method="fedavg", **kw) -> FlowerRun:
    return FlowerRun.of(**{**dict(method=method, rounds=4, seed=1, eval_every=2, fraction=0.67, connect_timeout=5), **kw})


def _lines(path):
    return [json.loads(l) for l in path.read_text().splitlines()]


def test_the_flower_engine_gives_the_in_process_numbers(flower_store, shards, tmp_path):
    summary = _serve(shards, tmp_path, _run(fraction=1.0, rounds=3, eval_every=3))
    state = torch.load(tmp_path / server.SERVER_STATE, weights_only=True)
    inproc = train(toy_config(flower_store))
    assert_same_run(summary, state, inproc)
    # The clients report their local losses: the metrics line's train_loss is the in-process one.
    [line] = _lines(tmp_path / "metrics.jsonl")
    assert line["train_loss"] == pytest.approx(inproc.history[-1]["train_loss"], abs=2e-6) and line["train_loss"] > 0
    assert (tmp_path / "checkpoint.pt").exists() and json.loads((tmp_path / "summary.json").read_text())["rounds"] == 3


def test_the_flower_engine_reports_each_round_as_the_in_process_engine_does(flower_store, shards, tmp_path):
    """on_round(done, total, line): once as the rounds start (done 0, no line), then once per round in order, the
    round's metrics line where it was evaluated; a resumed run's first call is where its checkpoint is, with no line."""
    calls = {"flower": [], "in-process": [], "resumed": []}
    record = lambda name: lambda done, total, line: calls[name].append((done, total, line and round(line["accuracy"], 2)))
    _serve(shards, tmp_path / "flower", _run(fraction=1.0, rounds=3, eval_every=2), on_round=record("flower"))
    train(toy_config(flower_store, eval_every=2), record("in-process"))
    assert [(d, t) for d, t, _ in calls["flower"]] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert [acc is None for *_, acc in calls["flower"]] == [True, True, False, False]
    assert calls["flower"] == calls["in-process"]
    with pytest.raises(Interrupted):
        _serve(shards, tmp_path / "part", _run(), stop_before=3)
    _serve(shards, tmp_path / "part", _run(), resume=True, on_round=record("resumed"))
    assert [(d, t, acc is None) for d, t, acc in calls["resumed"]] == [(2, 4, True), (3, 4, True), (4, 4, False)]


def test_an_interrupted_flower_run_resumes_to_the_uninterrupted_one(shards, tmp_path):
    full = _serve(shards, tmp_path / "full", _run())
    with pytest.raises(Interrupted):
        _serve(shards, tmp_path / "part", _run(), stop_before=4)
    assert [l["round"] for l in _lines(tmp_path / "part" / "metrics.jsonl")] == [2]
    with open(tmp_path / "part" / "rounds.jsonl", "a") as fh:
        fh.write('{"round": 4, "samp')  # a crash while appending: dropped on resume
    resumed = _serve(shards, tmp_path / "part", _run(), resume=True)
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(resumed) == drop(full)
    for name in ("metrics.jsonl",):
        assert _lines(tmp_path / "part" / name) == _lines(tmp_path / "full" / name)
    rounds = lambda d: [{k: v for k, v in l.items() if k != "seconds"} for l in _lines(d / "rounds.jsonl")]
    assert rounds(tmp_path / "part") == rounds(tmp_path / "full") and len(rounds(tmp_path / "full")) == 4
    a, b = (torch.load(d / server.SERVER_STATE, weights_only=True) for d in (tmp_path / "full", tmp_path / "part"))
    for n in a:
        torch.testing.assert_close(a[n], b[n], atol=0, rtol=0)


def _tear_last_line(run_dir):
    """A crash while the last metrics line was written, after its round's checkpoint: no summary.json either."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join([*lines[:-1], lines[-1][:20]]) + "\n")
    (run_dir / "summary.json").unlink()


def test_a_run_resumed_at_its_last_round_to_score_it_again_counts_the_evaluation_traffic_once(shards, tmp_path):
    """Scoring the last round again sends one more evaluation round to the nodes: the summary's evaluation_bytes_down
    counted it, so the resumed run's figures were not the uninterrupted run's."""
    run = _run(rounds=2, eval_every=1)
    full = _serve(shards, tmp_path / "full", run)
    _serve(shards, tmp_path / "g", run)
    _tear_last_line(tmp_path / "g")
    again = _serve(shards, tmp_path / "g", run, resume=True)
    assert full["evaluation_bytes_down"] > 0
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}


class StopInEvaluation(DirectGrid):
    """Interrupted as the ``stop_before``-th evaluation's messages are sent (its round's training done)."""

    def send_and_receive(self, messages, timeout=None):
        if messages and messages[0].metadata.message_type == "evaluate":
            self.stop_before -= 1
            if self.stop_before == 0:
                raise Interrupted
        return super().send_and_receive(messages, timeout)


def test_a_flower_run_interrupted_while_it_evaluates_resumes_to_the_uninterrupted_one(shards, tmp_path):
    """Interrupted as round 4 is scored, after its training: the checkpoint is round 3's, so the resumed run trains
    round 4 again, and ends as one never interrupted, evaluation_bytes_down too (what evaluation sent)."""
    full = _serve(shards, tmp_path / "full", _run())
    client._client.cache_clear()
    with pytest.raises(Interrupted):
        server.serve(StopInEvaluation([client_dir(shards, k) for k in range(3)], _run(), stop_before=2), _run(),
                     ServerPaths(shards / SERVER, tmp_path / "part"))
    resumed = _serve(shards, tmp_path / "part", _run(), resume=True)
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(resumed) == drop(full) and resumed["evaluation_bytes_down"] > 0
    assert _lines(tmp_path / "part" / "metrics.jsonl") == _lines(tmp_path / "full" / "metrics.jsonl")
    assert [r["round"] for r in _lines(tmp_path / "part" / "rounds.jsonl")] == [1, 2, 3, 4]


@pytest.mark.parametrize("resume_as, advice", [
    ("deploy.resume_run='7'", "submit the run anew without deploy.resume_run, which starts it again under a new run id"),
    ("--resume", "delete the folder {out} and run the same command without --resume, which starts that run again")])
def test_a_resumed_flower_run_lacking_a_metrics_line_says_how_a_flower_run_starts_again(shards, tmp_path, caplog,
                                                                                      resume_as, advice):
    """It was told to run it again with --overwrite, which neither a deployment nor the simulation takes."""
    run, out = _run(rounds=2, eval_every=1), tmp_path / "run"
    _serve(shards, out, run)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(["{damaged", *lines[1:]]) + "\n")
    (out / "summary.json").unlink()
    client._client.cache_clear()
    grid = DirectGrid([client_dir(shards, k) for k in range(3)], run, None)
    with caplog.at_level(logging.WARNING, logger="fedcache"):
        server.serve(grid, run, ServerPaths(shards / SERVER, out), resume=True, resume_as=resume_as)
    assert "lacked readable metrics lines of rounds [1]" in caplog.text and "overwrite" not in caplog.text
    assert f"miss them: {advice.format(out=out)} to have them" in caplog.text


def test_resume_refuses_other_settings_and_client_state_it_cannot_restore(shards, tmp_path):
    with pytest.raises(Interrupted):
        _serve(shards, tmp_path, _run(), stop_before=2)
    with pytest.raises(ConfigError, match=r"other settings \(schedule.rounds\)"):
        _serve(shards, tmp_path, _run(rounds=5), resume=True)
    with pytest.raises(ConfigError, match="fedproto keeps personal client state on the nodes.*start it again without "
                                          "--resume in another --out"):
        _serve(shards, tmp_path, _run("fedproto"), resume=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        _serve(shards, tmp_path / "empty", _run(), resume=True)
    with pytest.raises(ConfigError, match=r"^--resume: \S+missing does not exist; start the run without --resume$"):
        _serve(shards, tmp_path / "missing", _run(), resume=True)
    assert not (tmp_path / "missing").exists()


def _server_app(shards, runs, monkeypatch):
    """The ServerApp's entry point as a SuperLink calls it (run id, run config), the operator's environment set:
    the server's shard and its runs directory."""
    from fedcache.flower.config import SERVER_ENV

    monkeypatch.setenv(SERVER_ENV["deploy.server_shard"], str(shards / SERVER))
    monkeypatch.setenv(SERVER_ENV["deploy.out"], str(runs))
    nodes = [client_dir(shards, k) for k in range(3)]

    def main(run_id: int, run: FlowerRun, stop_before=None, grid=DirectGrid) -> None:
        client._client.cache_clear()
        context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=run.to_config())
        server.main(grid(nodes, run, stop_before), context)

    return main


def test_a_deployment_resumes_the_run_named_by_deploy_resume_run(shards, tmp_path, monkeypatch):
    """The ServerApp entry point: run 7 is interrupted; run 8, submitted with deploy.resume_run='7',
    continues in run-7/ (the operator's runs directory) and ends as an uninterrupted run."""
    main = _server_app(shards, tmp_path / "runs", monkeypatch)
    full = _serve(shards, tmp_path / "full", _run())
    with pytest.raises(Interrupted):
        main(7, _run(), stop_before=3)
    main(8, _run(resume_run="7"))
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["run-7"]
    resumed = json.loads((tmp_path / "runs" / "run-7" / "summary.json").read_text())
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    with pytest.raises(ConfigError, match="deploy.resume_run='run-7': give the Flower run id"):
        _run(resume_run="run-7")


class Unasked(DirectGrid):
    """SuperNodes that a run with nothing to train must never ask."""

    def get_nodes(self):
        raise AssertionError("a run with nothing to train asked for the nodes")

    def send_and_receive(self, messages, timeout=None):
        raise AssertionError("a run with nothing to train sent a message")


def test_a_deployment_resuming_a_finished_run_says_so_in_one_line_and_trains_nothing(shards, tmp_path, monkeypatch,
                                                                                     caplog):
    """deploy.resume_run naming a run that had finished all its rounds went on in silence: it waited for the nodes,
    scored the last round again and wrote the run's summary again, and the stream said nothing. It says so, as a
    finished grid's re-run does, and ends well, asking no node anything and leaving the run's files as they were."""
    main = _server_app(shards, tmp_path / "runs", monkeypatch)
    main(7, _run(rounds=2))
    done = tmp_path / "runs" / "run-7"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in done.iterdir()}
    with caplog.at_level(logging.INFO, logger="fedcache"):
        main(8, _run(rounds=2, resume_run="7"), grid=Unasked)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [(
        "WARNING", f"fedcache: nothing to train: the run in {done} had finished all its rounds (2), and its results are "
                   "kept there; submit the run anew without deploy.resume_run to train it again")]
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in done.iterdir()} == before
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["run-7"]


def test_a_second_resume_of_one_run_names_the_flower_run_to_stop(shards, tmp_path, monkeypatch):
    """Run 8 resumes run 7 and waits for its SuperNodes; run 9, a second resume of run 7, was refused naming the
    pid of run 8's flwr-serverapp (a process on the SuperLink's machine) and `kill`, where the submitter stops a
    run with `flwr stop <run id>`. It names Flower run 8 and that command, the pid beside it (a SuperLink started
    again since knows run 8 no more)."""
    import subprocess
    import sys

    from fedcache.errors import DirectoryBusyError

    main = _server_app(shards, tmp_path / "runs", monkeypatch)
    with pytest.raises(Interrupted):
        main(7, _run(), stop_before=3)
    first = subprocess.Popen([sys.executable, "-c", WAITING, json.dumps(_run(resume_run="7").to_config())],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "waiting"
        with pytest.raises(DirectoryBusyError) as err:
            main(9, _run(resume_run="7"))
    finally:
        first.kill()
        first.wait()
    said = str(err.value)
    assert f"run-7 is in use by another fedcache command: Flower run 8, whose ServerApp is pid {first.pid} " in said, said
    assert (f"stop it (`flwr stop 8`, or kill {first.pid} on " in said and "if its SuperLink was started again since: "
            "finished work is kept and deploy.resume_run='7' continues it)" in said), said


# Run 8's ServerApp, resuming run 7 (the run config in argv[1]): it holds run-7/ and waits for SuperNodes that never come.
WAITING = """import json, sys, time
from flwr.app import Context, RecordDict
from fedcache.flower import server

class Waiting:
    def get_nodes(self):
        print("waiting", flush=True)
        time.sleep(120)

server.main(Waiting(), Context(run_id=8, node_id=0, node_config={}, state=RecordDict(), run_config=json.loads(sys.argv[1])))
"""


def test_a_deployment_that_cannot_resume_names_deploy_resume_run(shards, tmp_path, monkeypatch):
    """The submitter gave deploy.resume_run, not --resume: the refusals say so, also for a run stopped before its
    first round ended (config.json, no checkpoint), which the round driver would refuse naming --resume."""
    main = _server_app(shards, tmp_path / "runs", monkeypatch)
    with pytest.raises(Interrupted):
        main(7, _run(), stop_before=1)
    (tmp_path / "runs" / "run-5").mkdir()
    for resumed, why in (("7", "has no checkpoint"), ("5", "has no config.json"), ("7", "other settings")):
        run = _run(resume_run=resumed, rounds=5 if why == "other settings" else 4)
        if why == "other settings":
            (tmp_path / "runs" / "run-7" / "checkpoint.pt").write_bytes(b"")  # past the checkpoint check
        with pytest.raises(ConfigError, match=f"deploy.resume_run='{resumed}': .*{why}") as err:
            main(8, run)
        assert "--resume" not in str(err.value)
    with pytest.raises(ConfigError, match="deploy.resume_run='7': fedproto keeps personal client state .*; submit the "
                                          "run anew without deploy.resume_run") as err:
        main(8, _run("fedproto", resume_run="7", rounds=4))
    assert "--resume" not in str(err.value) and "in-process engine, or" not in str(err.value)


def test_a_deployment_resuming_a_run_id_that_never_ran_says_so_and_makes_nothing(shards, tmp_path, monkeypatch):
    """The server's hold of the run's folder made it first: a run id with no run was said to have no config.json,
    and its empty folder stayed among the runs."""
    main = _server_app(shards, tmp_path / "runs", monkeypatch)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ConfigError) as err:
        main(8, _run(resume_run="9"))
    assert str(err.value) == (f"deploy.resume_run='9': {tmp_path / 'runs' / 'run-9'} does not exist; check the run id "
                              "(`flwr run` printed it), or submit the run anew without deploy.resume_run")
    assert list((tmp_path / "runs").iterdir()) == []


def test_the_in_process_engine_refuses_to_resume_a_flower_run_in_one_line(flower_store, shards, tmp_path):
    """Its config.json records a run config and shards, not a spec: compared as one, every option was said to differ,
    in a dump of both records, with advice (the same options, --overwrite) that could not help."""
    with pytest.raises(Interrupted):
        _serve(shards, tmp_path / "sim", _run(), stop_before=3)
    with pytest.raises(ConfigError, match=r"sim holds a run of --engine flower-sim, which this engine cannot continue; "
                                          r"resume it with --engine flower-sim$") as err:
        train(toy_config(flower_store, out=tmp_path / "sim", resume=True))
    assert "differ" not in str(err.value)


def test_a_finished_run_without_its_checkpoint_is_not_said_to_have_stopped_before_its_first_round(shards, tmp_path):
    """keep_checkpoints=none removes a finished run's checkpoint: a resume of it was told the run 'stopped before its
    first round ended' and to start it anew, which config.json then refuses."""
    run = _run(rounds=2)
    _serve(shards, tmp_path / "done", run)
    (tmp_path / "done" / "checkpoint.pt").unlink()  # as keep_checkpoints=none leaves it
    with pytest.raises(ConfigError, match="finished .*kept no checkpoint; nothing is left to run"):
        _serve(shards, tmp_path / "done", run, resume=True)


@pytest.mark.parametrize("text, problem", [('{"run": {"method.na', "not JSON"), ("[]", 'not a JSON object with a "run" object'),
                                           ('{"run": 3}', 'not a JSON object with a "run" object')])
def test_a_torn_config_json_met_by_a_resume_is_one_line_naming_it(shards, tmp_path, monkeypatch, text, problem):
    """The ServerApp read a resumed run's config.json with json.loads: torn or hand-edited, it was a JSONDecodeError
    (or AttributeError) traceback; it is one line naming the file and how to start the run again (disk.read_json)."""
    from fedcache.errors import DamagedFileError

    with pytest.raises(Interrupted):
        _serve(shards, tmp_path / "sim", _run(), stop_before=3)
    (tmp_path / "sim" / "config.json").write_text(text)
    with pytest.raises(DamagedFileError, match=rf"config.json is damaged \({problem}.*delete the folder .*sim and run the "
                                               r"same command without --resume"):
        _serve(shards, tmp_path / "sim", _run(), resume=True)
    main = _server_app(shards, tmp_path / "runs", monkeypatch)
    with pytest.raises(Interrupted):
        main(7, _run(), stop_before=3)
    (tmp_path / "runs" / "run-7" / "config.json").write_text(text)
    with pytest.raises(DamagedFileError, match=rf"run-7/config.json is damaged \({problem}.*submit the run anew without "
                                               "deploy.resume_run"):
        main(8, _run(resume_run="7"))


@pytest.fixture(scope="module")
def other_shards(flower_store, tmp_path_factory):
    """The same partition (same samples, options and seed: the same partition id) cut from another backbone."""
    out = tmp_path_factory.mktemp("other") / "shards"
    write_shards(shard_spec(toy_config(flower_store, clients=3, backbones=["tiny-clip-random"])), out)
    return out


def test_a_resume_on_shards_cut_again_from_other_features_is_refused(shards, other_shards, tmp_path):
    """`fedcache shard` run again into the shards' place with another -b (or on features extracted again) gives the
    same partition id: a resumed run took them for its own and went on from a head of the other features (or failed
    loading it, when their sizes differ). The run records what its shards were cut from and refuses others."""
    with pytest.raises(Interrupted):
        _serve(shards, tmp_path, _run(), stop_before=2)
    grid = DirectGrid([client_dir(other_shards, k) for k in range(3)], _run())
    with pytest.raises(ConfigError, match=r"other settings \(the shards' backbones \(\['tiny-timm-random'\] there, "
                                          r"\['tiny-clip-random'\] here\)\); use the same settings and shards"):
        server.serve(grid, _run(), ServerPaths(other_shards / SERVER, tmp_path), resume=True)
    assert (tmp_path / "checkpoint.pt").exists() and not (tmp_path / "summary.json").exists()


def test_nodes_on_shards_cut_from_other_features_than_the_servers_are_refused(shards, other_shards, tmp_path):
    """Client shards of one `fedcache shard` output and the server's of another, of the same partition: the nodes were
    admitted (same partition id) and trained on other features than the server's, silently where their sizes agree."""
    run = _run(connect_timeout=0.5)
    grid = DirectGrid([client_dir(other_shards, k) for k in range(3)], run)
    client._client.cache_clear()
    with pytest.raises(server.TooFewClientsError, match=r"only 0 of 3 clients.*node 100 refused: serves a shard of the "
                                                        r"same partition cut from other features"):
        server.serve(grid, run, ServerPaths(shards / SERVER, tmp_path))


def test_a_run_on_shards_cut_before_their_entries_were_recorded_resumes_on_the_same_features(shards, tmp_path):
    """Shards cut by an older fedcache carry no store entries: a run on them, resumed on the same features cut again
    (which carry them), was refused as cut "from other features"; what one side lacks is unknown, not different."""
    with pytest.raises(Interrupted):
        _serve(shards, tmp_path, _run(), stop_before=2)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["shards"]["entries"] = []
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert _serve(shards, tmp_path, _run(), resume=True)["rounds"] == 4  # _run's rounds: it went on to the end


@pytest.fixture(scope="module")
def view_shards(tmp_path_factory):
    """Shards of a store with augmented views, one set per backbone: every method's data is there."""
    from fedcache.extract.runner import ExtractConfig, extract
    from .conftest import BACKBONE

    root = tmp_path_factory.mktemp("every-method")
    store = root / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE, "tiny-clip-random"], store=store, workers=0,
                          views=2))
    shards = {}
    for backbone in (BACKBONE, "tiny-clip-random"):
        shards[backbone] = root / backbone
        write_shards(shard_spec(toy_config(store, backbones=[backbone])), shards[backbone])
    return store, shards


ON_CLIP = {"promptfl", "tpfl", "atpfl", "fst-cbdg"}  # prompt learning runs CLIP's text tower; fst-cbdg's anchors


def _every_method():
    from fedcache.federate.methods import METHODS

    # tpfl's visual=pixel too: it reads the images behind its shard's rows, named by their entries' keys.
    return [(m, "") for m in METHODS.names()] + [("tpfl", "visual=pixel pad=4")]


@pytest.mark.parametrize("method, settings", _every_method())
def test_every_method_runs_on_flower_as_in_process_or_is_refused_before_it_starts(method, settings, view_shards,
                                                                                  tmp_path):
    """Methods the docs say run on Flower stopped at the ServerApp's first step (their server shard had no views, no
    record of the features' entries): each runs there to the in-process numbers, or is refused up front, saying why."""
    from fedcache.federate.methods import METHODS
    from fedcache.flower.config import check_deployable

    from .conftest import BACKBONE

    store, shards = view_shards
    run = _run(method, rounds=2, eval_every=2, fraction=1.0, **({"settings": settings} if settings else {}))
    reason = METHODS.get(method).not_deployable(run.method.params)
    if reason:
        with pytest.raises(ConfigError, match=rf"^{method} cannot run on Flower: .+; run it with the in-process engine"):
            check_deployable(run.method)
        return
    backbone = "tiny-clip-random" if method in ON_CLIP else BACKBONE
    summary = _serve(shards[backbone], tmp_path, run)
    state = torch.load(tmp_path / server.SERVER_STATE, weights_only=True)
    # Each client trains alone on its node: the in-process run's clients one by one round the same way.
    inproc = train(toy_config(store, method=method, backbones=[backbone], rounds=2, eval_every=2, batched=False,
                              settings=settings or None))
    assert_same_run(summary, state, inproc)


def _keeping_client_state():
    from fedcache.federate.methods import METHODS
    from fedcache.flower.config import may_keep_client_state

    return [m for m in METHODS.names() if may_keep_client_state(METHODS.get(m))]


@pytest.mark.parametrize("method", ["fedavg", *_keeping_client_state()])
def test_a_finished_run_of_every_method_resumed_trains_nothing_and_keeps_its_result(method, view_shards, tmp_path,
                                                                                    monkeypatch, caplog):
    """A resume of a finished fedpcl run (fedproto's, fedrep's, ...: every method whose clients keep state on the
    nodes) was refused: its run 'cannot continue'. A finished run has no round left to train, so the nodes' state is
    not needed: it is resumed as fedavg's is, training nothing and keeping the run's files and summary."""
    from fedcache.federate.methods import METHODS

    run = _run(method, rounds=2, eval_every=1, fraction=1.0)
    if METHODS.get(method).not_deployable(run.method.params):
        return  # refused up front (test_every_method_runs_on_flower_as_in_process_or_is_refused_before_it_starts)
    _, shards = view_shards
    main = _server_app(shards["tiny-clip-random" if method in ON_CLIP else BACKBONE], tmp_path / "runs", monkeypatch)
    main(7, run)
    done = tmp_path / "runs" / "run-7"
    before = {p.name: p.read_bytes() for p in done.iterdir()}
    with caplog.at_level(logging.WARNING, logger="fedcache"):
        main(8, _run(method, rounds=2, eval_every=1, fraction=1.0, resume_run="7"), grid=Unasked)
    assert [r.getMessage() for r in caplog.records if r.name == server.log.name] == [
        f"fedcache: nothing to train: the run in {done} had finished all its rounds (2), and its results are kept there; "
        "submit the run anew without deploy.resume_run to train it again"]
    assert {p.name: p.read_bytes() for p in done.iterdir()} == before


class FailingOnce(DirectGrid):
    """Client 2's ClientApp raises in round 2's training only (its SuperNode stays connected), as one ClientApp
    process can on a busy machine."""

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Error, Message

        fails = lambda m: (m.metadata.message_type, m.metadata.group_id, m.metadata.dst_node_id) == ("train", "2", 102)
        return [Message(Error(code=0, reason="ClientApp raised MemoryError"), reply_to=m) if fails(m)
                else HANDLERS[m.metadata.message_type](m, self.contexts[m.metadata.dst_node_id]) for m in messages]


def test_a_client_whose_clientapp_failed_once_is_left_out_of_that_round_only_and_the_reason_kept(shards, tmp_path):
    """An error reply dropped its client for the rest of the run (its node was taken for gone, and never asked
    again), and the reason was written nowhere."""
    run = _run(rounds=4, eval_every=4, fraction=1.0)
    client._client.cache_clear()
    grid = FailingOnce([client_dir(shards, k) for k in range(3)], run)
    summary = server.serve(grid, run, ServerPaths(shards / SERVER, tmp_path))
    rounds = _lines(tmp_path / "rounds.jsonl")
    assert [r["clients"] for r in rounds] == [[0, 1, 2], [0, 1], [0, 1, 2], [0, 1, 2]]
    assert rounds[1]["rejected"] == {"2": "its ClientApp failed: ClientApp raised MemoryError"}
    assert all(r["joined"] == [] for r in rounds)  # never taken for gone: not asked who it is again
    assert len(summary["per_client_accuracy"]) == 3 and _lines(tmp_path / "metrics.jsonl")[-1]["evaluated"] == [0, 1, 2]
    assert summary["evaluated_clients"] == [0, 1, 2]  # which clients per_client_accuracy holds


class ShardReplaced(DirectGrid):
    """After round 1, client 0's node finds client 1's shard where its own was (its directory replaced) and, as a
    process started for a message would, loads it."""

    def send_and_receive(self, messages, timeout=None):
        if any(m.metadata.message_type == "train" and m.metadata.group_id == "2" for m in messages):
            self.contexts[100].node_config["shard"] = self.contexts[101].node_config["shard"]
            client._client.cache_clear()
        return super().send_and_receive(messages, timeout)


def test_a_node_whose_shard_was_replaced_during_the_run_is_refused_not_trained_as_its_client(shards, tmp_path):
    """Identity was asked once, as the node joined: from round 2 on client 1's rows were trained and scored as
    client 0's, and nothing said so."""
    run = _run(rounds=3, eval_every=1, fraction=1.0, min_clients=2)
    client._client.cache_clear()
    server.serve(ShardReplaced([client_dir(shards, k) for k in range(3)], run), run, ServerPaths(shards / SERVER, tmp_path))
    rounds = _lines(tmp_path / "rounds.jsonl")
    assert [r["clients"] for r in rounds] == [[0, 1, 2], [1, 2], [1, 2]]
    assert all("joined as client 0 but now serves client 1's shard" in r["rejected"]["0"] for r in rounds[1:]), rounds
    metrics = _lines(tmp_path / "metrics.jsonl")
    assert [m["evaluated"] for m in metrics] == [[0, 1, 2], [1, 2], [1, 2]]
    assert "now serves client 1's shard" in metrics[-1]["eval_rejected"]["0"]


class FailingAlways(DirectGrid):
    """Client 2's ClientApp raises at every training message (its weights file is missing, say)."""

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Error, Message

        fails = lambda m: (m.metadata.message_type, m.metadata.dst_node_id) == ("train", 102)
        return [Message(Error(code=0, reason="no CLIP weights at /w.pt"), reply_to=m) if fails(m)
                else HANDLERS[m.metadata.message_type](m, self.contexts[m.metadata.dst_node_id]) for m in messages]


def test_too_few_clients_for_a_clientapp_that_always_fails_says_to_fix_what_it_reports(shards, tmp_path):
    """A restart starts a failing ClientApp again as it was: the advice was to restart its SuperNode."""
    run = _run(rounds=2, fraction=1.0, min_clients=3)
    client._client.cache_clear()
    with pytest.raises(server.TooFewClientsError, match=r"refused replies: client 2: its ClientApp failed: no CLIP weights at "
                                                 r"/w.pt\) .*; fix what their ClientApps report, or lower"):
        server.serve(FailingAlways([client_dir(shards, k) for k in range(3)], run), run,
                     ServerPaths(shards / SERVER, tmp_path))


class FailingFromRound2(FailingAlways):
    """Client 2's ClientApp raises at every training message after round 1's."""

    def send_and_receive(self, messages, timeout=None):
        if any(m.metadata.group_id == "1" for m in messages):
            return DirectGrid.send_and_receive(self, messages, timeout)
        return super().send_and_receive(messages, timeout)


def test_a_deployment_refused_before_its_first_round_ended_leaves_no_run_directory(shards, tmp_path, monkeypatch):
    """A run that stopped with its error before its first round ended left run-<id>/config.json: a folder no resume
    can continue (it has no checkpoint) and no submission writes again (each has a new run id). A run that finished a
    round keeps its folder: deploy.resume_run continues it."""
    main = _server_app(shards, tmp_path / "runs", monkeypatch)
    with pytest.raises(server.TooFewClientsError, match="^round 1: "):
        main(7, _run(rounds=2, fraction=1.0, min_clients=3), grid=FailingAlways)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(server.TooFewClientsError, match="^round 2: "):
        main(8, _run(rounds=2, fraction=1.0, min_clients=3), grid=FailingFromRound2)
    assert {"checkpoint.pt", "config.json", "rounds.jsonl"} <= {p.name for p in (tmp_path / "runs" / "run-8").iterdir()}


class Recording(DirectGrid):
    """Keeps each message's type and time to live as it is sent."""

    sent: list = []

    def send_and_receive(self, messages, timeout=None):
        Recording.sent += [(m.metadata.message_type, m.metadata.ttl, timeout) for m in messages]
        return super().send_and_receive(messages, timeout)


def test_every_message_lives_as_long_as_the_server_waits_for_it(shards, tmp_path):
    """A message left queued for a lost node's id (a SuperNode started again with its key keeps it) was the first
    its new process ran, a round behind; each message's ttl is the round's timeout, so none outlives its wait.
    Flower's default ttl (12 hours) passes every other test: the race it prevents needs a real restart."""
    run, Recording.sent = _run(rounds=2, eval_every=1, round_timeout=37.0), []
    grid = Recording([client_dir(shards, k) for k in range(3)], run)
    client._client.cache_clear()
    server.serve(grid, run, ServerPaths(shards / SERVER, tmp_path))
    assert {kind for kind, *_ in Recording.sent} == {"query", "train", "evaluate"}
    assert {(ttl, timeout) for kind, ttl, timeout in Recording.sent if kind != "query"} == {(37.0, 37.0)}
    assert all(ttl == timeout for _, ttl, timeout in Recording.sent)
