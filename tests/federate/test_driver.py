"""The round driver (fedcache/federate/driver.py), through the in-process engine: exact bytes, client sampling,
determinism, checkpoints and resume, the metrics lines, the evaluation cadence and the training loss."""
import json

import numpy as np
import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.federate.driver import sample_clients
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.federate.schedule import Schedule
from fedcache.wording import keyword_names

from .conftest import synthetic


def make(name, data, head=None, optim=None, **schedule):
    ctx = MethodContext(data, head or METHODS.get(name).default_head, optim or OptimConfig(), Schedule(**schedule))
    return METHODS.get(name)(ctx)


def test_fedavg_bytes_match_the_formula(data):
    r = run(make("fedavg", data), RunConfig(rounds=3))
    per_client = (data.dim * data.n_classes + data.n_classes) * 4  # W and b, float32
    assert r.summary["bytes_up"] == 3 * 5 * per_client == r.summary["bytes_down"]
    assert r.summary["params_up_per_round"] == 5 * (data.dim * data.n_classes + data.n_classes)


def test_fraction_samples_clients_and_counts_only_them():
    data = synthetic(n_clients=20, per_client=20)
    m = make("fedavg", data)
    r = run(m, RunConfig(rounds=2, fraction=0.25))
    assert r.summary["bytes_up"] == 2 * 5 * (data.dim * data.n_classes + data.n_classes) * 4
    picks = [sample_clients(m, RunConfig(fraction=0.25), rnd) for rnd in range(3)]
    assert all(len(p) == 5 for p in picks) and picks[0] != picks[1]


@pytest.mark.parametrize("name", ["fedproto", "fedrep"])
def test_a_client_trains_the_same_whether_every_client_or_a_fraction_trains(name):
    """One round with an mlp head (BatchNorm statistics, which the head returns): a client sampled with
    --fraction 0.6 ends the round with the state it has when every client trains; clients not sampled
    keep their initial state (these methods' local step depends only on the client's own state)."""
    data = synthetic(sizes=[37, 80, 12, 64, 51])
    every = run(make(name, data, head="mlp"), RunConfig(rounds=1))
    some_method = make(name, data, head="mlp")
    some = run(some_method, RunConfig(rounds=1, fraction=0.6))
    sampled = sample_clients(some_method, RunConfig(fraction=0.6), 0)
    initial = some_method.init_clients(data.n_clients)
    assert len(sampled) == 3 and "bn.running_mean" in some.clients
    for n, t in some.clients.items():
        for k in range(data.n_clients):
            if k in sampled:
                torch.testing.assert_close(t[k], every.clients[n][k], atol=1e-6, rtol=1e-6, msg=f"{n} of client {k}")
            else:
                assert torch.equal(t[k], initial[n][k]), f"{n} of client {k}, not sampled, changed"
    changed = lambda n: [k for k in range(data.n_clients) if not torch.equal(some.clients[n][k], initial[n][k])]
    assert changed("bn.running_mean") == changed("bn.running_var") == sampled


def test_progress_is_said_as_the_rounds_start(data):
    """Before the first round too (done 0, no line): a command's bar showed nothing through a long first round."""
    calls = []
    run(make("fedavg", data), RunConfig(rounds=3, eval_every=2),
        on_round=lambda done, total, line: calls.append((done, total, line is None)))
    assert calls == [(0, 3, True), (1, 3, True), (2, 3, False), (3, 3, False)]


def test_same_seed_same_numbers_other_seed_differs(data):
    a = run(make("solo", data, seed=3), RunConfig(rounds=2)).summary
    b = run(make("solo", data, seed=3), RunConfig(rounds=2)).summary
    c = run(make("solo", data, seed=4), RunConfig(rounds=2)).summary
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(a) == drop(b) and drop(a) != drop(c)


def test_interrupted_run_resumes_to_identical_results(data, tmp_path):
    full = run(make("solo", data), RunConfig(rounds=4))
    out = tmp_path / "part"
    out.mkdir()

    def stop_after_two(done, total, line):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(make("solo", data), RunConfig(rounds=4, out=out), on_round=stop_after_two)
    # A metrics line written after the last checkpoint (a crash between the two) is dropped on resume.
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"round": 3, "accuracy": -1}) + "\n")
    progress = []
    resumed = run(make("solo", data), RunConfig(rounds=4, out=out, resume=True),
                  on_round=lambda done, total, line: progress.append((done, line is None)))
    assert progress == [(2, True), (3, False), (4, False)]  # progress starts at the checkpoint, said before round 3
    assert resumed.summary["per_client_accuracy"] == full.summary["per_client_accuracy"]
    for n in full.clients:
        torch.testing.assert_close(full.clients[n], resumed.clients[n], atol=0, rtol=0)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [l["round"] for l in lines] == [1, 2, 3, 4] and lines[2]["accuracy"] != -1


