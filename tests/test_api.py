"""The Python API (fedcache/api.py): cheap import, the same functions as the CLI, results with history and trained
state; in a notebook, real signatures in help(), HTML reprs, to_pandas() behind an extra, the server as one model."""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import fedcache
from fedcache.errors import ConfigError, FedcacheError, UnknownOptionError
from fedcache.spec import options
from tests.conftest import BACKBONE

ROOT = Path(__file__).resolve().parents[1]


def test_import_fedcache_loads_no_torch():
    code = "import sys, fedcache; fedcache.train; fedcache.grid; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


def test_train_returns_summary_history_and_state(toy_store, tmp_path):
    run = fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", settings={"lr": 0.05}, clients=2,
                         rounds=3, out=tmp_path / "run")
    assert [line["round"] for line in run.metrics] == [1, 2, 3]
    assert run.metrics[-1]["accuracy"] == pytest.approx(run.summary["mean_accuracy"], abs=1e-3)  # summary: per-client values rounded
    assert run.server["weight"].shape[-1] == 3 and run.server["bias"].shape[-1] == 3  # the global head, 3 classes
    assert (tmp_path / "run" / "summary.json").exists() and "fedavg" in repr(run)
    with pytest.raises(ConfigError, match="unknown option.*round\\b"):
        fedcache.train(toy_store, "test-toy", "tiny-timm-random", "fedavg", round=3)


def test_the_library_prints_nothing_of_its_slow_steps(toy_store, tmp_path, capsys, monkeypatch):
    """The command line says a slow store read or partitioning; from Python the steps go to the log only."""
    from fedcache import progress

    monkeypatch.setattr(progress, "SLOW_STEP", 0.0)
    fedcache.train(toy_store, "test-toy", BACKBONE, "fedavg", clients=2, rounds=1)
    fedcache.grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", out=tmp_path / "g",
                  sweep={"partition": "iid", "rounds": 1, "clients": 2}, on_plan=lambda text: None)
    assert capsys.readouterr() == ("", "")


def test_extract_is_callable_and_reuses_the_cache(toy_store):
    import fedcache.extract.runner

    reports = fedcache.extract_features("test-toy", "tiny-timm-random", store=toy_store, workers=0)
    assert reports and all(r.status == "already complete" for r in reports)
    with pytest.raises(ConfigError, match="unknown option"):
        fedcache.extract_features("test-toy", "tiny-timm-random", store=toy_store, colour="red")


def test_a_grid_gives_swept_numbers_back_as_numbers_as_its_results_csv_reads_them(toy_store, tmp_path):
    told = []
    table = fedcache.grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", out=tmp_path / "g",
                          sweep={"partition": "iid", "rounds": 1, "clients": 3, "lr": [0.01, "1e-1"]},
                          on_cell=lambda done, total, row: told.append(row))
    assert sorted(table.column("lr")) == [0.01, 0.1] and table.column("clients") == [3, 3]
    assert sorted(r["lr"] for r in told) == [0.01, 0.1]  # the progress rows are the returned table's
    assert fedcache.Table([{"x": "true", "y": "True", "z": "no"}]).parsed(["x", "y", "z"])[0] == {"x": True, "y": True, "z": "no"}
    assert len(table.where(lr=0.01)) == 1 and table.column("partition") == ["iid", "iid"]
    assert table.to_records() == fedcache.Table.from_csv(tmp_path / "g" / "results.csv").to_records()


def test_what_would_fail_after_training_is_refused_before_anything_runs(toy_store, tmp_path):
    base = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, method="fedavg", rounds=1, out=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^on_round: fedcache calls it as on_round\(done, total, line\), which .* cannot take"):
        fedcache.train(**base, on_round=lambda done, total: None)
    with pytest.raises(ConfigError, match=r"^on_round='x' is not a function; give one that fedcache calls as on_round\("):
        fedcache.train(**base, on_round="x")
    with pytest.raises(ConfigError, match=r"^backbones=123: give a name, comma-separated names"):
        fedcache.train(**{**base, "backbones": 123})
    with pytest.raises(ConfigError, match=r"^resume=True works on the run folder in out, and none was given; add out="):
        fedcache.train(**{**base, "out": None}, resume=True)
    with pytest.raises(ConfigError, match=r"^track_dir is where trackers write, and no tracker was given; add "
                                          r"track='tensorboard' \(or mlflow\), or leave track_dir out$"):
        fedcache.train(**base, track_dir=tmp_path / "tb")
    with pytest.raises(ConfigError, match=r"^out='': give a path \(or leave it out\)"):  # trained, saving nothing
        fedcache.train(**{**base, "out": ""})
    with pytest.raises(ConfigError, match=r"^on_cell: fedcache calls it as on_cell\(done, total, row\)"):
        fedcache.grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", out=tmp_path / "g",
                      sweep={"rounds": 1}, on_cell=lambda row: None)
    with pytest.raises(ConfigError, match=r"^progress=5 is not a function; give one that fedcache calls as progress\(event\)"):
        fedcache.extract_features("test-toy", BACKBONE, store=tmp_path / "new.zarr", progress=5)
    with pytest.raises(ConfigError, match=r"^run_or_grid=5: expected a path \(text\), a run"):
        fedcache.report(5)
    assert not (tmp_path / "run").exists() and not (tmp_path / "g").exists() and not (tmp_path / "new.zarr").exists()
    fedcache.train(**base, on_round=print)  # a builtin, whose signature may not be readable, is called as it is


