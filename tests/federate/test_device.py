"""Rounds on the device a run names (``--device``): the CPU path is today's, bit for bit; on a GPU every method
runs with its features, partitions and states there, a stack equals its runs, and reproducibility is measured
(which methods repeat bit for bit on the GPU, which only to float rounding)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from fedcache.federate import driver
from fedcache.federate.driver import Run
from fedcache.federate.inprocess import RunConfig, run, run_one
from fedcache.federate.methods import METHODS
from fedcache.federate.schedule import Schedule
from fedcache.federate.stacked import Stacked

from .test_methods import NEEDS_CLIP, make

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PLAIN = [n for n in METHODS.names() if n not in NEEDS_CLIP]


def test_a_run_inside_a_cpu_device_context_is_today_s_run_bit_for_bit(skewed):
    """The device context and the host-built index tensors change nothing on the CPU."""
    plain = run(make("fedproto", skewed), RunConfig(rounds=3, fraction=0.6))
    with torch.device("cpu"):
        placed = run(make("fedproto", skewed), RunConfig(rounds=3, fraction=0.6))
    assert placed.history == plain.history
    assert all(torch.equal(placed.clients[n], plain.clients[n]) for n in plain.clients)


def test_the_device_is_recorded_and_a_bad_one_is_refused(tmp_path):
    from fedcache.errors import ConfigError, DeviceError
    from fedcache.spec import RunSpec
    from fedcache.training import run_device

    with pytest.raises(ConfigError, match=r"--device \(engine.device\)='gpu': must be auto, cpu, cuda, cuda:N or mps"):
        RunSpec.of(dataset="d", backbones="b", method="fedavg", device="gpu")
    assert run_device("cpu") == torch.device("cpu")
    assert run_device("auto").type == ("cuda" if torch.cuda.is_available() else run_device("auto").type)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA GPU is visible; use --device cpu or auto"):
            run_device("cuda")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("device") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0))
    return path


def test_train_records_the_device_in_config_and_summary(store, tmp_path):
    from fedcache.spec import RunSpec
    from fedcache.training import train

    spec = RunSpec.of(store=store, dataset="test-toy", backbones="tiny-timm-random", method="fedavg", rounds=2,
                      device="cpu", out=tmp_path / "r")
    result = train(spec)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["device"] == "cpu"
    assert result.summary["device"] == "cpu"


# ---- on a GPU -------------------------------------------------------------------------------------
def _on(device: str, name: str, data, rounds: int = 3, fraction: float = 0.6, seed: int = 0):
    with torch.device(device):
        m = make(name, data.to(torch.device(device)), seed=seed)
        return run(m, RunConfig(rounds=rounds, fraction=fraction))


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("name", PLAIN)
def test_every_method_runs_on_the_gpu_and_agrees_with_the_cpu(name, skewed):
    cpu, gpu = _on("cpu", name, skewed), _on("cuda", name, skewed)
    assert all(t.device.type == "cuda" for t in gpu.server.values())
    assert gpu.summary["rounds"] == cpu.summary["rounds"] and gpu.summary["bytes_up"] == cpu.summary["bytes_up"]
    # Different kernels round differently; after three rounds the accuracies stay within a few test rows.
    assert abs(gpu.summary["mean_accuracy"] - cpu.summary["mean_accuracy"]) < 15, (gpu.summary, cpu.summary)


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedproto", "fedpcl", "fst-cbdg"])
def test_a_stack_on_the_gpu_computes_what_its_runs_compute_alone(name, skewed):
    with torch.device("cuda"):
        data = skewed.to(torch.device("cuda"))
        runs = [Run(make(name, data, head="projection" if name == "fedpcl" else None, seed=s), Schedule(rounds=3))
                for s in (0, 1)]
        stacked = driver.run(runs, Stacked(runs))
        for r, got in zip(runs, stacked):
            alone = run_one(Run(type(r.method)(dataclasses.replace(r.method.ctx), r.method.p), r.schedule))
            for n in alone.server:
                torch.testing.assert_close(got.server[n], alone.server[n], rtol=1e-4, atol=1e-5)


@CUDA
@pytest.mark.gpu
def test_gpu_reproducibility_of_every_method(skewed, record_property):
    """Same seed twice on the GPU: every method repeats bit for bit, as docs/performance.md states (recorded too)."""
    exact = {}
    for name in PLAIN:
        a, b = _on("cuda", name, skewed), _on("cuda", name, skewed)
        exact[name] = all(torch.equal(a.server[n], b.server[n]) for n in a.server) and a.history == b.history
    record_property("bit_reproducible", json.dumps(exact))
    print("GPU_REPRODUCIBLE", json.dumps(exact))
    assert all(exact.values()), f"not bit for bit on this GPU: {[n for n, same in exact.items() if not same]}"
