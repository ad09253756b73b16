"""`fedcache train --engine flower-sim`: shard, then run the same ServerApp / ClientApp in Flower's
simulation engine (Ray), one virtual SuperNode per client.

Ray and Flower change the process they run in (a SIGTERM handler, ``sys.excepthook``, environment variables,
``sys.path``, loggers, warnings filters), and once interrupted leave threads behind that keep the process from
exiting, so ``train_flower_sim`` (the library's and ``fedcache train``'s) runs the simulation in a child process
(``python -m fedcache.flower.sim``, ``train_flower_sim_here``) and leaves its caller's process as it was.

Flower's public ``run_simulation`` gives the apps an empty run config; the run config reaches both
apps here through a Flower App directory (``project.write_app``), as it does under ``flwr run``.
That needs ``_run_simulation``'s ``app_dir`` and ``server_app_context`` arguments, which is why the
flwr version is pinned.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fedcache import disk, errors
from fedcache.errors import ConfigError, DiskFullError, EntryNotFoundError, FedcacheError
from fedcache.partitioning import partition_request
from fedcache.training import check_not_a_cell, owned
from fedcache.federate.inprocess import OnRound
from fedcache.federate.rundir import RunDir, check_resumable, resume_named
from fedcache.federate.tables import unextractable
from fedcache.flower.config import (FlowerRun, ServerPaths, build_method, check_deployable, may_keep_client_state,
                                    refuse_resume_with_client_state)
from fedcache.flower.project import write_app
from fedcache.flower.shard import (SERVER, ShardInfo, ShardSpec, changed_since_cut, load_server, open_shard,
                                   write_shards)
from fedcache.interrupts import RaisedAgain
from fedcache.ownership import Holder, on_orphaned
from fedcache.progress import StepCallback, check_callback, log_to_stderr, said_now, said_step
from fedcache.spec import RunSpec, method_class
from fedcache.store.entries import newest
from fedcache.store.feature_store import FeatureStore
from fedcache.wording import count, named

log = logging.getLogger("fedcache.flower.sim")  # named: run with -m (the child), __name__ is "__main__"

INTERRUPTED = 130  # the shell's code for SIGINT, as `fedcache` exits when interrupted
SIM_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",  # Flower reports usage events over the network by default
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",  # silences a Ray FutureWarning; no GPUs are used
}
# What the user's own environment may set otherwise. Flower's log level (its documented variable), in the simulation's
# process and its Ray actors, which inherit it: each actor logs a WARNING as the simulation ends it ("Manually
# terminating ClientAppActor"), which Ray forwarded, in colour, to the end of every run's output. Errors still show.
SIM_DEFAULTS = {"FLWR_LOG_LEVEL": "ERROR"}

StepDone = Callable[[str, float], None]  # a step done and its seconds, as ``progress.said_step`` takes them


def shard_spec(spec: RunSpec) -> ShardSpec:
    d = spec.data
    try:
        entries = FeatureStore(d.store, create=False).find(d.dataset, "train", d.backbones[0])
    except EntryNotFoundError as exc:  # a name fedcache cannot extract is not advised to be extracted
        raise unextractable(exc) or exc
    n_domains = len(newest(entries).attrs["domains"])
    return ShardSpec(Path(d.store), d.dataset, list(d.backbones), partition_request(spec, n_domains),
                     method_class(spec.method.name).uses_views)


def flower_run(spec: RunSpec, shard_dir: Path, **extra) -> FlowerRun:
    return FlowerRun.from_spec(spec, shard_dir=str(shard_dir), **extra)


def train_flower_sim(spec: RunSpec, cpus: int | None = None, on_round: OnRound | None = None,
                     on_step: StepCallback | None = None) -> dict:
    """Shard into ``<out>/shards`` (a temporary directory without --out), simulate, return the summary; in a
    child process, which gets the spec as JSON and answers with the summary or the error as JSON.
    With --resume, the run in --out continues from its checkpoint on the shards already there.
    ``on_round(done, total, line)``: called here as ``fedcache.train`` calls it, as the child reports each round;
    ``on_step(text)``: as Flower and Ray start, and once the rounds are done, as they shut down (seconds each:
    the rounds of a small run take less); before those, the child's start and its shards, once done, where slow
    (``said_step``); all logged at INFO too."""
    import torch

    check_callback("on_round", on_round, "done", "total", "line")  # before the child starts, not at its first round
    check_callback("on_step", on_step, "text")
    _refuse_unsupported(spec)
    check_not_a_cell(spec.engine.out)
    e = spec.engine
    # The caller's thread count, as an in-process run would compute with (the command's --threads choice); the
    # caller as the holder of --out, which a refused command names: the process a user started, and can stop; the
    # caller's pid, the parent the child watches for (``_child``).
    ask = {"spec": spec.to_dict(), "cpus": cpus, "threads": torch.get_num_threads(), "holder": Holder.me().to_text(),
           "caller": os.getpid(),
           "engine": {"out": str(e.out) if e.out else None, "resume": e.resume, "keep_checkpoints": e.keep_checkpoints}}
    with tempfile.TemporaryDirectory(prefix="fedcache-flower-call-") as tmp:
        request, answer = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        progress = Progress(Path(tmp) / "progress.jsonl", on_round, on_step)
        ask["progress"] = str(progress.path)
        # The wall clock, not a monotonic one, whose readings other processes cannot compare: the child says how long
        # it took to start and import (seconds on a busy machine) from here.
        ask["started"] = time.time()
        disk.write_text(request, json.dumps(ask), "the Flower simulation's request")
        # Its own session: Ctrl-C reaches the caller only, which interrupts the child once (a second SIGINT would
        # break Flower's and Ray's shutdown half-way).
        child = subprocess.Popen([sys.executable, "-m", "fedcache.flower.sim", str(request), str(answer)],
                                 env={**SIM_DEFAULTS, **os.environ, **SIM_ENV}, start_new_session=True)
        try:
            code = _wait(child, progress)
        except BaseException:  # interrupted here (Ctrl-C): the simulation must not outlive its caller
            _interrupt(child)
            raise
        if not answer.exists():
            raise FedcacheError(f"the Flower simulation's process ended (exit code {code}) without a result; "
                                "see the log above")
        reply = json.loads(answer.read_text())
    if "error" in reply:
        raise rebuilt(reply["kind"], reply["error"])
    return reply["summary"]


class Progress:
    """The rounds the simulation has finished and the steps it is taking, as the child reports them
    (``report_progress``): JSON lines appended to a file in the call's own directory, each read once whole and
    passed to ``on_round``, or logged and passed to ``on_step`` (a step done with its seconds: where slow)."""

    def __init__(self, path: Path, on_round: OnRound | None = None, on_step: StepCallback | None = None) -> None:
        self.path, self.on_round, self.on_step, self.read = path, on_round, on_step, 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.read)
                new = f.read()
        except FileNotFoundError:  # nothing reported yet
            return
        whole = new.rfind(b"\n") + 1  # a line the child is still writing is read at the next poll
        self.read += whole
        for raw in new[:whole].splitlines():
            try:
                r = json.loads(raw)
            except ValueError:  # progress only: the run's own answer says how it ended
                log.warning("a progress line of the Flower simulation could not be read; left out: %r", raw[:200])
                continue
            if "seconds" in r:  # decided here whether it is slow enough to say: every step is logged
                said_step(log, self.on_step, r["step"], r["seconds"])
            elif "step" in r:
                said_now(log, self.on_step, r["step"])  # logged here: the child logs warnings only
            elif self.on_round is not None:
                self.on_round(r["done"], r["total"], r["line"])


def report_progress(path: Path) -> tuple[OnRound, StepCallback, StepDone]:
    """The child's side of ``Progress``: (on_round, on_step, on_done), each call appended as one JSON line
    (never a pickle: plain data only)."""
    failed = False

    def report(record: dict) -> None:
        # Progress only: a line that cannot be written (a full disk under the call's temporary directory) must not
        # end the run, which says itself what stops it; said once, then no more lines (none torn: disk.append).
        nonlocal failed
        if failed or _ORPHANED.is_set():  # no one reads it: its caller is gone, and its terminal with it
            return
        try:
            disk.append(path, (json.dumps(record) + "\n").encode(), "the Flower simulation's progress")
        except (OSError, FedcacheError) as exc:
            failed = True
            log.warning("the Flower simulation's progress is no longer shown: %s", exc)

    def on_round(done: int, total: int, line: dict | None) -> None:
        report({"done": done, "total": total, "line": line})

    def on_done(text: str, seconds: float) -> None:
        report({"step": text, "seconds": seconds})

    return on_round, lambda text: report({"step": text}), on_done


def _wait(child: subprocess.Popen, progress: Progress, every: float = 0.2) -> int:
    """The child's exit code, passing on the rounds and steps it reports meanwhile (and those it reported just
    before it ended); once it has ended, for any reason, what is left of its group is ended with it (``_end_group``)."""
    while _wait_unreaped(child, every) == RUNNING:
        progress.poll()
    progress.poll()
    return _end_group(child)


def _interrupt(child: subprocess.Popen, grace: float = 60.0) -> int:
    """Interrupt the simulation as Ctrl-C would (Flower and Ray shut down, the run keeps its last checkpoint) unless
    it has ended, then ``_end_group``. SIGTERM would meet Ray's handler, which aborts the process in the middle of
    whatever it was doing. Not Popen.send_signal, which reaps a child that has ended (see ``_end_group``)."""
    if _wait_unreaped(child, 0) == RUNNING:
        os.kill(child.pid, signal.SIGINT)
    return _end_group(child, grace)


def _end_group(child: subprocess.Popen, grace: float = 0.0) -> int:
    """Once the simulation's process has ended (killed outright too: the OOM killer's likeliest pick), or after
    ``grace`` seconds, kill what is left of its process group, then reap it; its exit code. Ray's processes outlived
    it by a minute, and the caller's cleanup removed its temporary directory under them. Killed before the child is
    reaped: until then its pid, the group's id, cannot be a new process's, whose group the SIGKILL would reach; one
    reaped elsewhere is left alone for that reason. A second Ctrl-C while it waits still kills and reaps."""
    ended = RUNNING
    try:
        ended = _wait_unreaped(child, grace)
    finally:
        if ended != REAPED:
            with contextlib.suppress(ProcessLookupError):  # its whole group: Ray's processes too, not the child alone
                os.killpg(child.pid, signal.SIGKILL)
        code = child.wait()
    return code


RUNNING, ENDED, REAPED = "running", "ended", "reaped"  # what _wait_unreaped found


def _wait_unreaped(child: subprocess.Popen, timeout: float, every: float = 0.05) -> str:
    """Wait until ``child`` has ended (left a zombie: os.waitid's WNOWAIT) or ``timeout`` seconds have passed:
    ENDED or RUNNING, or REAPED where another wait reaped it (its pid no longer ours). Where os.waitid is missing,
    it is waited for as before, and reaped (ENDED)."""
    if not hasattr(os, "waitid"):
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            return RUNNING
        return ENDED
    deadline = time.monotonic() + timeout
    try:
        while os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() >= deadline:
                return RUNNING
            time.sleep(every)
    except ChildProcessError:
        return REAPED
    return ENDED


def rebuilt(kind: str, message: str) -> FedcacheError:
    """The child's error as the same class with the same message. Its constructor is not called: some take other
    arguments than the message (DamagedCheckpointError: a path and a problem), and the message is already made."""
    cls = getattr(errors, kind, FedcacheError)
    cls = cls if isinstance(cls, type) and issubclass(cls, FedcacheError) else FedcacheError
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


def train_flower_sim_here(spec: RunSpec, cpus: int | None = None, holder: Holder | None = None,
                          on_round: OnRound | None = None, on_step: StepCallback | None = None,
                          on_done: StepDone | None = None, scratch: Path | None = None) -> dict:
    """``train_flower_sim`` in this process, which Ray and Flower then change (see the module's docstring).
    ``holder``: the command recorded as holding --out (this process unless given: ``train_flower_sim``'s caller).
    ``on_round``: called from the ServerApp's thread; ``on_step``: as ``simulate`` calls it; ``on_done(text,
    seconds)``: the shards written (or checked, resumed), which took seconds before Ray started, with nothing said;
    by default ``said_step`` here (the child passes them to its caller, whose log has them). ``scratch``: where its
    temporary directory (without --out, every client's shard) is made; the child's is its caller's call directory,
    which the caller removes once the child has ended, killed outright too."""
    _refuse_unsupported(spec)
    for k, v in {**SIM_ENV, **SIM_DEFAULTS}.items():
        os.environ.setdefault(k, v)
    e = spec.engine
    # --out held while the simulation writes it (fedcache/ownership.py), as `train` holds it in-process.
    with tempfile.TemporaryDirectory(prefix="fedcache-flower-", dir=scratch) as tmp, owned(spec, holder):
        base = Path(e.out) if e.out else Path(tmp)
        shards, shard = base / "shards", shard_spec(spec)
        run, t0 = flower_run(spec, shards), time.perf_counter()
        if e.resume:
            _check_shards(shards, shard)
            if RunDir(base).finished():
                return _finished(run, shards, base, on_round)
            _check_server_shard(run, shards, base)
        else:
            _fresh_start(base, shards, shard)
        seconds = time.perf_counter() - t0
        done = (f"shards of the interrupted run checked in {seconds:.1f} s" if e.resume else
                f"shards written in {seconds:.1f} s: {count(shard.request.n_clients, 'client')} and the server")
        done += f" ({shards})" if e.out else ""  # a temporary directory's name tells its user nothing
        (on_done or (lambda text, s: said_step(log, on_step, text, s)))(done, seconds)
        paths = ServerPaths(shards / SERVER, base if e.out else None)
        return simulate(run, paths, shard.request.n_clients, Path(tmp) / "app", cpus,
                        resume=e.resume, keep_checkpoints=e.keep_checkpoints, on_round=on_round, on_step=on_step)


def _refuse_unsupported(spec: RunSpec) -> None:
    e = spec.engine
    given = ((("--validation", "validation=True"), spec.schedule.validation), (("--no-batch", "batched=False"), not e.batched),
             (("--overwrite", "overwrite=True"), e.overwrite), (("--track", "track"), bool(e.track)))
    unsupported = [named(*said) for said, on in given if on]
    if unsupported:
        engine = named("--engine flower-sim", "engine='flower-sim'")
        raise FedcacheError(f"{engine} does not support "
                            f"{', '.join(unsupported)}; drop {'them' if len(unsupported) > 1 else 'it'}")
    if e.resume and e.out is None:
        raise ConfigError(named("--resume continues the run in --out; give the --out of the interrupted run",
                                "resume=True continues the run in out; give the out of the interrupted run"))
    if e.resume:
        check_resumable(e.out)
    check_deployable(spec.method)  # before the shards are written and Ray is started, not after


def _fresh_start(base: Path, shards: Path, want: ShardSpec) -> None:
    """A run from round 0 in ``base``, which holds no started run (``owned`` refused one), but may hold what an
    attempt that never finished a round left: its config.json (and a round of rounds.jsonl), removed as in-process
    ``train`` rewrites them; its shards, written again from the store as it is now (no round used them, and they
    do not record which store they were cut from: reused, they could be another store's features).
    Shards are written under a temporary name and renamed once complete, so an interrupted sharding leaves nothing
    that passes for shards."""
    from fedcache.flower.server import ROUNDS  # flwr: imported once the simulation is under way

    RunDir(base).clear()
    (base / ROUNDS).unlink(missing_ok=True)
    if shards.exists():
        if any(shards.iterdir()) and not (shards / SERVER).is_dir():
            raise ConfigError(f"{shards} holds files that are not fedcache shards; move them, or choose another "
                              f"{named('--out', 'out')}")
        shutil.rmtree(shards)
    partial = shards.with_name(shards.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # an interrupted sharding's
    write_shards(want, partial)
    partial.rename(shards)


def _check_shards(shards: Path, want: ShardSpec) -> None:
    """A resumed run trains on the shards it started with; they must be of the partition asked for."""
    if not (shards / SERVER).is_dir():
        _not_an_in_process_run(shards.parent)
        raise ConfigError(f"{resume_named()}: {shards} holds no shards; start the run without {resume_named()}")
    _, info = open_shard(shards / SERVER)
    asked = {"dataset": want.dataset, "backbones": list(want.backbones), "request": want.request.to_dict()}
    had = {"dataset": info.dataset, "backbones": list(info.backbones), "request": info.request}
    if json.loads(json.dumps(had)) != json.loads(json.dumps(asked)):
        differ = [k for k in asked if json.loads(json.dumps(had[k])) != json.loads(json.dumps(asked[k]))]
        raise ConfigError(f"{resume_named()}: the shards in {shards} were made with other data or partition options "
                          f"({', '.join(differ)}); use the options of the interrupted run")
    _check_features(shards, info, want.store)


def _not_an_in_process_run(out: Path) -> None:
    """A run of the in-process engine has no shards: told to start without --resume, its user was then told the
    folder already holds a run (pass --resume), a loop. training._not_a_flower_run is the other way round."""
    if RunDir(out).made_by() == "in-process":
        resume = resume_named()
        raise ConfigError(f"{resume}: {out} holds a run of the in-process engine, which the Flower simulation cannot "
                          f"continue; resume it with {named('`fedcache train` without --engine', 'fedcache.train')} "
                          f"and {resume}, or start the simulation in another {named('--out', 'out')}")


def _finished(run: FlowerRun, shards: Path, out: Path, on_round: OnRound | None) -> dict:
    """A resume of a run that had finished all its rounds, as the in-process engine's: it trains nothing and shows the
    run's result (the rounds bar at its last round, its summary), for every method: one whose clients keep state on
    the nodes too, which no round needs now. Its settings are checked as any resume's; the files are left as they
    were, and Ray and Flower are not started (a minute on a small machine) to ask no node anything."""
    from fedcache.flower.server import check_resumed  # flwr: imported where a run needs it

    check_resumed(out, run, open_shard(shards / SERVER)[1], resume_named())
    log.info("the run in %s had finished all its rounds (%d): nothing to train", out, run.schedule.rounds)
    if on_round is not None:
        on_round(run.schedule.rounds, run.schedule.rounds, None)
    return RunDir(out).summary()


def _check_server_shard(run: FlowerRun, shards: Path, out: Path) -> None:
    """The server shard read, and a resume the ServerApp refuses refused, as the ServerApp would, but before Ray and
    Flower start (a minute on a small machine, whose noise came before the one line that mattered): a damaged shard
    is said at once, for every method. Only a method that may keep client state is built (the refusal it checks)."""
    data, _ = load_server(shards / SERVER)
    if may_keep_client_state(method_class(run.method.name)):
        refuse_resume_with_client_state(build_method(run, data), out, resume_named())


def _check_features(shards: Path, info: ShardInfo, store: Path) -> None:
    """The shards hold copies of the store's features: a run resumed on them after those features were extracted
    (or imported) again would finish on features the store no longer holds."""
    if not info.entries:
        log.warning("the shards in %s were cut by an older fedcache, which did not record the store entries they came "
                    "from: whether the features in %s changed since is not checked", shards, store)
        return
    changed = changed_since_cut(info, FeatureStore(store, create=False))
    if changed:
        raise ConfigError(f"{resume_named()}: the shards in {shards} were cut from other features than {store} holds now "
                          f"({changed}: extracted or imported again since?); the run would go on from features the "
                          f"store no longer holds: start it again without {resume_named()} in another "
                          f"{named('--out', 'out')}, which cuts its shards from the features as they are now")


def simulate(run: FlowerRun, paths: ServerPaths, n_clients: int, app_dir: Path, cpus: int | None = None,
             resume: bool = False, keep_checkpoints: str = "last", on_round: OnRound | None = None,
             on_step: StepCallback | None = None) -> dict:
    """Run ``run`` with ``n_clients`` virtual SuperNodes; returns the server's summary. ``on_step``: told as Flower
    and Ray start, and as they shut down once the rounds are done; each takes seconds, longer than the rounds of a
    small run, and the caller's rounds bar showed nothing meanwhile, then sat at its end."""
    said_now(log, on_step, f"starting Flower's simulation (Ray, {n_clients} virtual SuperNodes) ...")
    from flwr.app import Context, RecordDict
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    from fedcache.flower import client, server

    write_app(app_dir, run)
    summary: dict = {}

    def main(grid, context) -> None:  # keeps the summary in this process
        summary.update(server.serve(grid, run, paths, resume, keep_checkpoints, on_round=on_round))
        said_now(log, on_step, "rounds done; Flower and Ray shutting down ...")

    app = server.ServerApp()
    app.main()(main)
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus or min(2, os.cpu_count() or 1), "logging_level": "ERROR"}}
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run.to_config())
    _run_simulation(num_supernodes=n_clients, exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
                    client_app=client.app, server_app=app, backend_config=backend, app_dir=str(app_dir),
                    server_app_context=context, is_app=True)
    if not summary:
        raise FedcacheError("the Flower simulation ended without a result; see the log above for the ServerApp's error")
    return summary


def _child(request: Path, answer: Path, on_interrupt: _Interrupt | None = None) -> int:
    on_interrupt = on_interrupt or _Interrupt(threading.Event())
    signal.signal(signal.SIGINT, on_interrupt)  # its caller interrupts it so, even if it ignores Ctrl-C
    ask = json.loads(request.read_text())
    try:
        # Watched from here on (the interrupt it sends is caught below), for the caller the request names: a caller
        # killed while this process imported its modules had already left it to init, whose pid os.getppid() gives.
        on_orphaned(ask["caller"], lambda: _interrupt_then_end(request.parent, on_interrupt.over), every=0.2)
        try:
            reply = {"summary": _simulate_asked(ask, scratch=request.parent)}
        except FedcacheError as err:
            reply = {"error": str(err), "kind": type(err).__name__}
        # The run is over, and its answer is written whole: the orphan watcher's SIGINT, sent as the caller went,
        # raised outside this try, and the process left with a traceback and its call directory.
        on_interrupt.over.set()
    except KeyboardInterrupt:
        _end_interrupted(request.parent)
    code = _answer(answer, reply)
    if _ORPHANED.is_set():  # it ended as its caller went: no one reads the answer
        _end_orphaned(request.parent, code)
    return code


def _answer(answer: Path, reply: dict) -> int:
    # Whole or not at all: its caller reads an answer that exists, and one cut short by a full disk was a traceback.
    try:
        disk.write_text(answer, json.dumps(reply), "the Flower simulation's answer")
    except DiskFullError as err:  # the caller, finding no answer, points at this line
        log.error("%s", err)
        return 1
    return 0


def _simulate_asked(ask: dict, scratch: Path | None = None) -> dict:
    """``train_flower_sim_here`` as the request asks, in this process, its temporary directory in ``scratch``;
    the summary."""
    if ask.get("threads"):
        import torch

        torch.set_num_threads(ask["threads"])  # this process is the call's own: its ServerApp computes as its caller
    spec = RunSpec.from_dict(ask["spec"]).replace(engine="flower-sim", **ask["engine"])
    on_round, on_step, on_done = report_progress(Path(ask["progress"]))
    # This process started and imported its modules: seconds, with nothing said. Clamped: the wall clock may step back.
    seconds = max(0.0, time.time() - ask["started"])
    on_done(f"simulation process ready in {seconds:.1f} s (started, fedcache and torch imported)", seconds)
    return train_flower_sim_here(spec, ask["cpus"], holder=Holder.parse(ask.get("holder") or ""),
                                 on_round=on_round, on_step=on_step, on_done=on_done, scratch=scratch)


def _flower_logging() -> _Interrupt:
    """How the simulation's process (the call's own, never its caller's) shows Flower's log records; returns its
    SIGINT handler. Flower's own handler shows them, at its level (FLWR_LOG_LEVEL), and the root's handler no longer
    shows each again. Once interrupted, none: Ray ends its actors under Flower's waiting workers, and each logs the
    ActorDiedError it gets, with its traceback (tens of lines), noise of the interrupt and no error of the run;
    FEDCACHE_DEBUG=1 (errors.debugging) shows them."""
    flower = logging.getLogger("flwr")
    flower.propagate = False
    interrupted = threading.Event()
    if not errors.debugging():
        flower.addFilter(lambda record: not interrupted.is_set())
    return _Interrupt(interrupted)


class _Interrupt:
    """The simulation process's SIGINT handler: KeyboardInterrupt once, as the CLI's _interrupted (a second SIGINT,
    the caller's then the orphan watcher's, raised again in the middle of Flower's and Ray's shutdown, which the
    first had started); and again where Python dropped it (``rearm``)."""

    def __init__(self, interrupted: threading.Event) -> None:
        self.interrupted = interrupted
        self.over = threading.Event()  # the run is over: an interrupt changes nothing, its answer is written whole
        self._raised: KeyboardInterrupt | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self._raised is not None or self.over.is_set():
            return
        self._raised = KeyboardInterrupt()
        self.interrupted.set()
        raise self._raised

    def rearm(self, dropped: BaseException) -> int | None:
        """Raise again (``interrupts.RaisedAgain``): the interrupt it raised was ``dropped``, and the simulation
        trained on, deaf to its caller's Ctrl-C."""
        if self._raised is None or dropped is not self._raised:
            return None
        self._raised = None
        return signal.SIGINT


# Set once the caller is gone: no one else will end what is left of this process's group (the caller's _interrupt).
_ORPHANED = threading.Event()


def _end_interrupted(call_dir: Path) -> None:
    """Interrupted, the simulation has shut down and its --out and temporary directory are let go; but Flower's
    worker threads still wait for replies of Ray actors that are gone, and a normal exit joins them forever."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if _ORPHANED.is_set():
        _end_orphaned(call_dir, INTERRUPTED)
    os._exit(INTERRUPTED)


def _interrupt_then_end(call_dir: Path, over: threading.Event, grace: float = 10.0) -> None:
    """Its caller gone (killed outright), the simulation is interrupted as Ctrl-C would (Flower and Ray shut
    down, --out and the temporary directories let go), and ended with its process group if that has not ended it
    after ``grace`` seconds."""
    _ORPHANED.set()
    if not over.is_set():  # else nothing is left to interrupt
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(grace)
    _end_orphaned(call_dir, 1)


def _end_orphaned(call_dir: Path, code: int) -> None:
    """Its caller, killed outright, can neither remove its call directory (the request, the progress, this
    process's temporary directory) nor end what is left of this process's group: both done here, once the
    simulation has shut down (removed under it, the shards it still read were gone)."""
    shutil.rmtree(call_dir, ignore_errors=True)
    _end_own_group()
    os._exit(code)


def _end_own_group() -> None:
    """This process and what is left of its group killed, as its caller's ``_end_group`` would: Ray's agents,
    interrupted as Ray starts, outlived it by a minute. Only a group it leads (``train_flower_sim`` starts it in a
    session of its own): started otherwise, its group is its starter's (a shell's job, a test runner)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    log_to_stderr(logging.WARNING)
    _on_interrupt = _flower_logging()
    sys.unraisablehook = RaisedAgain(_on_interrupt.rearm)  # this process is the call's own
    sys.exit(_child(Path(sys.argv[1]), Path(sys.argv[2]), _on_interrupt))
