"""`fedcache train --engine flower-sim`: Flower's simulation engine gives the in-process numbers."""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import warnings

import pytest
import torch

from fedcache.cli import main
from fedcache.errors import ConfigError, FedcacheError
from fedcache.training import train
from fedcache.flower.server import SERVER_STATE
from fedcache.flower.sim import Progress, _wait, report_progress, train_flower_sim

from .conftest import BACKBONE, assert_same_run, toy_config


@pytest.mark.slow
def test_cli_flower_sim_fedavg_equals_in_process(flower_store, tmp_path, capfd, monkeypatch):
    """capfd: the simulation's process and its Ray actors write to the file descriptors, not to sys.stderr."""
    from fedcache import progress

    monkeypatch.setattr(progress, "SLOW_STEP", 0.0)  # every step said, however fast this machine
    out = tmp_path / "sim"
    code = main(["train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg",
                 "--partition", "dirichlet", "--alpha", "1.0", "--clients", "3", "--rounds", "3", "--seed", "1",
                 "--eval-every", "3", "--engine", "flower-sim", "--out", str(out)])
    out_text, err = capfd.readouterr()
    assert code == 0 and "Flower simulation" in out_text
    # Every Ray actor's WARNING as the simulation ended it, forwarded in colour at the end of every run's output.
    assert "Manually terminating" not in err and "\x1b[" not in err, err
    # The rounds' progress, as the in-process engine draws it (plain lines where stderr is not a terminal).
    assert "fedavg rounds 3/3 (100%)" in err and "acc " in err, err
    # Said as Ray starts, and as it shuts down after the last round: seconds each, which showed nothing.
    lines = err.splitlines()
    start = lines.index("starting Flower's simulation (Ray, 3 virtual SuperNodes) ...")
    # Before it, the child's start and its shards, which took seconds with nothing said.
    said = [i for i, l in enumerate(lines) if l.startswith(("simulation process ready in ", "shards written in "))]
    assert [lines[i].split(" in ")[0] for i in said] == ["simulation process ready", "shards written"], err
    assert said[-1] < start, err
    assert lines.index("rounds done; Flower and Ray shutting down ...") > lines.index(next(
        l for l in lines if l.startswith("fedavg rounds 3/3"))) > start, err
    flower = json.loads((out / "summary.json").read_text())
    state = torch.load(out / SERVER_STATE, weights_only=True)
    assert_same_run(flower, state, train(toy_config(flower_store)))
    assert (out / "shards" / "client-002").is_dir() and flower["engine"] == "flower" and flower["dropped"] == {}
    # One evaluation (round 3) sent the server state to each of the 3 clients; training's bytes_down leave it out.
    assert flower["evaluation_bytes_down"] == 3 * sum(t.numel() * t.element_size() for t in state.values())


def _process_state() -> dict:
    return {"sigterm": signal.getsignal(signal.SIGTERM), "excepthook": sys.excepthook, "environ": dict(os.environ),
            "path": list(sys.path), "warnings": list(warnings.filters),
            "flwr_handlers": list(logging.getLogger("flwr").handlers)}


@pytest.mark.slow
def test_flower_sim_fedpcl_equals_in_process_and_leaves_the_callers_process_alone(flower_store, tmp_path):
    """The library call simulates in a child process: Ray and Flower set a SIGTERM handler, sys.excepthook,
    environment variables, sys.path, loggers and warnings filters in the process they run in."""
    cfg = toy_config(flower_store, "fedpcl", out=tmp_path / "pcl")
    before = _process_state()
    flower = train_flower_sim(cfg, cpus=1)
    assert _process_state() == before
    state = torch.load(cfg.engine.out / SERVER_STATE, weights_only=True)
    assert_same_run(flower, state, train(toy_config(flower_store, "fedpcl")))


def test_the_rounds_the_child_reports_are_passed_on_whole_and_once(tmp_path):
    """The child appends a JSON line per round; the caller reads a line once it is whole, each line once, and
    those written just before the child ended."""
    path, calls = tmp_path / "progress.jsonl", []
    rounds, (report, _, _) = Progress(path, lambda *call: calls.append(call)), report_progress(path)
    rounds.poll()  # no round yet: no file
    report(1, 3, None)
    report(2, 3, {"round": 2, "accuracy": float("nan")})
    with open(path, "a") as f:
        f.write('{"done": 3, "tot')  # the child is writing round 3
    rounds.poll()
    assert calls[0] == (1, 3, None) and calls[1][:2] == (2, 3) and len(calls) == 2
    with open(path, "a") as f:
        f.write('al": 3, "line": {"round": 3}}\n')
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert _wait(child, rounds, every=0.05) == 0 and calls[2:] == [(3, 3, {"round": 3})]


def test_progress_that_cannot_be_written_or_read_does_not_end_the_run(tmp_path, caplog):
    """Progress only: a line the child cannot write (a full disk) raised out of the run's rounds, and a line the
    caller could not read stopped the caller on a traceback. Each is one warning; the child then writes no more."""
    report, _, _ = report_progress(tmp_path / "gone" / "progress.jsonl")  # its folder is not there: every write fails
    with caplog.at_level(logging.WARNING):
        report(1, 2, None)
        report(2, 2, None)
    assert [r.getMessage().startswith("the Flower simulation's progress is no longer shown") for r in caplog.records] == [True]
    caplog.clear()
    path, calls = tmp_path / "progress.jsonl", []
    path.write_text('{"done": 1, not json\n{"done": 2, "total": 2, "line": null}\n')
    with caplog.at_level(logging.WARNING):
        Progress(path, lambda *call: calls.append(call)).poll()
    assert calls == [(2, 2, None)] and "could not be read" in caplog.text


def test_the_steps_the_child_reports_are_logged_and_said(tmp_path, caplog):
    """Flower's and Ray's start and shutdown take seconds each (longer than a small run's rounds): the child
    reports them as it reports rounds, and the caller logs them (the child logs warnings only) and passes them on,
    with or without an on_round."""
    path, steps = tmp_path / "progress.jsonl", []
    report_round, report_step, _ = report_progress(path)
    report_step("starting")
    report_round(1, 1, None)
    report_step("shutting down")
    caplog.set_level(logging.INFO, logger="fedcache.flower.sim")
    Progress(path, on_step=steps.append).poll()
    assert steps == ["starting", "shutting down"]
    assert [r.getMessage() for r in caplog.records if r.name == "fedcache.flower.sim"] == steps
    rounds, said = [], []
    Progress(path, lambda *call: rounds.append(call), said.append).poll()
    assert rounds == [(1, 1, None)] and said == steps


