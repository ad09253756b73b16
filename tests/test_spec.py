"""The run specification: every run option declared once (fedcache/spec.py), and the CLI, the Python API,
config.json and the Flower run config all derived from it; ``--set`` resolved against its typed tree."""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Annotated, Literal

import pytest
import typer.main
from rich.markup import escape

import fedcache
from fedcache.cli import GRID_HOW, GRID_OWN, GRID_SKIPS, app, main
from fedcache.cli.threads import PROCESS_OPTIONS
from fedcache.config import Range, fields_of
from fedcache.errors import ConfigError
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.spec import RunSpec, is_option, option, options
from tests.federate.conftest import skewed  # noqa: F401  (a fixture of the --set tests)
from tests.federate.test_methods import NEEDS_CLIP
from tests.resolve import resolve_settings

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
    # The command's own --threads: "did you mean 'head'?" was no help; the library sets no threads of the process.
    with pytest.raises(ConfigError, match=r"unknown option\(s\) threads \(threads: the library changes nothing "
                                          r"process-wide; call torch.set_num_threads\(N\) yourself\)"):
        fedcache.train("nowhere.zarr", "test-toy", "b", "fedavg", threads=2)


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
    name = option(flag[2:]).name
    with pytest.raises(ConfigError) as exc:  # the Python API says the same, naming the keyword it was given
        fedcache.train(store, "x", "y", "fedavg", **{name: value})
    assert str(exc.value).startswith(re.sub(r"^--[a-z-]+ \([a-z_.]+\)", name, message))


def test_a_partition_spec_reads_its_options_as_a_run_spec_does():
    """DataPartition (a run's data, partition and seed, without the method) finds an option's value as RunSpec does,
    by name or qualified key: one ``get`` for both, not a copy that could drift."""
    from fedcache.spec import DataPartition

    given = dict(dataset="x", backbones="y", partition="dirichlet", alpha=0.3, seed=4)
    part, run = DataPartition.of(**given), RunSpec.of(**given, method="fedavg")
    assert [part.get(k) for k in ("alpha", "partition.alpha", "seed", "dataset")] == [0.3, 0.3, 4, "x"]
    assert [run.get(k) for k in ("alpha", "partition.alpha", "seed", "dataset")] == [0.3, 0.3, 4, "x"]
    assert DataPartition.get is RunSpec.get


def test_numbers_are_checked_when_given_in_python_too():
    with pytest.raises(ConfigError, match=r"--fraction \(schedule.fraction\)=2.0: must be in \(0, 1\]"):
        RunSpec.of(**TOY, fraction=2)
    with pytest.raises(ConfigError, match="expected an integer"):
        RunSpec.of(**TOY, rounds=2.5)
    with pytest.raises(ConfigError, match="needs --dataset"):
        RunSpec.of(backbones="b", method="fedavg")


def test_a_backbone_named_twice_is_refused():
    """-b lite0,lite0 fused the same features with themselves: a run on a doubled input, said nowhere."""
    with pytest.raises(ConfigError, match=r"--backbones \(data.backbones\): b named more than once"):
        RunSpec.of(**{**TOY, "backbones": ["b", "c", "b"]})


def test_option_names_and_qualified_keys_are_the_same_option():
    assert RunSpec.of(**TOY, **{"partition.alpha": "0.5"}) == RunSpec.of(**TOY, alpha=0.5)
    assert RunSpec.of(**TOY).replace(**{"schedule.rounds": 4}).schedule.rounds == 4
    with pytest.raises(ConfigError, match="given twice"):
        RunSpec.of(**TOY, alpha=1.0, **{"partition.alpha": 0.5})


SPEC = RunSpec.of(dataset="d", backbones="a,b", method="fedprox", partition="domain-dirichlet", alpha="0.3",
                  few_shot=5, subsample=0.5, settings=["mu=0.5", "optim.momentum=0.5"], preset="fst-cbdg",
                  head="mlp", rounds=7, fraction=0.5, eval_every=2, seed=3, validation=True, batched=False)


