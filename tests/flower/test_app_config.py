"""The Flower App project and its run config: what `fedcache flower-app` writes, what the apps accept."""
import tomllib

import pytest

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.flower.config import FlowerRun, build_method
from fedcache.flower.project import FLWR_VERSION


def test_flower_app_names_the_generic_apps_and_the_run_config(tmp_path):
    assert main(["flower-app", str(tmp_path / "app")]) == 0
    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fedcache.flower.server:app", "clientapp": "fedcache.flower.client:app"}
    assert FlowerRun.from_config(app["config"]) == FlowerRun()
    assert f"flwr=={FLWR_VERSION}" in project["project"]["dependencies"]


def test_flwr_pin_matches_the_installed_flwr():
    from importlib.metadata import version

    assert version("flwr") == FLWR_VERSION


def test_run_config_is_typed_and_unknown_keys_are_named():
    run = FlowerRun.from_config({"method": "fedpcl", "rounds": 5, "min-clients": 2, "settings": "lr=0.01"})
    assert (run.method, run.rounds, run.min_clients) == ("fedpcl", 5, 2)
    with pytest.raises(ConfigError, match="unknown run config keys.*'round'"):
        FlowerRun.from_config({"round": 3})
    with pytest.raises(ConfigError, match="rounds=.*expected a int"):
        FlowerRun.from_config({"rounds": "many"})
    with pytest.raises(ConfigError, match="min-clients >= 1"):
        FlowerRun.from_config({"min-clients": 0})


def test_methods_that_pool_all_data_are_refused():
    from tests.federate.conftest import synthetic

    with pytest.raises(ConfigError, match="pools every client's data"):
        build_method(FlowerRun(method="centralized"), synthetic())
    assert build_method(FlowerRun(method="fedprox", settings="mu=0.5"), synthetic()).p.mu == 0.5


def test_server_side_prototype_anchors_are_refused():
    """FST-CBDG's prototype anchors average labelled rows of every client on the server: a deployment
    cannot do that, so it must say so instead of building anchors from whatever one machine holds."""
    from tests.federate.conftest import synthetic

    with pytest.raises(ConfigError, match="use anchors=text"):
        build_method(FlowerRun(method="fst-cbdg", settings="anchors=prototypes"), synthetic())