def test_table_to_pandas_without_pandas_says_so(monkeypatch):
    table = fedcache.Table([{"a": 1}, {"a": 2, "b": 3}])
    assert table.columns == ["a", "b"] and table.column("b") == [None, 3]
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="to_records"):
        table.to_pandas()


def test_performance_page_quotes_the_grid_benchmark_json():
    spec = importlib.util.spec_from_file_location("grid_speed", ROOT / "benchmarks" / "grid_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.render() in (ROOT / "docs" / "performance.md").read_text()


# ---- in a notebook ------------------------------------------------------------------------------------------
def keywords(fn) -> dict[str, inspect.Parameter]:
    params = inspect.signature(fn).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()), "a **kwargs hides the options"
    return dict(params)


def test_train_signature_lists_every_run_option_with_its_default():
    params = keywords(fedcache.train)
    for o in options():
        name = "method" if o.name == "method" else o.name
        assert name in params, f"help(fedcache.train) does not show {name}"
        if not o.required and o.name not in ("store", "settings"):
            assert params[name].default == o.default, name
    assert params["rounds"].default == 50 and params["partition"].default == "iid"
    assert "subsample:" in fedcache.train.__doc__ and "rounds: Federated rounds." in fedcache.train.__doc__


def test_extract_and_grid_signatures_are_real():
    from fedcache.extract.datasets import DatasetOptions
    from fedcache.extract.runner import ExtractConfig

    params = keywords(fedcache.extract_features)
    wanted = {f.name for c in (ExtractConfig, DatasetOptions) for f in dataclasses.fields(c)} - {"dataset_options"}
    assert wanted <= set(params) and params["views"].default == 0 and params["data_root"].default is None
    assert fedcache.extract_features.__name__ == "extract_features"
    grid = keywords(fedcache.grid)
    assert {"methods", "sweep", "seeds", "select", "jobs", "out"} <= set(grid)
    assert grid["select"].annotation is not str  # resolved annotations, not their text


def test_signatures_keep_import_fedcache_cheap():
    code = "import sys, inspect, fedcache; inspect.signature(fedcache.train); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


@pytest.fixture(scope="module")
def run(toy_store, tmp_path_factory):
    return fedcache.train(toy_store, "test-toy", BACKBONE, "fedavg", clients=2, rounds=2,
                          out=tmp_path_factory.mktemp("nb") / "run")


def test_server_state_is_one_model_without_the_client_axis(run):
    import torch

    from fedcache.api import one_model

    w, b = run.server["weight"], run.server["bias"]
    assert w.ndim == 2 and w.shape[1] == 3 and b.shape == (1, 3)  # (D, C) and (1, C): logits = x @ W + b
    stacked = {"weight": torch.zeros(1, 4, 3), "protos": torch.zeros(3, 4), "counts": torch.zeros(1)}
    got = one_model(stacked)
    assert got["weight"].shape == (4, 3) and got["protos"].shape == (3, 4) and got["counts"].shape == (1,)


def test_results_show_as_html_in_a_notebook(run, toy_grid):
    page = run._repr_html_()
    assert "<table>" in page and "mean_accuracy" in page and "fedavg" in page and "train_loss" in page
    table = fedcache.Table.from_csv(toy_grid / "results.csv")
    page = table._repr_html_()
    assert page.count("<tr>") == len(table) + 1 and "<th>alpha</th>" in page
    many = fedcache.Table([{"i": i, "x": "<b>"} for i in range(60)])._repr_html_()
    assert many.count("<tr>") == 51 and "10 more rows" in many and "&lt;b&gt;" in many


def test_to_pandas_names_the_extra_and_passes_every_column(run, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"pip install 'fedcache\[pandas\]'"):
        run.to_pandas()
    extras = (ROOT / "pyproject.toml").read_text()
    assert '\npandas = ["pandas' in extras  # the extra the message names exists
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda records, columns: (records, columns)
    monkeypatch.setitem(sys.modules, "pandas", fake)
    records, columns = run.to_pandas()
    assert [r["round"] for r in records] == [1, 2] and columns[0] == "round" and "train_loss" in columns


def test_one_model_keeps_a_method_s_entries_by_client():
    """fedpcl's server holds a prototype set per client that has sent one: with one such client it is still a row
    per client, while its global prototypes lose the stacking axis as every global model does."""
    import torch

    from fedcache.api import one_model
    from fedcache.federate.methods import METHODS

    by_client = METHODS.get("fedpcl").server_by_client
    server = {"global": torch.zeros(1, 3, 4), "local": torch.zeros(1, 3, 4), "local_count": torch.zeros(1, 3),
              "local_ids": torch.tensor([7])}
    got = one_model(server, by_client)
    assert got["global"].shape == (3, 4) and got["local"].shape == (1, 3, 4) and got["local_count"].shape == (1, 3)


# ---- what the arguments accept: one value, a comma-separated text or a list, as methods= and backbones= ------
@pytest.fixture
def grid_spec_of(monkeypatch, tmp_path):
    """``grid_spec_of(**arguments)``: the GridSpec ``fedcache.grid`` builds from them, without running a cell."""
    import fedcache.grids

    specs = []
    monkeypatch.setattr(fedcache.grids, "run_grid", lambda spec, on_cell=None, on_plan=None: specs.append(spec) or fedcache.Table([]))
    base = dict(store=tmp_path / "store.zarr", dataset="test-toy", backbones=BACKBONE, methods="fedavg")
    return lambda **given: (fedcache.grid(**{**base, "out": tmp_path / "grid", **given}), specs[-1])[1]