def test_the_childs_start_and_its_shards_are_said_before_flowers_simulation_starts(flower_store, tmp_path, monkeypatch,
                                                                                    caplog):
    """`fedcache train --engine flower-sim` said `loading torch ...`, then nothing until Ray started: the child's
    start and imports (5 to 8 s on a busy machine) and its shards written (longer on a large store) looked hung. The
    child reports each once done, with its seconds, before Flower starts; the caller logs every one and says it
    where it was slow (progress.said_step), as every other command says its steps."""
    import time

    from fedcache import progress as steps
    from fedcache.flower import sim

    path, out, before_flower = tmp_path / "progress.jsonl", tmp_path / "sim", []
    caller = Progress(path, on_step=before_flower.append)
    # What the caller has been told by the time Flower starts (`simulate` says that first).
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: caller.poll() or {"ok": 1})
    monkeypatch.setattr(steps, "SLOW_STEP", 0.0)
    for resume in (False, True):  # as train_flower_sim asks it, started 3 s ago
        spec = toy_config(flower_store, out=out, resume=resume)
        assert sim._simulate_asked({"spec": spec.to_dict(), "cpus": 1, "threads": 0, "holder": "", "started": time.time() - 3,
                                    "progress": str(path), "caller": os.getpid(), "engine": {
                                        "out": str(out), "resume": resume, "keep_checkpoints": "last"}}) == {"ok": 1}
    ready = r"simulation process ready in (\d+\.\d) s \(started, fedcache and torch imported\)"
    shards = rf"shards written in \d+\.\d s: 3 clients and the server \({re.escape(str(out / 'shards'))}\)"
    checked = rf"shards of the interrupted run checked in \d+\.\d s \({re.escape(str(out / 'shards'))}\)"
    assert [bool(re.fullmatch(p, line)) for p, line in zip([ready, shards, ready, checked], before_flower)] == [True] * 4
    assert len(before_flower) == 4 and 3.0 <= float(re.fullmatch(ready, before_flower[0])[1]) < 60, before_flower

    monkeypatch.setattr(steps, "SLOW_STEP", 1e9)  # none slow: none said, every one logged
    said = []
    caplog.set_level(logging.INFO, logger="fedcache.flower.sim")
    Progress(path, on_step=said.append).poll()
    assert said == [] and [r.getMessage() for r in caplog.records if r.name == "fedcache.flower.sim"] == before_flower


@pytest.mark.parametrize("given", [dict(on_round=lambda done, total: None), dict(on_step=lambda: None),
                                   dict(on_round="not a function")])
def test_a_callback_that_cannot_take_its_arguments_is_refused_before_the_child_starts(flower_store, given,
                                                                                       monkeypatch):
    """As fedcache.train refuses it: called only as the child reports, it failed once Ray had started (and a
    round had trained and written --out)."""
    def started(*args, **kwargs):
        raise AssertionError("the child was started")

    monkeypatch.setattr(subprocess, "Popen", started)
    name = next(iter(given))
    with pytest.raises(ConfigError, match=f"^{name}"):
        train_flower_sim(toy_config(flower_store), **given)


def test_in_process_training_refuses_a_flower_spec(flower_store):
    with pytest.raises(ConfigError, match="engine='flower-sim' runs through fedcache.flower.sim.train_flower_sim"):
        train(toy_config(flower_store).replace(engine="flower-sim"))


def test_flower_sim_refuses_what_it_cannot_do(flower_store, tmp_path):
    with pytest.raises(FedcacheError, match="--resume continues the run in --out"):
        train_flower_sim(toy_config(flower_store, resume=True))
    with pytest.raises(FedcacheError, match="does not support --validation, --track; drop them$"):
        train_flower_sim(toy_config(flower_store, validation=True, track=("tensorboard",), out=tmp_path))
    with pytest.raises(FedcacheError, match="does not support --validation; drop it$"):
        train_flower_sim(toy_config(flower_store, validation=True, out=tmp_path))
    with pytest.raises(FedcacheError, match="holds no shards"):
        train_flower_sim(toy_config(flower_store, resume=True, out=tmp_path))
    with pytest.raises(ConfigError, match=f"^--resume: {tmp_path / 'gone'} does not exist; start the run without"):
        train_flower_sim(toy_config(flower_store, resume=True, out=tmp_path / "gone"))  # not "holds no shards"


def test_flower_sim_resume_of_an_in_process_run_says_which_engine_continues_it(flower_store, tmp_path):
    """It said the folder held no shards, to start without --resume; without it, that the folder held a run."""
    out = tmp_path / "run"
    train(toy_config(flower_store, out=out, rounds=1, eval_every=1))
    with pytest.raises(ConfigError, match=f"^--resume: {out} holds a run of the in-process engine, which the Flower "
                                          "simulation cannot continue; resume it with `fedcache train` without --engine"):
        train_flower_sim(toy_config(flower_store, resume=True, out=out))


@pytest.mark.slow
def test_flower_sim_resume_continues_the_run_in_out(flower_store, tmp_path):
    """--resume reaches the ServerApp through the simulation: a finished run resumes to its own summary
    (an interrupted one is tested without Ray in test_driver.py); other settings or shards are refused."""
    out, calls = tmp_path / "sim", []
    record = lambda done, total, line: calls.append((done, total, line and line["round"]))
    first = train_flower_sim(toy_config(flower_store, rounds=2, eval_every=1, out=out), cpus=1, on_round=record)
    # One call as the rounds start, then one per round, in order, with the round's metrics line, as
    # fedcache.train's on_round gets them.
    assert calls == [(0, 2, None), (1, 2, 1), (2, 2, 2)]
    again = train_flower_sim(toy_config(flower_store, rounds=2, eval_every=1, out=out, resume=True), cpus=1,
                             on_round=record)
    assert calls[3:] == [(2, 2, None)]  # resumed where its checkpoint is: nothing left to run
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(again) == drop(first) and len((out / "metrics.jsonl").read_text().splitlines()) == 2
    with pytest.raises(FedcacheError, match="other settings"):  # the rounds are part of the run's settings
        train_flower_sim(toy_config(flower_store, rounds=3, eval_every=1, out=out, resume=True), cpus=1)
    with pytest.raises(FedcacheError, match="other data or partition options"):
        train_flower_sim(toy_config(flower_store, rounds=2, eval_every=1, alpha=0.5, out=out, resume=True), cpus=1)


@pytest.mark.parametrize("method", ["fedavg", "fedpcl"])
def test_a_finished_run_resumed_shows_its_result_as_in_process_without_starting_flower(flower_store, tmp_path,
                                                                                       monkeypatch, method):
    """--resume of a finished fedpcl run (of every method whose clients keep state on the nodes) was refused: 'the run
    in --out cannot continue'; fedavg's started Ray and Flower (a minute) to score its last round again. As the
    in-process engine's, it trains nothing and shows the run's result (the rounds bar at its last round, its summary),
    leaving its files as they were; a resume with other settings is still refused."""
    from flwr.supercore.task_identity import TaskIdentity

    from fedcache.flower import client, server, sim
    from fedcache.flower.config import ServerPaths
    from fedcache.flower.shard import SERVER, client_dir, write_shards

    from .test_driver import DirectGrid

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):  # a ServerApp process's, stamped on messages
        monkeypatch.setattr(TaskIdentity, name, value)
    out, calls = tmp_path / "sim", []
    spec = toy_config(flower_store, method, rounds=2, eval_every=1, out=out)
    write_shards(sim.shard_spec(spec), out / "shards")
    run = sim.flower_run(spec, out / "shards")
    client._client.cache_clear()
    first = server.serve(DirectGrid([client_dir(out / "shards", k) for k in range(3)], run), run,
                         ServerPaths(out / "shards" / SERVER, out))
    for p in out.rglob("*"):
        os.utime(p, ns=(10**18, 10**18))  # long before now: a file written again has another mtime
    files = lambda: {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    before = files()
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: pytest.fail("Ray and Flower were started"))
    again = sim.train_flower_sim_here(toy_config(flower_store, method, rounds=2, eval_every=1, out=out, resume=True),
                                      on_round=lambda *call: calls.append(call))
    assert again == json.loads(json.dumps(first)) and calls == [(2, 2, None)]  # as in-process: "resumed after round 2"
    assert files() == before  # every file, the shards' too, with its bytes and its mtime (test_training.py: in-process)
    with pytest.raises(ConfigError, match=r"^--resume: the run in \S+ was made with other settings \(schedule.rounds\)"):
        sim.train_flower_sim_here(toy_config(flower_store, method, rounds=3, eval_every=1, out=out, resume=True))


