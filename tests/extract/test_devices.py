"""extract's device and precision (fedcache/extract/devices.py), MPS included, with the GPUs' availability
monkeypatched: no Apple GPU here, and the plan is what is tested, not a forward pass on it."""
from __future__ import annotations

import pytest
import torch

from fedcache.errors import ConfigError, DeviceError
from fedcache.extract.devices import plan_device


def _answer(value: bool):
    def answer(*args, **kwargs) -> bool:
        return value
    # torch._dynamo, which a backbone may import while the patch holds, reads the __wrapped__ of torch's own.
    answer.__wrapped__ = answer
    return answer


@pytest.fixture
def gpus(monkeypatch):
    def have(cuda: bool = False, mps: bool = False) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", _answer(cuda))
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", _answer(True))
        monkeypatch.setattr(torch.backends.mps, "is_available", _answer(mps))
    return have


def test_auto_takes_cuda_else_mps_else_the_cpu_and_says_which(gpus):
    gpus(cuda=True, mps=True)
    plan = plan_device("auto")
    assert plan.device.type == "cuda" and plan.autocast_dtype == torch.bfloat16 and plan.note == "using the GPU"
    gpus(mps=True)
    plan = plan_device("auto")
    assert plan.device.type == "mps" and "mps" in plan.note and not plan.channels_last
    gpus()
    plan = plan_device("auto")
    assert plan.device.type == "cpu" and plan.note == "no CUDA GPU found; extracting on the CPU"


def test_mps_runs_fp32_unless_fp16_is_asked_for(gpus):
    gpus(mps=True)
    assert plan_device("mps").autocast_dtype is None
    assert plan_device("mps", "fp32").autocast_dtype is None
    assert plan_device("mps", "fp16").autocast_dtype == torch.float16
    with pytest.raises(ConfigError, match="--precision bf16 is not supported on MPS; use --precision fp16 or fp32"):
        plan_device("mps", "bf16")


def test_mps_without_an_apple_gpu_is_a_clear_error(gpus):
    gpus(cuda=True)
    with pytest.raises(DeviceError, match="--device mps was requested but this torch sees no Apple GPU.*--device cpu"):
        plan_device("mps")


@pytest.mark.parametrize("request_", ["metal", "cuda:", "mps:0", "gpu"])
def test_a_device_that_is_no_device_names_the_choices(gpus, request_):
    gpus(mps=True)
    with pytest.raises(ConfigError, match="auto, cpu, cuda, cuda:N or mps"):
        plan_device(request_)


def test_extract_says_when_mps_is_not_there(capsys, store_path, gpus):
    from fedcache.cli import main

    gpus()
    assert main(["extract", "-d", "test-toy", "-b", "tiny-timm-random", "--store", str(store_path), "--device", "mps"]) == 1
    assert "this torch sees no Apple GPU (MPS); use --device cpu" in capsys.readouterr().err
