"""Advice shared by the command line and the Python API names what its reader gave: a flag (``--out``) on the
command line, the keyword (``out``) in a Python call. Each text here said the flag to a Python caller too."""
from __future__ import annotations

import fcntl
import os

import pytest

from fedcache.errors import ConfigError, DamagedCheckpointError, EntryLockedError, FedcacheError
from fedcache.wording import flag_names, keyword_names


def _both(make) -> tuple[str, str]:
    """The message ``make()`` gives (or raises) on the command line and in a Python API call."""
    said = []
    for naming in (flag_names, keyword_names):
        with naming():
            try:
                said.append(str(make()))
            except FedcacheError as exc:  # the message is what is compared
                said.append(str(exc))
    return said[0], said[1]


def _locked_advice(tmp_path) -> str:
    from fedcache.store.locks import exclusive_lock

    path = tmp_path / "entry.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(EntryLockedError) as err, exclusive_lock(path, "entry x"):
            pass
    finally:
        os.close(fd)
    return str(err.value)


def _tracker_missing() -> str:
    from fedcache.trackers.mlflow_tracker import MLflow

    return str(MLflow.missing(ModuleNotFoundError("no mlflow", name="mlflow")))


def _uneven_domain_clients() -> str:
    import numpy as np

    from fedcache.federate.partitions.core import PartitionRequest
    from fedcache.federate.partitions.schemes import domain

    labels, domains = np.zeros(30, np.int64), np.repeat(np.arange(3), 10)
    domain(labels, domains, PartitionRequest.of("domain", 5, clients_per_domain=2), np.random.default_rng(0))


CASES = [
    ("domains' clients that do not add up", lambda tmp: _uneven_domain_clients(),
     "must equal --clients (5); use --clients 6, or leave --clients-per-domain out",
     "must equal clients (5); use clients=6, or leave clients_per_domain out"),
    ("a damaged checkpoint", lambda tmp: DamagedCheckpointError(tmp / "checkpoint.pt", "it cannot be read"),
     "another --out (or with --overwrite)", "another out (or with overwrite=True)"),
    ("an entry another writer holds", _locked_advice, "pass --wait SECONDS", "pass wait=SECONDS"),
    ("a tracker not installed", lambda tmp: _tracker_missing(), "--track mlflow needs", "track='mlflow' needs"),
]


@pytest.mark.parametrize("what, make, flag, keyword", CASES, ids=[c[0] for c in CASES])
def test_advice_names_the_flag_on_the_command_line_and_the_keyword_in_python(what, make, flag, keyword, tmp_path):
    on_cli, in_python = _both(lambda: make(tmp_path))
    assert flag in on_cli, on_cli
    assert keyword in in_python and " --" not in in_python, in_python


def test_a_report_s_out_is_named_as_the_call_gave_it(toy_grid, tmp_path):
    """fedcache.report(out=a_file) said "--out ... is a file", a flag the caller never typed."""
    import fedcache

    taken = tmp_path / "taken"
    taken.write_text("mine")
    with pytest.raises(ConfigError) as err:
        fedcache.report(toy_grid, out=taken)
    assert str(err.value) == f"out {taken} is a file; give a directory (it is created if missing)"


def test_a_store_that_cannot_be_made_is_named_as_the_call_gave_it(tmp_path, monkeypatch):
    """fedcache.extract_features(store=...) in a folder this user cannot write in said "give a --store"."""
    import fedcache
    from fedcache.errors import StoreError
    from tests.faults import deny_writes_in

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        deny_writes_in(monkeypatch, ro)
        with pytest.raises(StoreError) as err:
            fedcache.extract_features("test-toy", "tiny-timm-random", store=ro / "s.zarr", workers=0)
    finally:
        ro.chmod(0o755)
    assert str(err.value).endswith("; give a store=... (or FEDCACHE_STORE) in a folder you can write to"), err.value


def test_a_report_of_no_directory_says_how_a_python_caller_makes_one(tmp_path):
    """fedcache.report(missing) said "give a run directory (train --out)", the command line's way to make one."""
    import fedcache

    with pytest.raises(ConfigError) as err:
        fedcache.report(tmp_path / "nope")
    assert str(err.value) == (f"{tmp_path / 'nope'} does not exist; give a run directory (fedcache.train(out=...)) or "
                              "a grid directory (fedcache.grid(out=...))")