def test_unknown_engine_is_a_bad_parameter(flower_store, capsys):
    assert main(["train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg",
                 "--engine", "grpc"]) == 2
    assert "--engine" in capsys.readouterr().err


def test_every_error_comes_back_from_the_child_as_itself():
    """The child reports an error by its class name and message; DamagedCheckpointError's constructor takes a path
    and a problem, and rebuilding it as kind(message) raised a TypeError that lost the message."""
    from fedcache import errors
    from fedcache.flower.sim import rebuilt

    kinds = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.FedcacheError)]
    assert errors.DamagedCheckpointError in kinds
    for cls in kinds:
        err = rebuilt(cls.__name__, "what went wrong")
        assert type(err) is cls and str(err) == "what went wrong"
    assert type(rebuilt("ValueError", "x")) is errors.FedcacheError  # only fedcache's own errors are rebuilt


CALLER = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.flower.conftest import toy_config
from fedcache.flower.sim import train_flower_sim
import tempfile
tempfile.tempdir = sys.argv[4]  # killed outright, the caller cannot remove its temporary directory
train_flower_sim(toy_config(Path(sys.argv[2]), rounds=100000, eval_every=1000, out=Path(sys.argv[3])), cpus=1)
"""


@pytest.mark.slow
def test_the_simulation_ends_with_a_caller_killed_outright(flower_store, tmp_path):
    """Its caller killed with SIGKILL, the simulation's process went on training and writing --out under its lock."""
    import subprocess
    import time
    from pathlib import Path

    from tests.grids.test_pool import _alive, _children

    out = tmp_path / "sim"
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(Path(__file__).resolve().parents[2]), str(flower_store),
                               str(out), str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = None
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoint.pt").exists():  # rounds under way
            assert caller.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        (child,) = _children(caller.pid)
        call_dir = Path(Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[-2].decode()).parent
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait()
        deadline = time.monotonic() + 60
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(child)
        # The killed caller's temporary directory (the request it gave its child) is removed by the child.
        assert call_dir.name.startswith("fedcache-flower-call-") and not call_dir.exists()
    finally:
        for pid in [p for p in (caller.pid, child) if p and _alive(p)]:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
@pytest.mark.parametrize("ends, grace, then", [("as interrupted", 60, "Z"), ("never", 0.5, "S")])
def test_an_interrupted_simulations_group_is_killed_before_its_process_is_reaped(monkeypatch, ends, grace, then):
    """The caller killed what was left of the simulation's process group after reaping the simulation's process: from
    then on that pid, the group's id, was free for a new process to take (and lead a group of its own), which the
    SIGKILL would have reached. The group is killed while that process is a zombie, its pid still taken; one that
    does not end once interrupted is killed with it after the grace."""
    from fedcache.flower import sim

    def state(pid: int) -> str | None:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None

    code = {"as interrupted": "import time; print(flush=True); time.sleep(60)",
            "never": "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(flush=True); time.sleep(60)"}
    child = subprocess.Popen([sys.executable, "-c", code[ends]], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    # Interrupted once it runs its code: under load (make test) one interrupted as the interpreter started was seen
    # still sleeping when the grace ended. "never" ignores SIGINT from here on.
    child.stdout.readline()
    killed, killpg = [], os.killpg
    monkeypatch.setattr(sim.os, "killpg", lambda pgid, sig: killed.append((pgid, state(child.pid))) or killpg(pgid, sig))
    try:
        sim._interrupt(child, grace=grace)
        assert killed == [(child.pid, then)] and child.returncode is not None and state(child.pid) is None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()



def _stubborn_child() -> subprocess.Popen:
    """A process leading a session of its own that ignores SIGINT, as a simulation that does not end once interrupted."""
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                              "print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE, start_new_session=True)
    child.stdout.readline()  # SIGINT ignored from here on
    return child


def test_a_second_ctrl_c_while_the_simulation_shuts_down_still_ends_its_group(monkeypatch):
    """A Python caller pressing Ctrl-C again while ``_interrupt`` waited for the simulation to shut down: the
    KeyboardInterrupt escaped the wait, and the process group was neither killed nor its leader reaped (Ray's
    processes ran on). The interrupt still goes on to the caller, once the group is killed and the child reaped."""
    import threading

    from fedcache.flower import sim

    child, killed, killpg = _stubborn_child(), [], os.killpg
    monkeypatch.setattr(sim.os, "killpg", lambda pgid, sig: killed.append(pgid) or killpg(pgid, sig))
    again = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))  # the second Ctrl-C, as the caller waits
    # Python's own handler, as a script has it: a CLI test run before in this process may have left another.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        again.start()
        with pytest.raises(KeyboardInterrupt):
            sim._interrupt(child, grace=60)
        assert killed == [child.pid] and child.returncode == -signal.SIGKILL
    finally:
        again.cancel()
        signal.signal(signal.SIGINT, handler)
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="os.waitid tells a child reaped elsewhere")
def test_a_simulation_reaped_elsewhere_is_not_killed_by_its_pid(monkeypatch):
    """Reaped by another wait, the simulation's pid, its group's id, is no longer ours: a new process may take it and
    lead a group, which ``_interrupt`` killed. Neither it nor the end of a run kills a group then."""
    from fedcache.flower import sim

    child, killed = _stubborn_child(), []
    monkeypatch.setattr(sim.os, "killpg", lambda *a: killed.append(a))
    try:
        child.kill()
        os.waitpid(child.pid, 0)  # reaped behind Popen's back
        sim._interrupt(child, grace=5)
        assert killed == [] and child.returncode is not None
        sim._end_group(child)  # as a run that ended
        assert killed == []
    finally:
        child.stdout.close()


def test_an_interrupt_as_the_simulation_writes_its_answer_leaves_it_whole(tmp_path, monkeypatch):
    """The orphan watcher's SIGINT (its caller killed as the run ended) raised KeyboardInterrupt outside the child's
    try, as it wrote its answer: the process left with a traceback, its call directory with it."""
    import json
    import os

    from fedcache.flower import sim
    from tests.flower.conftest import toy_config

    request, answer = tmp_path / "request.json", tmp_path / "answer.json"
    request.write_text(json.dumps({"spec": toy_config(tmp_path / "store.zarr").to_dict(), "cpus": 1, "threads": 0,
                                   "engine": {"out": None}, "caller": os.getpid(),
                                   "progress": str(tmp_path / "progress.jsonl"), "started": 0.0}))
    monkeypatch.setattr(sim, "on_orphaned", lambda *a, **k: None)
    monkeypatch.setattr(sim, "train_flower_sim_here", lambda spec, cpus, **how: {"mean_accuracy": 50.0})
    write = sim._answer
    monkeypatch.setattr(sim, "_answer", lambda *a: os.kill(os.getpid(), signal.SIGINT) or write(*a))
    before = signal.getsignal(signal.SIGINT)
    try:
        code = sim._child(request, answer)
    except KeyboardInterrupt:  # caught here: one escaping a test ends pytest's whole session
        code = "raised"
    finally:
        signal.signal(signal.SIGINT, before)
    assert code == 0 and json.loads(answer.read_text()) == {"summary": {"mean_accuracy": 50.0}}