def test_grid_select_and_track_take_a_text(grid_spec_of):
    sweep = {"lr": [0.01, 0.1], "rounds": [1, 2]}
    assert grid_spec_of(sweep=sweep, select="lr").select == ["lr"]  # not l,r
    assert grid_spec_of(sweep=sweep, select="lr,rounds").select == ["lr", "rounds"]
    assert grid_spec_of(sweep=sweep, select=("lr",)).select == ["lr"]
    assert grid_spec_of(track="tensorboard").track == ["tensorboard"]
    with pytest.raises(ConfigError, match="^track='csv': unknown tracker"):  # not c,s,v; quoted as passed
        grid_spec_of(track="csv")
    with pytest.raises(ConfigError, match=r"^track=\['csv', 'zz'\]: unknown tracker"):  # the unknown ones only
        grid_spec_of(track=["tensorboard", "csv", "zz"])


def test_grid_seeds_take_one_a_text_or_a_list(grid_spec_of):
    assert grid_spec_of(seeds=0).seeds == [0]
    assert grid_spec_of(seeds="0,1").seeds == [0, 1]
    assert grid_spec_of(seeds=[2, 3]).seeds == grid_spec_of(seeds=range(2, 4)).seeds == [2, 3]
    with pytest.raises(ConfigError, match="^seeds='x': expected an integer"):
        grid_spec_of(seeds="0,x")


@pytest.mark.parametrize("sweep", [["rounds=1"], "rounds=1"])
def test_grid_sweep_that_is_not_a_dict_says_what_it_is(grid_spec_of, sweep):
    with pytest.raises(ConfigError, match=r"^sweep=.*: sweep is a dict \{key: value or list of values\}"):
        grid_spec_of(sweep=sweep)


@pytest.mark.parametrize("given, said", [
    (dict(sweep={5: 1}), "sweep={5: ...}: sweep's keys are names (text), e.g. sweep={'rounds': 10, 'lr': [0.01, 0.1]}"),
    (dict(sweep={"lr": {"a": 1}}), "sweep['lr']={'a': 1}: expected a value or a list of values (text, a number, "
                                   "True/False or None; a list of lists for a setting that takes several numbers, as "
                                   "sweep={'betas': [[0.9, 0.999]]})"),
    (dict(sweep={"lr": [0.1, {0.2}]}), "sweep['lr']=[0.1, {0.2}]: expected a value or a list of values"),
    (dict(config=5), "config=5: expected a path (text), a grid file (TOML)"),
])
def test_a_grid_argument_of_the_wrong_type_is_one_error_naming_it(grid_spec_of, given, said):
    """sweep={5: 1} raised AttributeError ('int' object has no attribute 'strip'), config=5 a TypeError from
    pathlib, and a dict as a swept value was echoed as a text that is no number."""
    with pytest.raises(ConfigError) as err:
        grid_spec_of(**given)
    assert str(err.value).startswith(said), str(err.value)


def test_a_grid_sweeps_none_and_a_setting_of_several_numbers(grid_spec_of):
    """What the sweep's check lets through: None (an option's none: every row) and a pair as one value."""
    assert grid_spec_of(sweep={"few_shot": [None, 10], "betas": [(0.9, 0.99)]}).sweep == {
        "few_shot": ["None", "10"], "betas": ["(0.9,0.99)"]}


@pytest.fixture
def train_spec_of(monkeypatch, toy_store):
    """``train_spec_of(method, **arguments)``: the RunSpec ``fedcache.train`` builds from them, without training."""
    import fedcache.training

    class Built(Exception):
        pass

    def stop(spec, on_round=None):
        raise Built(spec)

    monkeypatch.setattr(fedcache.training, "train", stop)

    def spec_of(method: str, **given):
        with pytest.raises(Built) as built:
            fedcache.train(toy_store, "test-toy", BACKBONE, method, **given)
        return built.value.args[0]
    return spec_of


def test_train_settings_take_a_text_a_dict_or_a_list(train_spec_of):
    as_text = train_spec_of("fedprox", settings="lr=0.1 mu=0.5")  # --set's own form: space-separated
    assert as_text.optim.lr == 0.1 and as_text.method.params.mu == 0.5
    for same in ({"lr": 0.1, "mu": 0.5}, ["lr=0.1", "mu=0.5"]):
        spec = train_spec_of("fedprox", settings=same)
        assert (spec.optim, spec.method) == (as_text.optim, as_text.method)
    with pytest.raises(ConfigError, match=r"^settings=0.1: expected a dict \{key: value\}"):
        fedcache.train("unused.zarr", "test-toy", BACKBONE, "fedavg", settings=0.1)


def test_a_setting_of_none_or_a_dict_is_refused_in_pythons_words():
    for value, shown in ((None, "None"), ({"a": 1}, r"\{'a': 1\}")):
        with pytest.raises(ConfigError, match=rf"^settings\['lr'\]={shown}: give a number.*leave 'lr' out of settings"):
            fedcache.train("unused.zarr", "test-toy", BACKBONE, "fedavg", settings={"lr": value})


