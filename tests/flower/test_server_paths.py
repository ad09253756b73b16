"""Where the ServerApp reads and writes is the SuperLink operator's setting (its environment), never
something a run config, which anyone reaching the SuperLink can submit, may name."""
import tomllib

import pytest
from flwr.app import Context, RecordDict

from fedcache.errors import ConfigError, FedcacheError
from fedcache.flower import server
from fedcache.flower.config import SERVER_ENV, FlowerRun, ServerPaths
from fedcache.flower.project import write_app
from fedcache.flower.shard import SERVER, write_shards
from fedcache.flower.sim import shard_spec

from .conftest import toy_config


@pytest.mark.parametrize("key, env", [("deploy.out", "FEDCACHE_FLOWER_RUNS"), ("deploy.server_shard", "FEDCACHE_FLOWER_SERVER_SHARD")])
def test_a_run_config_cannot_name_server_paths(key, env):
    with pytest.raises(ConfigError, match=f"paths on the server.*set {env}"):
        FlowerRun.from_config({"method.name": "fedavg", key: "/etc/cron.d"})


def test_the_flower_app_carries_no_server_path(tmp_path):
    config = tomllib.loads(write_app(tmp_path / "app").read_text())["tool"]["flwr"]["app"]["config"]
    assert not set(config) & set(SERVER_ENV)


def test_server_paths_come_from_the_environment(tmp_path):
    env = {SERVER_ENV["deploy.server_shard"]: str(tmp_path / "shards" / SERVER), SERVER_ENV["deploy.out"]: str(tmp_path / "runs")}
    assert ServerPaths.from_env(42, env) == ServerPaths(tmp_path / "shards" / SERVER, tmp_path / "runs" / "run-42")
    assert ServerPaths.from_env(42, {}) == ServerPaths(None, None)


class NoNodes:
    """A Grid with no SuperNode connected."""

    def get_node_ids(self):
        return []

    def get_nodes(self):
        return []


def _context(run_config: dict) -> Context:
    return Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


def test_the_serverapp_writes_where_the_operator_says(flower_store, tmp_path, monkeypatch):
    """The ServerApp entry point: paths from the SuperLink's environment; a run config naming one is refused
    before anything is created; without a server shard it says which variable to set. A run refused before its first
    round ended (too few clients) leaves nothing there."""
    write_shards(shard_spec(toy_config(flower_store)), tmp_path / "shards")
    monkeypatch.setenv(SERVER_ENV["deploy.out"], str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="paths on the server"):
        server.main(NoNodes(), _context({"deploy.out": str(tmp_path / "elsewhere")}))
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "runs").exists()
    with pytest.raises(FedcacheError, match=SERVER_ENV["deploy.server_shard"]):
        server.main(NoNodes(), _context({}))
    monkeypatch.setenv(SERVER_ENV["deploy.server_shard"], str(tmp_path / "shards" / SERVER))
    served, serve = [], server.serve
    monkeypatch.setattr(server, "serve", lambda grid, run, paths, **kw: served.append(paths) or serve(grid, run, paths, **kw))
    with pytest.raises(server.TooFewClientsError, match="only 0 of 3 clients"):
        server.main(NoNodes(), _context({"deploy.connect_timeout": 0.01}))
    assert served == [ServerPaths(tmp_path / "shards" / SERVER, tmp_path / "runs" / "run-7")]
    assert not (tmp_path / "runs").exists()


def test_a_second_serverapp_of_one_run_is_refused_while_the_first_writes(flower_store, tmp_path, monkeypatch):
    """A ServerApp left running by a stopped SuperLink and a resumed run of its id (deploy.resume_run) both wrote
    run-<id>/: the run directory is held while a ServerApp writes it."""
    import subprocess
    import sys

    from fedcache.errors import DirectoryBusyError

    write_shards(shard_spec(toy_config(flower_store)), tmp_path / "shards")
    monkeypatch.setenv(SERVER_ENV["deploy.out"], str(tmp_path / "runs"))
    monkeypatch.setenv(SERVER_ENV["deploy.server_shard"], str(tmp_path / "shards" / SERVER))
    first = subprocess.Popen([sys.executable, "-c", "import sys, time; from fedcache.ownership import hold\n"
                              "with hold(sys.argv[1], 'x'):\n    print('held', flush=True); time.sleep(60)",
                              str(tmp_path / "runs" / "run-7")], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryBusyError, match=r"run-7 is in use by another fedcache command.*other ServerApp"):
            server.main(NoNodes(), _context({"deploy.connect_timeout": 0.01}))
    finally:
        first.kill()
        first.wait()
    assert not (tmp_path / "runs" / "run-7" / "config.json").exists()


class Untouched:
    """A Grid that a refused run must never use."""

    def get_node_ids(self):
        raise AssertionError("a refused run config went on to ask for the nodes")

    get_nodes = get_node_ids