def test_a_simulation_orphaned_once_its_run_is_over_ends_at_once(tmp_path, monkeypatch):
    """Its caller gone after the run (the answer being written), the orphan watcher's SIGINT met no one to interrupt:
    the process left normally, its call directory with it, and the watcher's grace went by for nothing."""
    import os
    import threading

    from fedcache.flower import sim

    ended, sent = [], []
    monkeypatch.setattr(sim, "_end_orphaned", lambda call_dir, code: ended.append(call_dir))
    monkeypatch.setattr(sim.os, "kill", lambda *a: sent.append(a))
    over = threading.Event()
    over.set()
    try:
        sim._interrupt_then_end(tmp_path, over, grace=5)
    finally:
        sim._ORPHANED.clear()
    assert ended == [tmp_path] and sent == []


def test_an_orphaned_simulation_reports_nothing(tmp_path, caplog):
    """Orphaned, the simulation's process reported rounds into a call directory its caller was no longer reading
    (or that was gone): `WARNING __main__: the Flower simulation's progress is no longer shown` on the dead caller's
    terminal, from a logger named `__main__` (the child runs with -m)."""
    import runpy

    from fedcache.flower import sim

    path = tmp_path / "gone" / "progress.jsonl"  # every write would fail
    report, step, done = report_progress(path)
    sim._ORPHANED.set()
    try:
        with caplog.at_level(logging.DEBUG):
            report(1, 2, None)
            step("shutting down")
            done("shards written", 1.0)
    finally:
        sim._ORPHANED.clear()
    assert caplog.records == [] and not path.parent.exists()
    with warnings.catch_warnings():  # runpy's: the module is imported already, and run again in a namespace of its own
        warnings.simplefilter("ignore", RuntimeWarning)
        as_child = runpy.run_module("fedcache.flower.sim", run_name="__not_main__")  # not __name__'s module name, as -m
    assert as_child["log"].name == "fedcache.flower.sim"


def test_the_simulations_sigint_handler_raises_once():
    """The simulation's process raised KeyboardInterrupt at every SIGINT: a second one (its caller's interrupt, then
    the orphan watcher's) broke Flower's and Ray's shutdown half-way, as the CLI's own handler prevents."""
    from fedcache.flower import sim

    flower = logging.getLogger("flwr")
    before = (flower.propagate, list(flower.filters))
    try:
        on_interrupt = sim._flower_logging()
        with pytest.raises(KeyboardInterrupt):
            on_interrupt(signal.SIGINT, None)
        try:
            again = on_interrupt(signal.SIGINT, None)
        except KeyboardInterrupt:  # caught here: one escaping a test ends pytest's whole session
            again = "raised again"
        assert again is None
    finally:
        flower.propagate, flower.filters[:] = before[0], before[1]


def test_an_interrupt_python_swallowed_in_a_weakref_callback_is_raised_again(monkeypatch):
    """CI: the caller's SIGINT found the simulation's main thread in a weakref's callback (an import's module lock);
    its KeyboardInterrupt was printed as "Exception ignored in" and dropped, and the simulation trained on to its end.
    It is raised again once the main thread has left the callback, and nothing is printed."""
    import sys

    from fedcache.flower import sim
    from fedcache.interrupts import RaisedAgain
    from tests.test_interrupts import dropped_then_raised

    flower = logging.getLogger("flwr")
    before = (flower.propagate, list(flower.filters))
    printed = []
    monkeypatch.setattr(sys, "__unraisablehook__", printed.append)
    try:
        on_interrupt = sim._flower_logging()
        hook = RaisedAgain(on_interrupt.rearm)
        monkeypatch.setattr(sys, "unraisablehook", hook)
        previous = signal.signal(signal.SIGINT, on_interrupt)
        try:
            assert dropped_then_raised(hook)
        finally:
            signal.signal(signal.SIGINT, previous)
        assert printed == []
    finally:
        flower.propagate, flower.filters[:] = before[0], before[1]


