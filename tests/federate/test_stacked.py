"""Runs trained as one stack of federations (federate/stacked.py) equal the same runs one by one.

Every method that declares itself stackable (federate/stacking.py) is here, with a stack for each setting its
declaration lets differ (ROW_SETTINGS, generated from the declarations and the settings' types): each federation
of a stack, with its own partition, seed, sampling fraction, optimizer settings and value of that setting, must end
with the per-client accuracies, history and final server and client state of its own run.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
import torch

from fedcache.config import base_type, choices, fields_of, value_range
from fedcache.federate.schedule import Schedule
from fedcache.errors import ConfigError
from fedcache.federate import driver
from fedcache.federate.driver import Run as Federation
from fedcache.federate.inprocess import run_one
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.methods.fedproto import PFLLIB
from fedcache.federate.methods.fst_cbdg import FSTCBDGSettings
from fedcache.federate.optim import OptimConfig
from fedcache.federate.rundir import RunDir
from fedcache.federate.stacked import Stacked, stack_key, why_alone
from fedcache.federate.stacking import Joint, stacking_of

from .conftest import synthetic

STACKABLE = sorted(name for name, cls in METHODS.items() if stacking_of(cls) is not None)
# Settings every run of a method's stacks shares, beyond the defaults: values worth covering too.
SHARED = {"fedntd": {"tau": 2.0}, "fedrep": {"head_epochs": 1}}
# A setting that acts only once another is set: the stacks that vary it share these (a missing entry fails
# test_each_value_a_stacked_setting_takes_there_changes_what_its_run_computes).
ENABLERS = {("fedpcl", "noise_scale"): {"noise": "gaussian"}, ("fedpcl", "perturb"): {"noise": "laplace"},
            ("fst-cbdg", "shots"): {"anchors": "prototypes"}}
# A setting that acts only when a round's sampled clients lack a class: its stacks train on label-skewed partitions.
LABEL_SKEW = {("fedproto", "missing")}


def candidates(typ, default) -> list:
    """The default, then the other values of a setting's declared type that a stack tries: the other choices,
    the flipped bool, or half, zero and double of a number (0.5, 1 and 2 when it is 0) where its range allows."""
    named = choices(typ)
    if named:
        return [default, *(c for c in named if c != default)]
    base = base_type(typ)
    if base is bool:
        return [default, not default]
    if base not in (int, float):
        raise TypeError(f"no candidate values for a stacked setting of type {typ}: add them to candidates()")
    allowed = value_range(typ)
    out = [default]
    for v in map(base, [default / 2, 0, default * 2] if default else [0.5, 1, 2]):
        if v not in out and (allowed is None or allowed.contains(v)):
            out.append(v)
    return out


def _row_settings() -> dict[str, dict[str, list]]:
    out = {}
    for name in STACKABLE:
        cls = METHODS.get(name)
        types, defaults = fields_of(cls.Settings), cls.Settings(**SHARED.get(name, {}))
        out[name] = {s: candidates(types[s], getattr(defaults, s)) for s in stacking_of(cls).varying}
    return out


# Per method, each setting its declaration lets differ between stacked runs -> the values its runs take.
ROW_SETTINGS = _row_settings()
# (method, the setting its stack's runs differ in; None for a method that declares none)
CASES = [(name, setting) for name in STACKABLE for setting in ROW_SETTINGS[name] or [None]]
# The setting the other tests' stacks differ in: the method's first declared one.
FIRST = {name: next(iter(ROW_SETTINGS[name]), None) for name in STACKABLE}


def run_stack(feds, checkpoint=None, on_round=None):
    """The round driver with the stacked engine, continuing ``checkpoint`` where it exists."""
    return driver.run(feds, Stacked(feds), on_round, resume=checkpoint is not None and checkpoint.exists(),
                      checkpoint=checkpoint)


def test_declarations_are_per_class_and_every_declared_setting_gets_other_values():
    # Declared per class: a subclass (fedprox-ssl, ...) does not inherit its parent's declaration.
    assert stacking_of(type("Sub", (METHODS.get("fedavg"),), {})) is None
    assert {"fedavg", "fedpcl", "fedproto", "fst-cbdg"} <= set(STACKABLE)
    # What docs/getting-started.md says cells may differ in and still share a stack.
    assert {"tau", "noise_scale", "perturb", "aggregation"} <= set(ROW_SETTINGS["fedpcl"])
    assert {"lam", "predict", "aggregation", "missing", "init"} <= set(ROW_SETTINGS["fedproto"])
    assert {"lam", "gamma", "sigma", "sampling", "tsamp_weight", "synthetic", "anchors", "shots"} <= set(ROW_SETTINGS["fst-cbdg"])
    for name, settings in ROW_SETTINGS.items():
        for setting, values in settings.items():
            assert len(values) > 1, f"{name}'s {setting}: no value other than its default to stack it with"


def test_a_stacked_setting_s_candidate_values_follow_its_declared_type():
    typ = {**fields_of(METHODS.get("fedpcl").Settings), **{f"cbdg.{n}": t for n, t in fields_of(FSTCBDGSettings).items()}}
    assert candidates(typ["tau"], 0.07) == [0.07, 0.035, 0.14]  # Positive: no zero
    assert candidates(typ["perturb"], 0.1) == [0.1, 0.05, 0.0, 0.2]
    assert candidates(typ["perturb"], 0.8) == [0.8, 0.4, 0.0]  # Fraction: no 1.6
    assert candidates(typ["cbdg.gamma"], 0.0) == [0.0, 0.5, 1.0, 2.0]
    assert candidates(typ["cbdg.shots"], 16) == [16, 8, 32]  # PositiveInt
    assert candidates(typ["aggregation"], "mean") == ["mean", "weighted"]
    assert candidates(bool, False) == [False, True]


def partitions(base, seed: int, n_clients: int, skew: bool = False):
    """Another split of the same rows among ``n_clients`` clients (unequal sizes); ``skew``: client k keeps only
    its rows of classes k..k+5 (mod C), so a round's sampled clients can miss a class."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(base.y_train))
    cuts = np.sort(rng.choice(np.arange(1, len(order)), n_clients - 1, replace=False))
    train = [np.sort(p) for p in np.split(order, cuts)]
    test = [np.sort(p) for p in np.array_split(rng.permutation(len(base.y_test)), n_clients)]
    if skew:
        held = [(k + np.arange(6)) % base.n_classes for k in range(n_clients)]
        train = [r[np.isin(base.y_train[r].numpy(), h)] for r, h in zip(train, held)]
        test = [r[np.isin(base.y_test[r].numpy(), h)] for r, h in zip(test, held)]
    return dataclasses.replace(base, client_train=train, client_test=test)