def test_settings_of_the_wrong_type_are_refused_as_a_grids_sweep_is():
    """settings={5: 1} was the unknown setting '5', and {'lr': {0.1}} the text '{0.1}', "expected a finite number"."""
    with pytest.raises(ConfigError) as err:
        fedcache.train("unused.zarr", "test-toy", BACKBONE, "fedavg", settings={5: 1})
    assert str(err.value) == "settings={5: ...}: settings's keys are names (text), e.g. settings={'lr': 0.01}"
    with pytest.raises(ConfigError, match=r"^settings\['lr'\]=\{0.1\}: give a number, a text, True/False or a pair"):
        fedcache.train("unused.zarr", "test-toy", BACKBONE, "fedavg", settings={"lr": {0.1}})


def test_a_settings_text_with_a_comma_and_a_space_is_read_as_set_reads_it(train_spec_of, toy_store, capsys):
    """settings="lr=0.01, mu=0.1" was split at the space: "settings['lr']='0.01,': expected a finite number" (or, with
    fedavg, mu an unknown key). As `--set "lr=0.01, mu=0.1"`, it is two pairs in one, said with the form to give;
    a comma and a space inside one value stay one value, as --set takes them."""
    from fedcache.cli import main

    with pytest.raises(ConfigError) as err:
        train_spec_of("fedprox", settings="lr=0.01, mu=0.1")
    assert str(err.value) == "settings['lr']='0.01, mu=0.1' holds 2 pairs; give each its own: settings=['lr=0.01', 'mu=0.1']"
    assert main(["train", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedprox",
                 "--set", "lr=0.01, mu=0.1"]) != 0
    assert "--set lr='0.01, mu=0.1' holds 2 pairs; give each its own: --set lr=0.01 --set mu=0.1" in capsys.readouterr().err
    spec = train_spec_of("fedprox", settings="optimizer=adam  betas=0.8, 0.9 lr=0.01")
    assert spec.optim.betas == (0.8, 0.9) and spec.optim.lr == 0.01


def test_train_says_a_setting_given_as_an_option_goes_in_settings():
    with pytest.raises(ConfigError, match=r"lr is a method/optimizer setting, not a run option; "
                                          r"pass it as settings=\{'lr': 0.1\}$"):
        fedcache.train("unused.zarr", "test-toy", BACKBONE, "fedavg", lr=0.1)
    with pytest.raises(ConfigError, match=r"lr, mu are method/optimizer settings.*settings=\{'lr': 0.1, 'mu': 0.01\}"):
        fedcache.train("unused.zarr", "test-toy", BACKBONE, "fedprox", lr=0.1, mu=0.01)
    with pytest.raises(ConfigError, match="unknown option.*colour") as err:  # not a setting either: as before
        fedcache.train("unused.zarr", "test-toy", BACKBONE, "fedavg", colour="red")
    assert "settings=" not in str(err.value)


