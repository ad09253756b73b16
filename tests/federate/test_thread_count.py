"""A run's numbers do not depend on torch's thread count (``--threads``, the command's choice by load, a grid's
workers), also where a round trains one client: torch splits a single product across its threads, and summed in
another order (heads/base.py ``bmm``)."""
import pytest
import torch

from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.federate.schedule import Schedule
from fedcache.heads.base import CHUNK, affine, bmm, transposed_affine

from .conftest import synthetic


def _at(threads: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("classes", [10, 65])  # the two layouts of heads/base.py affine
def test_one_product_has_the_same_bits_at_any_thread_count_and_as_one_of_a_stack(classes):
    g = torch.Generator().manual_seed(0)
    z, w, b = torch.randn(3, 256, 1280, generator=g), torch.randn(3, 1280, classes, generator=g), torch.randn(3, 1, classes, generator=g)

    def one():
        weight = w[:1].clone().requires_grad_(True)
        out = affine(weight, b[:1], z[:1])
        return out.detach(), torch.autograd.grad((out ** 2).sum(), [weight])[0]

    stacked = _at(1, lambda: affine(w, b, z))[:1]
    for threads in (1, 2, 4):
        out, grad = _at(threads, one)
        assert torch.equal(out, stacked), threads
        assert torch.equal(grad, _at(1, one)[1]), threads
    assert torch.equal(_at(2, lambda: bmm(z[:1], z[:1].transpose(1, 2))), _at(1, lambda: bmm(z[:1], z[:1].transpose(1, 2))))


@pytest.mark.parametrize("name, head", [("fedavg", "linear"), ("fedproto", "mlp"), ("fedpcl", "projection")])
def test_a_run_of_one_client_a_round_is_the_same_at_one_two_and_four_threads(name, head):
    data = synthetic(n_clients=4, per_client=128, dim=1280)

    def train():
        ctx = MethodContext(data, head, OptimConfig("adam", 1e-2), Schedule(batch_size=32))
        r = run(METHODS.get(name)(ctx), RunConfig(rounds=3, fraction=0.25, eval_every=3))
        return r.server, dict(r.clients), r.summary["mean_accuracy"]

    one = _at(1, train)
    for threads in (2, 4):
        other = _at(threads, train)
        for part in (0, 1):
            assert one[part].keys() == other[part].keys()
            assert all(torch.equal(one[part][k], other[part][k]) for k in one[part]), (name, threads)
        assert one[2] == other[2]


# Four clients a round, or one; the first (over 20 s on a busy 2-core machine) in make test-slow.
@pytest.mark.parametrize("fraction, draws", [pytest.param(1.0, "implicit", marks=pytest.mark.slow), (0.25, "explicit")])
def test_fst_cbdg_is_the_same_at_one_two_and_four_threads(fraction, draws):
    """Its synthetic instances' W^T T_c was one einsum, a single product of K C columns that torch splits across
    threads, as were its zero-shot labels (every row against the anchors) and Eq. 4's refresh of a client's every
    row (1,100 here: over 1,024, a product torch splits)."""
    from fedcache.federate.methods.fst_cbdg import FSTCBDGSettings

    data = synthetic(n_clients=4, per_client=1100, dim=1280)

    def train():
        ctx = MethodContext(data, "linear", OptimConfig("adam", 1e-2), Schedule(batch_size=32))
        method = METHODS.get("fst-cbdg")(ctx, FSTCBDGSettings(anchors="prototypes", synthetic=draws))
        r = run(method, RunConfig(rounds=2, fraction=fraction, eval_every=2))
        return r.server, dict(r.clients)

    one = _at(1, train)
    for threads in (2, 4):
        other = _at(threads, train)
        for part in (0, 1):
            assert all(torch.equal(one[part][k], other[part][k]) for k in one[part]), threads


def test_fedpcls_prototype_scores_are_the_same_at_any_thread_count():
    """Its prototype term scored all clients' rows against all sets as one product (an einsum)."""
    from fedcache.federate.methods._fedpcl_losses import batch_term, paper_term

    g = torch.Generator().manual_seed(0)
    z, protos, y = torch.randn(2, 32, 256, generator=g), torch.randn(5, 10, 256, generator=g), torch.randint(0, 10, (2, 32), generator=g)
    present, mask = torch.ones(5, 10, dtype=torch.bool), torch.ones(2, 32, dtype=torch.bool)

    def terms():
        return paper_term(z, y, protos, present, 0.5)[0], batch_term(z, y, mask, protos, present, 0.5)[0]

    one = _at(1, terms)
    for threads in (2, 8):
        assert all(torch.equal(a, b) for a, b in zip(one, _at(threads, terms))), threads


@pytest.mark.parametrize("n, m, p, add", [
    (CHUNK * 4 + 77, 64, 65, "row"), (CHUNK * 4 + 1, 64, 65, "bias"), (CHUNK * 5, 64, 3, None),  # rows in pieces
    (CHUNK * 4 + 1, 64, 11, "bias"), (CHUNK * 4 + 3, 16, 10, "bias"),  # last rows MKL gives another kernel
    (10, 64, CHUNK * 4 + 1, None), (10, 64, CHUNK * 4 + 33, "column"),  # a few-class head's transposed layout
    (CHUNK * 4 + 1, 64, 1, None), (1, 64, 9, None), (40, 64, 9, "bias")])  # matrix-vector products; a small one
def test_a_single_product_is_its_stacked_cell_at_one_and_two_threads(n, m, p, add):
    """A run's product and its grid cell's, stacked with others, are the same bits with or without a gradient."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(3, n, m, generator=g), torch.randn(3, m, p, generator=g)
    addend = {"row": torch.randn(3, n, p, generator=g), "bias": torch.randn(3, 1, p, generator=g),
              "column": torch.randn(3, n, 1, generator=g), None: None}[add]
    first = addend[:1] if addend is not None else None
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            cell = _at(1, lambda: bmm(a, b, addend))[:1]
            for threads in (1, 2):
                assert torch.equal(_at(threads, lambda: bmm(a[:1], b[:1], first)), cell), (grad, threads)
    plain = torch.bmm(a, b) if addend is None else torch.baddbmm(addend, a, b)
    torch.testing.assert_close(cell, plain[:1])


def test_a_large_single_product_without_a_gradient_runs_as_a_batch_of_pieces(monkeypatch):
    """torch would split it across threads in another order, and the first-of-two product runs on one thread."""
    shapes, real = [], torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: shapes.append(tuple(a.shape)) or real(a, b))
    z, w = torch.randn(1, CHUNK * 6, 32), torch.randn(1, 32, 10)
    with torch.no_grad():
        _at(2, lambda: transposed_affine(w, torch.zeros(1, 1, 10), z))
    assert shapes == [(6, 10, 32)]
    shapes.clear()
    _at(2, lambda: transposed_affine(w.requires_grad_(True), torch.zeros(1, 1, 10), z))  # training: one product
    assert shapes == [(2, 10, 32)]
    shapes.clear()  # tall on a small inner size (fst-cbdg's algebra): its 256-row pieces are all overhead
    _at(1, lambda: bmm(torch.randn(3, 1280, 10), torch.randn(3, 10, 10)))
    assert shapes == [(3, 1280, 10)]


def test_nearest_prototype_scores_are_the_same_at_one_and_four_threads():
    """torch.cdist split one client's distance product across threads: fedproto's and fedpcl's evaluation scores
    moved in their last bits at 4 threads."""
    from fedcache.federate.prototypes import nearest

    g = torch.Generator().manual_seed(0)
    z, protos, present = torch.randn(1, 2000, 256, generator=g), torch.randn(1, 65, 256, generator=g), torch.ones(1, 65, dtype=torch.bool)
    one = _at(1, lambda: nearest(z, protos, present))
    assert torch.equal(_at(4, lambda: nearest(z, protos, present)), one)
    torch.testing.assert_close(one, -torch.cdist(z, protos) ** 2)
    small = (z[:, :20], protos[:, :5], present[:, :5])  # cdist's own pairwise distances
    assert torch.equal(nearest(*small), -torch.cdist(*small[:2]) ** 2)