def test_config_json_round_trip():
    assert RunSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    assert set(SPEC.to_dict()) == {"data", "partition", "method", "optim", "head", "schedule", "engine"}
    written = SPEC.replace(out="runs/x", resume=True)  # where a run is written is not what the run is
    assert written.to_dict() == SPEC.to_dict() and RunSpec.from_dict(written.to_dict()) == SPEC


def test_flower_run_config_round_trip():
    from fedcache.flower.config import FlowerRun

    run = FlowerRun.from_spec(SPEC.replace(validation=False))  # a Flower run scores on its shards' test split
    flat = run.to_config()
    assert all(isinstance(v, (str, int, float, bool)) for v in flat.values())  # what a Flower run config holds
    assert flat["method.settings"] == "method.mu=0.5 optim.momentum=0.5"
    assert FlowerRun.from_config(flat) == run
    text = {k: str(v) for k, v in flat.items()}  # as `flwr run --run-config` may hand them over
    assert FlowerRun.from_config(text) == run


def test_a_run_s_config_json_holds_its_spec(toy_store, tmp_path):
    spec = RunSpec.of(store=toy_store, **TOY, partition="domain", few_shot=5, rounds=2, settings=["lr=0.01"],
                      out=tmp_path / "run")
    from fedcache.training import train

    train(spec)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert RunSpec.from_dict(config["spec"]) == spec.replace(out=None)
    assert config["spec"]["optim"]["lr"] == 0.01 and config["spec"]["head"]["name"] == "linear"
    with pytest.raises(ConfigError, match=r"options differ from the run in .* \(rounds \(2 there, 3 here\)\); use the same"):
        train(spec.replace(rounds=3, resume=True))


def test_the_spec_imports_no_torch():
    code = "import sys, fedcache.spec; fedcache.spec.options(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


def test_an_unknown_method_is_refused_before_torch_loads():
    """The Python API's spec (fedcache.train's) imported every method, and torch, to say a name was none of theirs:
    METHODS knows the names from the methods' files and imports one when it is asked for."""
    code = ("import sys\nfrom fedcache.spec import RunSpec\ntry:\n    RunSpec.of(dataset='d', backbones='b', method='fedavgg')\n"
            "except KeyError as e:\n    print(type(e).__name__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "UnknownNameError False"


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory) -> Path:
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("spec") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0))
    return path


def test_a_grid_key_both_a_run_option_and_a_method_setting_must_be_qualified(monkeypatch, tmp_path):
    from dataclasses import dataclass

    from fedcache.federate.methods import METHODS
    from fedcache.grids import GridSpec, cells, train_config

    @dataclass(frozen=True)
    class Settings:
        alpha: float = 1.0  # a method parameter named like the Dirichlet concentration

    method = type("Clash", (), {"Settings": Settings, "default_preset": "default", "default_head": "linear", "uses_optimizer": True,
                                     "heads": ()})
    monkeypatch.setattr(METHODS, "get", lambda name: method)
    monkeypatch.setattr(METHODS, "check", lambda name: None)  # a grid checks its methods' names before it gets them
    grid = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["clash"], out=tmp_path,
                    sweep={"alpha": ["0.5"]})
    with pytest.raises(ConfigError, match=r"alpha is ambiguous.*; write --set partition\.alpha=\.\.\. or "
                                          r"--set method\.alpha=\.\.\.$"):
        train_config(grid, cells(grid)[0], None)
    for key, where in (("partition.alpha", "partition"), ("method.alpha", "settings")):
        grid = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["clash"], out=tmp_path,
                        sweep={key: ["0.5"], "partition": ["dirichlet"]})  # a scheme that reads alpha
        spec = train_config(grid, cells(grid)[0], None)
        assert (spec.partition.alpha == 0.5) if where == "partition" else (spec.method.params.alpha == 0.5)