def _tree(pid: int) -> set[int]:
    from tests.grids.test_pool import _children

    kids = _children(pid)
    return kids.union(*(_tree(k) for k in kids))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_cli_simulation_ends_and_says_how_to_go_on(flower_store, tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM (to the command) mid-run: `fedcache train
    --engine flower-sim` printed 'interrupted' and then hung forever (Flower's worker threads wait for Ray actors
    that are gone, and a normal exit joins them), or was aborted by Ray's SIGTERM handler; it now ends with 130 (143 for SIGTERM),
    leaving no process and its checkpoint for --resume. Meanwhile a command refused --out names this command's pid,
    the one SIGTERM is sent to here (it named the simulation's process, whose SIGTERM meets Ray's handler)."""
    import subprocess
    import time

    from fedcache.errors import DirectoryBusyError
    from fedcache.ownership import check_free
    from tests.grids.test_pool import _alive

    out = tmp_path / "sim"
    cmd = [sys.executable, "-m", "fedcache.cli", "train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE,
           "-m", "fedavg", "--clients", "3", "--rounds", "100000", "--eval-every", "1000", "--engine", "flower-sim",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoint.pt").exists():  # rounds under way
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        tree = _tree(proc.pid)
        with pytest.raises(DirectoryBusyError) as busy:  # named as the command started, not its simulation's process
            check_free(out, "the run directory")
        assert f"pid {proc.pid} " in str(busy.value) and "(`fedcache train --store" in str(busy.value)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == {"ctrl-c": 130, "sigterm": 143}[how] and "re-run the command with --resume" in err
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [p for p in tree if _alive(p)]
    finally:
        for pid in [p for p in tree | {proc.pid} if _alive(p)]:
            os.kill(pid, signal.SIGKILL)


def _command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _started(pid: int, title: str) -> bool:
    """A process of Ray's titled so among the simulation's (``ray::DashboardAgent`` as Ray starts,
    ``ray::ClientAppActor`` as Flower's actors do)."""
    return any(_command_of(p).startswith(title) for p in _tree(pid))


def _of_session(sid: int) -> set[int]:
    """The live processes of session ``sid``: those the simulation's process started and that outlived it, which no
    longer descend from it (orphaned, they are its init's or subreaper's children)."""
    from tests.grids.test_pool import _alive

    def session(entry: str) -> int | None:
        try:
            with open(f"/proc/{entry}/stat") as fh:
                return int(fh.read().rsplit(")", 1)[1].split()[3])
        except (OSError, IndexError, ValueError):
            return None

    return {int(e) for e in os.listdir("/proc") if e.isdigit() and session(e) == sid and _alive(int(e))}


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
@pytest.mark.parametrize("point", ["child starting", "ray's processes starting", "rounds under way"])
def test_nothing_a_cli_simulation_started_outlives_it_killed_outright(flower_store, tmp_path, point):
    """`fedcache train --engine flower-sim` killed with SIGKILL (the command's process alone, as the OOM killer or
    `kill -9 PID` do). Killed while its simulation's process started, that process watched the wrong parent (init,
    which os.getppid() gave once the caller was gone) and trained on to the last round; killed as Ray started, Ray's
    agents, in that process's group, outlived it by a minute. Every process the command started is gone within
    seconds: the simulation's process, once Flower and Ray have shut down, kills what is left of its group."""
    import time

    from tests.grids.test_pool import _alive, _children

    out = tmp_path / "sim"
    cmd = [sys.executable, "-m", "fedcache.cli", "train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE,
           "-m", "fedavg", "--clients", "3", "--rounds", "100000", "--eval-every", "1000", "--engine", "flower-sim",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    tree: set[int] = set()

    def left() -> set[int]:  # the simulation's process leads a session of its own (sim.train_flower_sim)
        return {p for p in tree if _alive(p)}.union(*(_of_session(s) for s in tree | {proc.pid}))

    try:
        reached = {"child starting": lambda: _children(proc.pid),
                   "ray's processes starting": lambda: _started(proc.pid, "ray::"),
                   "rounds under way": lambda: (out / "checkpoint.pt").exists()}[point]
        deadline = time.monotonic() + 240
        while not reached():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        tree = _tree(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20  # seconds on a loaded 2-core machine; it was a minute, or the whole run
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left(), {p: _command_of(p) for p in left()}
    finally:
        for pid in left():
            os.kill(pid, signal.SIGKILL)



@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_nothing_of_a_simulation_killed_outright_outlives_its_command(flower_store, tmp_path):
    """The simulation's process killed with SIGKILL (the OOM killer's likelier pick than the command, which is
    smaller): the command said the simulation ended without a result and exited, while Ray's processes, in the
    simulation's session, lived a minute more, and its temporary directory (every client's shard without --out) was
    left. The command ends that group once the process has ended, and the directory lives in the command's own."""
    import tempfile
    import time

    from tests.grids.test_pool import _alive, _children

    out, tmp = tmp_path / "sim", tmp_path / "tmp"
    tmp.mkdir()
    # Ray's own directory where it would be: it takes TMPDIR too, and its socket paths have a length limit.
    env = {**os.environ, "TMPDIR": str(tmp), "RAY_TMPDIR": os.environ.get("RAY_TMPDIR", tempfile.gettempdir())}
    cmd = [sys.executable, "-m", "fedcache.cli", "train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE,
           "-m", "fedavg", "--clients", "3", "--rounds", "100000", "--eval-every", "1000", "--engine", "flower-sim",
           "--out", str(out)]
    with open(tmp_path / "err.txt", "w") as err:  # not a pipe: Ray's processes inherit it
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
    child, left = None, set()
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoint.pt").exists():  # rounds under way
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        (child,) = _children(proc.pid)
        assert list(tmp.glob("fedcache-flower-*"))  # the simulation's temporary directory, whose --out has no shards
        os.kill(child, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        assert "ended (exit code -9) without a result" in (tmp_path / "err.txt").read_text()
        deadline = time.monotonic() + 20  # seconds on a loaded 2-core machine; it was a minute
        while (left := _of_session(child)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, {p: _command_of(p) for p in left}
        assert not list(tmp.glob("fedcache-flower-*")), list(tmp.rglob("*"))
    finally:
        for pid in [p for p in left | {proc.pid} if _alive(p)]:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["ray starting", "ray's processes starting", "actors starting", "rounds starting"])
def test_a_simulation_interrupted_before_its_first_round_says_one_line(flower_store, tmp_path, monkeypatch, capfd,
                                                                       point):
    """Interrupted before its first round ended, the simulation printed some 75 lines of Flower's ActorDiedError
    tracebacks (Ray's actors ended under Flower's waiting workers), each twice (Flower's handler, then the process's
    root handler), and interrupted as Ray started, Ray's agents outlived it by a minute. The command says the one
    'interrupted' line, leaves no process, and ends with 130."""
    import time

    from fedcache.flower import sim
    from tests.grids.test_pool import _alive

    tree: set[int] = set()
    out = tmp_path / "sim"

    def interrupted(child, progress, every=0.2):  # sim._wait, interrupted as Ctrl-C would at `point`
        said, rounds = [], []
        step, round_ = progress.on_step, progress.on_round
        progress.on_step = lambda text: said.append(text) or step(text)
        progress.on_round = lambda *call: rounds.append(call) or round_(*call)
        reached = {"ray starting": lambda: any(t.startswith("starting Flower") for t in said),  # not the steps before
                   "ray's processes starting": lambda: _started(child.pid, "ray::"),
                   "actors starting": lambda: _started(child.pid, "ray::ClientAppActor"),
                   "rounds starting": lambda: rounds}[point]
        deadline = time.monotonic() + 240
        while not reached():
            assert child.poll() is None and time.monotonic() < deadline
            progress.poll()
            time.sleep(0.05)
        tree.update(_tree(child.pid) | {child.pid})
        raise KeyboardInterrupt

    monkeypatch.setattr(sim, "_wait", interrupted)
    try:
        code = main(["train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg",
                     "--clients", "3", "--rounds", "3", "--engine", "flower-sim", "--out", str(out)])
        _, err = capfd.readouterr()
        # At "rounds starting" a toy round may end between the first round's start and the interrupt.
        said = ("interrupted: no round had finished",) + (("interrupted: its last checkpoint is kept",)
                                                         if point == "rounds starting" else ())
        assert code == 130 and sum(line in err for line in said) == 1, err
        assert "Traceback" not in err and "Error" not in err and "ERROR" not in err, err
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {p: _command_of(p) for p in tree if _alive(p)}
        assert not left, left
    finally:
        for pid in [p for p in tree if _alive(p)]:
            os.kill(pid, signal.SIGKILL)


INTERRUPTED_FLOWER = """
import importlib, logging, os, runpy, signal, sys, time
from flwr.common.logger import log

flower = importlib.import_module("flwr.simulation.run_simulation")  # the module: its package names a function so


def simulation(**kwargs):  # Flower's, played here: one error of its own, then interrupted as it waits for Ray
    log(logging.ERROR, "an error of Flower's own")
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
    finally:  # Ray ends its actors under Flower's waiting workers, which log each
        log(logging.ERROR, "ray.exceptions.ActorDiedError: The actor died unexpectedly")


flower._run_simulation = simulation
runpy.run_module("fedcache.flower.sim", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("debug", [False, True])
def test_the_simulations_process_shows_flowers_errors_once_and_no_noise_of_its_interrupt(flower_store, tmp_path,
                                                                                        monkeypatch, debug):
    """Its root handler showed each of Flower's records a second time (``ERROR flwr: ...``) after Flower's own
    handler; and interrupted, the ActorDiedError (with its traceback) that each of Flower's workers logs as Ray ends
    its actors filled the terminal. Flower's errors show once; those logged once interrupted only with
    FEDCACHE_DEBUG=1. The simulation's own process (`python -m fedcache.flower.sim`) runs, Flower's simulation
    played."""
    from fedcache.flower import sim

    popen, said = subprocess.Popen, []

    class Child:  # the simulation's process, with Flower's simulation played: run to its end as it is started
        pid = os.getpid()  # no child of this process: nothing to wait for, no group to kill

        def __init__(self, args, env, **kw):
            env = {**env, "FEDCACHE_DEBUG": "1" if debug else "0"}
            child = popen([sys.executable, "-c", INTERRUPTED_FLOWER, *args[-2:]], env=env, stderr=subprocess.PIPE,
                          text=True)
            said.append(child.communicate(timeout=240)[1])
            self.code = child.returncode

        def wait(self, *a):
            return self.code

        def poll(self):
            return self.code

    monkeypatch.setattr(sim.subprocess, "Popen", Child)
    with pytest.raises(FedcacheError, match=r"ended \(exit code 130\) without a result"):  # as interrupted
        train_flower_sim(toy_config(flower_store, out=tmp_path / "sim"))
    (err,) = said
    assert err.count("an error of Flower's own") == 1, err
    assert err.count("ActorDiedError") == (1 if debug else 0), err


def test_a_method_flower_cannot_run_is_refused_before_any_work(flower_store, tmp_path):
    """Refused only by the ServerApp, after the shards were written into --out and Ray started (half a minute):
    the same --out was then refused both without --resume ('shards is not empty') and with it ('no config.json')."""
    out = tmp_path / "sim"
    with pytest.raises(ConfigError, match="centralized cannot run on Flower"):
        train_flower_sim(toy_config(flower_store, "centralized", out=out))
    assert not out.exists()


@pytest.mark.slow
def test_a_run_that_never_finished_a_round_starts_again(flower_store, tmp_path, monkeypatch):
    """What an attempt that finished no round left in --out (its shards, config.json, a round of rounds.jsonl, or a
    sharding cut short) no longer blocks the same command; its shards are made again (they might be of another
    store or partition), and a folder of other files where the shards go is said, not removed."""
    import shutil

    from fedcache.flower import sim
    from fedcache.flower.shard import write_shards

    for k, v in sim.SIM_ENV.items():
        monkeypatch.setenv(k, v)
    seen = []
    monkeypatch.setattr(sim, "simulate", lambda run, paths, *a, **kw: seen.append(paths) or {"trained": True})
    out = tmp_path / "sim"
    spec = toy_config(flower_store, out=out)
    write_shards(sim.shard_spec(spec), out / "shards")
    (out / "config.json").write_text("{}")
    (out / "rounds.jsonl").write_text('{"round": 1}\n')
    assert sim.train_flower_sim_here(spec) == {"trained": True}
    assert seen[-1].server_shard == out / "shards" / "server"
    assert not (out / "config.json").exists() and not (out / "rounds.jsonl").exists()
    (out / "shards" / "server" / "stale").write_text("of the attempt before")
    assert sim.train_flower_sim_here(toy_config(flower_store, alpha=0.5, out=out)) == {"trained": True}
    assert not (out / "shards" / "server" / "stale").exists()  # written again, of the partition asked for now
    shutil.rmtree(out / "shards")
    (out / "shards" / "mine").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"holds files that are not fedcache shards"):
        sim.train_flower_sim_here(spec)
    assert (out / "shards" / "mine").is_dir()
    shutil.rmtree(out / "shards")
    (out / "shards.partial" / "client-000").mkdir(parents=True)  # a sharding interrupted
    assert sim.train_flower_sim_here(spec) == {"trained": True}
    assert (out / "shards" / "server").is_dir() and not (out / "shards.partial").exists()


def test_a_resume_after_the_features_were_extracted_again_is_refused(flower_store, tmp_path, monkeypatch, caplog):
    """--resume went on on the shards already in --out, copies of the features as they were: after the store's were
    extracted again (another dtype here; another weight or dataset alike), the run finished on features the store no
    longer holds. Shards cut before their entries were recorded go on as before, saying the check was not made."""
    import shutil

    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.flower import sim
    from fedcache.flower.shard import SERVER, entries_now, open_shard, write_shards
    from fedcache.store.feature_store import SHARD_ATTR, FeatureStore

    store, out = tmp_path / "store.zarr", tmp_path / "sim"
    shutil.copytree(flower_store, store)
    ran = []
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: ran.append(kw["resume"]) or {"trained": True})
    write_shards(sim.shard_spec(toy_config(store, out=out)), out / "shards")  # what the interrupted run cut
    shard, info = open_shard(out / "shards" / SERVER)
    assert info.entries == entries_now(FeatureStore(store, create=False), "test-toy", [BACKBONE])
    resume = toy_config(store, out=out, resume=True)
    assert sim.train_flower_sim_here(resume) == {"trained": True} and ran == [True]  # the same features: goes on

    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE], store=store, splits=("train",), dtype="float32",
                          workers=0))
    with pytest.raises(ConfigError, match=rf"--resume: the shards in {out / 'shards'} were cut from other features than "
                                          rf"{store} holds now \(new entries for test-toy/train/\S+ {BACKBONE}.*start it "
                                          "again without --resume in another --out") as refused:
        sim.train_flower_sim_here(resume)
    assert "\n" not in str(refused.value) and ran == [True]

    shard.root.attrs.update({SHARD_ATTR: {**shard.root.attrs[SHARD_ATTR], "entries": []}})  # cut by an older fedcache
    with caplog.at_level("WARNING", logger="fedcache.flower.sim"):
        assert sim.train_flower_sim_here(resume) == {"trained": True} and ran == [True, True]
    assert "did not record the store entries they came from" in caplog.text


def test_a_resume_of_a_method_with_client_state_is_refused_before_ray_with_advice_that_works(flower_store, tmp_path,
                                                                                             monkeypatch):
    """The ServerApp refused it once Ray had started (a minute on a small machine), saying to resume the run 'with the
    in-process engine', which refuses a Flower run's directory (its config.json is another's), and the same command
    without --resume refuses a directory that holds a run: the one way on is another --out."""
    from fedcache.flower import sim
    from fedcache.flower.shard import write_shards

    out, ran = tmp_path / "sim", []
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: ran.append(kw["resume"]) or {"trained": True})
    write_shards(sim.shard_spec(toy_config(flower_store, "fedproto", out=out)), out / "shards")
    with pytest.raises(ConfigError, match=rf"--resume: fedproto keeps personal client state on the nodes, .* the run in "
                                          rf"{out} cannot continue; start it again without --resume in another --out") as e:
        sim.train_flower_sim_here(toy_config(flower_store, "fedproto", out=out, resume=True))
    assert ran == [] and "resume it with the in-process engine" not in str(e.value)
    assert sim.train_flower_sim_here(toy_config(flower_store, out=out, resume=True)) == {"trained": True}  # fedavg goes on


def test_a_resume_of_a_method_without_client_state_builds_no_method_before_ray(flower_store, tmp_path, monkeypatch):
    """The method was built before Ray started for fedavg too, which keeps no client state to refuse: only the
    ServerApp needs it. The server shard is read once before Ray, to say a damaged one at once."""
    from fedcache.flower import sim
    from fedcache.flower.shard import SERVER, write_shards

    out, built, read, build, load = tmp_path / "sim", [], [], sim.build_method, sim.load_server
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: {"trained": True})
    monkeypatch.setattr(sim, "build_method", lambda run, data: built.append(run.method.name) or build(run, data))
    monkeypatch.setattr(sim, "load_server", lambda path: read.append(path) or load(path))
    write_shards(sim.shard_spec(toy_config(flower_store, out=out)), out / "shards")
    assert sim.train_flower_sim_here(toy_config(flower_store, out=out, resume=True)) == {"trained": True}
    assert built == [] and read == [out / "shards" / SERVER]
    with pytest.raises(ConfigError, match="fedproto keeps personal client state"):  # built where it is needed
        sim.train_flower_sim_here(toy_config(flower_store, "fedproto", out=out, resume=True))
    assert read == [out / "shards" / SERVER] * 2


@pytest.mark.parametrize("method", ["fedavg", "fedproto"])
def test_a_resume_on_a_damaged_server_shard_is_refused_before_ray_starts(flower_store, tmp_path, monkeypatch, method):
    """fedavg's resume read no server shard before the simulation: a damaged one was found by the ServerApp once Ray
    had started (a minute on a small machine), its line after Ray's noise. Said before Ray, for every method."""
    from fedcache.errors import DamagedEntryError
    from fedcache.flower import sim
    from fedcache.flower.shard import SERVER, write_shards

    def ray_started(*a, **kw):
        raise AssertionError("the simulation (Ray) started")

    out = tmp_path / "sim"
    monkeypatch.setattr(sim, "simulate", ray_started)
    write_shards(sim.shard_spec(toy_config(flower_store, method, out=out)), out / "shards")
    chunks = list((out / "shards" / SERVER).glob("entries/*/features/c/0/0"))
    assert chunks
    for chunk in chunks:
        chunk.write_bytes(b"\0" * chunk.stat().st_size)  # damaged in place: the checksums tell
    with pytest.raises(DamagedEntryError, match=rf"the server's shard {out / 'shards' / SERVER} is damaged: .*; copy "
                                                r"that directory again from the `fedcache shard` output") as err:
        sim.train_flower_sim_here(toy_config(flower_store, method, out=out, resume=True))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("sharded_for", ["a method not known (fedcache shard)", "fedavg"])
def test_a_resume_after_the_views_were_extracted_again_is_refused_where_the_shards_hold_views(
        sharded_for, flower_store, tmp_path, monkeypatch):
    """Client shards copy the training split's augmented views (``extract --views``), separate entries of the store,
    where the method trains on them or is not known (`fedcache shard`): they were not among the entries the shards
    recorded, so a resume after the views were extracted again (another --view-seed here) finished on the old views.
    A method that reads no views has none copied, and its resume was refused all the same."""
    import dataclasses
    import shutil

    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.flower import sim
    from fedcache.flower.shard import SERVER, entries_now, open_shard, write_shards
    from fedcache.store.feature_store import FeatureStore

    store, out = tmp_path / "store.zarr", tmp_path / "sim"
    shutil.copytree(flower_store, store)
    views = dict(dataset="test-toy", backbones=[BACKBONE], store=store, splits=("train",), views=1, workers=0)
    extract(ExtractConfig(**views))
    ran = []
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: ran.append(kw["resume"]) or {"trained": True})
    cut = sim.shard_spec(toy_config(store, out=out))  # fedavg's: no views
    known = sharded_for == "fedavg"
    write_shards(cut if known else dataclasses.replace(cut, views=None), out / "shards")
    _, info = open_shard(out / "shards" / SERVER)
    source = FeatureStore(store, create=False)
    viewed = {e.entry_id for e in source.entries() if e.key["view"] == 1}
    assert len(viewed) == 2 and info.views is not known
    assert bool(viewed & set(info.entries)) is not known
    assert set(info.entries) == set(entries_now(source, "test-toy", [BACKBONE], views=not known))
    resume = toy_config(store, out=out, resume=True)
    assert sim.train_flower_sim_here(resume) == {"trained": True} and ran == [True]

    extract(ExtractConfig(**views, view_seed=1))  # view 0 is the same entry; view 1's are new
    if known:
        assert sim.train_flower_sim_here(resume) == {"trained": True} and ran == [True, True]
        return
    with pytest.raises(ConfigError, match=rf"were cut from other features than {store} holds now \(new entries for "
                                          rf"test-toy/train/\S+ {BACKBONE} view 1, test-toy/train/\S+ {BACKBONE} view 1:"):
        sim.train_flower_sim_here(resume)
    assert ran == [True]


def test_a_resume_on_a_store_whose_views_are_of_some_domains_goes_on(flower_store, tmp_path, monkeypatch):
    """Views extracted for one domain (`extract --views 1 --domains light`) are no table: a sharding copies none (as
    train reads none). The entries a resume compared were every current entry `find` found, the view's among them:
    the same store, untouched since the sharding, was refused as 'new entries for test-toy/train/light ... view 1'.
    The sharding and the resume take their entries from one function (``cut_from``)."""
    import dataclasses
    import shutil

    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.flower import sim
    from fedcache.flower.shard import SERVER, entries_now, open_shard, write_shards
    from fedcache.store.feature_store import FeatureStore

    store, out = tmp_path / "store.zarr", tmp_path / "sim"
    shutil.copytree(flower_store, store)
    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE], store=store, splits=("train",), views=1,
                          domains=("light",), workers=0))
    ran = []
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: ran.append(kw["resume"]) or {"trained": True})
    # As `fedcache shard` cuts them, for a method not known: the views are cut, where they are a table.
    write_shards(dataclasses.replace(sim.shard_spec(toy_config(store, out=out)), views=None), out / "shards")
    assert sim.train_flower_sim_here(toy_config(store, out=out, resume=True)) == {"trained": True} and ran == [True]
    _, info = open_shard(out / "shards" / SERVER)
    source = FeatureStore(store, create=False)
    assert info.views and not {e.entry_id for e in source.entries() if e.key["view"]} & set(info.entries)
    assert info.entries == entries_now(source, "test-toy", [BACKBONE])


def test_a_views_method_is_refused_before_sharding_and_shard_warns_of_no_view(flower_store, tmp_path, monkeypatch,
                                                                            caplog):
    """The methods that train on augmented views are the self-supervised ones, which do not deploy (their probe
    evaluates on every client's rows together): one is refused before any shard is written, as not deployable; it
    said, once Ray was up, that it found 0 views. `fedcache shard` no longer warns of a view of some domains only
    (`extract --views 1 --domains light`): no method that runs on Flower reads it."""
    import shutil

    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.flower import sim

    store, out = tmp_path / "store.zarr", tmp_path / "sim"
    shutil.copytree(flower_store, store)
    extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE], store=store, splits=("train",), views=1,
                          domains=("light",), workers=0))
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: pytest.fail("the simulation started"))
    with pytest.raises(ConfigError, match=r"^fedavg-ssl cannot run on Flower: its evaluation fits its linear probe "
                                          r"on labelled training rows pooled"):
        sim.train_flower_sim_here(toy_config(store, method="fedavg-ssl", out=out))
    assert not (out / "shards").exists()

    with caplog.at_level("WARNING", logger="fedcache.flower.shard"):
        assert main(["shard", "--store", str(store), "-d", "test-toy", "-b", BACKBONE, "--partition", "iid",
                     "--clients", "2", "--out", str(tmp_path / "shards")]) == 0
    assert "augmented view" not in caplog.text