@pytest.mark.slow  # a process of its own that imports torch, timm and matplotlib: half a minute on a 2-core CI machine
def test_the_library_leaves_the_process_as_it_found_it(tmp_path):
    """extract_features, train (fedavg and a linear probe), grid, report and a store read, once each on a tiny
    store, change no process-wide state (tests/process_state.py: torch's threads, RNGs and flags, numpy's and
    random's RNGs, matplotlib, logging, warnings, signal handlers, the environment, cwd, umask, hooks, start
    method, threads, children, open files) and leave no file in the working or temporary directory."""
    import shutil
    import tempfile

    # A short temporary directory: multiprocessing puts its sockets there (a DataLoader worker's shared tensors), and
    # pytest's own paths (/tmp/pytest-of-root/pytest-123/popen-gw1/test_the_library_leaves_the_pr0/tmp) pass the
    # 108 bytes an AF_UNIX path may have once pytest has numbered a hundred runs: the worker then hung.
    tmp = Path(tempfile.mkdtemp(prefix="fc-"))
    try:
        env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-m", "tests.process_state", str(tmp_path)], capture_output=True,
                             text=True, cwd=ROOT, env=env, timeout=600)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "{}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_store_this_user_cannot_write_is_the_cli_s_line_and_still_a_permission_error(toy_store, tmp_path, monkeypatch):
    """An extraction into another user's store raised Python's "[Errno 13] Permission denied: '.../.locks/<entry>.
    create.lock'" in a notebook, naming neither the store nor what to do, where the command line says both."""
    import errno
    import pickle
    import shutil

    from fedcache.errors import FedcacheError
    from tests.faults import deny_writes_in, read_only

    store = tmp_path / "theirs.zarr"
    shutil.copytree(toy_store, store)
    read_only(store)
    try:
        deny_writes_in(monkeypatch, store)
        with pytest.raises(PermissionError) as caught:
            fedcache.extract_features("test-toy", BACKBONE, store=store, workers=0, name="mine")
    finally:
        for p in [store, *store.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    exc = caught.value
    assert str(exc).startswith(f"cannot write in the feature store {store} (no permission to write {store}/.locks/"), exc
    # Its advice names the store as the call gave it, not as the command line's --store, nor "run this command".
    assert str(exc).endswith("; use a store you can write to (store=..., or FEDCACHE_STORE), or have its owner run "
                             "this call; reading a complete store needs no write permission"), exc
    assert isinstance(exc, FedcacheError)
    assert exc.errno == errno.EACCES and exc.filename.startswith(f"{store}/.locks/") and exc.__cause__ is not None
    again = pickle.loads(pickle.dumps(exc))  # as a worker of the caller's own multiprocessing pool sends it back
    assert (type(again), str(again), again.errno, again.filename) == (type(exc), str(exc), exc.errno, exc.filename)


def test_a_read_only_mount_stays_an_os_error_that_is_no_permission_error(tmp_path):
    """EROFS is an OSError, not a PermissionError: said in one line, its type is kept, not widened."""
    import errno

    from fedcache.errors import DeniedError
    from fedcache.paths import denied_error

    exc = denied_error(OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x")))
    assert isinstance(exc, DeniedError) and not isinstance(exc, PermissionError) and exc.errno == errno.EROFS
    assert str(exc) == f"{tmp_path / 'x'} is on a read-only file system; choose a path you can write to"


def test_every_api_function_says_a_refused_file_in_one_line():
    """The wrapper is what turns a refusal into the CLI's line: a function of the API without it would not."""
    functions = [name for name in fedcache._API if inspect.isfunction(getattr(fedcache, name))]
    assert functions and all(getattr(fedcache, name).__wrapped__ for name in functions), functions


# ---- the store's default, and messages in the caller's names ------------------------------------------------
def test_train_and_grid_default_the_store_as_extract_features_and_the_cli_do(grid_spec_of, tmp_path, monkeypatch):
    shown = {f.__name__: inspect.signature(f).parameters["store"].default
             for f in (fedcache.extract_features, fedcache.train, fedcache.grid)}
    # the store a signature shows (FEDCACHE_STORE's, as the signatures were made) is the same in all three
    assert isinstance(shown["train"], Path) and shown == dict.fromkeys(shown, shown["train"])
    assert all("FEDCACHE_STORE" in f.__doc__ for f in (fedcache.train, fedcache.grid))
    monkeypatch.setenv("FEDCACHE_STORE", str(tmp_path / "env.zarr"))  # read when called
    assert grid_spec_of(store=None).store == tmp_path / "env.zarr"


def test_train_without_a_store_reads_fedcache_store(toy_store, monkeypatch):
    monkeypatch.setenv("FEDCACHE_STORE", str(toy_store))
    run = fedcache.train(dataset="test-toy", backbones=BACKBONE, method="fedavg", clients=2, rounds=1)
    assert run.summary["rounds"] == 1


CALLER_NAMES = [  # what was wrong: (CLI arguments, the message's start there), (API keywords, its start there)
    (["--set", "lrr=1"], "--set lrr: unknown key (did you mean 'lr'?)",
     {"settings": {"lrr": 1}}, "settings['lrr']: unknown key (did you mean 'lr'?)"),
    (["--set", "lr=-1"], "--set lr=-1: must be > 0", {"settings": {"lr": -1}}, "settings['lr']=-1: must be > 0"),
    (["--set", "lr"], "--set expects key=value (e.g. --set lr=0.01)",
     {"settings": ["lr"]}, "settings expects key=value (e.g. settings={'lr': 0.01})"),
    (["--partition", "dirichlett"], "--partition (partition.scheme)='dirichlett': must be one of",
     {"partition": "dirichlett"}, "partition='dirichlett': must be one of"),
    (["--rounds", "0"], "--rounds (schedule.rounds)=0: must be >= 1", {"rounds": 0}, "rounds=0: must be >= 1"),
    (["--alpha", "0.3"], "--alpha 0.3: the partition scheme iid ignores alpha",
     {"alpha": 0.3}, "alpha=0.3: the partition scheme iid ignores alpha"),
    (["--resume"], "--resume works on the run folder in --out, and none was given; add --out DIR",
     {"resume": True}, "resume=True works on the run folder in out, and none was given; add out=..."),
]


@pytest.mark.parametrize("argv,said,given,told", CALLER_NAMES)
def test_errors_name_the_flags_on_the_command_line_and_the_keywords_in_python(argv, said, given, told, capsys, tmp_path):
    from fedcache.cli import main

    store = tmp_path / "missing.zarr"  # any work would fail on the missing store instead
    assert main(["train", "--store", str(store), "-d", "x", "-b", "y", "-m", "fedavg", *argv]) == 2
    assert said in " ".join(capsys.readouterr().err.split())  # as printed, wrapped at the console's width
    with pytest.raises(ConfigError) as err:
        fedcache.train(store, "x", "y", "fedavg", **given)
    assert str(err.value).startswith(told)


def test_a_missing_required_option_is_named_as_it_is_given(capsys, tmp_path):
    from fedcache.cli import main

    assert main(["grid", "--store", str(tmp_path), "-d", "x", "-b", "y", "--method", "fedavg"]) == 2
    assert "a grid needs --out (as options or in the TOML file)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^a grid needs out \(as arguments or in the TOML file\)$"):
        fedcache.grid(store=tmp_path, dataset="x", backbones="y", methods="fedavg")
    with pytest.raises(ConfigError, match=r"^a run needs backbones, method$"):
        fedcache.train(tmp_path, "x")
    with pytest.raises(ConfigError, match=r"^jobs=0: must be >= 1$"):
        fedcache.grid(store=tmp_path, dataset="x", backbones="y", methods="fedavg", out=tmp_path / "g", jobs=0)
    with pytest.raises(ConfigError, match=r"^batch_size=0: must be >= 1$"):
        fedcache.extract_features("x", "y", store=tmp_path, batch_size=0)


def test_the_keyword_names_last_as_long_as_the_call():
    """The naming is the call's alone: after it (raised or not), the library names the flags again."""
    from fedcache.spec import RunSpec

    with pytest.raises(ConfigError, match="^rounds=0"):
        fedcache.train("unused.zarr", "x", "y", "fedavg", rounds=0)
    with pytest.raises(ConfigError, match=r"^--rounds \(schedule.rounds\)=0"):
        RunSpec.of(dataset="x", backbones="y", method="fedavg", rounds=0)


def test_a_command_that_calls_the_python_api_names_its_flags(monkeypatch, capsys, tmp_path):
    """`fedcache reproduce` trains through fedcache.grid: its user typed --jobs, not jobs=."""
    import fedcache.reproduce
    from fedcache.cli import main

    monkeypatch.setattr(fedcache.reproduce, "check", lambda *a, **k: [])  # nothing to fetch or extract
    monkeypatch.setattr(fedcache.reproduce, "_to_extract", lambda *a, **k: [])
    code = main(["reproduce", "fedpcl-fairness", "--jobs", "0", "--store", str(tmp_path / "s.zarr"),
                 "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and "error: --jobs=0: must be >= 1" in err, err  # as `fedcache grid --jobs 0` says it


def test_a_run_directory_already_used_is_named_by_the_flags_or_the_keywords(capsys, tmp_path, monkeypatch):
    """The whole refusal: its advice ends with the option that chooses another directory (it ended with a repr)."""
    from fedcache.cli import main
    from fedcache.training import _check_not_started
    from fedcache.spec import RunSpec
    from fedcache.wording import keyword_names

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "checkpoint.pt").write_bytes(b"")
    monkeypatch.setattr("fedcache.federate.rundir.RunDir.finished", lambda self: True)
    spec = RunSpec.of(dataset="x", backbones="y", method="fedavg", out=str(out))
    with pytest.raises(ConfigError, match=r"already holds a run; pass --resume to continue it, --overwrite to "
                                          r"replace it, or choose another --out$"):
        _check_not_started(spec)
    with keyword_names(), pytest.raises(ConfigError, match=r"pass resume=True to continue it, overwrite=True to "
                                                           r"replace it, or choose another out$"):
        _check_not_started(spec)
    (out / "checkpoint.pt").unlink()  # finished with keep_checkpoints=none: nothing to resume, so no resume offered
    with pytest.raises(ConfigError, match=r"nothing is left to run: --overwrite to replace it, or choose another --out$"):
        _check_not_started(spec)
    with keyword_names(), pytest.raises(ConfigError, match=r"nothing is left to run: overwrite=True to replace it, or "
                                                           r"choose another out$"):
        _check_not_started(spec)


def test_the_advice_of_a_refused_run_or_grid_names_keywords_in_python(toy_store, tmp_path):
    """Messages that spelled their advice as flags (--out, --subsample 0.8, --set) to a caller who typed none."""
    base = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE)
    with pytest.raises(ConfigError) as err:
        fedcache.train(**base, method="fedavg", rounds=1, clients=2, partition="iid", validation=True)
    assert str(err.value).startswith("scoring on validation (validation=True, or grid select) needs training rows")
    assert str(err.value).endswith("add subsample=0.8 (each client trains on 80% of its rows; the rest are spare) "
                                   "or few_shot=N") and "--" not in str(err.value)
    grid = tmp_path / "g"
    (grid / "x").mkdir(parents=True)
    (grid / "grid.json").write_text("{}")
    with pytest.raises(ConfigError, match=rf"^out='{grid / 'x'}' is inside the grid directory {grid}, "):
        fedcache.train(**base, method="fedavg", rounds=1, out=grid / "x")
    with pytest.raises(ConfigError, match=r"^sweep\['seed'\]: not an axis; give methods with methods=, seeds with "
                                          r"seeds=; .* cannot be swept$"):
        fedcache.grid(**base, methods="fedavg", sweep={"seed": [1, 2]}, out=tmp_path / "g2")
    with pytest.raises(ConfigError, match=r"^sweep\['lr'\]=-1: must be > 0"):  # a setting swept, not settings=
        fedcache.grid(**base, methods="fedavg", sweep={"lr": [-1, 0.1]}, out=tmp_path / "g3")


def test_a_grid_worker_names_keywords_as_its_python_caller_does(toy_store, tmp_path):
    """The naming crosses into the --jobs workers: a context variable stays in its process."""
    sweep = {"rounds": 1, "clients": 2, "partition": "iid", "validation": [False, True]}  # cell 1: checked here
    with pytest.raises(ConfigError) as err:
        fedcache.grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg", sweep=sweep,
                      engine="processes", jobs=2, out=tmp_path / "g")
    assert "add subsample=0.8" in str(err.value) and "--" not in str(err.value), str(err.value)


