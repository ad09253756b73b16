"""The round loop: determinism, batched == per-client, exact bytes, checkpoints and resume, divergence."""
import json

import numpy as np
import pytest
import torch

from fedcache.errors import ConfigError
from fedcache.federate.divergence import DivergedError
from fedcache.federate.driver import sample_clients
from fedcache.federate.schedule import Schedule
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.metrics import fairness, summarize
from fedcache.federate.optim import OptimConfig

from .conftest import synthetic


def make(name, data, head=None, optim=None, **schedule):
    ctx = MethodContext(data, head or METHODS.get(name).default_head, optim or OptimConfig(), Schedule(**schedule))
    return METHODS.get(name)(ctx)


def test_fedavg_bytes_match_the_formula(data):
    r = run(make("fedavg", data), RunConfig(rounds=3))
    per_client = (data.dim * data.n_classes + data.n_classes) * 4  # W and b, float32
    assert r.summary["bytes_up"] == 3 * 5 * per_client == r.summary["bytes_down"]
    assert r.summary["params_up_per_round"] == 5 * (data.dim * data.n_classes + data.n_classes)


def test_fraction_samples_clients_and_counts_only_them():
    data = synthetic(n_clients=20, per_client=20)
    m = make("fedavg", data)
    r = run(m, RunConfig(rounds=2, fraction=0.25))
    assert r.summary["bytes_up"] == 2 * 5 * (data.dim * data.n_classes + data.n_classes) * 4
    picks = [sample_clients(m, RunConfig(fraction=0.25), rnd) for rnd in range(3)]
    assert all(len(p) == 5 for p in picks) and picks[0] != picks[1]


@pytest.mark.parametrize("head", ["linear", "mlp"])
def test_batched_and_loop_paths_agree_with_unequal_clients(head):
    data = synthetic(sizes=[37, 80, 12, 64, 51])  # different step counts per client
    a = run(make("fedavg", data, head=head), RunConfig(rounds=3, batched=True))
    b = run(make("fedavg", data, head=head), RunConfig(rounds=3, batched=False))
    for n in a.server:
        torch.testing.assert_close(a.server[n], b.server[n], atol=1e-4, rtol=1e-4)  # fused optimizer kernels round per chunk
    assert a.summary["per_client_accuracy"] == b.summary["per_client_accuracy"]


# Methods with personal client state, which the loop hands to local training without a copy when
# every client trains (mlp-head methods replace BatchNorm statistics; fedpcl and pfedme replace
# other state).
STATEFUL = ["solo", "fedproto", "fedrep", "pfedme", "fedpcl"]


@pytest.mark.parametrize("name", STATEFUL)
def test_training_client_state_in_place_equals_training_a_copy(name, monkeypatch):
    import fedcache.federate.inprocess as loop

    data = synthetic(sizes=[37, 80, 12, 64, 51])
    in_place = run(make(name, data), RunConfig(rounds=3))
    monkeypatch.setattr(loop, "_gather", lambda stacked, idx: {n: t[idx] for n, t in stacked.items()})
    copied = run(make(name, data), RunConfig(rounds=3))
    assert in_place.summary["per_client_accuracy"] == copied.summary["per_client_accuracy"]
    for got, want in ((in_place.clients, copied.clients), (in_place.server, copied.server)):
        for n in want:
            torch.testing.assert_close(got[n], want[n], atol=0, rtol=0, msg=n)


def test_same_seed_same_numbers_other_seed_differs(data):
    a = run(make("solo", data, seed=3), RunConfig(rounds=2)).summary
    b = run(make("solo", data, seed=3), RunConfig(rounds=2)).summary
    c = run(make("solo", data, seed=4), RunConfig(rounds=2)).summary
    drop = lambda s: {k: v for k, v in s.items() if k != "seconds"}
    assert drop(a) == drop(b) and drop(a) != drop(c)