@pytest.mark.parametrize("stop_in", ["light", "dark"])  # no domain of view 1 complete; light's complete, dark's not
def test_an_unfinished_view_is_left_to_the_method(flower_store, tmp_path, monkeypatch, caplog, stop_in):
    """An `extract --views` interrupted (or still running) in view 1: finding the entries a sharding cuts raised its
    IncompleteEntryError before the view was weighed, so a fedavg run (no views), `fedcache shard` and a resume's
    check were refused over a view they never read. None of them is now; `fedcache shard` says nothing of the view,
    which no method that runs on Flower reads."""
    import shutil

    from fedcache.extract.runner import ExtractConfig, extract
    from fedcache.flower import sim
    from fedcache.flower.shard import SERVER, changed_since_cut, open_shard, write_shards
    from fedcache.store.feature_store import FeatureStore

    store, out = tmp_path / "store.zarr", tmp_path / "sim"
    shutil.copytree(flower_store, store)

    def interrupt(event):
        if event.kind == "start" and event.label == f"test-toy/train/{stop_in} {BACKBONE} view 1":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(ExtractConfig(dataset="test-toy", backbones=[BACKBONE], store=store, splits=("train",), views=1,
                              workers=0), progress=interrupt)
    write_shards(sim.shard_spec(toy_config(store, out=out)), out / "shards")  # fedavg: no view read
    _, info = open_shard(out / "shards" / SERVER)
    assert changed_since_cut(info, FeatureStore(store, create=False)) == ""  # what a resume checks
    with caplog.at_level("WARNING", logger="fedcache.flower.shard"):
        assert main(["shard", "--store", str(store), "-d", "test-toy", "-b", BACKBONE, "--partition", "iid",
                     "--clients", "2", "--out", str(tmp_path / "shards")]) == 0
    assert "augmented view" not in caplog.text


