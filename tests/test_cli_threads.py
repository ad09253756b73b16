"""The command's torch threads (fedcache/cli/threads.py): the cores other processes leave free, said once, overridden
by the user, restored after; and the library leaves them alone."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedcache
from fedcache.cli import main
from fedcache.cli import train as cli_train
from fedcache.cli import threads
from fedcache.cli.threads import ENV, Choice, Sample, choose, others_busy

REPO = Path(__file__).resolve().parents[1]
TOY = ["-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg", "--partition", "domain", "--rounds", "2"]


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory) -> Path:
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("threads") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0))
    return path


@pytest.fixture
def said(caplog):
    """The command's records so far (its thread choice is an INFO record, as the device choice is)."""
    caplog.set_level(logging.INFO, logger="fedcache.cli")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "fedcache.cli"]


@pytest.fixture
def threads_restored():
    n = torch.get_num_threads()
    yield n
    torch.set_num_threads(n)


# ---- the choice ---------------------------------------------------------------------------------
def _never() -> float:
    raise AssertionError("the machine was watched although the choice did not need it")


@pytest.mark.parametrize("current, cores, others, expected", [
    (2, 2, 0.0, 2), (2, 2, 0.4, 2),  # idle: torch's default
    (2, 2, 1.2, 1), (2, 2, 5.0, 1),  # beside busy work: the free cores, one at the least
    (8, 16, 0.0, 8), (8, 16, 10.4, 6), (8, 16, 15.7, 1),  # never more than torch's default
])
def test_the_cores_other_processes_leave_free(current, cores, others, expected):
    choice = choose(None, {}, current, cores, lambda: others)
    assert choice.threads == expected
    busy = f"other processes kept {others:.1f} of {cores} cores busy as this command started"
    assert choice.why == (f"torch's default; {busy}" if expected == current else busy) + f"; --threads N or {ENV} to change"


def test_without_a_measurement_torch_s_default_stays():
    choice = choose(None, {}, 4, 4, lambda: None)
    assert choice == Choice(4, "torch's default: this system does not say how busy its cores are")


def test_omp_num_threads_wins_over_the_policy():
    # torch has read the variable already: the current count is the user's
    assert choose(None, {ENV: " 3 "}, 3, 8, _never) == Choice(3, f"{ENV}=3")
    assert choose(None, {ENV: ""}, 4, 4, lambda: 3.5).threads == 1  # set but empty: torch ignores it, so do we


def test_threads_option_wins_over_everything():
    for env in ({}, {ENV: "2"}):
        assert choose(5, env, 2, 2, _never) == Choice(5, "--threads")


def test_others_busy_is_the_machine_s_busy_time_less_this_process_s():
    start, end = Sample(at=10.0, busy=100.0, own=5.0), Sample(at=12.0, busy=103.5, own=6.0)
    assert others_busy(start, end) == pytest.approx(1.25)  # (3.5 - 1.0) busy core-seconds in 2 s
    assert others_busy(start, Sample(at=12.0, busy=100.5, own=6.0)) == 0.0  # never below zero (clock ticks)
    if hasattr(os, "getloadavg"):  # no /proc/stat (macOS) or no start: the one-minute load average
        assert others_busy(None, end) == os.getloadavg()[0] or others_busy(None, end) >= 0


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux's /proc/stat")
def test_a_busy_process_beside_this_one_is_seen():
    start = Sample.now()
    spin = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass"])
    spin.wait(timeout=60)
    assert others_busy(start, Sample.now()) >= 0.3  # at least the spinner's share of a core, whatever else runs


# ---- the command --------------------------------------------------------------------------------
def _spy_on_training(monkeypatch) -> list[int]:
    """The thread count the in-process engine trains with, per call (the real engine runs)."""
    seen, real = [], cli_train.ENGINES["in-process"]

    def engine(spec):
        seen.append(torch.get_num_threads())
        return real(spec)

    monkeypatch.setitem(cli_train.ENGINES, "in-process", engine)
    return seen


def _machine(monkeypatch, cores: int, others: float) -> None:
    """The command sees ``cores`` usable cores of which other processes keep ``others`` busy."""
    monkeypatch.setattr(threads, "usable_cores", lambda: list(range(cores)))
    monkeypatch.setattr(threads, "_watched", lambda: others)


