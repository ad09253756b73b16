"""The stacked optimizer (fedcache/federate/optim.py) against torch.optim, with and without torch's fused kernels."""
import pytest
import torch

from fedcache.federate.optim import OptimConfig


@pytest.mark.parametrize("kernels", ["fused", "fallback"])
def test_sgd_and_adam_match_torch_optim(kernels, monkeypatch):
    """The masked stacked optimizer equals torch.optim on a single client, through torch's fused kernels
    and through the single-tensor fallback taken where a torch lacks them."""
    from fedcache.federate import optim
    from fedcache.federate.optim import StackedOptimizer

    assert optim.kernel_options() == {"fused": True}  # the torch range pyproject.toml allows has them
    if kernels == "fallback":
        monkeypatch.setattr(optim, "kernel_options", lambda: {"foreach": False})

    for cfg in (OptimConfig("sgd", 0.1, 0.9, 1e-3), OptimConfig("adam", 0.01, 0.9, 1e-3)):
        w0 = torch.randn(1, 4, 3)
        ours = {"w": w0.clone()}
        opt = StackedOptimizer(ours, cfg)
        ref = w0[0].clone().requires_grad_(True)
        torch_opt = (torch.optim.SGD([ref], lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
                     if cfg.optimizer == "sgd" else torch.optim.Adam([ref], lr=cfg.lr, weight_decay=cfg.weight_decay))
        for step in range(5):
            g = torch.randn(4, 3)
            opt.step(ours, {"w": g[None]}, torch.tensor([True]))
            ref.grad = g.clone()
            torch_opt.step()
        torch.testing.assert_close(ours["w"][0], ref.detach(), atol=1e-6, rtol=1e-5)


def test_inactive_clients_are_untouched():
    from fedcache.federate.optim import StackedOptimizer

    p = {"w": torch.ones(3, 2)}
    opt = StackedOptimizer(p, OptimConfig("adam", 0.1, weight_decay=0.1))
    opt.step(p, {"w": torch.ones(3, 2)}, torch.tensor([True, False, True]))
    assert torch.equal(p["w"][1], torch.ones(2)) and not torch.equal(p["w"][0], torch.ones(2))
    assert opt.t.tolist() == [1.0, 0.0, 1.0]


def test_a_block_of_no_rows_is_a_step_of_nothing():
    """A stack of no clients (or a RowOptim part of none) took t[0] of an empty tensor: IndexError."""
    from fedcache.federate.optim import RowOptim, StackedOptimizer

    empty = {"w": torch.ones(0, 2), "b": torch.ones(0, 10)}
    StackedOptimizer(empty, OptimConfig("adam", 0.1)).step(empty, {"w": torch.ones(0, 2), "b": torch.ones(0, 10)},
                                                            torch.ones(0, dtype=torch.bool))
    p = {"w": torch.ones(2, 2)}
    parts = RowOptim(((0, OptimConfig("sgd", 0.1)), (2, OptimConfig("sgd", 0.5))))
    StackedOptimizer(p, parts).step(p, {"w": torch.ones(2, 2)}, torch.ones(2, dtype=torch.bool))
    torch.testing.assert_close(p["w"], torch.full((2, 2), 0.5), atol=1e-3, rtol=0)  # the second part's lr


def test_a_torch_without_fused_kernels_is_detected_once(monkeypatch):
    from fedcache.federate import optim

    def no_fused(*args):
        if args[-1].get("fused"):  # the options dict _torch_step passes on to torch.optim
            raise RuntimeError("fused=True is not supported on CPU")

    optim.kernel_options.cache_clear()
    monkeypatch.setattr(optim, "_torch_step", no_fused)
    try:
        assert optim.kernel_options() == {"foreach": False}
    finally:
        optim.kernel_options.cache_clear()


def test_non_contiguous_gradients_are_applied_correctly():
    """A transposed (non-contiguous) gradient must update the same elements as its contiguous copy."""
    from fedcache.federate.optim import StackedOptimizer

    for cfg in (OptimConfig("sgd", 0.1, 0.9, 0.0), OptimConfig("adam", 0.01, 0.9, 0.0)):
        a, b = {"w": torch.zeros(2, 3, 4)}, {"w": torch.zeros(2, 3, 4)}
        g = torch.randn(2, 4, 3).transpose(1, 2)  # shape (2, 3, 4), not contiguous
        StackedOptimizer(a, cfg).step(a, {"w": g}, torch.tensor([True, True]))
        StackedOptimizer(b, cfg).step(b, {"w": g.contiguous()}, torch.tensor([True, True]))
        torch.testing.assert_close(a["w"], b["w"], atol=0, rtol=0)


@pytest.mark.parametrize("grad", [torch.ones(1, 10), torch.ones(3, 1, 10, dtype=torch.float64), torch.ones(3, 2, 5)],
                         ids=["broadcast", "float64", "reshaped"])
def test_a_gradient_unlike_its_parameter_is_refused(grad):
    """A bias of 10 classes goes to the kernels through a padded buffer, whose copy would broadcast, cast or
    reshape such a gradient without a word."""
    from fedcache.federate.optim import StackedOptimizer

    p = {"b": torch.zeros(3, 1, 10)}
    for cfg in (OptimConfig("sgd", 0.1), OptimConfig("adam", 0.1)):
        with pytest.raises(ValueError, match="the gradient of 'b' is .*; its parameter is \\(3, 1, 10\\)"):
            StackedOptimizer(p, cfg).step(p, {"b": grad}, torch.tensor([True, True, True]))
    assert torch.equal(p["b"], torch.zeros(3, 1, 10))
    w = {"w": torch.zeros(3, 1, 64)}  # unpadded: the kernels themselves broadcast one
    with pytest.raises(ValueError, match="the gradient of 'w' is \\(1, 64\\)"):
        StackedOptimizer(w, OptimConfig("adam", 0.1)).step(w, {"w": torch.ones(1, 64)}, torch.tensor([True, True, True]))


def test_every_optimizer_name_has_an_update_rule():
    """OptimConfig names the optimizers without importing torch (help texts); federate/optim.py's registry
    holds their rules: the two lists are one."""
    import typing

    from fedcache.config import choices
    from fedcache.federate.optim import OPTIMIZERS
    from fedcache.federate.optim_config import OPTIMIZERS_KNOWN

    assert sorted(choices(typing.get_type_hints(OptimConfig, include_extras=True)["optimizer"])) == sorted(OPTIMIZERS.names())
    for name, known in OPTIMIZERS_KNOWN.items():  # each field an optimizer leaves unread is read by the one it names
        for field, (_, other) in known.unread.items():
            assert field not in OPTIMIZERS_KNOWN[other].unread, (name, field, other)


@pytest.mark.parametrize("cfg", [OptimConfig("sgd", 0.1, 0.9, 1e-4), OptimConfig("adam", 1e-3, weight_decay=1e-4)])
def test_a_client_steps_stacked_as_alone(cfg):
    """A bias of 10 classes: torch's fused kernels compute a tensor's last elements one by one, its others a vector's
    width at a time, which rounds otherwise; stacked, a client's last elements were vector mates of the next client's,
    and batched runs drifted from --no-batch (and a Flower client's) numbers."""
    from fedcache.federate.optim import StackedOptimizer

    gen = torch.Generator().manual_seed(0)
    k, shape = 200, (1, 10)
    p0 = torch.randn(k, *shape, generator=gen) * 1e-3
    grads = [torch.randn(k, *shape, generator=gen) * 1e-3 for _ in range(3)]
    stacked = {"b": p0.clone()}
    opt = StackedOptimizer(stacked, cfg)
    for g in grads:
        opt.step(stacked, {"b": g}, torch.ones(k, dtype=torch.bool))
    for i in range(k):
        alone = {"b": p0[i:i + 1].clone()}
        one = StackedOptimizer(alone, cfg)
        for g in grads:
            one.step(alone, {"b": g[i:i + 1]}, torch.ones(1, dtype=torch.bool))
        assert torch.equal(alone["b"], stacked["b"][i:i + 1]), i
    assert stacked["b"].shape == (k, *shape) and stacked["b"].is_contiguous()