def test_the_simulations_process_computes_with_its_callers_threads(flower_store, monkeypatch):
    """`fedcache train --engine flower-sim` chose its threads (--threads) in the process that only waits for the
    simulation's: the ServerApp computed with torch's default, all cores."""
    from pathlib import Path

    from fedcache.flower import sim

    asked = {}

    class Child:  # stands in for the simulation's process: reads the request, answers
        pid = os.getpid()  # no child of this process: nothing to wait for, no group to kill

        def __init__(self, args, **kw):
            asked.update(json.loads(Path(args[-2]).read_text()))
            Path(args[-1]).write_text(json.dumps({"summary": {"ok": True}}))

        def wait(self, *a):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(sim.subprocess, "Popen", Child)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert sim.train_flower_sim(toy_config(flower_store)) == {"ok": True}
    finally:
        torch.set_num_threads(before)
    assert asked["threads"] == 1


FLOWER_WARNS = ("import logging; from flwr.supercore.logger import log; "
                "log(logging.WARNING, 'Manually terminating ClientAppActor')")


@pytest.mark.parametrize("users", [None, "WARNING"])
def test_flowers_warnings_are_kept_out_of_the_simulation_unless_its_user_sets_flowers_level(flower_store, monkeypatch,
                                                                                           users):
    """Each Ray actor logged ``WARNING: Manually terminating ClientAppActor`` (in colour) as the simulation ended it,
    and Ray forwarded it to the end of the run's output. The simulation's process, whose environment its actors
    inherit, gets Flower's level ERROR (FLWR_LOG_LEVEL, Flower's own setting), unless the user set one; the caller's
    environment is left as it was."""
    from pathlib import Path

    from fedcache.flower import sim

    env = {}

    class Child:  # stands in for the simulation's process: keeps the environment it is started with, answers
        pid = os.getpid()  # no child of this process: nothing to wait for, no group to kill

        def __init__(self, args, **kw):
            env.update(kw["env"])
            Path(args[-1]).write_text(json.dumps({"summary": {"ok": True}}))

        def wait(self, *a):
            return 0

        def poll(self):
            return 0

    if users:
        monkeypatch.setenv("FLWR_LOG_LEVEL", users)
    else:
        monkeypatch.delenv("FLWR_LOG_LEVEL", raising=False)
    with monkeypatch.context() as m:  # subprocess's own Popen, for the process started below
        m.setattr(sim.subprocess, "Popen", Child)
        assert sim.train_flower_sim(toy_config(flower_store)) == {"ok": True}
    assert os.environ.get("FLWR_LOG_LEVEL") == users
    said = subprocess.run([sys.executable, "-c", FLOWER_WARNS], env=env, capture_output=True, text=True, timeout=120)
    assert said.returncode == 0 and ("Manually terminating" in said.stderr) == (users == "WARNING"), said.stderr