def test_a_refused_run_config_is_one_line_naming_the_key_and_starts_nothing(tmp_path, monkeypatch, caplog):
    """`flwr run ... --run-config "method.settings='lr=abc'"` streamed fedcache's whole call stack inside Flower's
    traceback, the key named only as `--set`; `flwr run` exits 0 whatever the ServerApp raises (Flower 1.41). The
    ServerApp logs one line naming the key and where to correct it, and raises it again with a traceback of its own
    frame only (Flower adds its few), before any node is asked or any directory made."""
    import logging
    import traceback

    monkeypatch.setenv(SERVER_ENV["deploy.out"], str(tmp_path / "runs"))
    with caplog.at_level(logging.ERROR, logger="fedcache"), pytest.raises(ConfigError) as err:
        server.main(Untouched(), _context({"method.settings": "lr=abc"}))
    line = str(err.value)
    assert line.startswith("run config refused: method.settings='lr=abc': ") and "flwr run --run-config" in line, line
    assert [r.getMessage() for r in caplog.records] == [f"fedcache: the run stopped: {line}"]
    assert [f.name for f in traceback.extract_tb(err.tb)] == ["test_a_refused_run_config_is_one_line_naming_the_key_and_starts_nothing", "main"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("config, key", [({"method.name": "fedavgg"}, "method.name='fedavgg': unknown method"),
                                         ({"method.name": "fedpcl", "head.name": "linear"}, "head.name='linear': fedpcl runs"),
                                         ({"method.settings": "lr"}, "method.settings='lr': --set expects key=value"),
                                         ({"schedule.rounds": 0}, "(schedule.rounds)=0: must be >= 1"),
                                         ({"deploy.min_clients": 0}, "refused: deploy.min_clients=0: must be >= 1")])
def test_a_refused_run_config_names_its_key(config, key):
    """Messages made for `fedcache train` name its options or only the value; a run config's name the key."""
    with pytest.raises(ConfigError, match="correct it in `flwr run --run-config`") as err:
        FlowerRun.from_config(config)
    assert str(err.value).startswith("run config refused: ") and key in str(err.value), str(err.value)


def test_server_paths_that_cannot_serve_are_refused_in_the_environment_s_words(tmp_path):
    """FEDCACHE_FLOWER_RUNS naming a file raised a bare NotADirectoryError through Flower's traceback (the
    ServerApp's one line is for FedcacheErrors), and a shard path naming a file advised `--store`."""
    afile = tmp_path / "afile"
    afile.write_text("")
    shard, runs = SERVER_ENV["deploy.server_shard"], SERVER_ENV["deploy.out"]
    with pytest.raises(ConfigError, match=rf"^{runs} .*run-7: .*afile is a file, so nothing can be made below it"):
        ServerPaths.from_env(7, {runs: str(afile)}).checked()
    for path, why in ((afile, "is a file"), (tmp_path / "missing", "does not exist")):
        with pytest.raises(ConfigError, match=rf"^{shard}={path} {why}; set it to the server/ directory `fedcache shard`"):
            ServerPaths.from_env(7, {shard: str(path)}).checked()
    (tmp_path / "server").mkdir()
    fine = ServerPaths.from_env(7, {shard: str(tmp_path / "server"), runs: str(tmp_path / "runs")})
    assert fine.checked() == fine and not (tmp_path / "runs").exists()  # checked, not made


def test_the_serverapp_checks_its_paths_before_it_serves(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv(SERVER_ENV["deploy.server_shard"], str(afile))
    with pytest.raises(ConfigError, match=rf"^{SERVER_ENV['deploy.server_shard']}=.*afile is a file"):
        server.main(NoNodes(), _context({}))


def test_deploy_resume_run_takes_the_run_id_as_flwr_ls_shows_it():
    """`flwr ls` shows a run id as a number; `--run-config deploy.resume_run=7` was refused as no text."""
    for given in (7, "7"):
        assert FlowerRun.from_config({"method.name": "fedavg", "deploy.resume_run": given}).deploy.resume_run == "7"
    with pytest.raises(ConfigError, match=r"deploy.resume_run=True: expected text"):
        FlowerRun.from_config({"method.name": "fedavg", "deploy.resume_run": True})


def test_only_a_deployment_without_a_runs_directory_is_warned_it_writes_nothing(flower_store, tmp_path, monkeypatch,
                                                                                caplog):
    """`fedcache train --engine flower-sim` without --out (asked to write nothing) was warned to set
    FEDCACHE_FLOWER_RUNS, a SuperLink's setting it has no use for."""
    import logging

    write_shards(shard_spec(toy_config(flower_store)), tmp_path / "shards")
    monkeypatch.setenv(SERVER_ENV["deploy.server_shard"], str(tmp_path / "shards" / SERVER))
    monkeypatch.delenv(SERVER_ENV["deploy.out"], raising=False)
    run = FlowerRun.from_config({"method.name": "fedavg", "deploy.connect_timeout": 0.01})
    with caplog.at_level(logging.WARNING, logger="fedcache"), pytest.raises(server.TooFewClientsError):
        server.serve(NoNodes(), run, ServerPaths(tmp_path / "shards" / SERVER, None))  # as the simulation calls it
    assert "FEDCACHE_FLOWER_RUNS" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="fedcache"), pytest.raises(server.TooFewClientsError):
        server.main(NoNodes(), _context({"deploy.connect_timeout": 0.01}))
    assert "FEDCACHE_FLOWER_RUNS is not set: this run's metrics and summary are written nowhere" in caplog.text
