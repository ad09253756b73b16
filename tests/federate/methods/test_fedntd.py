"""FedNTD's local loss against hand-computed values at a temperature other than 1."""
from __future__ import annotations

import math

import torch

from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods.fedntd import not_true_kl
from fedcache.federate.optim import OptimConfig

from ..conftest import synthetic
from ..test_methods import make


def fedntd(tau: float, beta: float):
    data = synthetic(n_clients=1, per_client=4, n_classes=3, dim=3)
    return METHODS.get("fedntd")(MethodContext(data, "linear", OptimConfig("sgd", 0.1)), METHODS.get("fedntd").Settings(tau=tau, beta=beta))


def identity_head(bias: list[float]) -> dict:
    """A linear head whose logits are the input features plus ``bias``."""
    return {"weight": torch.eye(3)[None], "bias": torch.tensor(bias)[None, None]}


def test_fedntd_loss_at_tau_2_matches_hand_computation():
    tau, beta = 2.0, 0.5
    m = fedntd(tau, beta)
    # Row 0 (label 0): student logits (ln 2, 0, 0), so CE = -ln(2/4) = ln 2 and the student's not-true
    # distribution is uniform; the teacher (received head: bias (0, 2 ln 3, 0)) has not-true logits
    # (2 ln 3, 0) / tau = (ln 3, 0), i.e. (3/4, 1/4). KL = 3/4 ln(3/2) + 1/4 ln(1/2).
    # Row 1 (label 1): student (0, 5, 0), teacher (0, 5 + 2 ln 3, 0): both not-true parts are (0, 0), KL = 0;
    # CE = -ln(e^5 / (e^5 + 2)).
    x = torch.tensor([[[math.log(2), 0.0, 0.0], [0.0, 5.0, 0.0]]])
    y = torch.tensor([[0, 1]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    anchor = identity_head([0.0, 2 * math.log(3), 0.0])
    got, buffers = m.loss(identity_head([0.0, 0.0, 0.0]), x, y, mask, {"anchor": anchor})
    assert buffers == {}  # a linear head keeps no statistics
    ce = (math.log(2) - math.log(math.exp(5) / (math.exp(5) + 2))) / 2
    kl = (0.75 * math.log(1.5) + 0.25 * math.log(0.5) + 0.0) / 2
    # The official NTD_Loss: tau^2 * KLDiv(batchmean), weighted by beta.
    torch.testing.assert_close(got, torch.tensor([ce + beta * tau**2 * kl]))


def test_not_true_kl_softens_both_sides_with_tau():
    # Not-true logits student (0, 0), teacher (3 ln 3, 0) at tau = 3: teacher (3/4, 1/4) as above;
    # at tau = 1 it would be (27/28, 1/28).
    t = torch.tensor([[0.0, 3 * math.log(3), 0.0]])
    s = torch.tensor([[9.0, 0.0, 0.0]])
    y = torch.tensor([0])
    torch.testing.assert_close(not_true_kl(s, t, y, 3.0), torch.tensor([0.75 * math.log(1.5) + 0.25 * math.log(0.5)]))
    # Student not-true logits (3 ln 2, 0) at tau = 3 are (2/3, 1/3); teacher (0, 0) uniform:
    # KL = 1/2 ln((1/2)/(2/3)) + 1/2 ln((1/2)/(1/3)).
    s2 = torch.tensor([[9.0, 3 * math.log(2), 0.0]])
    want = 0.5 * math.log(0.75) + 0.5 * math.log(1.5)
    torch.testing.assert_close(not_true_kl(s2, torch.zeros(1, 3), y, 3.0), torch.tensor([want]))


def test_not_true_kl_ignores_the_true_class():
    y = torch.tensor([0, 2])
    logits = torch.tensor([[5.0, 1.0, -1.0], [0.3, 0.1, 2.0]])
    other = logits + torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    kl = not_true_kl(logits, other, y, 2.0)
    assert kl[0] > 0 and kl[1].abs() < 1e-7  # row 1 differs only in its true class (2)
    bumped = logits.clone()
    bumped[torch.arange(2), y] += torch.tensor([7.0, -3.0])
    torch.testing.assert_close(not_true_kl(bumped, other, y, 2.0), kl)


def test_teacher_normalises_with_the_global_models_running_statistics():
    """The official teacher is a deep copy of a model left in eval mode: BatchNorm uses the received
    running statistics, not the batch's (and they stay as received)."""
    from fedcache.federate.local import cross_entropy
    from fedcache.heads import train_forward

    tau, beta = 2.0, 0.5
    data = synthetic(n_clients=1, per_client=6, n_classes=3, dim=4)
    cls = METHODS.get("fedntd")
    m = cls(MethodContext(data, "mlp", OptimConfig("sgd", 0.1)), cls.Settings(tau=tau, beta=beta))
    g = torch.Generator().manual_seed(3)
    anchor = m.head.init(1, g)
    h = anchor["bn.running_mean"].shape[-1]
    anchor["bn.running_mean"] = torch.randn(1, 1, h, generator=g)
    anchor["bn.running_var"] = torch.rand(1, 1, h, generator=g) * 3 + 0.2
    anchor["bn.weight"] = torch.rand(1, 1, h, generator=g) + 0.5
    student = m.head.init(1, torch.Generator().manual_seed(4))
    x = data.x_train[None, :6]
    y = data.y_train[None, :6]
    mask = torch.ones(1, 6, dtype=torch.bool)
    received = {n: t.clone() for n, t in anchor.items()}

    got, _ = m.loss({n: t.clone() for n, t in student.items()}, x, y, mask, {"anchor": anchor})

    # The teacher by hand: FC -> ReLU -> (h - running mean) / sqrt(running var + eps) * gamma + beta -> FC.
    a = {n: t[0] for n, t in received.items()}
    hid = torch.relu(x[0] @ a["fc1.weight"] + a["fc1.bias"])
    z = (hid - a["bn.running_mean"]) / torch.sqrt(a["bn.running_var"] + 1e-5) * a["bn.weight"] + a["bn.bias"]
    teacher = (z @ a["fc2.weight"] + a["fc2.bias"])[None]
    s_logits, _ = train_forward(m.head, {n: t.clone() for n, t in student.items()}, x, mask)
    want = cross_entropy(s_logits, y, mask) + beta * tau**2 * not_true_kl(s_logits, teacher, y, tau).mean(-1)
    torch.testing.assert_close(got, want)
    # Batch statistics would give another teacher here, so the match above tests the mode.
    batch_teacher, _ = train_forward(m.head, {n: t.clone() for n, t in received.items()}, x, mask)
    assert not torch.allclose(batch_teacher, teacher, atol=1e-3)
    assert all(torch.equal(anchor[n], received[n]) for n in received)


# ---- on test_methods.py's skewed problem -------------------------------------------------------------------
def test_fedntd_equals_fedavg_with_beta_zero(skewed):
    a = run(make("fedntd", skewed, beta=0.0), RunConfig(rounds=2))
    b = run(make("fedavg", skewed), RunConfig(rounds=2))
    for n in a.server:
        torch.testing.assert_close(a.server[n], b.server[n])
