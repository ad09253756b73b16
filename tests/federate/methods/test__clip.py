"""What the CLIP-feature methods (clip-zs, clip-fc-centralized, fst-cbdg) share (fedcache/federate/methods/_clip.py):
test_methods.py's checks with a stand-in text tower, the errors without text, and prototype anchors."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcache.errors import ConfigError
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods._clip import prototype_anchors, unit

from .. import test_methods as generic
from ..conftest import HELD, synthetic
from .clip_problem import CLIP_METHODS, accuracy, make


@pytest.mark.parametrize("name", CLIP_METHODS)
def test_generic_method_checks_with_a_text_tower(name):
    """test_methods.py's checks on its problem, with class directions standing in for the text tower."""
    data = synthetic(per_client=120)  # the skewed problem of conftest.py
    for k in range(data.n_clients):
        held = (k + np.arange(HELD)) % data.n_classes
        data.client_train[k] = data.client_train[k][np.isin(data.y_train[data.client_train[k]].numpy(), held)]
        data.client_test[k] = data.client_test[k][np.isin(data.y_test[data.client_test[k]].numpy(), held)]
    data.info["text"] = F.normalize(F.one_hot(data.y_train).float().T @ unit(data.x_train), dim=-1)
    generic.test_method_learns_deterministically_and_counts_bytes(name, data)


# ---- anchors, text and errors ------------------------------------------------------------------------
def test_prototype_anchors_need_no_text(iid):
    data = dataclasses.replace(iid, info={})
    every = prototype_anchors(data, 10**6, 0)  # every held row: the unit mean of unit features per class
    held = np.concatenate(data.client_train)
    y = data.y_train[held]
    want = torch.stack([unit(unit(data.x_train[held][y == c]).mean(0)) for c in range(data.n_classes)])
    torch.testing.assert_close(every, want)
    assert accuracy("fst-cbdg", data, anchors="prototypes") > 90  # image-space anchors carry no text bias


def test_clear_errors_without_text(iid):
    bare = dataclasses.replace(iid, info={})
    for name in CLIP_METHODS:
        with pytest.raises(ConfigError, match="needs a backbone with a text tower, e.g. clip-rn50"):
            make(name, bare)
    make("clip-fc-centralized", bare, init="random")  # the random-init probe needs no text
    wrong = dataclasses.replace(iid, info={"text": torch.randn(iid.n_classes, 7)})
    with pytest.raises(ConfigError, match="use the backbone the text was extracted with"):
        make("fst-cbdg", wrong)
    only_single = dataclasses.replace(iid, info={"text_sets": {"single": iid.info["text"]}})
    with pytest.raises(ConfigError, match="no 'ensemble' text embeddings"):
        make("clip-zs", only_single, templates="ensemble")
    with pytest.raises(ConfigError, match="linear classifier"):
        METHODS.get("fst-cbdg")(MethodContext(iid, "mlp"))
    with pytest.raises(ConfigError, match="beta"):
        make("fst-cbdg", iid, beta=1.5)