@pytest.mark.parametrize("others, expected, line", [
    (0.0, 2, "torch threads: 2 (torch's default; other processes kept 0.0 of 2 cores busy as this command started; "),
    (1.3, 1, "torch threads: 1 (other processes kept 1.3 of 2 cores busy as this command started; "),
])
def test_train_takes_the_free_cores_says_so_and_restores_the_count(others, expected, line, toy_store, monkeypatch, capsys,
                                                                    said, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    _machine(monkeypatch, 2, others)
    torch.set_num_threads(2)
    seen = _spy_on_training(monkeypatch)
    assert main(["train", "--store", str(toy_store), *TOY]) == 0
    assert seen == [expected]
    assert said() == [line + "--threads N or OMP_NUM_THREADS to change)"]
    assert "torch threads" not in capsys.readouterr().err  # the log's, not stderr's: a failing command's error stays one line
    assert torch.get_num_threads() == 2  # a caller of main() keeps its own count


def test_the_command_watches_the_machine_from_its_start(toy_store, monkeypatch, said, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    watched, real = [], threads.others_busy
    monkeypatch.setattr(threads, "others_busy", lambda start, end: watched.append((start, end)) or real(start, end))
    assert main(["train", "--store", str(toy_store), *TOY]) == 0
    ((start, end),) = watched
    assert start is threads._START and end.at - start.at >= threads.SHORTEST  # main() marked it, the choice waited
    assert any(m.startswith("torch threads: ") for m in said())


@pytest.mark.parametrize("given, env, expected, line", [
    (["--threads", "3"], None, 3, "torch threads: 3 (--threads)"),
    (["--threads", "3"], "1", 3, "torch threads: 3 (--threads)"),
    ([], "2", 2, f"torch threads: 2 ({ENV}=2)"),
])
def test_threads_option_and_omp_num_threads_win(given, env, expected, line, toy_store, monkeypatch, said, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(ENV, env)
        torch.set_num_threads(int(env))  # what torch did with the variable when the process started
    seen = _spy_on_training(monkeypatch)
    assert main(["train", "--store", str(toy_store), *TOY, *given]) == 0
    assert seen == [expected] and said() == [line]


def test_threads_must_be_positive(toy_store, capsys):
    assert main(["train", "--store", str(toy_store), *TOY, "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err


def test_grid_and_the_other_training_commands_take_threads(toy_store, tmp_path, monkeypatch, capsys, said, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
                 "--partition", "domain", "--rounds", "1", "--seeds", "0", "--threads", "2", "-o", str(tmp_path / "g")])
    assert code == 0 and said() == ["torch threads: 2 (--threads)"]
    capsys.readouterr()
    for command in ("demo", "reproduce", "backbone-heatmap"):
        assert main([command, "-h"]) == 0 and "--threads" in capsys.readouterr().out, command


@pytest.mark.parametrize("seeds, in_this_process", [("0", [2]), pytest.param("0,1", [], marks=pytest.mark.slow)])
def test_a_grid_trains_here_on_the_free_cores_whatever_jobs_says(seeds, in_this_process, toy_store, tmp_path, monkeypatch,
                                                                  said, threads_restored):
    """--jobs 2 with one batch (two lrs of one seed) trains it in this process, as fast as `train` would; with two
    batches (two seeds) both train in workers of one thread each, and this process trains nothing."""
    import fedcache.grids.batches as batches

    monkeypatch.delenv(ENV, raising=False)
    _machine(monkeypatch, 2, 0.0)  # an idle machine: torch's default
    torch.set_num_threads(2)
    seen, real = [], batches._run_batch

    def run_batch(*args):
        seen.append(torch.get_num_threads())
        yield from real(*args)

    monkeypatch.setattr(batches, "_run_batch", run_batch)
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", "tiny-timm-random", "-m", "fedavg",
                 "--partition", "domain", "--rounds", "1", "--set", "lr=0.01,0.1", "--seeds", seeds, "-j", "2",
                 "-o", str(tmp_path / "g")])
    assert code == 0 and seen == in_this_process
    assert said()[0].startswith("torch threads: 2 (torch's default; other processes kept 0.0 of 2 cores busy")
    assert torch.get_num_threads() == 2


def test_a_bad_option_on_a_busy_machine_is_one_error_line(toy_store, tmp_path, monkeypatch, capsys, threads_restored):
    monkeypatch.delenv(ENV, raising=False)
    _machine(monkeypatch, 2, 1.9)  # the choice changes the count, and the run then fails on its output path
    (tmp_path / "f").write_text("x")
    assert main(["train", "--store", str(toy_store), *TOY, "-o", str(tmp_path / "f" / "run")]) == 2
    assert capsys.readouterr().err.startswith("error: --out")


@pytest.mark.slow
def test_the_console_script_logs_the_line_at_info(toy_store):
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(PYTHONPATH=str(REPO), FEDCACHE_LOG="info")
    done = subprocess.run([sys.executable, "-m", "fedcache.cli", "train", "--store", str(toy_store), *TOY],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "torch threads:" in line]
    assert len(lines) == 1 and re.fullmatch(r"INFO fedcache\.cli: torch threads: \d+ \((torch's default; )?other processes "
                                            r"kept \d+\.\d of \d+ cores busy as this command started; --threads N or "
                                            r"OMP_NUM_THREADS to change\)", lines[0]), lines


# ---- the library --------------------------------------------------------------------------------
def test_the_library_changes_no_thread_count(toy_store, tmp_path, threads_restored):
    torch.set_num_threads(2)
    during = []
    fedcache.train(store=toy_store, dataset="test-toy", backbones="tiny-timm-random", method="fedavg", partition="domain",
                   rounds=2, on_round=lambda *_: during.append(torch.get_num_threads()))
    fedcache.grid(store=toy_store, dataset="test-toy", backbones="tiny-timm-random", methods=["fedavg"],
                  sweep={"partition": "domain", "rounds": 1}, seeds=[0], out=tmp_path / "g",
                  on_cell=lambda *_: during.append(torch.get_num_threads()))
    assert during == [2, 2, 2, 2] and torch.get_num_threads() == 2  # on_round as the rounds start and after each