EXTRACT_NAMES = [  # an extraction's refusal: (what the caller passed, the message's start, as Python spells it)
    (dict(dataset="test-toy", name="a/b"), "name 'a/b': a name cannot hold a path separator"),
    (dict(dataset="test-toy", weights={BACKBONE: "/nope.pth"}), f"weights={{{BACKBONE!r}: '/nope.pth'}}: no such file"),
    (dict(dataset="imagefolder"), "dataset 'imagefolder' needs path=ROOT, a folder laid out as"),
    (dict(dataset="cifar10"), "dataset 'cifar10' is read from a data folder: pass data_root=DIR (with download=True "),
    (dict(dataset="test-toy", device="cuda"), "device='cuda' was requested but no CUDA GPU is visible; use device='cpu'"),
]


@pytest.mark.parametrize("given,told", EXTRACT_NAMES)
def test_an_extraction_s_refusals_name_its_keywords_in_python(given, told, tmp_path):
    """fedcache.extract_features said --name, --weights, --path, --data-root, --download, --device to a caller who
    typed no flag."""
    import torch

    if given.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the extraction would run")
    with pytest.raises(FedcacheError) as err:  # a DeviceError, a ConfigError
        fedcache.extract_features(backbones=BACKBONE, store=tmp_path / "s.zarr", workers=0, **given)
    assert str(err.value).startswith(told) and "--" not in str(err.value), str(err.value)


