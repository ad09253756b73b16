"""The command's torch threads (fedcache/cli/threads.py): chosen from the work, said once, overridden by the user,
restored after; and the library leaves them alone."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedcache
from fedcache.cli import main
from fedcache.cli import train as cli_train
from fedcache.cli import threads
from fedcache.cli.threads import ENV, EXTRACTS, WIDE, Choice, Work, choose, features_missing, rounds_work

REPO = Path(__file__).resolve().parents[1]
TOY = ["-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg", "--partition", "domain", "--rounds", "2"]


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory) -> Path:
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("threads") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0))
    return path


@pytest.fixture
def threads_restored():
    n = torch.get_num_threads()
    yield n
    torch.set_num_threads(n)


# ---- the choice ---------------------------------------------------------------------------------
SMALL = Work("rounds on cached features", head_params=12_810)


def test_rounds_of_a_small_head_take_one_thread():
    choice = choose(SMALL, None, {}, current=4)
    assert choice.threads == 1
    assert choice.line().startswith("torch threads: 1 (rounds on cached features with a head of 12,810 parameters")


@pytest.mark.parametrize("work, why", [
    (Work("rounds", head_params=WIDE), "wide head, 100,000 parameters"),
    (Work("rounds", head_params=10, frozen_model="promptfl"), "promptfl runs a frozen model"),
    (Work("extraction", extracts=True), "extracted first"),
])
def test_wide_work_keeps_torch_s_default(work, why):
    choice = choose(work, None, {}, current=4)
    assert choice.threads == 4 and why in choice.why
    assert choose(Work("rounds", head_params=WIDE - 1), None, {}, current=4).threads == 1


def test_grid_workers_take_one_thread_whatever_the_head():
    choice = choose(Work("rounds on cached features", head_params=10 * WIDE, workers=2), None, {}, current=4)
    assert choice.threads == 1 and "2 worker processes of one thread each" in choice.why


def test_omp_num_threads_wins_over_the_policy():
    # torch has read the variable already: the current count is the user's
    for work in (SMALL, Work("wide", head_params=WIDE), EXTRACTS):
        choice = choose(work, None, {ENV: " 3 "}, current=3)
        assert choice.threads == 3 and choice.why == f"{ENV}=3"
    assert choose(SMALL, None, {ENV: ""}, current=4).threads == 1  # set but empty: torch ignores it, so do we


def test_threads_option_wins_over_everything():
    for env in ({}, {ENV: "2"}):
        for work in (SMALL, Work("wide", head_params=WIDE), EXTRACTS, Work("grid", workers=3)):
            assert choose(work, 5, env, current=2) == Choice(5, "--threads")


def test_the_work_of_a_run_is_its_widest_head(toy_store):
    dims = 96 * 3 + 3  # tiny-timm-random's 96-d features, test-toy's 3 classes: the linear head's parameters
    assert rounds_work(toy_store, "test-toy", ["tiny-timm-random"], [("fedavg", None)]).head_params == dims
    mlp = 96 * 256 + 3 * 256 + 256 * 3 + 3  # FC(96, 256) with its bias, BatchNorm's scale and shift, FC(256, 3)
    work = rounds_work(toy_store, "test-toy", ["tiny-timm-random"], [("fedavg", None), ("fedproto", None), ("fedavg", "linear")])
    assert work.head_params == mlp and work.frozen_model == ""
    assert rounds_work(toy_store, "test-toy", ["tiny-timm-random"], [("tpfl", None)]).frozen_model == "tpfl"
    for store, dataset, method, head in ((toy_store, "nope", "fedavg", None), (toy_store, "test-toy", "nope", None),
                                         (toy_store, "test-toy", "fedavg", "nope"), (toy_store.parent / "none.zarr", "test-toy", "fedavg", None)):
        assert rounds_work(store, dataset, ["tiny-timm-random"], [(method, head)]).head_params == 0  # the run says why


def test_a_grid_a_preset_and_the_demo_count_their_widest_run(toy_store):
    from types import SimpleNamespace as NS

    from fedcache.cli.threads import demo_work, grid_work, preset_work

    toy = dict(store=toy_store, dataset="test-toy", backbones=["tiny-timm-random"])
    mlp = rounds_work(*toy.values(), [("fedproto", None)]).head_params
    assert grid_work(NS(**toy, methods=["fedavg"], sweep={"head": ["linear", "mlp"]}, jobs=1)).head_params == mlp
    assert grid_work(NS(**toy, methods=["fedavg"], sweep={}, jobs=2)).workers == 2
    grids = [NS(store_dataset="test-toy", backbones=["tiny-timm-random"], methods=m, sweep=sw)
             for m, sw in ((["fedavg"], {}), (["fedavg"], {"head": "mlp"}))]
    assert preset_work(NS(experiments=grids), toy_store, 1).head_params == mlp
    assert preset_work(NS(experiments=[*grids, NS(store_dataset="test-toy", backbones=["efficientnet-lite0"], methods=["fedavg"],
                                                  sweep={})]), toy_store, 1) == EXTRACTS
    assert demo_work(toy_store, "test-toy", ["tiny-timm-random"], ["fedavg", "fedproto"]).head_params == mlp
    assert demo_work(toy_store, "test-toy", ["tiny-timm-random", "efficientnet-lite0"], ["fedavg"]) == EXTRACTS


def test_features_missing(toy_store, tmp_path):
    assert not features_missing(toy_store, "test-toy", ["tiny-timm-random"])
    assert features_missing(toy_store, "test-toy", ["tiny-timm-random", "efficientnet-lite0"])
    assert features_missing(toy_store, "no-such-dataset", ["tiny-timm-random"])
    assert features_missing(tmp_path / "none.zarr", "test-toy", ["tiny-timm-random"])


# ---- the command --------------------------------------------------------------------------------
def _spy_on_training(monkeypatch) -> list[int]:
    """The thread count the in-process engine trains with, per call (the real engine runs)."""
    seen, real = [], cli_train.ENGINES["in-process"]

    def engine(spec):
        seen.append(torch.get_num_threads())
        return real(spec)

    monkeypatch.setitem(cli_train.ENGINES, "in-process", engine)
    return seen


def test_train_uses_one_thread_says_so_and_restores_the_count(toy_store, monkeypatch, capsys, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    torch.set_num_threads(2)
    seen = _spy_on_training(monkeypatch)
    assert main(["train", "--store", str(toy_store), *TOY]) == 0
    err = capsys.readouterr().err
    assert seen == [1]
    assert err.count("torch threads: 1 (rounds on cached features with a head of 291 parameters per client") == 1
    assert torch.get_num_threads() == 2  # a caller of main() keeps its own count


@pytest.mark.parametrize("given, env, expected, said", [
    (["--threads", "3"], None, 3, "torch threads: 3 (--threads)"),
    (["--threads", "3"], "1", 3, "torch threads: 3 (--threads)"),
    ([], "2", 2, f"torch threads: 2 ({ENV}=2)"),
])
def test_threads_option_and_omp_num_threads_win(given, env, expected, said, toy_store, monkeypatch, capsys, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(ENV, env)
        torch.set_num_threads(int(env))  # what torch did with the variable when the process started
    seen = _spy_on_training(monkeypatch)
    assert main(["train", "--store", str(toy_store), *TOY, *given]) == 0
    assert seen == [expected] and said in capsys.readouterr().err


def test_a_wide_head_trains_on_torch_s_default(toy_store, monkeypatch, capsys, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(threads, "WIDE", 1000)  # the toy's mlp head (26,115 parameters) counts as wide
    torch.set_num_threads(2)
    seen = _spy_on_training(monkeypatch)
    assert main(["train", "--store", str(toy_store), *TOY, "--head", "mlp"]) == 0
    assert seen == [2] and "torch threads: 2 (torch's default: rounds on cached features with a wide head, 26,115" in capsys.readouterr().err


def test_threads_must_be_positive(toy_store, capsys):
    assert main(["train", "--store", str(toy_store), *TOY, "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err


def test_grid_and_the_other_training_commands_take_threads(toy_store, tmp_path, monkeypatch, capsys, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
                 "--partition", "domain", "--rounds", "1", "--seeds", "0", "--threads", "2", "-o", str(tmp_path / "g")])
    assert code == 0 and "torch threads: 2 (--threads)" in capsys.readouterr().err
    for command in ("demo", "reproduce", "backbone-heatmap"):
        assert main([command, "-h"]) == 0 and "--threads" in capsys.readouterr().out, command


def test_the_console_script_logs_the_line_at_info(toy_store):
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(PYTHONPATH=str(REPO), FEDCACHE_LOG="info")
    done = subprocess.run([sys.executable, "-m", "fedcache.cli", "train", "--store", str(toy_store), *TOY],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "torch threads:" in line]
    assert lines == ["INFO fedcache.cli: torch threads: 1 (rounds on cached features with a head of 291 parameters per client; "
                     "--threads N or OMP_NUM_THREADS to change)"]


# ---- the library --------------------------------------------------------------------------------
def test_the_library_changes_no_thread_count(toy_store, tmp_path, threads_restored):
    torch.set_num_threads(2)
    during = []
    fedcache.train(store=toy_store, dataset="test-toy", backbones="tiny-timm-random", method="fedavg", partition="domain",
                   rounds=2, on_round=lambda *_: during.append(torch.get_num_threads()))
    fedcache.grid(store=toy_store, dataset="test-toy", backbones="tiny-timm-random", methods=["fedavg"],
                  sweep={"partition": "domain", "rounds": 1}, seeds=[0], out=tmp_path / "g",
                  on_cell=lambda *_: during.append(torch.get_num_threads()))
    assert during == [2, 2, 2] and torch.get_num_threads() == 2
