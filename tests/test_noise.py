import math

import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.noise import KINDS, perturb, sample_noise

# The ends of what torch.rand can return: 0 exactly, and the largest float32 / float64 below 1.
EXTREMES = (0.0, 1 - 2**-24, 1 - 2**-53, 0.5, 0.5 - 2**-53)


def constant_rand(value: float):
    def rand(*size, generator=None, dtype=None, **kwargs):
        shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
        return torch.full(tuple(shape), value, dtype=dtype or torch.float32)

    return rand


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", EXTREMES)
def test_noise_is_finite_at_the_extreme_uniform_draws(kind, value, monkeypatch):
    monkeypatch.setattr(torch, "rand", constant_rand(value))
    e = sample_noise(kind, (3, 4), 2.0, torch.Generator().manual_seed(0))
    assert e.shape == (3, 4) and e.dtype == torch.float32
    assert torch.isfinite(e).all(), f"{kind} noise is {e.flatten()[0]} when rand returns {value!r}"
    assert torch.isfinite(perturb(torch.ones(3, 4), kind, 2.0, 0.1, torch.Generator())).all()


def test_laplace_at_the_ends_has_the_inverse_cdf_values(monkeypatch):
    # u in the lower half gives -(-log(1 - 2u)), the upper half +(-log(1 - (2u - 1))): at u = 0 and 1/2 both 0,
    # at the top of each half the largest magnitude the float64 grid allows (52 * ln 2 = 36.04).
    for u, want in ((0.0, 0.0), (0.5, 0.0), (0.25, -math.log(2)), (0.75, math.log(2)), (1 - 2**-53, 52 * math.log(2))):
        monkeypatch.setattr(torch, "rand", constant_rand(u))
        got = sample_noise("laplace", (1,), 3.0, torch.Generator())
        torch.testing.assert_close(got, torch.tensor([3.0 * want]), msg=f"u = {u}")


@pytest.mark.parametrize("kind, abs_mean, var", [("laplace", 1.0, 2.0), ("gaussian", math.sqrt(2 / math.pi), 1.0)])
def test_noise_has_the_named_distribution(kind, abs_mean, var):
    s = 0.5
    e = sample_noise(kind, (400_000,), s, torch.Generator().manual_seed(1)).double()
    assert abs(e.mean()) < 0.01
    assert e.abs().mean().item() == pytest.approx(s * abs_mean, rel=0.01)
    assert e.var().item() == pytest.approx(s * s * var, rel=0.02)
    assert (e > 0).double().mean().item() == pytest.approx(0.5, abs=0.005)


@pytest.mark.parametrize("kind", KINDS)
def test_noise_is_reproducible_from_the_generator(kind):
    a = sample_noise(kind, (5, 7), 1.0, torch.Generator().manual_seed(3))
    b = sample_noise(kind, (5, 7), 1.0, torch.Generator().manual_seed(3))
    c = sample_noise(kind, (5, 7), 1.0, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_unknown_noise_kind_is_refused():
    with pytest.raises(ConfigError, match="gaussian, laplace"):
        sample_noise("uniform", (2,), 1.0, torch.Generator())
