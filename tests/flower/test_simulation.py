"""`fedcache train --engine flower-sim`: Flower's simulation engine gives the in-process numbers."""
import json

import pytest
import torch

from fedcache.cli import main
from fedcache.errors import FedcacheError
from fedcache.federate.train import train
from fedcache.flower.server import SERVER_STATE
from fedcache.flower.sim import train_flower_sim

from .conftest import BACKBONE, assert_same_run, toy_config


@pytest.mark.slow
def test_cli_flower_sim_fedavg_equals_in_process(flower_store, tmp_path, capsys):
    out = tmp_path / "sim"
    code = main(["train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg",
                 "--partition", "dirichlet", "--alpha", "1.0", "--clients", "3", "--rounds", "3", "--seed", "1",
                 "--eval-every", "3", "--engine", "flower-sim", "--out", str(out)])
    assert code == 0 and "Flower simulation" in capsys.readouterr().out
    flower = json.loads((out / "summary.json").read_text())
    state = torch.load(out / SERVER_STATE, weights_only=True)
    assert_same_run(flower, state, train(toy_config(flower_store)))
    assert (out / "shards" / "client-002").is_dir() and flower["engine"] == "flower" and flower["dropped"] == {}


@pytest.mark.slow
def test_flower_sim_fedpcl_equals_in_process(flower_store, tmp_path):
    cfg = toy_config(flower_store, "fedpcl", out=tmp_path / "pcl")
    flower = train_flower_sim(cfg, cpus=1)
    state = torch.load(cfg.engine.out / SERVER_STATE, weights_only=True)
    assert_same_run(flower, state, train(toy_config(flower_store, "fedpcl")))


def test_flower_sim_refuses_what_it_cannot_do(flower_store):
    with pytest.raises(FedcacheError, match="--resume"):
        train_flower_sim(toy_config(flower_store, resume=True))


def test_unknown_engine_is_a_bad_parameter(flower_store, capsys):
    assert main(["train", "--store", str(flower_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg",
                 "--engine", "grpc"]) == 2
    assert "--engine" in capsys.readouterr().err
