"""Backbone specs and loaders, offline: user checkpoints, missing weights, prefixes, random marking."""
import pytest
import torch
import torchvision

from fedcache.errors import ConfigError, UnknownNameError, WeightsNotFoundError
from fedcache.extract.backbones import BACKBONES
from fedcache.extract.config import parse_weights
from fedcache.extract.loading import load_backbone

PAPER_BACKBONES = [
    "clip-rn50", "clip-rn101", "clip-vit-b32", "clip-vit-b16", "clip-vit-l14",
    "resnet18-imagenet", "resnet50-imagenet", "vit-tiny-imagenet", "vit-small-imagenet", "vit-base-imagenet",
    "vgg11-imagenet", "alexnet-imagenet", "resnet18-quickdraw", "resnet18-aircraft", "resnet18-birds",
    "efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2",
]


def test_every_backbone_the_papers_need_is_registered():
    missing = [n for n in PAPER_BACKBONES if n not in BACKBONES]
    assert not missing
    assert all(BACKBONES.get(n).has_text for n in PAPER_BACKBONES if n.startswith("clip-"))


def test_meta_dataset_resnet_without_checkpoint_names_what_is_expected():
    with pytest.raises(WeightsNotFoundError, match=r"QuickDraw.*--weights resnet18-quickdraw=PATH"):
        load_backbone("resnet18-quickdraw")


def test_meta_dataset_resnet_loads_a_user_checkpoint(tmp_path):
    net = torchvision.models.resnet18(weights=None)
    ckpt = tmp_path / "quickdraw.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, ckpt)
    bb = load_backbone("resnet18-quickdraw", checkpoint=ckpt)
    assert not bb.spec.random_weights and bb.embed_dim == 512
    x = torch.randn(2, 3, 64, 64)
    net.fc = torch.nn.Identity()
    with torch.inference_mode():
        out = bb.image_encoder(x)
        expected = net.eval()(x)
    assert out.shape == (2, 512)
    torch.testing.assert_close(out, expected)  # the user's weights, not a fresh init


def test_checkpoint_that_does_not_fit_is_refused(tmp_path):
    ckpt = tmp_path / "wrong.pth"
    torch.save({"conv.weight": torch.zeros(3, 3)}, ckpt)
    with pytest.raises(WeightsNotFoundError, match="not a torchvision-style resnet18"):
        load_backbone("resnet18-birds", checkpoint=ckpt)


class Evil:
    """Anything that is not a tensor: torch.load(weights_only=True) must refuse to build it."""


def test_pickled_objects_in_a_checkpoint_are_refused(tmp_path):
    ckpt = tmp_path / "evil.pth"
    torch.save({"w": Evil()}, ckpt)
    with pytest.raises(WeightsNotFoundError, match="weights_only"):
        load_backbone("resnet18-birds", checkpoint=ckpt)


def test_hub_weights_without_network_fail_with_a_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsNotFoundError, match=r"--weights resnet18-imagenet=PATH"):
        load_backbone("resnet18-imagenet")


def test_timm_checkpoint_path_loads_without_the_hub(tmp_path):
    import timm

    model = timm.create_model("test_resnet", pretrained=False, num_classes=10)
    ckpt = tmp_path / "m.safetensors"
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(ckpt))
    bb = load_backbone("tiny-timm-random", checkpoint=ckpt)  # classifier weights are dropped
    assert bb.weights_hash != load_backbone("tiny-timm-random").weights_hash
    assert not bb.spec.random_weights


def test_prefix_backbones_resolve_specs_offline():
    spec = BACKBONES.get("timm:test_vit")
    assert spec.source == "timm" and spec.embed_dim > 0 and spec.input_size > 0
    assert spec.fixed_size  # a ViT's positional embeddings fix its input size (timm's fixed_input_size)
    assert not BACKBONES.get("timm:test_resnet").fixed_size
    spec = BACKBONES.get("open_clip:ViT-B-32/laion2b_s34b_b79k")
    assert spec.has_text and spec.embed_dim == 512 and spec.weights == "laion2b_s34b_b79k" and spec.fixed_size
    with pytest.raises(WeightsNotFoundError, match="no architecture"):
        BACKBONES.get("open_clip:NoSuchNet/x")


@pytest.mark.slow
def test_random_init_is_marked_and_deterministic():
    a = load_backbone("clip-rn50", random_init=True)
    b = load_backbone("clip-rn50", random_init=True)
    assert a.spec.random_weights and a.weights_hash == b.weights_hash and a.embed_dim == 1024
    texts = a.encode_text(["a photo of a zero.", "a photo of a one."])
    assert texts.shape == (2, 1024)


def test_parse_weights():
    assert parse_weights(["resnet18-birds=/x/y.pth"])["resnet18-birds"].name == "y.pth"
    with pytest.raises(ConfigError, match="NAME=PATH"):
        parse_weights(["resnet18-birds"])
    with pytest.raises(UnknownNameError):
        parse_weights(["resnet18-bird=/x.pth"])
    with pytest.raises(ConfigError, match="no such file"):
        load_backbone("resnet18-birds", checkpoint="/nonexistent.pth")


@pytest.mark.parametrize("name,random_init", [("efficientnet-lite0", False), ("alexnet-imagenet", True),
                                              ("resnet18-quickdraw", True)])
def test_loading_a_backbone_leaves_the_callers_torch_generator_alone_and_random_weights_repeat(name, random_init):
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a = load_backbone(name, random_init=random_init)
    assert torch.equal(torch.get_rng_state(), before)
    assert load_backbone(name, random_init=random_init).weights_hash == a.weights_hash


@pytest.mark.parametrize("content", [b"root:x:0:0:root:/root:/bin/bash\n", b"hello", b""])
def test_a_file_that_is_no_checkpoint_is_said_to_be_none(tmp_path, content):
    """torch.load's words for a text file were "list index out of range", "101" or nothing (EOFError)."""
    ckpt = tmp_path / "notes.pth"
    ckpt.write_bytes(content)
    with pytest.raises(WeightsNotFoundError, match=r"notes.pth is not a checkpoint: torch.save writes a zip archive"):
        load_backbone("resnet18-birds", checkpoint=ckpt)
