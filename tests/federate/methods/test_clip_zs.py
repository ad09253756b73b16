"""clip-zs: CLIP's zero-shot classifier, the scaled cosines of the chosen template set's text embeddings."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods._clip import unit

from .clip_problem import make


def test_clip_zs_scores_are_scaled_cosines_of_the_chosen_template_set(iid):
    other = F.normalize(torch.randn_like(iid.info["text"]), dim=-1)
    data = dataclasses.replace(iid, info={"text_sets": {"single": iid.info["text"], "ensemble": other}})
    m = make("clip-zs", data, templates="ensemble")
    got = m.global_logits(m.init_server(), data.x_test[:5])
    torch.testing.assert_close(got, 100 * unit(data.x_test[:5]) @ other.T)
    r = run(m, RunConfig(rounds=1)).summary
    assert r["bytes_up"] == r["bytes_down"] == 0