@pytest.mark.parametrize("name", ["fedavg", "fedrep"])
def test_a_run_interrupted_while_it_evaluates_resumes_to_identical_results(data, tmp_path, monkeypatch, name):
    """Ctrl-C while round 3 is scored, after its training: the checkpoint is round 2's (a round's checkpoint is
    written once it is scored), so the resumed run trains round 3 again, and ends as one never interrupted: its
    metrics lines (train_loss too), clients' and server's state and summary."""
    from fedcache.federate.inprocess import InProcess

    cfg = dict(rounds=4, fraction=0.6, eval_every=1)
    full = run(make(name, data, fraction=0.6), RunConfig(**cfg))
    evaluate = InProcess.evaluate

    def interrupted_in_round_3(self, i, state, glob):
        if state.rnd == 2:  # round 3's state: the driver counts it done once it is scored
            raise KeyboardInterrupt
        return evaluate(self, i, state, glob)

    monkeypatch.setattr(InProcess, "evaluate", interrupted_in_round_3)
    with pytest.raises(KeyboardInterrupt):
        run(make(name, data, fraction=0.6), RunConfig(**cfg, out=tmp_path))
    monkeypatch.setattr(InProcess, "evaluate", evaluate)
    resumed = run(make(name, data, fraction=0.6), RunConfig(**cfg, out=tmp_path, resume=True))
    assert resumed.history == full.history
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == full.history
    for got, want in ((resumed.server, full.server), (resumed.clients, full.clients)):
        assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(resumed.summary) == drop(full.summary)


def test_resume_without_checkpoint_is_an_error(data, tmp_path):
    """The round driver's refusal and a run directory's are one message (rundir.no_checkpoint), for one place."""
    from fedcache.federate.rundir import RunDir

    with pytest.raises(ConfigError, match="no checkpoint") as driven:
        run(make("fedavg", data), RunConfig(rounds=2, out=tmp_path, resume=True))
    with pytest.raises(ConfigError) as read:
        RunDir(tmp_path).load_checkpoint()
    assert str(driven.value) == str(read.value) == f"--resume: no checkpoint in {tmp_path}; start the run without --resume"


def test_a_torn_last_metrics_line_is_dropped_on_resume(data, tmp_path):
    full = run(make("fedavg", data), RunConfig(rounds=3))

    def stop_after_two(done, total, line):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(make("fedavg", data), RunConfig(rounds=3, out=tmp_path), on_round=stop_after_two)
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 3, "accur')  # a crash while appending
    resumed = run(make("fedavg", data), RunConfig(rounds=3, out=tmp_path, resume=True))
    assert resumed.summary["per_client_accuracy"] == full.summary["per_client_accuracy"]
    assert [json.loads(l)["round"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_metrics_line_the_checkpoint_covers_cannot_vanish_silently(data, tmp_path, caplog):
    """A torn line after the checkpoint is re-run; one the checkpoint already covers (a damaged or edited
    file: a middle line, or the last line of a finished run) is lost, and a resume says which rounds."""
    run(make("fedavg", data), RunConfig(rounds=4, out=tmp_path))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:30]  # round 2's line torn in the middle of the file
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # and round 4's
    with caplog.at_level("WARNING"):
        resumed = run(make("fedavg", data), RunConfig(rounds=4, out=tmp_path, resume=True))
    assert [l["round"] for l in resumed.history] == [1, 3]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "rounds [2, 4]" in warned[0] and "--overwrite" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING"), keyword_names():  # fedcache.train(resume=True) names its keyword
        run(make("fedavg", data), RunConfig(rounds=4, out=tmp_path, resume=True))
    assert "miss them: run it again with overwrite=True to have them" in caplog.text


@pytest.mark.parametrize("name,eval_every", [("fedavg", 1), ("fedrep", 1), ("fedavg", 5)])
def test_a_run_resumed_at_its_last_round_whose_line_is_damaged_is_summarised_at_that_round(data, tmp_path, name,
                                                                                           eval_every):
    """The checkpoint of the last round holds its trained state: the summary is that round's, scored again, as an
    uninterrupted run's (it was the previous line's, or, with no other line, an IndexError)."""
    full = run(make(name, data, fraction=0.6), RunConfig(rounds=3, fraction=0.6, eval_every=eval_every))
    run(make(name, data, fraction=0.6), RunConfig(rounds=3, fraction=0.6, eval_every=eval_every, out=tmp_path))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join([*lines[:-1], lines[-1][:20]]) + "\n")
    (tmp_path / "summary.json").unlink()
    resumed = run(make(name, data, fraction=0.6),
                  RunConfig(rounds=3, fraction=0.6, eval_every=eval_every, out=tmp_path, resume=True))
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(resumed.summary) == drop(full.summary)
    assert drop(json.loads((tmp_path / "summary.json").read_text())) == drop(full.summary)
    assert [l["round"] for l in resumed.history] == [l["round"] for l in full.history[:-1]]


