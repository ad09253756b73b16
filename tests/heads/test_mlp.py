"""The mlp head against torch's own modules; padding rows change nothing."""
import torch

from fedcache.heads import make_head
from fedcache.heads.mlp import BN_EPS


def torch_mlp(p, k=0):
    """nn.Sequential(Linear, ReLU, BatchNorm1d, Linear) holding client k's parameters."""
    d_in, hidden = p["fc1.weight"].shape[1:]
    net = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.BatchNorm1d(hidden, eps=BN_EPS),
                              torch.nn.Linear(hidden, p["fc2.weight"].shape[-1]))
    with torch.no_grad():
        net[0].weight.copy_(p["fc1.weight"][k].T), net[0].bias.copy_(p["fc1.bias"][k, 0])
        net[2].weight.copy_(p["bn.weight"][k, 0]), net[2].bias.copy_(p["bn.bias"][k, 0])
        net[3].weight.copy_(p["fc2.weight"][k].T), net[3].bias.copy_(p["fc2.bias"][k, 0])
    return net


def grads_of(out, tensors, seed=0):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, tensors, g)


def test_training_step_matches_torch_modules():
    head = make_head("mlp", 12, 4)
    p = head.init(1, torch.Generator().manual_seed(0))
    x = torch.randn(1, 9, 12, generator=torch.Generator().manual_seed(1))
    net = torch_mlp(p)
    leaves = {n: p[n].clone().requires_grad_(True) for n in ("fc1.weight", "fc1.bias", "bn.weight", "bn.bias")}
    q = {**p, **leaves}
    z, buffers = head.train_features(q, x)
    ours = head.classify(q, z)
    theirs = net(x[0])
    torch.testing.assert_close(ours[0], theirs, atol=1e-5, rtol=1e-5)
    g_ours = grads_of(ours[0], list(leaves.values()))
    g_theirs = grads_of(theirs, [net[0].weight, net[0].bias, net[2].weight, net[2].bias])
    torch.testing.assert_close(g_ours[0][0], g_theirs[0].T, atol=1e-5, rtol=1e-4)  # ours is stored (in, out)
    for a, b in zip(g_ours[1:], g_theirs[1:]):
        torch.testing.assert_close(a.reshape(-1), b, atol=1e-5, rtol=1e-4)
    # running statistics (unbiased variance, momentum 0.1) and the evaluation-mode output
    torch.testing.assert_close(buffers["bn.running_mean"][0, 0], net[2].running_mean, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(buffers["bn.running_var"][0, 0], net[2].running_var, atol=1e-6, rtol=1e-5)
    # ... returned, never written into the parameters the head was given
    assert set(buffers) == set(head.buffer_keys) and all(torch.equal(q[n], p[n]) for n in head.buffer_keys)
    q.update(buffers)
    net.eval()
    torch.testing.assert_close(head.classify(q, head.features(q, x))[0], net(x[0]), atol=1e-5, rtol=1e-5)


def test_padding_rows_change_nothing():
    """A client's rows padded with junk rows (masked out) give its unpadded numbers and gradients; a
    client with only padding (it finished its epoch) keeps its running statistics."""
    head = make_head("mlp", 6, 3)
    # float64: the padded and unpadded sums round differently in float32 (1e-7 relative)
    p = {n: t.double() for n, t in head.init(3, torch.Generator().manual_seed(0)).items()}
    x = torch.randn(3, 8, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2] = False
    keys = ("fc1.weight", "fc1.bias", "bn.weight", "bn.bias")
    padded = {**p, **{n: p[n].clone().requires_grad_(True) for n in keys}}
    alone = {**{n: t[1:2] for n, t in p.items()}, **{n: p[n][1:2].clone().requires_grad_(True) for n in keys}}
    z_pad, padded_buffers = head.train_features(padded, x, mask)
    z_alone, alone_buffers = head.train_features(alone, x[1:2, :5])
    torch.testing.assert_close(z_pad[1, :5], z_alone[0], atol=1e-10, rtol=1e-10)
    g_pad = grads_of(z_pad[1:2, :5], [padded[n] for n in keys])
    g_alone = grads_of(z_alone, [alone[n] for n in keys])
    for n, a, b in zip(keys, g_pad, g_alone):
        torch.testing.assert_close(a[1], b[0], atol=1e-10, rtol=1e-10, msg=n)
    for n in ("bn.running_mean", "bn.running_var"):
        torch.testing.assert_close(padded_buffers[n][1], alone_buffers[n][0], atol=1e-10, rtol=1e-10)
        assert torch.equal(padded_buffers[n][2], p[n][2]), f"{n} of a client without real rows changed"
