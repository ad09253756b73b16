"""Every registered method on a small separable problem (the ``skewed`` fixture of conftest.py); each method's own
checks are in tests/federate/methods/test_<method>.py."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.federate.schedule import Schedule
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig

ROUNDS = 5


def make(name, data, head=None, seed=0, **params):
    cls = METHODS.get(name)
    ctx = MethodContext(data, head or cls.default_head, OptimConfig("adam", 1e-2), schedule=Schedule(local_epochs=2, batch_size=16, seed=seed, rounds=ROUNDS))
    return cls(ctx, cls.Settings(**params))


def summary(result):
    return {k: v for k, v in result.summary.items() if k != "seconds"}


# Methods that run a real CLIP text tower on class names cannot run on these synthetic features; the same
# checks (learning, determinism, batched == per-client, exact bytes) are in tests/federate/methods/test__prompt.py.
NEEDS_CLIP = {"promptfl", "tpfl", "atpfl"}


# FST-CBDG pads a step's synthetic instances to the run's client with the most draws (federate/methods/fst_cbdg.py,
# tsamp): a client alone sums its own at another width, which rounds otherwise (1e-8 after a round).
PADDED_TO_THE_RUN = {"fst-cbdg"}


# Over 20 s each on a 2-core machine: in make test-slow (CI runs both), so that make test stays under 10 minutes.
HEAVY = {"flesd", "min-local", "fedprox-ssl", "fedavg-ssl"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n
                                  for n in METHODS.names() if n not in NEEDS_CLIP])
def test_method_learns_deterministically_and_counts_bytes(name, skewed):
    sizes = []
    m = make(name, skewed)
    upload_size = m.upload_size
    m.upload_size = lambda up, i: sizes.append(upload_size(up, i)) or sizes[-1]
    a = run(m, RunConfig(rounds=ROUNDS))
    s = a.summary
    assert s["mean_accuracy"] > 60, s  # chance is 1/6 on a client's own classes
    assert all(math.isfinite(v) for v in s["per_client_accuracy"])
    assert all(torch.isfinite(t).all() for t in [*a.server.values(), *a.clients.values()])
    # When every client trains, local training updates the loop's stored client state in place: the
    # server state must never be a view of it.
    client_memory = {t.untyped_storage().data_ptr() for t in a.clients.values()}
    assert not any(t.untyped_storage().data_ptr() in client_memory for t in a.server.values())
    assert (s["global_accuracy"] is not None) == m.has_global_model
    assert summary(run(make(name, skewed), RunConfig(rounds=ROUNDS))) == summary(a)
    assert s["bytes_up"] == sum(b for _, b in sizes)
    assert (s["bytes_up"] > 0 and s["bytes_down"] > 0) == m.federated
    if m.splittable:
        # Every client alone (--no-batch, as a Flower client computes) is its batched self to the bit, every round
        # (the optimizer's padded rows: fedcache/federate/optim.py, LANES).
        rounds, tol = (1, 1e-4) if name in PADDED_TO_THE_RUN else (ROUNDS, 0)
        a = a if rounds == ROUNDS else run(make(name, skewed), RunConfig(rounds=rounds))
        b = run(make(name, skewed), RunConfig(rounds=rounds, batched=False))
        assert b.summary["per_client_accuracy"] == a.summary["per_client_accuracy"]
        assert tol or summary(b) == summary(a)
        for got, want in ((b.server, a.server), (b.clients, a.clients)):
            assert got.keys() == want.keys()
            for n in want:
                torch.testing.assert_close(got[n], want[n], atol=tol, rtol=tol)


# Every personalised method, and the settings that change what its evaluation reads of the server.
SCORED_BY = [(n, {}) for n in METHODS.names() if n not in NEEDS_CLIP and METHODS.get(n).personalized] + [
    ("fedproto", {"predict": "proto"}), ("fedproto", {"init": "shared"}),
    ("fedpcl", {"predict": "classifier", "ce_weight": 1.0})]


@pytest.mark.parametrize("name, params", [
    pytest.param(n, p, marks=[pytest.mark.slow] if n in HEAVY else [], id="-".join([n, *map(str, p.values())]))
    for n, p in SCORED_BY])
def test_a_never_trained_client_s_kept_score_is_the_one_scoring_it_again_gives(name, params, skewed, monkeypatch):
    """A never-trained client's accuracy is kept from the evaluation that first scored it where the method scores a
    client by its own state alone (``Method.scores_by_own_state``): a run of 2 of 5 clients a round, evaluated
    every round, gives every evaluation's per-client accuracies as scoring every client again does."""
    from fedcache.federate import inprocess

    kept = run(make(name, skewed, **params), RunConfig(rounds=3, fraction=0.4))
    monkeypatch.setattr(inprocess, "_scores_kept", lambda method, state: False)
    again = run(make(name, skewed, **params), RunConfig(rounds=3, fraction=0.4))
    assert [h["per_client"] for h in kept.history] == [h["per_client"] for h in again.history]
    assert summary(kept) == summary(again)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedntd", "perfedavg", "pfedme"])
def test_whole_head_methods_send_the_whole_head(name, skewed):
    n = skewed.dim * skewed.n_classes + skewed.n_classes  # linear head: W and b
    s = run(make(name, skewed, head="linear"), RunConfig(rounds=2)).summary
    assert s["bytes_up"] == s["bytes_down"] == 2 * 5 * n * 4 and s["params_up_per_round"] == 5 * n


