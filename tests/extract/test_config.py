"""extract's settings (fedcache/extract/config.py): declared once, parsed and checked once, alike from the
command line's text and from Python."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedcache.errors import ConfigError
from fedcache.extract.config import ExtractConfig, extract_config, options
from fedcache.store.parts import Part


def test_text_and_python_values_give_the_same_settings():
    as_text = extract_config(dataset="d", backbones="a,b", splits="train", domains="x,y", part="1/4",
                             image_noise="gaussian,0.05,0.1", weights=["resnet18-birds=/w.pth"], batch_size="8")
    as_python = extract_config(dataset="d", backbones=["a", "b"], splits=("train",), domains=["x", "y"], part=Part(1, 4),
                               image_noise=("gaussian", 0.05, 0.1), weights={"resnet18-birds": Path("/w.pth")},
                               batch_size=8)
    assert as_text == as_python
    assert as_text.backbones == ("a", "b") and as_text.part == Part(1, 4) and as_text.image_noise == ("gaussian", 0.05, 0.1)


@pytest.mark.parametrize("given, said", [
    (dict(batch_size=0), "--batch-size=0: must be >= 1"),
    (dict(test_fraction=1.0), "--test-fraction=1.0: must be in (0, 1)"),
    (dict(dtype="float64"), "--dtype='float64': must be one of float16, float32"),
    (dict(precision="fp8"), "--precision='fp8': must be one of auto, fp32, bf16, fp16"),
    (dict(view_recipe="simclr2"), "--view-recipe='simclr2': must be one of simclr, simclr-noflip"),
    (dict(image_noise="uniform,1,0.5"), "--image-noise='uniform': must be one of gaussian, laplace"),
    (dict(image_noise="gaussian,1"), "--image-noise='gaussian,1': expected 3 comma-separated values"),
    (dict(part="2/2"), "--part='2/2': expected i/n, the i-th of n parts"),
    (dict(weights=["resnet18-birds"]), "--weights: expected NAME=PATH (e.g. resnet18-quickdraw=ckpt/quickdraw.pth), got 'resnet18-birds'"),
    (dict(backbones=""), "--backbones needs at least one name"),
    (dict(chunk_rows="100"), "--chunk-rows=100: must be a multiple of --batch-size (64)"),
    (dict(colour="red"), "unknown option(s) colour"),
    (dict(split="train"), "unknown option(s) split (did you mean 'splits'?); known: "),
])
def test_a_bad_value_is_one_message_naming_its_flag(given, said):
    with pytest.raises(ConfigError) as exc:
        extract_config(**{"dataset": "d", "backbones": "a", **given})
    assert said in str(exc.value)


def test_built_in_python_the_settings_are_checked_too():
    """ExtractConfig itself checks its fields when built (the runner no longer does), lists taken as tuples."""
    assert ExtractConfig(dataset="d", backbones=["a"], store=Path("s")).backbones == ("a",)
    with pytest.raises(ConfigError, match="--workers=-1: must be >= 0"):
        ExtractConfig(dataset="d", backbones=["a"], workers=-1)


def test_the_help_names_the_recipes_and_noise_kinds_the_registries_hold():
    """The help texts name them as text, so that --help imports no torch."""
    from fedcache.extract.transforms import AUGMENTATIONS
    from fedcache.noise import KINDS

    helps = {o.name: o.help for o in options()}
    assert f"({', '.join(AUGMENTATIONS.names())})" in helps["view_recipe"]
    assert f"({'|'.join(KINDS)})" in helps["image_noise"]