def test_grid_switches_and_qualified_keys_reach_the_cells(tmp_path):
    from fedcache.grids import GridSpec, cells, train_config

    grid = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path,
                    sweep={"batched": ["false"], "schedule.rounds": ["2", "4"], "lr": ["0.1"]})
    specs = [train_config(grid, c, None) for c in cells(grid)]
    assert [s.schedule.rounds for s in specs] == [2, 4] and not any(s.engine.batched for s in specs)
    assert all(s.optim.lr == 0.1 and s.settings() == ["optim.lr=0.1"] for s in specs)
    with pytest.raises(ConfigError, match="cannot be swept"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path, sweep={"schedule.seed": ["1"]})


def test_a_grid_checks_every_cell_before_any_work(tmp_path):
    from fedcache.api import grid

    out = tmp_path / "g"
    with pytest.raises(ConfigError, match=r"^sweep\['rounds'\]=0: must be >= 1"):  # as the call gave it
        grid(store=tmp_path / "missing.zarr", dataset="d", backbones="b", methods="fedavg", out=out,
             sweep={"rounds": [2, 0]})
    with pytest.raises(ConfigError, match=r"^sweep\['lr'\]=-1: must be > 0"):  # as the call gave it
        grid(store=tmp_path / "missing.zarr", dataset="d", backbones="b", methods="fedavg", out=out,
             sweep={"lr": [0.1, -1]})
    assert not out.exists()  # nothing written, the store not even opened


def test_the_command_line_builds_the_spec_the_api_builds(monkeypatch, tmp_path):
    from fedcache import cli

    got = []
    monkeypatch.setitem(cli.ENGINES, "in-process", lambda spec: (got.append(spec), ({}, ""))[1])
    monkeypatch.setattr(cli.train, "_result_line", lambda summary: "")  # train's module, where it is looked up
    argv = ["train", "--store", str(tmp_path), "-d", "d", "-b", "a,b", "-m", "fedprox", "--partition", "domain-dirichlet",
            "--alpha", "0.3", "--few-shot", "5", "--subsample", "0.5", "--set", "mu=0.5", "--set", "optim.momentum=0.5",
            "--preset", "fst-cbdg", "--head", "mlp", "--rounds", "7", "--fraction", "0.5", "--eval-every", "2",
            "--seed", "3", "--validation", "--no-batch"]
    assert main(argv) == 0
    assert got == [SPEC.replace(store=tmp_path)]
    assert set(cli.ENGINES) == set(option("engine").type.__args__)  # every engine the spec allows is runnable


def test_every_grid_engine_the_spec_allows_is_runnable():
    from fedcache.grids.run import GRID_ENGINES
    from fedcache.spec import GridEngineSpec

    allowed = typing.get_type_hints(GridEngineSpec)["engine"]
    assert set(GRID_ENGINES) == set(typing.get_args(allowed))


def test_partition_schemes_are_the_registry_s():
    from fedcache.federate.partitions import PARTITIONERS

    assert set(option("partition").help.rstrip(".").split(", ")) == set(PARTITIONERS.names())
    with pytest.raises(ConfigError, match=r"--partition \(partition.scheme\)='dirichet': must be one of"):
        RunSpec.of(**TOY, partition="dirichet")


def test_a_run_with_a_class_budget_records_it_and_tests_every_class(toy_store, tmp_path):
    # Toy data: 3 classes x 2 domains, 10 training and 4 test rows per (class, domain); one client per domain.
    spec = RunSpec.of(store=toy_store, **TOY, partition="domain-dirichlet", alpha=1.0, class_budget=5,
                      local_test_mix="uniform", rounds=1, out=tmp_path / "run")
    from fedcache.training import train

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
    from fedcache.grids import cells, train_config

    common = dict(store=tmp_path, dataset="d", backbones="b", out=tmp_path / "g",
                  option_axes={"alpha": ["1", "0.1"], "partition": ["dirichlet"]})
    grid = grid_spec(methods="perfedavg,fedavg", **common)
    assert list(grid.sweep) == ["partition.alpha", "partition"]
    specs = [train_config(grid, c, None) for c in cells(grid)]
    assert sorted({s.partition.alpha for s in specs}) == [0.1, 1.0] and all(s.settings() == [] for s in specs)
    assert list(grid_spec(methods="fedavg", **common).sweep) == ["alpha", "partition"]  # unchanged: grids already run keep their keys
    with pytest.raises(ConfigError, match="alpha is ambiguous"):  # `--set alpha=` (or the API's sweep) stays a question
        train_config(*(lambda g: (g, cells(g)[0]))(grid_spec(methods="perfedavg", store=tmp_path, dataset="d",
                                                               backbones="b", out=tmp_path / "h", settings=["alpha=1"])), None)