# Per federation: SGD's momentum, Adam's betas and eps. Each differs between the runs of a stack, so a stack that
# took any of them from its first run (rather than each run's own optimizer settings) fails the comparisons.
OPTIM_ROWS = [(0.9, (0.9, 0.999), 1e-8), (0.5, (0.8, 0.99), 1e-7), (0.0, (0.9, 0.99), 1e-8), (0.9, (0.85, 0.999), 1e-6)]
RUNS = [(0, 4, 1e-2), (1, 5, 3e-2), (2, 3, 1e-2), (0, 4, 3e-3)]  # per federation: seed, clients, lr


def federations(name: str, optimizer: str = "adam", fraction: float = 1.0, shared: dict | None = None,
                head: str | None = None, setting: str | None = "first"):
    """Four runs (or one per value of ``setting``, if more) differing in partition (and client count), seed, lr,
    weight decay, momentum, betas, eps and ``setting`` (default: the method's first declared one), which takes
    its ROW_SETTINGS values in turn; ``shared``: settings of all the runs."""
    setting = FIRST[name] if setting == "first" else setting
    values = [{setting: v} for v in ROW_SETTINGS[name][setting]] if setting else [{}]
    common = {**SHARED.get(name, {}), **ENABLERS.get((name, setting), {}), **(shared or {})}
    base = synthetic(n_clients=4, per_client=40)
    text = torch.randn(base.n_classes, base.dim, generator=torch.Generator().manual_seed(3))
    base = dataclasses.replace(base, info={"text": text})  # class-text embeddings (fst-cbdg's anchors)
    cls = METHODS.get(name)
    out = []
    for i in range(max(len(RUNS), len(values))):
        seed, n, lr = RUNS[i % len(RUNS)]
        data = partitions(base, 10 + i, n, skew=(name, setting) in LABEL_SKEW)
        params = cls.Settings(**{**common, **values[i % len(values)]})
        momentum, betas, eps = OPTIM_ROWS[i % len(OPTIM_ROWS)]
        optim = OptimConfig(optimizer, lr, momentum, 1e-4 * (i + 1), betas, eps)
        ctx = MethodContext(data, head or cls.default_head, optim, schedule=Schedule(local_epochs=2, batch_size=16, seed=seed, rounds=3))
        out.append(Federation(cls(ctx, params), Schedule(rounds=3, fraction=fraction if i % 2 else 1.0, eval_every=2)))
    return out


