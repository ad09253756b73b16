"""--select: per method and other setting, the values with the best mean validation score over seeds."""
import pytest

from fedcache.errors import ConfigError
from fedcache.grids.select import choose


def rows():
    out = []
    # fedavg: lr 0.01 wins at alpha 0.1 on the mean over seeds although lr 0.001 has the best single seed.
    for alpha, lr, scores in (("0.1", "0.001", (70, 40)), ("0.1", "0.01", (60, 58)),
                              ("1", "0.001", (80, 80)), ("1", "0.01", (70, 75))):
        out += [{"method": "fedavg", "alpha": alpha, "lr": lr, "seed": s, "mean_accuracy": v} for s, v in enumerate(scores)]
    # fedprox ties: the value listed first wins.
    out += [{"method": "fedprox", "alpha": "0.1", "lr": lr, "seed": 0, "mean_accuracy": 50} for lr in ("0.01", "0.001")]
    return out


def test_each_method_and_setting_gets_its_own_choice():
    got = {(c.method, c.fixed): (c.chosen, c.score) for c in choose(rows(), ["alpha", "lr"], ["lr"])}
    assert got[("fedavg", (("alpha", "0.1"),))] == ((("lr", "0.01"),), 59.0)
    assert got[("fedavg", (("alpha", "1"),))] == ((("lr", "0.001"),), 80.0)
    assert got[("fedprox", (("alpha", "0.1"),))][0] == (("lr", "0.01"),)


def test_selecting_a_setting_that_is_not_an_axis_says_how():
    with pytest.raises(ConfigError, match=r"--select mu: not an axis.*--set lr=1e-3,1e-2 --select lr"):
        choose(rows(), ["alpha", "lr"], ["mu"])


def test_a_value_that_diverged_on_any_seed_is_not_chosen():
    """lr 0.1 scores 90 on the seed that did not diverge: averaging only that seed would choose it."""
    rows = [{"method": "fedavg", "lr": "0.001", "seed": s, "mean_accuracy": v} for s, v in enumerate((60, 62))]
    rows += [{"method": "fedavg", "lr": "0.1", "seed": 0, "mean_accuracy": 90},
             {"method": "fedavg", "lr": "0.1", "seed": 1, "mean_accuracy": None, "diverged": True}]
    (choice,) = choose(rows, ["lr"], ["lr"])
    assert choice.chosen == (("lr", "0.001"),) and choice.score == 61.0
    assert dict(choice.candidates) == {(("lr", "0.001"),): 61.0, (("lr", "0.1"),): None}
    every = [{**r, "mean_accuracy": None, "diverged": True} for r in rows if r["lr"] == "0.1"]
    with pytest.raises(ConfigError, match=r"every value of lr diverged on validation for fedavg; add smaller values"):
        choose(every, ["lr"], ["lr"])