@pytest.mark.parametrize("typed", ["optim.lr", "lr"])
def test_a_setting_is_named_as_its_user_typed_it(typed):
    """``--set optim.lr=-1`` was said as ``--set lr=-1``, by train and by a grid's axis: a message names a setting
    by the key its user gave it (a search of the command for it finds it), the short one where typed short."""
    from fedcache.spec import RunSpec

    base = RunSpec.of(dataset="d", backbones=["b"], method="fedavg")
    flag, keyword = _both(lambda: RunSpec.of(dataset="d", backbones=["b"], method="fedavg", settings=[f"{typed}=-1"]))
    assert flag.startswith(f"--set {typed}=-1:") and keyword.startswith(f"settings[{typed!r}]=-1:"), (flag, keyword)
    flag, keyword = _both(lambda: base.override({typed: "-1"}))  # a grid's cell
    assert flag.startswith(f"--set {typed}=-1:") and keyword.startswith(f"sweep[{typed!r}]=-1:"), (flag, keyword)


def test_advice_in_a_run_or_a_cell_names_a_setting_as_its_user_typed_it():
    """Advice met while a run trains (lower the learning rate: ``--set lr=...``) names the setting as the command
    or the grid gave it: by the train command's --set keys, by a grid's axes in its cells."""
    from fedcache.grids.spec import Names
    from fedcache.spec import typed_keys
    from fedcache.wording import setting, typed_as

    with flag_names(), typed_as(typed_keys(["optim.lr=10", "mu=0.1"], "fedprox")):
        assert (setting("optim.lr"), setting("method.mu"), setting("optim.momentum")) == (
            "--set optim.lr", "--set mu", "--set momentum")
    with keyword_names(), Names().swept(["optim.lr"], ["fedavg"]):
        assert setting("optim.lr") == "sweep['optim.lr']"


def test_an_ambiguous_setting_is_advised_as_the_call_gives_settings(tmp_path):
    """flesd's ``momentum`` is its own and the optimizer's: a Python call was told to ``write settings
    method.momentum=...`` (``sweep method.momentum=...``), which is no Python, where the command line says
    ``--set method.momentum=...``."""
    import fedcache
    from fedcache.spec import RunSpec

    with pytest.raises(ConfigError) as err:
        fedcache.train(dataset="d", backbones="b", method="flesd", settings={"momentum": 0.5})
    assert str(err.value).endswith("write settings={'method.momentum': ...} or settings={'optim.momentum': ...}")
    with pytest.raises(ConfigError) as err:
        fedcache.grid(dataset="d", backbones="b", methods="flesd", sweep={"momentum": [0.5, 0.9]},
                      out=tmp_path / "g")
    assert str(err.value).endswith("write sweep={'method.momentum': ...} or sweep={'optim.momentum': ...}")
    with flag_names(), pytest.raises(ConfigError) as err:
        RunSpec.of(dataset="d", backbones=["b"], method="flesd", settings=["momentum=0.5"])
    assert str(err.value).endswith("write --set method.momentum=... or --set optim.momentum=...")


@pytest.mark.parametrize("ended, flag, keyword", [
    ("died", "died; re-run with --jobs 1 to see the error", "otherwise call it again with jobs=1 to see the error"),
    ("sent SIGTERM", "the same command resumes the others", "the same call resumes the others")])
def test_a_grid_worker_gone_is_said_as_the_grid_was_started(ended, flag, keyword):
    """A ``fedcache.grid(jobs=2)`` whose worker died was told to "re-run with --jobs 1" (sent SIGTERM: "the same
    command resumes"): the line is built in the call, which reads its workers' results. The command line's user was
    told how to call fedcache.grid from a script, which they never wrote."""
    import signal
    from concurrent.futures.process import BrokenProcessPool

    from fedcache.grids.pool import _lost_worker

    exc = BrokenProcessPool() if ended == "died" else SystemExit(128 + signal.SIGTERM)
    on_cli, in_python = _both(lambda: _lost_worker(exc, set()))
    assert ended in on_cli and flag in on_cli and "script" not in on_cli, on_cli
    assert ended in in_python and keyword in in_python and " --" not in in_python, in_python


