"""The run specification: every run option declared once (fedcache/spec.py), and the CLI, the Python API,
config.json and the Flower run config all derived from it."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from rich.markup import escape

import fedcache
from fedcache.cli import GRID_HOW, GRID_OWN, GRID_SKIPS, app, main
from fedcache.cli.threads import PROCESS_OPTIONS
from fedcache.errors import ConfigError
from fedcache.spec import RunSpec, is_option, option, options

ROOT = Path(__file__).resolve().parents[1]
TOY = dict(dataset="test-toy", backbones="tiny-timm-random", method="fedavg")


def _command(name: str):
    return typer.main.get_command(app).commands[name]


def _flags(param) -> set[str]:
    return set(param.opts + param.secondary_opts)


def _spec_flags(o) -> set[str]:
    return {f for flag in o.flags for f in flag.split("/")}


def test_every_train_option_comes_from_the_spec():
    params = {p.name: p for p in _command("train").params}
    assert set(params) == {o.name for o in options()} | set(PROCESS_OPTIONS)  # --threads: the process's, no run option
    for o in options():
        p = params[o.name]
        assert _flags(p) == _spec_flags(o), o.name
        assert p.help == escape(o.help) and p.required == o.required, o.name  # help is rich markup
        if not o.required:
            assert p.default == (list(o.default) if o.opt.repeatable else ",".join(o.default) if o.base is tuple
                                 else o.default), o.name


def test_partition_and_shard_take_the_spec_s_data_and_partition_options():
    wanted = {o.name for o in options("data", "partition")} | {"seed"}
    for name, own in (("partition", {"plot"}), ("shard", {"out"})):
        params = {p.name: p for p in _command(name).params}
        assert set(params) == wanted | own, name
        for n in wanted:
            assert _flags(params[n]) == _spec_flags(option(n)), (name, n)


def test_grid_takes_every_train_option_and_says_why_it_skips_any():
    grid = {p.name: p for p in _command("grid").params}
    not_axes = {o.name for o in options() if not o.opt.axis}
    # grid declares each itself, takes it as one value for every cell, or says why it has none
    assert not_axes == set(GRID_OWN) | set(GRID_SKIPS) | set(GRID_HOW)
    for o in options():
        if o.opt.axis or o.name in GRID_HOW:
            assert _flags(grid[o.name]) == _spec_flags(o), o.name


def test_api_and_cli_take_the_same_names():
    cli = {p.name for p in _command("train").params}
    explicit = {n for n, p in inspect.signature(fedcache.train).parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD}
    assert explicit - {"on_round"} <= cli
    for name in cli - explicit - set(PROCESS_OPTIONS):  # every other CLI name is a keyword of fedcache.train (built by RunSpec.of)
        assert is_option(name)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) colour"):
        fedcache.train("nowhere.zarr", "test-toy", "b", "fedavg", colour="red")


BAD = [  # (CLI flag, value, what the message must say)
    ("--rounds", "0", "--rounds (schedule.rounds)=0: must be >= 1"),
    ("--fraction", "1.5", "--fraction (schedule.fraction)=1.5: must be in (0, 1]"),
    ("--fraction", "0", "--fraction (schedule.fraction)=0.0: must be in (0, 1]"),
    ("--alpha", "0", "--alpha (partition.alpha)=0.0: must be > 0"),
    ("--subsample", "0", "--subsample (partition.subsample)=0.0: must be in (0, 1]"),
    ("--repeat-rate", "2", "--repeat-rate (partition.repeat_rate)=2.0: must be in [0, 1]"),
    ("--local-test", "0", "--local-test (partition.local_test)=0: must be >= 1"),
    ("--clients", "0", "--clients (partition.clients)=0: must be >= 1"),
    ("--batch-size", "0", "--batch-size (schedule.batch_size)=0: must be >= 1"),
    ("--eval-every", "0", "--eval-every (schedule.eval_every)=0: must be >= 1"),
    ("--seed", "-1", "--seed (schedule.seed)=-1: must be >= 0"),
    ("--preset", "fast", "--preset (optim.preset)='fast': must be one of default, fedpcl"),
    ("--engine", "grpc", "--engine (engine.name)='grpc': must be one of in-process, flower-sim"),
]


@pytest.mark.parametrize("flag,value,message", BAD)
def test_a_bad_value_fails_before_any_work_naming_the_field_and_its_range(flag, value, message, tmp_path, capsys):
    store = tmp_path / "missing.zarr"  # any work would fail on the missing store instead
    assert main(["train", "--store", str(store), "-d", "x", "-b", "y", "-m", "fedavg", flag, value]) == 2
    err = capsys.readouterr().err
    assert message in err and "no feature store" not in err
    with pytest.raises(ConfigError) as exc:  # the Python API says the same
        fedcache.train(store, "x", "y", "fedavg", **{option(flag[2:]).name: value})
    assert message in str(exc.value).replace("\n", "")


def test_numbers_are_checked_when_given_in_python_too():
    with pytest.raises(ConfigError, match=r"--fraction \(schedule.fraction\)=2.0: must be in \(0, 1\]"):
        RunSpec.of(**TOY, fraction=2)
    with pytest.raises(ConfigError, match="expected int"):
        RunSpec.of(**TOY, rounds=2.5)
    with pytest.raises(ConfigError, match="needs --dataset"):
        RunSpec.of(backbones="b", method="fedavg")


def test_option_names_and_qualified_keys_are_the_same_option():
    assert RunSpec.of(**TOY, **{"partition.alpha": "0.5"}) == RunSpec.of(**TOY, alpha=0.5)
    assert RunSpec.of(**TOY).replace(**{"schedule.rounds": 4}).schedule.rounds == 4
    with pytest.raises(ConfigError, match="given twice"):
        RunSpec.of(**TOY, alpha=1.0, **{"partition.alpha": 0.5})


SPEC = RunSpec.of(dataset="d", backbones="a,b", method="fedprox", partition="domain-dirichlet", alpha="0.3",
                  few_shot=5, subsample=0.5, settings=["mu=0.5", "optim.betas=0.9,0.99"], preset="fst-cbdg",
                  head="mlp", rounds=7, fraction=0.5, eval_every=2, seed=3, validation=True, batched=False)


def test_config_json_round_trip():
    assert RunSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    assert set(SPEC.to_dict()) == {"data", "partition", "method", "optim", "head", "schedule", "engine"}
    written = SPEC.replace(out="runs/x", resume=True)  # where a run is written is not what the run is
    assert written.to_dict() == SPEC.to_dict() and RunSpec.from_dict(written.to_dict()) == SPEC


def test_flower_run_config_round_trip():
    flat = SPEC.to_flat()
    assert all(isinstance(v, (str, int, float, bool)) for v in flat.values())  # what a Flower run config holds
    assert flat["method.settings"] == "mu=0.5 optim.betas=0.9,0.99" and flat["data.backbones"] == "a,b"
    assert flat["partition.clients"] == ""  # unset: Flower has no null
    assert RunSpec.from_flat(flat, RunSpec.of(**TOY)) == SPEC
    text = {k: str(v) for k, v in flat.items()}  # as `flwr run --run-config` may hand them over
    assert RunSpec.from_flat(text, RunSpec.of(**TOY)) == SPEC


def test_a_run_s_config_json_holds_its_spec(toy_store, tmp_path):
    spec = RunSpec.of(store=toy_store, **TOY, partition="domain", few_shot=5, rounds=2, settings=["lr=0.01"],
                      out=tmp_path / "run")
    from fedcache.federate.train import train

    train(spec)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert RunSpec.from_dict(config["spec"]) == spec.replace(out=None)
    assert config["resolved"]["optimizer"]["lr"] == 0.01 and config["resolved"]["head"] == "linear"
    with pytest.raises(ConfigError, match=r"options differ .*\(schedule.rounds\)"):
        train(spec.replace(rounds=3, resume=True))


def test_the_spec_imports_no_torch():
    code = "import sys, fedcache.spec; fedcache.spec.options(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory) -> Path:
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("spec") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0))
    return path


def test_a_grid_key_both_a_run_option_and_a_method_setting_must_be_qualified(monkeypatch, tmp_path):
    from dataclasses import dataclass

    from fedcache.federate.methods import METHODS
    from fedcache.sweep import GridSpec, cells, train_config

    @dataclass(frozen=True)
    class Params:
        alpha: float = 1.0  # a method parameter named like the Dirichlet concentration

    method = type("Clash", (), {"Params": Params})
    monkeypatch.setattr(METHODS, "get", lambda name: method)
    grid = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["clash"], out=tmp_path,
                    sweep={"alpha": ["0.5"]})
    with pytest.raises(ConfigError, match=r"alpha is ambiguous.*partition.alpha=\.\.\. or method.alpha="):
        train_config(grid, cells(grid)[0], None)
    for key, where in (("partition.alpha", "partition"), ("method.alpha", "settings")):
        grid = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["clash"], out=tmp_path, sweep={key: ["0.5"]})
        spec = train_config(grid, cells(grid)[0], None)
        assert (spec.partition.alpha == 0.5) if where == "partition" else (spec.method.settings == ("method.alpha=0.5",))


def test_grid_switches_and_qualified_keys_reach_the_cells(tmp_path):
    from fedcache.sweep import GridSpec, cells, train_config

    grid = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path,
                    sweep={"batched": ["false"], "schedule.rounds": ["2", "4"], "lr": ["0.1"]})
    specs = [train_config(grid, c, None) for c in cells(grid)]
    assert [s.schedule.rounds for s in specs] == [2, 4] and not any(s.engine.batched for s in specs)
    assert all(s.method.settings == ("lr=0.1",) for s in specs)
    with pytest.raises(ConfigError, match="cannot be swept"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path, sweep={"schedule.seed": ["1"]})


def test_a_grid_checks_every_cell_before_any_work(tmp_path):
    from fedcache.api import grid

    out = tmp_path / "g"
    with pytest.raises(ConfigError, match=r"--rounds \(schedule.rounds\)=0: must be >= 1"):
        grid(store=tmp_path / "missing.zarr", dataset="d", backbones="b", methods="fedavg", out=out,
             sweep={"rounds": [2, 0]})
    with pytest.raises(ConfigError, match=r"--set lr=-1: must be > 0"):
        grid(store=tmp_path / "missing.zarr", dataset="d", backbones="b", methods="fedavg", out=out,
             sweep={"lr": [0.1, -1]})
    assert not out.exists()  # nothing written, the store not even opened


def test_the_command_line_builds_the_spec_the_api_builds(monkeypatch, tmp_path):
    from fedcache import cli

    got = []
    monkeypatch.setitem(cli.ENGINES, "in-process", lambda spec: (got.append(spec), ({}, ""))[1])
    monkeypatch.setattr(cli.train, "_result_line", lambda summary: "")  # train's module, where it is looked up
    argv = ["train", "--store", str(tmp_path), "-d", "d", "-b", "a,b", "-m", "fedprox", "--partition", "domain-dirichlet",
            "--alpha", "0.3", "--few-shot", "5", "--subsample", "0.5", "--set", "mu=0.5", "--set", "optim.betas=0.9,0.99",
            "--preset", "fst-cbdg", "--head", "mlp", "--rounds", "7", "--fraction", "0.5", "--eval-every", "2",
            "--seed", "3", "--validation", "--no-batch"]
    assert main(argv) == 0
    assert got == [SPEC.replace(store=tmp_path)]
    assert set(cli.ENGINES) == set(option("engine").type.__args__)  # every engine the spec allows is runnable


def test_partition_schemes_are_the_registry_s():
    from fedcache.federate.partitions import PARTITIONERS

    assert set(option("partition").help.rstrip(".").split(", ")) == set(PARTITIONERS.names())
    with pytest.raises(ConfigError, match=r"--partition \(partition.scheme\)='dirichet': must be one of"):
        RunSpec.of(**TOY, partition="dirichet")


def test_a_run_with_a_class_budget_records_it_and_tests_every_class(toy_store, tmp_path):
    # Toy data: 3 classes x 2 domains, 10 training and 4 test rows per (class, domain); one client per domain.
    spec = RunSpec.of(store=toy_store, **TOY, partition="domain-dirichlet", alpha=1.0, class_budget=5,
                      local_test_mix="uniform", rounds=1, out=tmp_path / "run")
    from fedcache.federate.train import train

    train(spec)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    request = config["partition"]["request"]
    assert (request["class_budget"], request["local_test_mix"]) == (5, "uniform")
    assert config["spec"]["partition"]["class_budget"] == 5
    assert sum(config["data"]["client_train_sizes"]) <= 30  # 5 x 2 clients x 3 classes, each share floored
    assert config["data"]["client_test_sizes"] == [12, 12]  # every class of its domain, 4 rows each


def test_a_run_option_flag_of_grid_is_that_option_even_where_a_method_has_a_setting_of_its_name(tmp_path):
    """`grid -m perfedavg,fedavg --alpha 1` (the documented FedPCL comparison) was refused: the flag became the
    short key `alpha`, which perfedavg's own alpha makes ambiguous. A flag names the run option: it reaches
    the partition, perfedavg's alpha stays its default, and grids without such a method keep the short key."""
    from fedcache.api import grid_spec
    from fedcache.sweep import cells, train_config

    common = dict(store=tmp_path, dataset="d", backbones="b", out=tmp_path / "g", option_axes={"alpha": ["1", "0.1"]})
    grid = grid_spec(methods="perfedavg,fedavg", **common)
    assert list(grid.sweep) == ["partition.alpha"]
    specs = [train_config(grid, c, None) for c in cells(grid)]
    assert sorted({s.partition.alpha for s in specs}) == [0.1, 1.0] and all(s.method.settings == () for s in specs)
    assert list(grid_spec(methods="fedavg", **common).sweep) == ["alpha"]  # unchanged: grids already run keep their keys
    with pytest.raises(ConfigError, match="alpha is ambiguous"):  # `--set alpha=` (or the API's sweep) stays a question
        train_config(*(lambda g: (g, cells(g)[0]))(grid_spec(methods="perfedavg", store=tmp_path, dataset="d",
                                                               backbones="b", out=tmp_path / "h", settings=["alpha=1"])), None)


def test_a_qualified_partition_key_splits_report_panels_like_its_short_name():
    from fedcache.reports.layout import is_panel_key

    assert is_panel_key("alpha") and is_panel_key("partition.alpha") and is_panel_key("clients")
    assert not is_panel_key("lr") and not is_panel_key("method.alpha") and not is_panel_key("optim.momentum")
