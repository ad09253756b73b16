"""The Flower App project and its run config: what `fedcache flower-app` writes, what the apps accept."""
import tomllib

import pytest
import tomli_w

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.flower.config import FlowerRun, build_method
from fedcache.flower.project import FLWR_VERSION


def test_flower_app_names_the_generic_apps_and_the_run_config(tmp_path):
    assert main(["flower-app", str(tmp_path / "app")]) == 0
    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fedcache.flower.server:app", "clientapp": "fedcache.flower.client:app"}
    flat = {f"{section}.{k}": v for section, values in app["config"].items() for k, v in values.items()}
    assert FlowerRun.from_config(flat) == FlowerRun()
    assert app["config"]["schedule"]["rounds"] == 50 and app["config"]["deploy"]["min_clients"] == 1
    assert f"flwr=={FLWR_VERSION}" in project["project"]["dependencies"]


def test_flwr_pin_matches_the_installed_flwr():
    from importlib.metadata import version

    assert version("flwr") == FLWR_VERSION


def test_run_config_is_typed_and_unknown_keys_are_named():
    run = FlowerRun.from_config({"method.name": "fedpcl", "schedule.rounds": 5, "deploy.min_clients": 2,
                                 "method.settings": "lr=0.01"})
    assert (run.method.name, run.schedule.rounds, run.deploy.min_clients) == ("fedpcl", 5, 2)
    assert run.optim.lr == 0.01
    with pytest.raises(ConfigError, match="unknown run config keys.*'schedule.round'"):
        FlowerRun.from_config({"schedule.round": 3})
    with pytest.raises(ConfigError, match=r"schedule.rounds\)='many': expected an integer"):
        FlowerRun.from_config({"schedule.rounds": "many"})
    with pytest.raises(ConfigError, match=r"schedule.fraction\)=0.0: must be in \(0, 1\]"):
        FlowerRun.from_config({"schedule.fraction": 0.0})
    with pytest.raises(ConfigError, match="min_clients=0: must be >= 1"):
        FlowerRun.from_config({"deploy.min_clients": 0})
    with pytest.raises(ConfigError, match="validation"):
        FlowerRun.of(validation=True)  # the apps score on the shards' test split only


def test_run_config_round_trips_and_holds_the_train_options_sections():
    """The Flower run config is the run spec's method, optim, head and schedule sections, flattened to
    ``section.field`` plain values, plus ``deploy.*``; it reads back to the same run."""
    from fedcache.spec import RunSpec, options

    spec = RunSpec.of(dataset="d", backbones="b", method="fedprox", settings=["mu=0.5", "optim.momentum=0.5"],
                      preset="fst-cbdg", head="mlp", rounds=4, fraction=0.5, local_epochs=2, batch_size=8, seed=3)
    run = FlowerRun.from_spec(spec, min_clients=2, shard_dir="/tmp/x")
    config = run.to_config()
    assert all(isinstance(v, (str, int, float, bool)) for v in config.values())
    assert {k for k in config if not k.startswith("deploy.")} == {o.key for o in options("method", "optim", "head", "schedule")
                                                                  if o.opt.recorded} | {"method.settings"}
    assert FlowerRun.from_config(config) == run
    assert (run.method, run.optim, run.head, run.schedule) == (spec.method, spec.optim, spec.head, spec.schedule)
    flwr_config = pytest.importorskip("flwr.common.config")  # as `flwr run` reads a Flower App's pyproject.toml
    nested = flwr_config.unflatten_dict(config)
    assert FlowerRun.from_config(flwr_config.flatten_dict(tomllib.loads(tomli_w.dumps(nested)))) == run


def test_methods_that_pool_all_data_are_refused():
    from tests.federate.conftest import synthetic

    with pytest.raises(ConfigError, match="pools every client's data"):
        build_method(FlowerRun.of(method="centralized"), synthetic())
    assert build_method(FlowerRun.of(method="fedprox", settings="mu=0.5"), synthetic()).p.mu == 0.5


def test_server_side_prototype_anchors_are_refused():
    """FST-CBDG's prototype anchors average labelled rows of every client on the server: a deployment
    cannot do that, so it must say so instead of building anchors from whatever one machine holds."""
    from tests.federate.conftest import synthetic

    with pytest.raises(ConfigError, match="use anchors=text"):
        build_method(FlowerRun.of(method="fst-cbdg", settings="anchors=prototypes"), synthetic())


def test_flwr_run_overrides_reach_the_apps_as_the_run(tmp_path):
    """`flwr run --run-config` as LocalDeployment writes it, parsed and fused with the app's default config
    the way Flower does it, reads back to the run that was asked for."""
    from flwr.common.config import fuse_dicts, get_fused_config_from_dir, parse_config_args

    from fedcache.flower.local import LocalDeployment
    from fedcache.flower.project import write_app

    write_app(tmp_path / "app")
    run = FlowerRun.of(method="fedproto", settings="local_protos=last-epoch optim.lr=0.01", rounds=4, fraction=0.5,
                       min_clients=2, rejoin_wait=5.0)
    argv = LocalDeployment(tmp_path, []).flwr_run_command(tmp_path / "app", run)
    overrides = parse_config_args([argv[argv.index("--run-config") + 1]])
    assert FlowerRun.from_config(get_fused_config_from_dir(tmp_path / "app", overrides)) == run
    assert fuse_dicts(overrides, {}) == run.to_config()


@pytest.mark.parametrize("method", ["fedpcl", "fedproto", "pfedme"])
def test_the_apps_defaults_leave_a_named_method_its_own_preset_and_head(tmp_path, method):
    """`flwr run APP CONN --run-config 'method.name="fedpcl"'` (deploy.md's example) on the App `fedcache
    flower-app` writes: the App's defaults held fedavg's preset and head, which then overrode the method's own
    (FedPCL and FedProto refused the linear head; pFedMe trained silently with the wrong optimizer)."""
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    assert main(["flower-app", str(tmp_path / "app")]) == 0
    overrides = parse_config_args([f'method.name="{method}" schedule.rounds=3'])
    run = FlowerRun.from_config(get_fused_config_from_dir(tmp_path / "app", overrides))
    assert run == FlowerRun.of(method=method, rounds=3)


def test_flower_app_keeps_another_projects_pyproject_and_rewrites_its_own(tmp_path, capsys):
    """`fedcache flower-app .` in a project directory replaced that project's own pyproject.toml without a word."""
    mine = '[project]\nname = "mine"\nversion = "1"\n'
    (tmp_path / "pyproject.toml").write_text(mine)
    assert main(["flower-app", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "pyproject.toml is not a fedcache Flower App's, and is kept; give `fedcache flower-app` a directory of its own" in err
    assert (tmp_path / "pyproject.toml").read_text() == mine
    assert main(["flower-app", str(tmp_path / "app")]) == 0 and main(["flower-app", str(tmp_path / "app")]) == 0


def test_a_pyproject_this_user_cannot_read_is_said_unreadable_not_someone_elses(tmp_path, monkeypatch, capsys):
    """An App directory whose pyproject.toml this user may not read was called "not a fedcache Flower App's": it may
    well be one; the refused read is the command's one line for it (root reads every file: the refusal is faked)."""
    from pathlib import Path

    assert main(["flower-app", str(tmp_path)]) == 0
    read = Path.read_text

    def refuse(self, *a, **kw):
        if self.name == "pyproject.toml":
            raise PermissionError(13, "Permission denied", str(self))
        return read(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", refuse)
    assert main(["flower-app", str(tmp_path)]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "no permission to" in err and "not a fedcache Flower App" not in err