def test_interrupted_run_resumes_to_identical_results(data, tmp_path):
    full = run(make("solo", data), RunConfig(rounds=4))
    out = tmp_path / "part"
    out.mkdir()

    def stop_after_two(done, total, line):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(make("solo", data), RunConfig(rounds=4, out=out), on_round=stop_after_two)
    # A metrics line written after the last checkpoint (a crash between the two) is dropped on resume.
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"round": 3, "accuracy": -1}) + "\n")
    resumed = run(make("solo", data), RunConfig(rounds=4, out=out, resume=True))
    assert resumed.summary["per_client_accuracy"] == full.summary["per_client_accuracy"]
    for n in full.clients:
        torch.testing.assert_close(full.clients[n], resumed.clients[n], atol=0, rtol=0)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [l["round"] for l in lines] == [1, 2, 3, 4] and lines[2]["accuracy"] != -1


def test_resume_without_checkpoint_is_an_error(data, tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint"):
        run(make("fedavg", data), RunConfig(rounds=2, out=tmp_path, resume=True))


def test_non_finite_features_are_named_not_blamed_on_the_learning_rate(data):
    row = int(data.client_train[3][2])
    data.x_train[row, 5] = float("nan")
    with pytest.raises(DivergedError, match=rf"round 1, client 3.*training features are not finite \(1 of its 60 "
                                            rf"training rows, e.g. rows \[{row}\]") as err:
        run(make("fedavg", data), RunConfig(rounds=2))
    assert "learning rate" not in str(err.value)


def test_divergence_from_finite_inputs_names_round_client_and_the_learning_rate(data):
    # SGD steps of 1e38 overflow float32 within a few steps.
    with pytest.raises(DivergedError, match=r"round 1, client 0: '(weight|bias)'.*diverged from finite inputs: "
                                            r"lower the learning rate"):
        run(make("fedavg", data, optim=OptimConfig("sgd", 1e38, 0.0, 0.0)), RunConfig(rounds=2))


def test_a_non_finite_upload_that_is_not_a_head_weight_is_named(data):
    from fedcache.federate.methods.fedavg import FedAvg

    class Broken(FedAvg):
        def local_update(self, rnd, clients, down, states):
            r = super().local_update(rnd, clients, down, states)
            r.uploads["protos"] = torch.full((len(clients), 2), float("-inf"))
            return r

    m = make("fedavg", data)
    with pytest.raises(DivergedError, match=r"'protos' is not a weight of the linear head.*finite features") as err:
        run(Broken(m.ctx, m.p), RunConfig(rounds=1))
    assert "lower the learning rate" not in str(err.value)


def test_eval_every_and_history(data):
    r = run(make("fedavg", data), RunConfig(rounds=5, eval_every=2))
    assert [h["round"] for h in r.history] == [2, 4, 5]
    assert len(r.history[-1]["per_client"]) == 5 and "global_accuracy" in r.history[-1]


def test_fairness_figures():
    f = fairness(np.array([10.0, 20, 30, 40, 50, 60, 70, 80, 90, 100]))
    assert f["worst10"] == 10 and f["worst20"] == 15 and f["worst40"] == 25 and f["best10"] == 100
    assert f["variance"] == pytest.approx(np.var(np.arange(10, 101, 10)))



def test_std_over_clients_is_the_population_std_the_summary_names(data):
    # Two clients at 50 and 100: population std 25 (ddof=0, what `definitions` says); the sample std is 35.36.
    s = summarize(np.array([50.0, 100.0]))
    assert (s["std_accuracy"], s["variance"]) == (25.0, 625.0)
    r = run(make("fedavg", data), RunConfig(rounds=1)).summary
    acc = np.array(r["per_client_accuracy"])
    assert acc.std() > 0  # clients that differ, so ddof matters here
    assert r["std_accuracy"] == pytest.approx(acc.std(ddof=0)) and "ddof=0" in r["definitions"]["std_accuracy"]

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


def test_a_torn_last_metrics_line_is_dropped_on_resume(data, tmp_path):
    full = run(make("fedavg", data), RunConfig(rounds=3))

    def stop_after_two(done, total, line):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(make("fedavg", data), RunConfig(rounds=3, out=tmp_path), on_round=stop_after_two)
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 3, "accur')  # a crash while appending
    resumed = run(make("fedavg", data), RunConfig(rounds=3, out=tmp_path, resume=True))
    assert resumed.summary["per_client_accuracy"] == full.summary["per_client_accuracy"]
    assert [json.loads(l)["round"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_metrics_line_the_checkpoint_covers_cannot_vanish_silently(data, tmp_path, caplog):
    """A torn line after the checkpoint is re-run; one the checkpoint already covers (a damaged or edited
    file: a middle line, or the last line of a finished run) is lost, and a resume says which rounds."""
    run(make("fedavg", data), RunConfig(rounds=4, out=tmp_path))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:30]  # round 2's line torn in the middle of the file
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # and round 4's
    with caplog.at_level("WARNING"):
        resumed = run(make("fedavg", data), RunConfig(rounds=4, out=tmp_path, resume=True))
    assert [l["round"] for l in resumed.history] == [1, 3]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "rounds [2, 4]" in warned[0] and "--overwrite" in warned[0]


def test_train_loss_is_the_mean_local_step_loss(tmp_path):
    # One client, one step over all its rows: the recorded loss is the initial model's cross-entropy.
    data = synthetic(n_clients=2, per_client=20)
    m = make("fedavg", data, batch_size=64)
    init = m.init_server()
    r = run(m, RunConfig(rounds=2, out=tmp_path))
    logits = [data.x_train[rows] @ init["weight"][0] + init["bias"][0] for rows in data.client_train]
    expected = np.mean([torch.nn.functional.cross_entropy(lg, data.y_train[rows]).item()
                        for lg, rows in zip(logits, data.client_train)])
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["train_loss"] == pytest.approx(expected, rel=1e-5)
    assert r.history[1]["train_loss"] < first["train_loss"]
    # Methods that train nothing locally record none.
    assert run(make("linear-probe", data), RunConfig(rounds=1)).history[0]["train_loss"] is None


def test_a_run_resumed_between_two_metrics_lines_reports_the_same_train_loss(data, tmp_path):
    """The losses of rounds after the last metrics line are kept in the checkpoint."""
    full = run(make("fedavg", data), RunConfig(rounds=4, eval_every=2))

    def stop_after_three(done, total, line):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(make("fedavg", data), RunConfig(rounds=4, eval_every=2, out=tmp_path), on_round=stop_after_three)
    resumed = run(make("fedavg", data), RunConfig(rounds=4, eval_every=2, out=tmp_path, resume=True))
    assert resumed.history == full.history and full.history[-1]["train_loss"] is not None


@pytest.mark.parametrize("name", ["fedproto", "fedrep"])
def test_a_client_trains_the_same_whether_every_client_or_a_fraction_trains(name):
    """One round with an mlp head (BatchNorm statistics, which the head returns): a client sampled with
    --fraction 0.6 ends the round with the state it has when every client trains; clients not sampled
    keep their initial state (these methods' local step depends only on the client's own state)."""
    data = synthetic(sizes=[37, 80, 12, 64, 51])
    every = run(make(name, data, head="mlp"), RunConfig(rounds=1))
    some_method = make(name, data, head="mlp")
    some = run(some_method, RunConfig(rounds=1, fraction=0.6))
    sampled = sample_clients(some_method, RunConfig(fraction=0.6), 0)
    initial = some_method.init_clients(data.n_clients)
    assert len(sampled) == 3 and "bn.running_mean" in some.clients
    for n, t in some.clients.items():
        for k in range(data.n_clients):
            if k in sampled:
                torch.testing.assert_close(t[k], every.clients[n][k], atol=1e-6, rtol=1e-6, msg=f"{n} of client {k}")
            else:
                assert torch.equal(t[k], initial[n][k]), f"{n} of client {k}, not sampled, changed"
    changed = lambda n: [k for k in range(data.n_clients) if not torch.equal(some.clients[n][k], initial[n][k])]
    assert changed("bn.running_mean") == changed("bn.running_var") == sampled


def test_a_method_must_return_its_clients_whole_state(data):
    from fedcache.errors import FedcacheError
    from fedcache.federate.methods.solo import Solo

    class Forgetful(Solo):  # returns its weights but not its BatchNorm statistics
        def local_update(self, rnd, clients, down, states):
            r = super().local_update(rnd, clients, down, states)
            r.states = {n: t for n, t in r.states.items() if not n.startswith("bn.running")}
            return r

    m = make("solo", data, head="mlp")
    with pytest.raises(FedcacheError, match=r"solo.local_update returned states .* every entry of the personal state"):
        run(Forgetful(m.ctx, m.p), RunConfig(rounds=1, fraction=0.6))