def test_a_backbone_without_its_checkpoint_is_told_to_a_python_caller_as_a_keyword(tmp_path):
    """``extract_features`` of a checkpoint backbone without ``weights`` said "pass --weights NAME=PATH"."""
    import fedcache
    from fedcache.errors import WeightsNotFoundError

    with pytest.raises(WeightsNotFoundError) as err:
        fedcache.extract_features("test-toy", "resnet18-quickdraw", store=tmp_path / "s.zarr", workers=0)
    said = str(err.value)
    assert "pass weights={'resnet18-quickdraw': PATH} to a .pth" in said and " --" not in said, said
    with flag_names():
        from fedcache.extract.loading import load_backbone

        with pytest.raises(WeightsNotFoundError, match="pass --weights resnet18-quickdraw=PATH to a .pth"):
            load_backbone("resnet18-quickdraw")


def test_a_dataset_s_raw_files_are_placed_under_the_data_root_as_the_caller_gave_it(tmp_path):
    """A Python caller was told to extract MNIST-M "into data_root, giving <data-root>/mnist_m/...": a placeholder
    named after a flag they never typed. In Python the paths are under the folder the call passed."""
    from fedcache.extract.datasets import DATASETS, DatasetOptions
    from fedcache.extract.datasets._common import StandardSet, load_standard, read_class_folders

    root = tmp_path / "data"
    on_cli, in_python = _both(lambda: DATASETS.get("mnist-m").load(DatasetOptions(data_root=root)))
    assert "extract it into --data-root, giving <data-root>/mnist_m/{mnist_m_train/" in on_cli, on_cli
    assert f"extract it into data_root, giving {root}/mnist_m/{{mnist_m_train/" in in_python, in_python
    on_cli, in_python = _both(lambda: DATASETS.get("svhn").load(DatasetOptions(data_root=root)))
    assert "Pass --download to fetch it with torchvision into --data-root, or " in on_cli and "into <data-root>/svhn/." in on_cli
    assert "Pass download=True to fetch it with torchvision into data_root, or " in in_python, in_python
    assert f"test_32x32.mat from http://ufldl.stanford.edu/housenumbers/ into {root}/svhn/." in in_python, in_python

    def offline(data_root):
        raise RuntimeError("Name or service not known")

    row = StandardSet(name="fake", description="", reader=read_class_folders, dirs=("fake",), keys=("a",), classes=("a",),
                      download=offline, how_to_get="put fake.zip in <data-root>/fake/.")
    on_cli, in_python = _both(lambda: load_standard(row, DatasetOptions(data_root=root, download=True)))
    assert "Name or service not known. Put fake.zip in <data-root>/fake/." in on_cli, on_cli
    assert f"Name or service not known. Put fake.zip in {root}/fake/." in in_python, in_python
    assert "<data-root>" not in in_python and " --" not in in_python, in_python
    import fedcache  # the whole call, as a notebook makes it
    from tests.conftest import BACKBONE

    with pytest.raises(FedcacheError) as err:
        fedcache.extract_features(dataset="mnist-m", backbones=BACKBONE, store=tmp_path / "s.zarr", data_root=root, workers=0)
    assert f"extract it into data_root, giving {root}/mnist_m/" in str(err.value) and " --" not in str(err.value), str(err.value)


def test_a_very_long_key_is_cut_in_either_naming():
    from tests.resolve import resolve_settings

    cli, api = _both(lambda: resolve_settings("fedavg", ["q" * 400 + "=1"]))
    assert cli.startswith("--set " + "q" * 30 + "... (400 characters): unknown key") and len(cli) < 300
    assert api.startswith("settings['" + "q" * 30 + "'...] (a key of 400 characters): unknown key") and len(api) < 300


def test_pairs_in_one_value_are_given_each_its_own_in_either_naming():
    from tests.resolve import resolve_settings

    cli, api = _both(lambda: resolve_settings("fedavg", ["lr=0.1, weight_decay=0"]))
    assert cli == "--set lr='0.1, weight_decay=0' holds 2 pairs; give each its own: --set lr=0.1 --set weight_decay=0"
    assert api.endswith("holds 2 pairs; give each its own: settings=['lr=0.1', 'weight_decay=0']")
    from fedcache.spec import parse_pairs

    path = "/runs/multirun/lr=0.1,seed=0/head.pt"  # a path or a text may hold ", key=": a value, not pairs
    assert parse_pairs([f"weights={path}", "ctx_init=a photo of a, x=1"]) == {"weights": path, "ctx_init": "a photo of a, x=1"}