def test_a_qualified_partition_key_splits_report_panels_like_its_short_name():
    from fedcache.reports.layout import is_panel_key

    assert is_panel_key("alpha") and is_panel_key("partition.alpha") and is_panel_key("clients")
    assert not is_panel_key("lr") and not is_panel_key("method.alpha") and not is_panel_key("optim.momentum")


# Fields that share a name with alpha, lr or seed but are other settings, each with what it is.
OTHER_SETTINGS = {
    ("PerFedAvgSettings", "alpha"): "Per-FedAvg's personal step size (--set alpha=...), not the partition's",
    ("DatasetOptions", "seed"): "the split of an image folder that has no train/test split, at extraction",
    ("ViewSpec", "seed"): "the augmentation seed of extracted views (extract --view-seed)",
}
# Fields that carry a declared option's value (no default of their own) rather than declare it.
DERIVED = {("PartitionRequest", "seed"): "schedule.seed", ("Cell", "seed"): "schedule.seed"}


def test_alpha_lr_and_seed_are_each_declared_once():
    """Every dataclass of fedcache with a field named alpha, lr or seed: one declaration of each (default, range,
    help) that the CLI, the API, grids and config.json read; the others are other settings (named) or carry the
    declared value without a default of their own."""
    import dataclasses
    import importlib
    import pkgutil

    import fedcache

    declared: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(fedcache.__path__, "fedcache."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__):
                continue
            for f in dataclasses.fields(cls):
                if f.name not in ("alpha", "lr", "seed") or (cls.__name__, f.name) in OTHER_SETTINGS:
                    continue
                has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                assert has_default != ((cls.__name__, f.name) in DERIVED), (cls.__name__, f.name)
                if has_default:
                    declared.setdefault(f.name, []).append(f"{cls.__module__}.{cls.__name__}")
    assert declared == {"alpha": ["fedcache.federate.partitions.core.PartitionSpec"],
                        "lr": ["fedcache.federate.optim_config.OptimConfig"],
                        "seed": ["fedcache.federate.schedule.Schedule"]}
    # The command line has one flag for each option, with the declared default; lr is a --set setting.
    assert [o.key for o in options() if o.name in ("alpha", "seed", "lr")] == ["partition.alpha", "schedule.seed"]
    help_text = subprocess.run([sys.executable, "-m", "fedcache.cli", "train", "-h"], capture_output=True, text=True,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    import re

    flags = re.findall(r"^\W+(--[a-z-]+)", help_text, flags=re.M)  # the option table's first column
    assert flags.count("--alpha") == 1 and flags.count("--seed") == 1 and "[default: 0.5]" in help_text


# ---- --set: every key reaches the object it names, ambiguous and unused keys are refused -----------------------
def test_a_head_given_as_an_option_and_as_a_setting_is_refused_unless_the_same():
    """The setting won without a word: --head linear --set head=mlp trained the mlp head (and the API alike)."""
    with pytest.raises(ConfigError, match=r"^--head linear and --set head=mlp name two heads; give the head once$"):
        RunSpec.of(**TOY, head="linear", settings=["head=mlp"])
    same = RunSpec.of(**TOY, head="mlp", settings=["head=mlp"])
    assert same.head.name == "mlp"


def test_settings_are_typed_and_unknown_keys_listed():
    r = resolve_settings("fedprox", ["lr=0.1", "mu=0.5"])
    assert r.params.mu == 0.5 and r.optim.lr == 0.1
    with pytest.raises(ConfigError, match=r"--set mu_typo: unknown key\. Known keys -- method: init, mu; optim: optimizer, lr"):
        resolve_settings("fedprox", ["mu_typo=1"])
    with pytest.raises(ConfigError, match=r"--set muu: unknown key \(did you mean 'mu'\?\)\. Known keys"):
        resolve_settings("fedprox", ["muu=1"])
    with pytest.raises(ConfigError, match=r"--set mu: unknown key \(a setting of .*fedprox.*; fedavg has no mu\)\. Known"):
        resolve_settings("fedavg", ["mu=0.1"])  # another method's key: say whose, not only fedavg's keys
    with pytest.raises(ConfigError, match=r"^--set z{30}\.\.\. \(500 characters\): unknown key\. Known keys -- "):
        resolve_settings("fedprox", ["z" * 500 + "=1"])  # repeated whole, one line of 500 characters
    # The command's own option is said as that ("did you mean 'head'?" was no help); the library sets no threads.
    with pytest.raises(ConfigError, match=r"--set threads: unknown key \(threads is the torch threads of the fedcache "
                                          r"command's process: give --threads N on its command line\)"):
        resolve_settings("fedavg", ["threads=2"])
    from fedcache.wording import keyword_names

    with keyword_names(), pytest.raises(ConfigError, match=r"call torch.set_num_threads\(N\) yourself"):
        resolve_settings("fedavg", ["threads=2"])
    with pytest.raises(ConfigError, match="expected a finite number"):
        resolve_settings("fedprox", ["lr=fast"])
    with pytest.raises(ConfigError, match="one of sgd, adam"):
        resolve_settings("fedprox", ["optimizer=lion"])
    with pytest.raises(ConfigError, match="key=value"):
        resolve_settings("fedprox", ["lr"])



@pytest.mark.parametrize("key", ["head", "head.head", "head.name"])
def test_a_wrong_head_set_is_named_as_set(key):
    """Not as the option --head the user never gave (it said `--head (head.name)='mlpp'`)."""
    with pytest.raises(ConfigError, match=rf"^--set {re.escape(key)}=mlpp: must be one of linear, mlp, projection \(did you mean 'mlp'\?\)$"):
        RunSpec.of(**TOY, settings=[f"{key}=mlpp"])
    assert RunSpec.of(**TOY, settings=[f"{key}=mlp"]).head.name == "mlp"

# String fields have no generic "other" value; these are valid non-defaults.
STRING_VALUES = {"ctx_init": "a photo of a", "weights": "clip.pt", "device": "cuda", "dataset": "cifar10",
                 "data_root": "/data"}


def other_value(name: str, typ, default):
    """A valid value different from ``default``, as the text ``--set`` would carry, and as parsed."""
    rng = None
    if typing.get_origin(typ) is Annotated:
        typ, rng = typing.get_args(typ)[0], next((a for a in typing.get_args(typ)[1:] if isinstance(a, Range)), None)
    if typing.get_origin(typ) is Literal:
        v = next(a for a in typing.get_args(typ) if a != default)
        return str(v), v
    if typ is bool:
        return str(not default), not default
    if typ is str:
        return STRING_VALUES[name], STRING_VALUES[name]
    if typ is int:
        v = default + 1 if rng is None or rng.contains(default + 1) else default - 1
        return str(v), v
    if typ is float:
        v = default * 2 if default else 0.5
        if rng is not None and not rng.contains(v):
            v = (default + rng.hi) / 2 if rng.hi is not None else default / 2
        return repr(v), v
    raise AssertionError(f"no test value for {name}: {typ}")


def method_cases():
    for m in METHODS.names():
        cls = METHODS.get(m)
        for f in dataclasses.fields(cls.Settings):
            yield pytest.param(m, f.name, id=f"{m}.{f.name}")


# A field the defaults do not use (Params.ignored()) is set together with what makes it used.
ENABLERS = {"noise_scale": {"noise": "laplace"}, "perturb": {"noise": "laplace"}, "predict_with": {"noise": "laplace"},
            "shots": {"anchors": "prototypes"}, "pad": {"visual": "pixel"}, "dataset": {"visual": "pixel"},
            "data_root": {"visual": "pixel"}}


def enablers(cls, field: str) -> dict[str, str]:
    if field not in getattr(cls.Settings(), "ignored", dict)():
        return {}
    assert field in ENABLERS, f"add to ENABLERS what makes {cls.name}'s {field} used"
    return ENABLERS[field]


@pytest.mark.parametrize("method,field", list(method_cases()))
def test_every_method_setting_arrives(method, field, skewed):
    cls = METHODS.get(method)
    typ = fields_of(cls.Settings)[field]
    text, value = other_value(field, typ, getattr(cls.Settings(), field))
    extra = enablers(cls, field)
    for key in (f"method.{field}", field):  # qualified always; short when no other owner has the name
        if key == field and field in fields_of(OptimConfig):
            continue
        r = resolve_settings(method, [f"{key}={text}", *(f"method.{k}={v}" for k, v in extra.items())])
        assert getattr(r.params, field) == value
        assert {k: v for k, v in dataclasses.asdict(r.params).items() if k != field and k not in extra} == \
            {k: v for k, v in dataclasses.asdict(cls.Settings()).items() if k != field and k not in extra}
    if method in NEEDS_CLIP or {field, *extra} & {"device", "weights", "anchors"}:
        return  # building these needs a CLIP tower, a GPU or labelled anchors: resolution is checked above
    ctx = MethodContext(skewed, r.head, r.optim)
    assert getattr(cls(ctx, r.params).p, field) == value


OPTIM_CASES = {
    "sgd": ["optim.optimizer=sgd", "optim.lr=0.05", "optim.momentum=0.5", "optim.weight_decay=0.001"],
    "adam": ["optim.optimizer=adam", "optim.lr=0.05", "optim.betas=0.8,0.99", "optim.eps=1e-06", "optim.weight_decay=0.001"],
}


@pytest.mark.parametrize("method", [m for m in METHODS.names() if METHODS.get(m).uses_optimizer])
@pytest.mark.parametrize("kind", list(OPTIM_CASES))
def test_every_optimizer_setting_arrives(method, kind, skewed):
    r = resolve_settings(method, OPTIM_CASES[kind])
    expected = {"optimizer": kind, "lr": 0.05, "weight_decay": 0.001,
                **({"momentum": 0.5} if kind == "sgd" else {"betas": (0.8, 0.99), "eps": 1e-6})}
    assert {k: getattr(r.optim, k) for k in expected} == expected
    if method not in NEEDS_CLIP:
        cls = METHODS.get(method)
        assert cls(MethodContext(skewed, r.head, r.optim), r.params).ctx.optim == r.optim


def test_a_key_two_owners_share_is_refused_naming_both_spellings():
    with pytest.raises(ConfigError) as e:
        resolve_settings("flesd", ["momentum=0.99"])
    assert "method.momentum" in str(e.value) and "optim.momentum" in str(e.value)
    assert resolve_settings("flesd", ["method.momentum=0.99"]).params.momentum == 0.99
    assert resolve_settings("flesd", ["params.momentum=0.99"]).params.momentum == 0.99


def test_unused_optimizer_settings_are_refused():
    with pytest.raises(ConfigError, match="Adam has no momentum"):
        resolve_settings("fedavg", ["momentum=0.5"])  # the fedavg default preset is Adam
    with pytest.raises(ConfigError, match="Adam setting"):
        resolve_settings("fedavg", ["optimizer=sgd", "eps=1e-6"])
    with pytest.raises(ConfigError, match="trains nothing"):
        resolve_settings("clip-zs", ["lr=0.1"])


@pytest.mark.parametrize("method, given, cli, api", [
    ("linear-probe", ["lr=0.1", "optim.momentum=0.5"], "remove --set lr, --set optim.momentum",
     "remove settings['lr'], settings['optim.momentum']"),
    ("fedavg", ["optimizer=sgd", "betas=0.9,0.99"], "does not use --set betas (an Adam setting",
     "does not use settings['betas'] (an Adam setting"),
    ("fedavg", ["optimizer=sgd", "betas=0.9,0.99"], "(--set optimizer=adam to use it)",
     "(settings={'optimizer': 'adam'} to use it)"),
    ("fedavg", ["momentum=0.5"], "or --set optimizer=sgd", "or settings={'optimizer': 'sgd'}"),
])
def test_an_unused_setting_is_named_by_the_key_its_user_typed(method, given, cli, api):
    """They said `remove --set optim.lr` and `does not use optim.betas`, names the user never typed."""
    from fedcache.wording import keyword_names

    with pytest.raises(ConfigError) as on_cli:
        resolve_settings(method, given)
    with keyword_names(), pytest.raises(ConfigError) as in_python:
        resolve_settings(method, given)
    assert cli in str(on_cli.value) and api in str(in_python.value), (str(on_cli.value), str(in_python.value))


def unused_cases():
    for m in METHODS.names():
        params = METHODS.get(m).Settings()
        for field in getattr(params, "ignored", dict)():
            yield pytest.param(m, field, id=f"{m}.{field}")


@pytest.mark.parametrize("method,field", list(unused_cases()))
def test_a_method_setting_the_defaults_do_not_use_is_refused_with_the_reason(method, field):
    cls = METHODS.get(method)
    text, _ = other_value(field, fields_of(cls.Settings)[field], getattr(cls.Settings(), field))
    with pytest.raises(ConfigError, match=rf"{method} does not use --set method\.{field} \(.+\)"):
        resolve_settings(method, [f"method.{field}={text}"])


@pytest.mark.parametrize("method,unused,message,used", [
    ("fedpcl", ["noise_scale=0.1"], "noise=none sends the clean", ["noise=gaussian", "noise_scale=0.1"]),
    ("fedpcl", ["perturb=0.3"], "noise=none", ["noise=laplace", "perturb=0.3"]),
    ("fedpcl", ["noise=laplace", "predict=global", "predict_with=clean"], "predict=global does not classify",
     ["noise=laplace", "predict_with=clean"]),
    ("fedpcl", ["loss=supcon", "contrast=batch"], "loss=supcon contrasts", ["contrast=batch"]),
    ("fedpcl", ["loss=supcon", "prototypes=global"], "loss=supcon contrasts", ["prototypes=global"]),
    ("fedpcl", ["loss=supcon", "aggregation=mean"], "predict=local does not use the global",
     ["loss=supcon", "predict=global", "aggregation=mean"]),
    ("fedpcl", ["prototypes=global", "local_reduce=mean"], "sum and mean are the same", ["local_reduce=mean"]),
    ("fst-cbdg", ["losses=ist", "sigma=0.1"], "losses=ist draws no synthetic", ["losses=tsamp", "sigma=0.1"]),
    ("fst-cbdg", ["shots=8"], "anchors=text builds", ["anchors=prototypes", "shots=8"]),
    ("fst-cbdg", ["anchors=prototypes", "templates=ensemble"], "not from text templates", ["templates=ensemble"]),
    ("tpfl", ["pad=20"], "visual=feature prompts", ["visual=pixel", "pad=20"]),
    ("atpfl", ["data_root=/data"], "reads no images", ["visual=pixel", "data_root=/data"]),
])
def test_a_method_setting_the_configuration_does_not_use_is_refused(method, unused, message, used):
    with pytest.raises(ConfigError, match=message):
        resolve_settings(method, unused)
    resolve_settings(method, used)  # the same value where something reads it


def test_a_key_given_twice_is_refused():
    with pytest.raises(ConfigError, match="twice"):
        resolve_settings("fedprox", ["mu=0.1", "method.mu=0.2"])
    with pytest.raises(ConfigError, match="unknown prefix"):
        resolve_settings("fedprox", ["server.mu=0.1"])
    with pytest.raises(ConfigError, match="--set optim.mu: unknown key"):
        resolve_settings("fedprox", ["optim.mu=0.1"])