def test_the_simulation_holds_out_as_the_command_its_user_started(flower_store, tmp_path, monkeypatch):
    """The simulation's process holds --out and wrote itself as the holder: a second command on --out was told the
    child's pid and `sim.py /tmp/fedcache-flower-call-.../request.json ...`, a process the user never started and
    must not stop (SIGTERM meets Ray's handler). It names its caller: `fedcache train ...` and that process's pid."""
    from pathlib import Path

    from fedcache.flower import sim
    from fedcache.ownership import LOCK, Holder, busy, command_line

    out = tmp_path / "sim"
    seen = {}

    def simulate(*args, **kwargs):
        seen["holder"] = Holder.parse((out / LOCK).read_text())
        seen["refusal"] = str(busy(out / LOCK, f"the run directory {out}", "choose another --out"))
        return {"trained": True}

    class Child:  # the simulation's process, played here: its own command line, the request it is given
        pid = os.getpid()  # no child of this process: nothing to wait for, no group to kill

        def __init__(self, args, **kw):
            with monkeypatch.context() as m:
                m.setattr(sys, "argv", [sim.__file__, *args[-2:]])
                self.code = sim._child(Path(args[-2]), Path(args[-1]))

        def wait(self, *a):
            return self.code

        def poll(self):
            return self.code

    for name, stand_in in (("simulate", simulate), ("_fresh_start", lambda *a: None), ("on_orphaned", lambda *a, **k: None)):
        monkeypatch.setattr(sim, name, stand_in)
    monkeypatch.setattr(sim.signal, "signal", lambda *a: None)
    monkeypatch.setattr(sim.subprocess, "Popen", Child)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/fedcache", "train", "--engine", "flower-sim", "--out", str(out)])
    assert sim.train_flower_sim(toy_config(flower_store, out=out)) == {"trained": True}
    assert (seen["holder"].pid, seen["holder"].command) == (os.getpid(), command_line())
    assert f"pid {os.getpid()} " in seen["refusal"] and f"(`fedcache train --engine flower-sim --out {out}`" in seen["refusal"]
    assert "sim.py" not in seen["refusal"]


def test_a_started_run_in_out_is_refused_without_offering_what_flower_sim_refuses(flower_store, tmp_path, capsys):
    """A flower-sim killed midway and run again without --resume was told to pass `--overwrite`, which flower-sim
    then refused (`does not support --overwrite; drop it`)."""
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "checkpoint.pt").write_bytes(b"")  # what a killed run leaves, as far as the check goes
    code = main(["train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--clients", "3",
                 "--engine", "flower-sim", "--out", str(tmp_path / "sim")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "already holds a run; pass --resume to continue it, delete the folder to start it again" in err, err
    assert "--overwrite" not in err