def test_a_name_extracted_again_with_other_domains_names_the_keywords_in_python(tmp_path):
    """The refusal of a name's other domains named --name and --domains; its `store rm` stays a command to paste."""
    base = dict(dataset="test-toy", backbones=BACKBONE, store=tmp_path / "s.zarr", workers=0, name="Y")
    fedcache.extract_features(**base, domains=["light"])
    with pytest.raises(ConfigError) as err:
        fedcache.extract_features(**base, domains=["light", "dark"])
    said = str(err.value)
    assert said.startswith("name='Y' domains=['light', 'dark'] makes a dataset of light,dark, but the store's entries "
                           "of Y are of light "), said
    assert "extract under another name, or remove its entries first with `fedcache store rm --store " in said
    assert "--" not in said.split("`")[0], said


def test_a_swept_run_option_is_named_as_the_sweep_gave_it(tmp_path):
    """sweep={'rounds': [1, 0]} was refused as rounds=0, an argument the caller never passed (as sweep['lr'] is)."""
    with pytest.raises(ConfigError, match=r"^sweep\['rounds'\]=0: must be >= 1"):
        fedcache.grid(store=tmp_path, dataset="x", backbones="y", methods="fedavg", sweep={"rounds": [1, 0]},
                      out=tmp_path / "g")


def test_a_method_s_refusals_name_its_keywords_in_python(tmp_path):
    """A head the method does not run with (drop --head), and fedpcl's redirect to the paper's row (-m fedavg
    --head mlp), as a Python caller passes them."""
    with pytest.raises(ConfigError) as err:
        fedcache.train(tmp_path, "x", "y", "fedpcl", head="linear")
    assert "not 'linear'; drop head= (in a grid" in str(err.value) and "--" not in str(err.value), str(err.value)
    with pytest.raises(ConfigError) as err:
        fedcache.train(tmp_path, "x", "y", "fedpcl", settings={"loss": "ce"})
    assert "; run method='fedavg', head='mlp' (the paper's baseline head" in str(err.value), str(err.value)
    from fedcache.spec import RunSpec  # the command line's words, outside the call

    with pytest.raises(ConfigError, match=r"; run -m fedavg --head mlp \(the paper's"):
        RunSpec.of(dataset="x", backbones="y", method="fedpcl", settings=["loss=ce"])


def test_resume_on_a_folder_without_a_run_names_the_keyword(toy_store, tmp_path):
    """resume=True where out holds no run, or another one, said '--resume: ... start the run without --resume' to a
    caller who gave no flag: the docs' train cell says what resume=True does, and this is its refusal."""
    base = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, method="fedavg", rounds=1, clients=2)
    with pytest.raises(ConfigError) as absent:
        fedcache.train(**base, out=tmp_path / "run", resume=True)
    # A folder that does not exist was said to have "no config.json" (the run's lock had made it for a moment).
    assert str(absent.value) == f"resume=True: {tmp_path / 'run'} does not exist; start the run without resume=True"
    assert not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError) as empty:
        fedcache.train(**base, out=tmp_path / "run", resume=True)
    assert str(empty.value) == f"resume=True: {tmp_path / 'run'} has no config.json; start the run without resume=True"
    first = fedcache.train(**base, out=tmp_path / "run")
    with pytest.raises(ConfigError) as other:
        fedcache.train(**base, out=tmp_path / "run", resume=True, seed=1)
    assert str(other.value).startswith("resume=True: the options differ") and "overwrite=True to replace" in str(other.value)
    again = fedcache.train(**base, out=tmp_path / "run", resume=True)  # finished: read back, nothing trained
    assert again.summary["mean_accuracy"] == first.summary["mean_accuracy"] and again.history == first.history


def test_resume_where_out_has_a_config_but_no_checkpoint_names_the_keyword(toy_store, tmp_path):
    """A run stopped before its first checkpoint (config.json written, no round done) was refused with
    '--resume: no checkpoint in ...' by the round driver, to a caller who gave no flag."""
    base = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, method="fedavg", rounds=1, clients=2)
    fedcache.train(**base, out=tmp_path / "run")
    for name in ("checkpoint.pt", "summary.json", "metrics.jsonl"):  # as a kill before round 1 leaves the folder
        (tmp_path / "run" / name).unlink(missing_ok=True)
    with pytest.raises(ConfigError) as err:
        fedcache.train(**base, out=tmp_path / "run", resume=True)
    assert str(err.value).startswith("resume=True: no checkpoint in ") and "--" not in str(err.value), str(err.value)
    assert str(err.value).endswith("start the run without resume=True")