def test_eval_every_and_history(data):
    r = run(make("fedavg", data), RunConfig(rounds=5, eval_every=2))
    assert [h["round"] for h in r.history] == [2, 4, 5]
    assert len(r.history[-1]["per_client"]) == 5 and "global_accuracy" in r.history[-1]


def test_train_loss_is_the_mean_local_step_loss(tmp_path):
    # One client, one step over all its rows: the recorded loss is the initial model's cross-entropy.
    data = synthetic(n_clients=2, per_client=20)
    m = make("fedavg", data, batch_size=64)
    init = m.init_server()
    r = run(m, RunConfig(rounds=2, out=tmp_path))
    logits = [data.x_train[rows] @ init["weight"][0] + init["bias"][0] for rows in data.client_train]
    expected = np.mean([torch.nn.functional.cross_entropy(lg, data.y_train[rows]).item()
                        for lg, rows in zip(logits, data.client_train)])
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["train_loss"] == pytest.approx(expected, rel=1e-5)
    assert r.history[1]["train_loss"] < first["train_loss"]
    # Methods that train nothing locally record none.
    assert run(make("linear-probe", data), RunConfig(rounds=1)).history[0]["train_loss"] is None


def test_a_run_resumed_between_two_metrics_lines_reports_the_same_train_loss(data, tmp_path):
    """The losses of rounds after the last metrics line are kept in the checkpoint."""
    full = run(make("fedavg", data), RunConfig(rounds=4, eval_every=2))

    def stop_after_three(done, total, line):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(make("fedavg", data), RunConfig(rounds=4, eval_every=2, out=tmp_path), on_round=stop_after_three)
    resumed = run(make("fedavg", data), RunConfig(rounds=4, eval_every=2, out=tmp_path, resume=True))
    assert resumed.history == full.history and full.history[-1]["train_loss"] is not None


def test_a_paused_run_continues_to_the_numbers_and_files_of_one_that_never_paused(data, tmp_path):
    whole, paused = tmp_path / "whole", tmp_path / "paused"
    whole.mkdir()
    full = run(make("fedavg", data, fraction=0.6), RunConfig(rounds=5, out=whole, fraction=0.6, eval_every=2))
    from fedcache.federate.driver import Run as Federation
    from fedcache.federate.inprocess import run_one
    from fedcache.federate.rundir import RunDir

    def federation():
        m = make("fedavg", data, fraction=0.6)
        return Federation(m, Schedule(rounds=5, fraction=0.6, eval_every=2), RunDir(paused))

    paused.mkdir()
    first = run_one(federation(), stop_after=3)
    assert first.paused and first.summary["rounds"] == 3 and not (paused / "summary.json").exists()
    again = run_one(federation(), resume=True, stop_after=3)  # at the stop already: scored again, nothing trained
    assert again.summary["per_client_accuracy"] == first.summary["per_client_accuracy"]
    with pytest.raises(ConfigError, match="at round 3; pause at a round from 3 on"):
        run_one(federation(), resume=True, stop_after=2)
    rest = run_one(federation(), resume=True)
    assert not rest.paused and rest.history == full.history
    assert all(torch.equal(rest.server[n], full.server[n]) for n in full.server)
    assert (paused / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(rest.summary) == drop(full.summary)


def test_a_damaged_checkpoint_is_refused_naming_it(data, tmp_path):
    """torch read a checkpoint with flipped bytes without a word, and the resumed run went on from other numbers."""
    from fedcache.errors import DamagedCheckpointError
    from fedcache.federate.rundir import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"rnd": 3, "seconds": 1.0, "runs": [{"server": {"w": torch.arange(4096.0)}}], "engine": {}})
    assert load_checkpoint(path)["runs"][0]["server"]["w"].equal(torch.arange(4096.0))
    raw = bytearray(path.read_bytes())
    at = raw.find(torch.arange(4096.0)[1000:1002].numpy().tobytes())
    raw[at:at + 4] = bytes(b ^ 0xFF for b in raw[at:at + 4])
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedCheckpointError, match=f"the checkpoint {path} is damaged: what it holds no longer matches"):
        load_checkpoint(path)
    path.write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(DamagedCheckpointError, match="it cannot be read"):
        load_checkpoint(path)


