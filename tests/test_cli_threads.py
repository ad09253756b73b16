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
from fedcache.cli.threads import ENV, ROUNDS, Work, choose, features_missing

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
def test_rounds_on_cached_features_take_one_thread():
    choice = choose(ROUNDS, None, {}, current=4)
    assert choice.threads == 1 and choice.line().startswith("torch threads: 1 (rounds on cached features")


def test_extraction_keeps_torch_s_default():
    choice = choose(Work("the demo", extracts=True), None, {}, current=4)
    assert choice.threads == 4 and "extracted first" in choice.why


def test_omp_num_threads_wins_over_the_policy():
    # torch has read the variable already: the current count is the user's
    for work in (ROUNDS, Work("the demo", extracts=True)):
        choice = choose(work, None, {ENV: " 3 "}, current=3)
        assert choice.threads == 3 and choice.why == f"{ENV}=3"
    assert choose(ROUNDS, None, {ENV: ""}, current=4).threads == 1  # set but empty: torch ignores it, so do we


def test_threads_option_wins_over_everything():
    for env in ({}, {ENV: "2"}):
        for work in (ROUNDS, Work("x", extracts=True)):
            assert choose(work, 5, env, current=2) == choose(ROUNDS, 5, {}, current=7)
    assert choose(ROUNDS, 5, {ENV: "2"}, current=2).why == "--threads"


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
    assert err.count("torch threads: 1 (rounds on cached features") == 1
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
    assert lines == ["INFO fedcache.cli: torch threads: 1 (rounds on cached features; --threads N or OMP_NUM_THREADS to change)"]


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
