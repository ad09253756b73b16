"""Hub weights: a cached file is used without asking the Hub, an unreachable Hub is said at once, and OpenAI's
CLIPs run the QuickGELU their weights were trained with."""
import socket

import pytest
import torch

from fedcache.errors import WeightsNotFoundError
from fedcache.extract.backbones import BACKBONES
from fedcache.extract.backbones import open_clip_models
from fedcache.extract.loading import load_backbone


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """An empty Hub cache and no host reachable; the Hub's own client must not be asked at all."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for proxy in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)

    def unreachable(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def asked(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", asked)
    monkeypatch.setattr(huggingface_hub.file_download, "hf_hub_download", asked)
    return tmp_path / "hub"


def _put_in_cache(hub, repo_id: str, filename: str, state: dict) -> None:
    from safetensors.torch import save_file

    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    save_file(state, str(repo / "snapshots" / ("0" * 40) / filename))


@pytest.mark.parametrize("name", ["resnet18-imagenet", "clip-rn50"])
def test_weights_not_cached_and_no_hub_fail_at_once_with_the_fix(no_network, name):
    with pytest.raises(WeightsNotFoundError) as err:
        load_backbone(name)
    assert "not in the Hugging Face cache and huggingface.co cannot be reached (Name or service not known)" in str(err.value)
    assert f"--weights {name}=PATH" in str(err.value)


def test_cached_timm_weights_load_without_the_hub(no_network):
    import timm

    model = timm.create_model("test_resnet", pretrained=False, num_classes=1000)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # not what a fresh init gives
    _put_in_cache(no_network, "timm/test_resnet.r160_in1k", "model.safetensors", model.state_dict())
    bb = load_backbone("timm:test_resnet.r160_in1k")
    loaded = dict(bb.image_encoder.state_dict())
    torch.testing.assert_close(loaded["conv1.0.weight"], model.state_dict()["conv1.0.weight"])


def test_openai_clips_run_quick_gelu_and_their_features_are_not_those_made_without(monkeypatch):
    from open_clip.transformer import QuickGELU

    bb = load_backbone("clip-rn50", random_init=True)
    assert any(isinstance(m, QuickGELU) for m in bb.model.modules())
    import open_clip

    for name in (n for n in BACKBONES.names() if n.startswith("clip-")):
        spec = BACKBONES.get(name)
        assert open_clip_models._quick_gelu(spec) == open_clip.get_pretrained_cfg(spec.arch, spec.weights)["quick_gelu"]
    assert not open_clip_models._quick_gelu(BACKBONES.get("open_clip:ViT-B-32/laion2b_s34b_b79k"))
    # the same tensors built with nn.GELU hash differently: features made before the fix are not reused
    from fedcache.extract.backbones.base import hash_state

    assert bb.weights_hash != hash_state(bb.model)


def test_a_quickgelu_architecture_keeps_its_features_key():
    """open_clip's `-quickgelu` architectures always ran QuickGELU: their entries were right and stay found."""
    from fedcache.extract.backbones.base import hash_state

    bb = load_backbone("open_clip:RN50-quickgelu/openai", random_init=True)
    assert bb.weights_hash == hash_state(bb.model)


def test_clip_from_the_hub_cache_is_given_as_a_file_with_its_quick_gelu(monkeypatch, no_network):
    import open_clip

    asked = {}

    def create_model(arch, pretrained=None, **kwargs):
        asked.update(arch=arch, pretrained=pretrained, **kwargs)
        raise RuntimeError("stop here.")

    monkeypatch.setattr(open_clip, "create_model", create_model)
    _put_in_cache(no_network, "timm/resnet50_clip.openai", "open_clip_model.safetensors", {"x": torch.zeros(1)})
    with pytest.raises(WeightsNotFoundError, match=r"RN50/openai: stop here\. Without network access"):
        load_backbone("clip-rn50")
    assert asked["arch"] == "RN50" and asked["force_quick_gelu"] is True
    assert asked["pretrained"].endswith("open_clip_model.safetensors")


def test_a_safetensors_file_beside_a_named_bin_is_taken_from_the_cache(monkeypatch, no_network):
    """ViTamin's tags name `pytorch_model.bin`; open_clip takes `pytorch_model.safetensors` first where it is."""
    import open_clip

    asked = {}
    monkeypatch.setattr(open_clip, "create_model", lambda arch, pretrained=None, **kw: asked.update(pretrained=pretrained) or 1 / 0)
    _put_in_cache(no_network, "jienengchen/ViTamin-S", "pytorch_model.safetensors", {"x": torch.zeros(1)})
    with pytest.raises(WeightsNotFoundError):
        load_backbone("open_clip:ViTamin-S/datacomp1b")
    assert asked["pretrained"].endswith("pytorch_model.safetensors")
    assert open_clip_models._hub_files("open_clip_pytorch_model.bin") == open_clip_models._HUB_FILES
    assert open_clip_models._hub_files("weights.npz") == ["weights.npz"]