@pytest.mark.parametrize("name", [n for n in METHODS.names() if METHODS.get(n).heads and n not in NEEDS_CLIP])
def test_a_head_the_method_does_not_run_with_is_refused_not_replaced(name, skewed):
    """clip-zs and linear-probe used to set the context's head to linear whatever was asked: the run trained a
    linear head while config.json recorded the one asked for."""
    from fedcache.errors import ConfigError

    cls = METHODS.get(name)
    other = next(h for h in ("linear", "mlp", "projection") if h not in cls.heads)
    ctx = MethodContext(skewed, other, OptimConfig("adam", 1e-2), schedule=Schedule(local_epochs=1, batch_size=16))
    with pytest.raises(ConfigError, match=f"{name} runs with the .* head only, not '{other}'; drop --head"):
        cls(ctx, cls.Settings())
    assert ctx.head == other


def test_every_method_has_params_and_a_docs_page():
    docs = Path(__file__).resolve().parents[2] / "docs" / "methods"
    index = (docs / "README.md").read_text()
    for name in METHODS.names():
        assert dataclasses.is_dataclass(METHODS.get(name).Settings), name
        assert (docs / f"{name}.md").exists() and f"`{name}`" in index, f"document {name} in docs/methods/"


def test_method_tests_are_named_after_a_method_or_a_methods_module():
    """tests/federate/methods/ mirrors the package: test_<method>.py (its registry name, - as _) holds a method's own
    tests, test_<module>.py those of a module the methods share (test__prompt.py for _prompt.py)."""
    import fedcache.federate.methods as package

    modules = {p.stem for p in Path(package.__file__).parent.glob("*.py") if p.stem != "__init__"}
    known = {n.replace("-", "_") for n in METHODS.names()} | modules
    here = Path(__file__).resolve().parent / "methods"
    stray = [p.name for p in sorted(here.glob("test_*.py")) if p.stem.removeprefix("test_") not in known]
    assert not stray, f"name these after the method (its registry name, - as _) or the module they test: {stray}"


def test_a_method_naming_its_settings_params_is_told_the_new_name():
    from fedcache.federate.methods.fedavg import FedAvg, FedAvgSettings

    with pytest.raises(TypeError, match="rename `Params = FedAvgSettings` to `Settings = ...`"):
        type("Old", (FedAvg,), {"Params": FedAvgSettings})


@pytest.mark.parametrize("name", [n for n in METHODS.names() if n not in NEEDS_CLIP])
def test_a_method_that_may_keep_client_state_is_told_by_its_class(name, skewed):
    """A Flower resume builds the method (reading the server shard) only where its class may keep client state:
    a class said not to must make none, or such a resume would go on from other client states than the run had."""
    from fedcache.flower.config import may_keep_client_state

    assert may_keep_client_state(METHODS.get(name)) == bool(make(name, skewed).init_clients(1))


@pytest.fixture
def methods_copy(tmp_path, monkeypatch):
    """fedcache/federate/methods/__init__.py run again as ``methods_copy``, over its folder and ``tmp_path``: what
    it declares from files put there, and how its METHODS loads them, without touching the real package."""
    import importlib.util
    import sys

    import fedcache.federate.methods as package

    init = Path(package.__file__)
    spec = importlib.util.spec_from_file_location("methods_copy", init,
                                                  submodule_search_locations=[str(init.parent), str(tmp_path)])
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "methods_copy", module)
    (tmp_path / "helpers").mkdir()  # a subpackage holds helpers: no method
    (tmp_path / "helpers" / "__init__.py").write_text("")
    for file, names in {"renamed.py": ["named-otherwise"], "two_names.py": ["two-names", "second-name"]}.items():
        (tmp_path / file).write_text("import methods_copy\n" + "".join(
            f"methods_copy.METHODS.add({n!r}, type('M', (), {{}}))\n" for n in names))
    spec.loader.exec_module(module)
    yield module
    for name in ("renamed", "two_names"):
        sys.modules.pop(f"methods_copy.{name}", None)


def test_methods_are_the_package_s_files_and_say_how_to_name_them(methods_copy):
    assert "helpers" not in methods_copy.METHODS
    assert methods_copy.METHODS.names() == sorted({*METHODS.names(), "renamed", "two-names"})
    assert {"LocalResult", "Method", "MethodContext", "METHODS"} <= set(dir(methods_copy))
    with pytest.raises(ConfigError, match=r"registered no method 'renamed', the name it is declared with: register "
                                          r"'renamed' there, or name the file after the method \(fst_cbdg.py for "
                                          r"fst-cbdg\)$"):
        methods_copy.METHODS.get("renamed")
    with pytest.raises(ConfigError, match=r"registered method 'second-name' beside 'two-names'.*: move it to a module "
                                          r"of its own, and name the file after the method \(fst_cbdg.py"):
        methods_copy.METHODS.get("two-names")


def test_a_script_registering_a_built_in_method_s_name_is_refused_at_once(methods_copy):
    with pytest.raises(ConfigError, match=r"^method name 'fedavg' is a built-in method's \(registered by "
                                          r"methods_copy.fedavg\); register yours under another name$"):
        methods_copy.METHODS.register("fedavg")(type("MyFedAvg", (), {}))