@pytest.mark.parametrize("name", ["fedrep", "fedpcl"])
def test_a_checkpoint_holds_the_trained_clients_only_and_resumes_exactly(tmp_path, name):
    """Of 40 clients, 4 train a round: after two rounds the checkpoint holds the state of the (at most 8) clients
    that trained, not of all 40; resumed, the run ends as one that was never interrupted. A checkpoint of
    fedcache before client_ids (every client's state; fedpcl's server a prototype set for every client) still
    resumes to the same numbers."""
    from fedcache.federate.driver import restored_clients
    from fedcache.federate.rundir import load_checkpoint, save_checkpoint

    data = synthetic(n_clients=40, per_client=12)
    cfg = dict(rounds=4, fraction=0.1)
    full = run(make(name, data), RunConfig(**cfg))
    m = make(name, data)
    trained = sorted({k for rnd in range(2) for k in sample_clients(m, RunConfig(**cfg), rnd)})

    def interrupted(where):
        where.mkdir()
        with pytest.raises(KeyboardInterrupt):
            run(make(name, data), RunConfig(**cfg, out=where), on_round=lambda done, total, line: (_ for _ in ()).throw(
                KeyboardInterrupt) if done == 2 else None)
        return where / "checkpoint.pt"

    ck_path = interrupted(tmp_path / "sparse")
    ck = load_checkpoint(ck_path)["runs"][0]
    assert ck["client_ids"].tolist() == trained and 0 < len(trained) < data.n_clients
    assert all(len(t) == len(trained) for t in ck["clients"].values())
    dense_path = interrupted(tmp_path / "dense")
    old = load_checkpoint(dense_path)
    old["runs"][0]["clients"] = dict(restored_clients(m, old["runs"][0]))
    del old["runs"][0]["client_ids"]
    server = old["runs"][0]["server"]
    if "local_ids" in server:  # fedpcl before local_ids: a prototype set for every client, zeros if it sent none
        ids = server.pop("local_ids")
        for key in ("local", "local_count"):
            dense = server[key].new_zeros((data.n_clients, *server[key].shape[1:]))
            dense[ids] = server[key]
            server[key] = dense
    save_checkpoint(dense_path, old)
    for where in (tmp_path / "sparse", tmp_path / "dense"):
        resumed = run(make(name, data), RunConfig(**cfg, out=where, resume=True))
        assert resumed.summary["per_client_accuracy"] == full.summary["per_client_accuracy"]
        for n in full.clients:
            assert torch.equal(full.clients[n], resumed.clients[n]), n


def test_format_2_and_3_checkpoints_resume_and_a_newer_one_is_refused(data, tmp_path):
    """Formats 2 (every client's state) and 3 (fedpcl's server sets a row per client) are read as 4; a format this
    fedcache does not know is refused."""
    from fedcache.federate.rundir import DIGEST, FORMAT, digest, load_checkpoint

    path = tmp_path / "checkpoint.pt"
    for version in (2, 3):
        body = {"format": version, "rnd": 1, "seconds": 0.5, "runs": [{"server": {}, "clients": {"w": torch.ones(3, 2)}}]}
        torch.save({**body, DIGEST: digest(body)}, path)
        assert load_checkpoint(path)["format"] == FORMAT == 4
    body["format"] = 5
    torch.save({**body, DIGEST: digest(body)}, path)
    with pytest.raises(ConfigError, match="written by a newer fedcache .format 5."):
        load_checkpoint(path)


@pytest.mark.parametrize("evaluation_s, training_s, rounds, said", [
    (0.05, 0.0, 3, 1), (0.05, 0.2, 3, 0), (0.0, 0.0, 3, 0),
    (0.05, 0.0, 2, 0)])  # no later evaluation but the last's, which --eval-every keeps
def test_an_evaluation_that_takes_most_of_its_round_is_said_once(monkeypatch, data, evaluation_s, training_s, rounds, said):
    """Scoring thousands of clients by their own models can take far longer than a round's training: the
    progress showed rounds slow for no reason it gave."""
    import time

    from fedcache.federate import driver
    from fedcache.federate.driver import Run
    from fedcache.federate.inprocess import InProcess, run_one

    if evaluation_s:  # else the threshold stays: an evaluation of five clients takes far less
        monkeypatch.setattr(driver, "SLOW_EVALUATION", 0.04)
    evaluate, round_ = InProcess.evaluate, InProcess.round
    monkeypatch.setattr(InProcess, "evaluate", lambda self, *a: time.sleep(evaluation_s) or evaluate(self, *a))
    monkeypatch.setattr(InProcess, "round", lambda self, *a: time.sleep(training_s) or round_(self, *a))
    told = []
    method = METHODS.get("fedavg")(MethodContext(data, "linear", OptimConfig("sgd", 0.1), Schedule()))
    run_one(Run(method, Schedule(rounds=rounds, eval_every=1)), on_step=told.append)
    assert len(told) == said
    if said:
        assert told[0].startswith("evaluation took ") and "of round 1's" in told[0]
        assert told[0].endswith("scoring 5 clients on their test rows; --eval-every N evaluates every N-th round and the last")