def fresh(f: Federation) -> Federation:
    m = f.method
    return Federation(type(m)(dataclasses.replace(m.ctx), m.p), f.schedule)


def compare(feds, exact: bool, tol: float = 1e-4) -> None:
    stacked = run_stack([fresh(f) for f in feds])
    for f, got in zip(feds, stacked):
        alone = run_one(fresh(f))
        assert got.summary["per_client_accuracy"] == alone.summary["per_client_accuracy"]
        assert [h["per_client"] for h in got.history] == [h["per_client"] for h in alone.history]
        for key in ("bytes_up", "bytes_down", "params_up_per_round", "rounds"):
            assert got.summary[key] == alone.summary[key]
        for mine, theirs in ((got.server, alone.server), (got.clients, alone.clients)):
            assert set(mine) == set(theirs)
            for n in theirs:
                if exact:
                    assert torch.equal(mine[n], theirs[n]), n
                else:
                    torch.testing.assert_close(mine[n], theirs[n], rtol=tol, atol=tol)
        losses = [(h["train_loss"], a["train_loss"]) for h, a in zip(got.history, alone.history)]
        assert all((x is None and y is None) or (exact and x == y) or abs(x - y) <= tol for x, y in losses)


# Each case with one optimizer in make test, the two taken in turn; with the other in make test-slow.
@pytest.mark.parametrize("name, setting, optimizer", [
    pytest.param(name, setting, optimizer, id=f"{name}-{setting}-{optimizer}",
                 marks=[pytest.mark.slow] if (i + k) % 2 else [])
    for i, (name, setting) in enumerate(CASES) for k, optimizer in enumerate(("adam", "sgd"))])
def test_a_stack_computes_what_its_runs_compute_one_by_one(name, setting, optimizer):
    """Bit-identical, though the runs differ in partition, client count, seed and each setting the method declares
    per row or per run: every step is the plan's full width (local.train), so each federation's rows take the same
    kernels' arithmetic as in its own run (its own plan, one fused optimizer call per federation, the per-run
    aggregation on its own slice; FST-CBDG's synthetic instances padded per run, not per stack)."""
    compare(federations(name, optimizer, fraction=0.6, setting=setting), exact=True)


