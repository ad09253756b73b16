"""atpfl: with mu = 0 it is tpfl; its contrastive terms (Eq. 4-5) by hand, with CLIP's temperature by default, over
the real rows only, and the previous prompt of a client that never trained."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.federate.inprocess import RunConfig, run

from .prompt_problem import make


def test_atpfl_with_mu_zero_is_tpfl(hidden):
    a = run(make("atpfl", hidden, mu=0.0), RunConfig(rounds=3, fraction=0.5))
    b = run(make("tpfl", hidden), RunConfig(rounds=3, fraction=0.5))
    assert a.server.keys() == b.server.keys() == {"ctx", "vprompt"}
    for n in a.server:
        assert torch.equal(a.server[n], b.server[n])
    assert a.summary["per_client_accuracy"] == b.summary["per_client_accuracy"]
    c = run(make("atpfl", hidden, mu=1.0), RunConfig(rounds=3, fraction=0.5))
    assert not torch.equal(c.server["ctx"], a.server["ctx"])  # the InfoNCE terms do change training


# ---- the contrastive terms ----------------------------------------------------------------------------------
def cosine_nce(z, pos, neg, tau):
    """ATPFL Eq. 4 written out: log(1 + exp((cos(z, neg) - cos(z, pos)) / tau)) per row."""
    return torch.log1p(torch.exp((F.cosine_similarity(z, neg, dim=-1) - F.cosine_similarity(z, pos, dim=-1)) / tau))


def atpfl_regulariser(m, clients, server, states, p, rows, mask=None):
    info = m.local_extra(clients, server, states)
    mask = torch.ones(*rows.shape, dtype=torch.bool) if mask is None else mask
    image, text = m.visual.train_features(p, rows, mask), m.text.encode(p["ctx"])
    return m.regulariser(p, rows, mask, image, text, info)


def test_atpfl_global_prompt_is_the_positive_and_previous_the_negative(hidden):
    """Eq. 4-5 by hand for clients that trained before: the global prompts' features are the positive,
    the client's previous prompts' the negative; a local prompt equal to the global one scores below
    log 2 per term, one equal to the previous prompt above."""
    m = make("atpfl", hidden, mu=0.5, tau=0.7)
    server = m.init_server()
    g = torch.Generator().manual_seed(3)
    prev = {n: t.expand(2, *t.shape[1:]) + 0.5 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    states = {**{"prev_" + n: t for n, t in prev.items()}, "trained": torch.ones(2, 1)}
    clients = [1, 3]
    rows = torch.from_numpy(np.stack([hidden.client_train[k][:5] for k in clients]))
    p = {n: t.expand(2, *t.shape[1:]) + 0.2 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    glob = {n: t.expand(2, *t.shape[1:]) for n, t in server.items()}
    with torch.no_grad():
        text, text_g, text_prev = (m.text.encode(q["ctx"]) for q in (p, glob, prev))
        image, image_g, image_prev = (m.visual.train_features(q, rows, torch.ones(rows.shape, dtype=torch.bool))
                                      for q in (p, glob, prev))
    want = 0.5 * (cosine_nce(text, text_g, text_prev, 0.7).mean(-1) + cosine_nce(image, image_g, image_prev, 0.7).mean(-1))
    torch.testing.assert_close(atpfl_regulariser(m, clients, server, states, p, rows), want)
    two_log_two = torch.full((2,), 0.5 * 2 * math.log(2))
    assert (atpfl_regulariser(m, clients, server, states, glob, rows) < two_log_two).all()
    assert (atpfl_regulariser(m, clients, server, states, prev, rows) > two_log_two).all()


def test_atpfl_default_temperature_is_clips_and_padding_rows_do_not_count(hidden):
    """tau=0 (default) is Eq. 2's Gamma, 1 / logit_scale; the image term averages over the real rows
    of the batch only (a client with fewer rows is padded in batched training)."""
    m = make("atpfl", hidden, mu=1.0)
    assert m.p.tau == 0 and abs(1.0 / m.scale - 1.0) > 0.1  # a wrong default (e.g. 1) would show
    server = m.init_server()
    g = torch.Generator().manual_seed(5)
    prev = {n: t.expand(2, *t.shape[1:]) + 0.5 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    states = {**{"prev_" + n: t for n, t in prev.items()}, "trained": torch.ones(2, 1)}
    clients = [0, 2]
    rows = torch.from_numpy(np.stack([hidden.client_train[k][:6] for k in clients]))
    mask = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    p = {n: t.expand(2, *t.shape[1:]) + 0.2 * torch.randn(2, *t.shape[1:], generator=g) for n, t in server.items()}
    glob = {n: t.expand(2, *t.shape[1:]) for n, t in server.items()}
    tau = 1.0 / m.scale
    with torch.no_grad():
        text, text_g, text_prev = (m.text.encode(q["ctx"]) for q in (p, glob, prev))
        image, image_g, image_prev = (m.visual.train_features(q, rows, mask) for q in (p, glob, prev))
    per_row = cosine_nce(image, image_g, image_prev, tau)
    l_image = torch.stack([per_row[0].mean(), per_row[1, :2].mean()])
    want = cosine_nce(text, text_g, text_prev, tau).mean(-1) + l_image
    torch.testing.assert_close(atpfl_regulariser(m, clients, server, states, p, rows, mask), want)


def test_atpfl_previous_prompt_of_a_client_that_never_trained_is_the_global_one(hidden):
    """After a round with half the clients, those that trained have their upload as previous prompt;
    the others take the global prompt they receive (not the random initial one), so their terms are
    -log(1/2) each whatever the local prompt: mu * 2 log 2."""
    m = make("atpfl", hidden, mu=0.5)
    result = run(m, RunConfig(rounds=1, fraction=0.5))
    trained = [k for k in range(hidden.n_clients) if result.clients["trained"][k]]
    fresh = [k for k in range(hidden.n_clients) if k not in trained]
    assert len(trained) == len(fresh) == 2
    server = result.server
    states = {n: t[fresh] for n, t in result.clients.items()}
    prev = m.previous_prompts({n: t.expand(2, *t.shape[1:]) for n, t in server.items()}, states)
    for n, t in server.items():
        assert not torch.equal(t, m.init_server()[n])  # the global prompt has moved away from the initial one
        torch.testing.assert_close(prev[n], t.expand(2, *t.shape[1:]))
    rows = torch.from_numpy(np.stack([hidden.client_train[k][:5] for k in fresh]))
    p = {n: t.expand(2, *t.shape[1:]) + 0.1 for n, t in server.items()}  # a moved local prompt
    torch.testing.assert_close(atpfl_regulariser(m, fresh, server, states, p, rows), torch.full((2,), 0.5 * 2 * math.log(2)))
    mine = m.previous_prompts({n: t.expand(2, *t.shape[1:]) for n, t in server.items()},
                              {n: t[trained] for n, t in result.clients.items()})
    for n in server:
        torch.testing.assert_close(mine[n], result.clients["prev_" + n][trained])