@pytest.mark.parametrize("given, said", [
    ({"method": "fedavg"}, "method (did you mean 'methods'?)"),
    ({"rounds": 5}, "rounds (a run option is one of the grid's axes: sweep={'rounds': value or [values]})"),
    ({"mu": 0.1}, "mu (a method/optimizer setting is one of the grid's axes: sweep={'mu': value or [values]})"),
    ({"settings": {"lr": 0.1}}, "settings (a grid's settings are its axes: sweep={'lr': value or [values], ...})"),
])
def test_a_wrong_keyword_to_grid_says_what_was_meant(given, said, tmp_path):
    """Python's bare TypeError named the keyword alone; `fedcache.train(round=5)` listed every option."""
    import fedcache

    with pytest.raises(UnknownOptionError) as refused:
        fedcache.grid(store=tmp_path / "s", **given)
    known = ", ".join(sorted(inspect.signature(fedcache.grid).parameters))
    assert str(refused.value) == f"unknown option(s) {said}; known: {known}"
    with pytest.raises(ConfigError, match=r"unknown option\(s\) round \(did you mean 'rounds'\?\); known: "):
        fedcache.train(store=tmp_path / "s", dataset="test-toy", backbones="b", method="fedavg", round=5)


def test_an_unknown_keyword_is_one_error_of_one_kind_from_train_grid_and_report(tmp_path):
    """grid and report raised Python's TypeError where train raised ConfigError: a caller catching fedcache's errors
    (or ValueError) missed them. Each is now an UnknownOptionError: a ConfigError, and a TypeError as Python's was."""
    calls = {"train": lambda: fedcache.train(tmp_path / "s", "test-toy", "b", "fedavg", roundz=5),
             "grid": lambda: fedcache.grid(store=tmp_path / "s", seedz=[0]),
             "report": lambda: fedcache.report(tmp_path / "g", outt=tmp_path / "r")}
    said = {}
    for name, call in calls.items():
        with pytest.raises(UnknownOptionError) as err:
            call()
        assert isinstance(err.value, ConfigError) and isinstance(err.value, TypeError), name
        said[name] = str(err.value)
    assert said["train"].startswith("unknown option(s) roundz (did you mean 'rounds'?); known: alpha, ")
    assert said["grid"].startswith("unknown option(s) seedz (did you mean 'seeds'?); known: backbones, ")
    assert said["report"] == "unknown option(s) outt (did you mean 'out'?); known: out, run_or_grid"


def test_a_run_that_diverged_says_how_to_start_it_again_by_the_keywords(toy_store, tmp_path):
    """fedcache.train's diverged run was told to start again "with the change and --overwrite, or choose another
    --out": flags the caller never typed."""
    from fedcache.federate.divergence import DivergedError

    base = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, method="fedavg", rounds=1, clients=2)
    with pytest.raises(DivergedError) as err:
        fedcache.train(**base, settings={"lr": 1e300}, out=tmp_path / "run")
    assert str(err.value).endswith(f"The run in {tmp_path / 'run'} stopped there: start it again with the change and "
                                   "overwrite=True, or choose another out"), str(err.value)
    assert "settings['lr']" in str(err.value)
    with pytest.raises(DivergedError) as err:  # its advice names the key as the call gave it
        fedcache.train(**base, settings={"optim.lr": 1e300}, out=tmp_path / "full")
    assert "settings['optim.lr']" in str(err.value) and "settings['lr']" not in str(err.value), str(err.value)


def test_a_run_folder_another_command_holds_is_refused_by_the_keywords(toy_store, tmp_path, capsys):
    """fedcache.train into a folder another command holds was told "the same command with --resume continues it
    ... or choose another --out"; the command line keeps its flags."""
    from fedcache.cli import main
    from fedcache.errors import DirectoryBusyError
    from tests.faults import held_elsewhere

    base = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, method="fedavg", rounds=1, clients=2)
    with held_elsewhere(tmp_path / "run"):
        with pytest.raises(DirectoryBusyError) as err:
            fedcache.train(**base, out=tmp_path / "run")
        assert main(["train", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg",
                     "--out", str(tmp_path / "run")]) == 1
    said = str(err.value)
    assert "the same call with resume=True continues it)" in said and said.endswith(", or choose another out"), said
    assert "the same command with --resume continues it), or choose another --out" in capsys.readouterr().err


def test_a_setting_of_two_values_is_given_as_python_writes_a_pair(toy_store):
    """settings={'betas': (0.8, 0.99)} was read as the text '(0.8, 0.99)' and refused: "'(0.8': expected a finite
    number"."""
    base = dict(store=toy_store, dataset="test-toy", backbones=BACKBONE, method="fedavg", rounds=1)
    as_text = fedcache.train(**base, settings={"betas": "0.8,0.99"}).summary["mean_accuracy"]
    for pair in ((0.8, 0.99), [0.8, 0.99]):
        assert fedcache.train(**base, settings={"betas": pair}).summary["mean_accuracy"] == as_text