def outcome(result) -> str:
    """What a run computed: its history and final states, as one digest."""
    h = hashlib.sha256(repr(result.history).encode())
    for part in (result.server, result.clients):
        for n in sorted(part):
            h.update(n.encode() + part[n].cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("name, setting", [c for c in CASES if c[1]], ids=lambda v: str(v))
def test_each_value_a_stacked_setting_takes_there_changes_what_its_run_computes(name, setting):
    """Else a stack that applied one run's value to every row could pass the equality test above. A setting that
    acts only once another is set needs an entry in ENABLERS (or LABEL_SKEW)."""
    f = federations(name, fraction=0.6, setting=setting)[1]  # a run sampling 3 of its 5 clients a round
    m = f.method
    got = [outcome(run_one(Federation(type(m)(dataclasses.replace(m.ctx), dataclasses.replace(m.p, **{setting: v})),
                                      f.schedule))) for v in ROW_SETTINGS[name][setting]]
    assert len(set(got)) == len(got), f"{name}'s {setting}: {ROW_SETTINGS[name][setting]} -> {got}"


# Options that change what local_update or aggregate computes, each stacked as well.
VARIANTS = [("fedproto", PFLLIB), ("fedproto", {"local_protos": "last-epoch", "predict": "proto"}),
            ("fst-cbdg", {"refresh": "batch", "synthetic": "explicit"}),
            ("fst-cbdg", {"anchors": "prototypes", "shots": 4}),
            ("fst-cbdg", {"sampling": "equal", "tsamp_weight": "sum", "losses": "tsamp", "gamma": 0.5}),
            ("fedpcl", {"contrast": "batch", "first_round": "ce"}),
            ("fedpcl", {"first_round": "decay"}),
            ("fedpcl", {"prototypes": "local", "noise": "gaussian", "predict_with": "clean"}),
            ("fedpcl", {"prototypes": "global", "local_reduce": "mean", "ce_weight": 0.5, "predict": "global"}),
            ("fedpcl", {"loss": "supcon", "noise": "laplace", "aggregation": "mean", "predict": "classifier", "ce_weight": 0.5})]


@pytest.mark.parametrize("name, shared", VARIANTS, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_a_stack_of_runs_with_other_options_computes_what_they_compute_alone(name, shared):
    compare(federations(name, "adam", fraction=0.6, shared=shared), exact=True)


def test_fedproto_computes_a_stack_s_prototypes_run_by_run(monkeypatch):
    """The prototype pass after training pads each chunk of clients to its largest client: a chunk holding clients
    of several runs would pad a run's rows to another width than its run alone, which rounds differently at
    realistic widths (not at this test's 32 features, so the equality tests above cannot see it)."""
    cls = METHODS.get("fedproto")
    calls, own = [], cls._prototypes

    def recording(self, states, clients):
        calls.append(isinstance(self, Joint))  # the joint object holds every run's clients
        return own(self, states, clients)

    monkeypatch.setattr(cls, "_prototypes", recording)
    run_stack([fresh(f) for f in federations("fedproto", fraction=0.6)])
    assert calls and not any(calls), calls


def test_a_fst_cbdg_run_without_synthetic_instances_stays_bit_identical_in_a_stack_that_draws():
    """lambda = 0 per row: that run's rows draw nothing (its run alone skips L_tSamp), so the padding of the
    other runs' synthetic instances never reaches its arithmetic."""
    feds = federations("fst-cbdg", "adam", fraction=0.6, setting="lam")
    i = next(i for i, f in enumerate(feds) if f.method.p.lam == 0.0)
    got, alone = run_stack([fresh(f) for f in feds])[i], run_one(fresh(feds[i]))
    assert got.history == alone.history
    assert all(torch.equal(got.server[n], alone.server[n]) for n in alone.server)
    assert all(torch.equal(got.clients[n], alone.clients[n]) for n in alone.clients)


def test_fst_cbdg_runs_with_prototype_anchors_stack_each_with_its_own_anchors():
    """Each run draws its anchors from its own seed and clients (in its own method object); the stack reads them
    only in tsamp, run by run, so such runs stack (and equal their runs alone: VARIANTS, CASES)."""
    feds = federations("fst-cbdg", fraction=0.6, shared={"anchors": "prototypes"})
    assert all(why_alone(f) == "" for f in feds) and len({stack_key(f) for f in feds}) == 1
    assert not torch.equal(feds[0].method.anchors, feds[1].method.anchors)
    Stacked(feds)  # no refusal


def test_a_broadcast_whose_shape_differs_between_runs_is_read_run_by_run(monkeypatch):
    """FedPCL's local prototype sets are those of its run's clients that have sent one: read outside a per_run
    function, runs whose senders differ (here runs of different client counts) would not stack (and never be read
    as another run's sets)."""
    cls = METHODS.get("fedpcl")
    monkeypatch.setattr(cls, "contrastive", cls.contrastive.__wrapped__)
    with pytest.raises(ConfigError, match="fedpcl's broadcast 'local(_count)?' differs in shape between the stacked runs"):
        run_stack([fresh(f) for f in federations("fedpcl")[:2]])  # 4 and 5 clients


def test_a_setting_that_differs_per_run_is_read_only_in_per_run_functions(monkeypatch):
    """A joint object holds no single value of a per_run setting: reading it outside a @per_run function is an
    error, never the first run's value applied to every run."""
    cls = METHODS.get("fst-cbdg")
    monkeypatch.setattr(cls, "tsamp", cls.tsamp.__wrapped__)
    with pytest.raises(TypeError, match="fst-cbdg's setting 'lam' differs between stacked runs"):
        run_stack([fresh(f) for f in federations("fst-cbdg")])


def test_stacked_fedpcl_runs_must_agree_on_whether_global_prototypes_exist():
    """A run whose last sampled clients held no rows has no global prototypes: its rows would train another
    loss (and other layers) than the stack's others, so the stack refuses rather than mix them."""
    feds = [fresh(f) for f in federations("fedpcl")[:2]]
    m = feds[1].method
    with_prototypes = m.init_server()
    with_prototypes["global_mask"][:] = True
    m.init_server = lambda: with_prototypes
    with pytest.raises(ConfigError, match="stacked runs disagree on a fact their rows must share"):
        run_stack(feds)


@pytest.mark.parametrize("name, head", [("fedavg", "mlp"), ("fedntd", "mlp"), ("fedproto", "projection"), ("fedrep", "projection")])
def test_a_stack_of_runs_with_another_head_computes_what_they_compute_alone(name, head):
    """The mlp head's BatchNorm statistics are per client over its real rows, masked on every step (heads/mlp.py):
    with an unmasked shortcut on steps without padding rows, which a stack's step rarely is where a run's
    is, they rounded differently in a stack. fedproto and fedrep train with the mlp head above."""
    compare(federations(name, "adam", fraction=0.6, head=head), exact=True)


def test_runs_that_differ_in_a_setting_that_is_not_per_row_do_not_stack():
    a, b = federations("fedavg")[:2]
    b = Federation(b.method, dataclasses.replace(b.schedule, eval_every=1))
    with pytest.raises(ConfigError, match="cannot train stacked"):
        run_stack([a, b])


# fst-cbdg: client states padded to the widest run; fedpcl: servers of different shapes, broadcasts padded
@pytest.mark.parametrize("name", ["fedprox", "fst-cbdg", "fedpcl"])
def test_an_interrupted_stack_continues_from_its_checkpoint_to_the_same_result(tmp_path, name):
    feds = federations(name, fraction=0.6)

    def written(where: str) -> list[Federation]:  # each run writes its metrics lines into its own directory
        runs = [fresh(f) for f in feds]
        for i, r in enumerate(runs):
            (tmp_path / where / str(i)).mkdir(parents=True, exist_ok=True)
            r.out = RunDir(tmp_path / where / str(i))
        return runs

    whole = run_stack(written("whole"))

    def stop_after_one(done, total, lines):  # before the first metrics line (round 2): its losses are in the checkpoint
        if done == 1:
            raise KeyboardInterrupt

    ck = tmp_path / "checkpoint.pt"
    with pytest.raises(KeyboardInterrupt):
        run_stack(written("stopped"), ck, on_round=stop_after_one)
    assert torch.load(ck, weights_only=True)["rnd"] == 1
    resumed = run_stack(written("stopped"), ck)
    for a, b in zip(whole, resumed):
        assert a.history == b.history  # train_loss too: the losses since the last metrics line are kept
        assert all(torch.equal(a.server[n], b.server[n]) for n in a.server)
        assert all(torch.equal(a.clients[n], b.clients[n]) for n in a.clients)
        for key in ("params_up", "senders", "bytes_up", "bytes_down", "rnd"):
            assert a.checkpoint[key] == b.checkpoint[key], key
    with pytest.raises(ConfigError, match="is a checkpoint of 4 runs, not of these 3"):
        run_stack([fresh(f) for f in feds[:3]], ck)


@pytest.mark.parametrize("name", ["fedprox", "fst-cbdg", "fedpcl"])
def test_a_paused_stack_continues_in_other_stacks_to_the_same_result(tmp_path, name):
    """Successive halving pauses a stack at a rung and continues some of its runs, stacked anew or alone:
    each paused run keeps its own checkpoint, and continues to the numbers of a stack that never paused."""
    feds = federations(name, fraction=0.6)

    def written(where: str, which) -> list[Federation]:
        runs = [fresh(feds[i]) for i in which]
        for i, r in zip(which, runs):
            r.out = RunDir(tmp_path / where / str(i))
            r.out.path.mkdir(parents=True, exist_ok=True)
        return runs

    whole = run_stack(written("whole", range(4)))
    paused = driver.run(written("halved", range(4)), Stacked(written("halved", range(4))), stop_after=1,
                        checkpoint=tmp_path / "batch.pt")
    assert all(r.paused and r.summary["rounds"] == 1 for r in paused)
    assert all((tmp_path / "halved" / str(i) / "checkpoint.pt").exists() for i in range(4))
    assert not any((tmp_path / "halved" / str(i) / "summary.json").exists() for i in range(4))
    # Scored at round 1, which has no metrics line (eval_every=2): as a run evaluating every round scores it.
    every = [Federation(fresh(f).method, dataclasses.replace(f.schedule, eval_every=1)) for f in feds]
    for r, f in zip(paused, every):
        assert r.summary["per_client_accuracy"] == run_one(f).history[0]["per_client"]
    pair = written("halved", [0, 2])
    continued = driver.run(pair, Stacked(pair), resume=True) + [run_one(written("halved", [3])[0], resume=True)]
    for a, b in zip([whole[0], whole[2], whole[3]], continued):
        assert not b.paused and a.history == b.history
        assert all(torch.equal(a.server[n], b.server[n]) for n in a.server)
        assert all(torch.equal(a.clients[n], b.clients[n]) for n in a.clients)
        for key in ("params_up", "senders", "bytes_up", "bytes_down", "rnd"):
            assert a.checkpoint[key] == b.checkpoint[key], key
    for i in (0, 2, 3):
        assert (tmp_path / "halved" / str(i) / "metrics.jsonl").read_text() == (tmp_path / "whole" / str(i) / "metrics.jsonl").read_text()


def test_runs_paused_at_different_rounds_do_not_stack(tmp_path):
    feds = federations("fedavg")
    runs = [fresh(f) for f in feds[:2]]
    for i, (r, stop) in enumerate(zip(runs, (1, 2))):
        r.out = RunDir(tmp_path / str(i))
        r.out.path.mkdir()
        run_one(r, stop_after=stop)
    runs = [fresh(f) for f in feds[:2]]
    for i, r in enumerate(runs):
        r.out = RunDir(tmp_path / str(i))
    with pytest.raises(ConfigError, match=r"rounds \[1, 2\], not of one round"):
        driver.run(runs, Stacked(runs), resume=True)
