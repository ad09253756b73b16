"""A standing fuzz of the command line (issue 18): random options and values for `train`, `partition`,
`grid`, `store info/export`, `store import` of malformed .npz/.h5 files, and `grid --config` of malformed TOML
files (issue 33), run in-process. Whatever the input, a command either succeeds or says
what was wrong in one message with exit 1 or 2; an uncaught exception (a traceback) fails the test.

The options come from fedcache/spec.py, so a new run option is fuzzed without touching this file. The
default run is derandomized and small (a few seconds per command, within `make test`'s budget);
FEDCACHE_FUZZ_EXAMPLES=500 explores further with fresh random draws.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fedcache.cli import main  # noqa: E402
from fedcache.spec import Option, options  # noqa: E402

EXPLORE = int(os.environ.get("FEDCACHE_FUZZ_EXAMPLES", "0"))


def fuzz(examples: int):
    return settings(max_examples=EXPLORE or examples, deadline=timedelta(seconds=20), derandomize=not EXPLORE,
                    database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- values ------------------------------------------------------------------------------------------
# Each value is drawn from sensible ones (listed twice, so about half the draws go past the option checks
# into the work) and edge cases; hypothesis shrinks towards the first.
INTS, BAD_INTS = ["1", "2", "3"], ["0", "-1", "1.5", "99999999999999999999", "x", ""]
FLOATS, BAD_FLOATS = ["0.5", "1", "0.1", "0.9"], ["0", "-1", "1.5", "nan", "inf", "-inf", "1e309", "x", ""]
NAMES_BAD = ["bogus", ""]
# Options whose large values cost time or memory rather than being wrong.
COSTLY = {"rounds", "local_epochs", "clients", "clients_per_domain", "shards", "local_test", "few_shot"}
# Values that would start something heavy or outside this test (a Ray cluster, tracker servers).
AVOID = {"engine": {"flower-sim"}, "track": {"tensorboard", "mlflow"}}


def _pool(good: list[str], bad: list[str]) -> list[str]:
    return good + good + bad


def _names(option: Option) -> list[str]:
    from fedcache.federate.methods import METHODS
    from fedcache.federate.optim_config import OPTIMIZER_PRESETS
    from fedcache.federate.partitions import PARTITIONERS
    from fedcache.heads import HEADS

    known = {"partition": list(PARTITIONERS.names()), "method": list(METHODS.names()), "preset": list(OPTIMIZER_PRESETS),
             "head": list(HEADS.names()), "engine": ["in-process", "flower-sim"], "track": ["tensorboard", "mlflow"],
             "keep_checkpoints": ["last", "none", "all"]}
    return [n for n in known.get(option.name, []) if n not in AVOID.get(option.name, set())]


def _values(option: Option, work: Path) -> list[str]:
    """Candidate texts for one option."""
    if option.base is int:
        return _pool(INTS, BAD_INTS[:-3] if option.name in COSTLY else BAD_INTS)
    if option.base is float:
        return _pool(FLOATS, BAD_FLOATS)
    if option.base is Path:
        return _pool([str(work / "out")], [str(work / "file"), str(work / "file" / "below"), ""])
    return _pool(_names(option), NAMES_BAD)


def _setting_values(typ) -> list[str]:
    """Texts for a --set key of this type: its choices, or numbers."""
    import typing

    from fedcache.config import fields_of  # noqa: F401  (the same typing view as --set)

    args = typing.get_args(typ)
    if typing.get_origin(typ) is typing.Literal:
        return _pool([str(a) for a in args], NAMES_BAD)
    if typ is bool:
        return _pool(["true", "false"], ["2", "x"])
    if typing.get_origin(typ) is tuple:
        return _pool(["0.9,0.99"], ["0.9", "1,1", "nan,0.9", ""])
    return _pool(INTS + FLOATS, BAD_FLOATS)


def _settings(method: str) -> dict[str, list[str]]:
    """``--set`` keys of ``method`` (and of the optimizer) with the texts to try for each."""
    import typing

    from fedcache.federate.methods import METHODS
    from fedcache.federate.optim_config import OptimConfig
    from fedcache.config import fields_of

    def base(t):
        while typing.get_origin(t) in (typing.Annotated,) or (typing.get_origin(t) is typing.Union):
            t = next(a for a in typing.get_args(t) if a is not type(None))
        return t

    own = fields_of(METHODS.get(method).Settings) if method in METHODS.names() else {}
    keys = {f"method.{k}": _setting_values(base(t)) for k, t in own.items()}
    keys.update({f"optim.{k}": _setting_values(base(t)) for k, t in fields_of(OptimConfig).items()})
    keys.update({"bogus": ["1"], "head": ["mlp", "bogus"]})
    return keys


METHOD_CHOICES = ["fedavg", "fedproto", "fedprox", "fedrep", "solo", "linear-probe"]


@st.composite
def spec_args(draw, names: list[Option], work: Path, store: Path, axis: bool = False, most: int = 4) -> list[str]:
    """Command-line arguments: the data options, then up to ``most`` of the given spec options.
    ``axis``: a value may be a comma-separated list (a grid axis)."""
    from fedcache.federate.methods import METHODS

    args = ["--store", draw(st.sampled_from([str(store)] * 4 + [str(work / "missing.zarr")])),
            "-d", draw(st.sampled_from(["test-toy"] * 4 + ["nope"])),
            "-b", draw(st.sampled_from(["tiny-timm-random"] * 4 + ["nope", "tiny-timm-random,tiny-timm-random"]))]
    method = draw(st.sampled_from(METHOD_CHOICES + list(METHODS.names()) + NAMES_BAD))
    if any(o.name == "method" for o in names):
        args += ["-m", method]
    free = [o for o in names if o.name not in ("store", "dataset", "backbones", "method")]
    for o in draw(st.lists(st.sampled_from(free), max_size=most, unique_by=lambda o: o.name)):
        if o.name == "settings":
            pool = _settings(method)
            for key in draw(st.lists(st.sampled_from(sorted(pool)), min_size=1, max_size=2, unique=True)):
                args += ["--set", f"{key}={draw(st.sampled_from(pool[key]))}"]
        elif o.base is bool:
            args.append(draw(st.sampled_from(o.flags[0].split("/"))))
        else:
            value = draw(st.sampled_from(_values(o, work)))
            if axis and draw(st.booleans()):
                value += "," + draw(st.sampled_from(_values(o, work)))
            args += [o.flags[0], value]
    return args


# ---- running -----------------------------------------------------------------------------------------
def run_cli(argv: list[str]) -> tuple[int, str]:
    """Exit code and stderr of ``fedcache argv``; an exception escaping main fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    text = err.getvalue()
    if os.environ.get("FEDCACHE_FUZZ_LOG"):  # what the fuzz reached: exit codes and messages, one line per run
        with open(os.environ["FEDCACHE_FUZZ_LOG"], "a") as log:
            log.write(f"{code} {' '.join(argv)} :: {(text.strip().splitlines() or [''])[-1][:160]}\n")
    assert code in (0, 1, 2), (argv, code, text)
    assert "Traceback" not in text, (argv, text)
    if code:
        assert text.strip(), (argv, "failed without saying why")
    return code, text


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A toy store and a scratch directory holding a file (for outputs that name or go below a file)."""
    from fedcache.extract.runner import ExtractConfig, extract

    os.environ.pop("FEDCACHE_DEBUG", None)
    root = tmp_path_factory.mktemp("fuzz")
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=root / "store.zarr", workers=0))
    (root / "file").write_text("not a directory")
    return root


_count = itertools.count()


def _fresh(work: Path) -> Path:
    """A new directory per example, holding its own file, so examples do not share outputs by accident."""
    d = work / f"ex{next(_count)}"
    d.mkdir()
    (d / "file").write_text("not a directory")
    return d


TRAIN = [o for o in options()]
PARTITION = [o for o in options("data", "partition")] + [o for o in options("schedule") if o.name == "seed"]
GRID_OPTIONS = [o for o in options() if o.name not in ("resume", "engine", "overwrite", "track_dir", "seed", "out")]


def test_fuzz_train(work):
    @fuzz(25)
    @given(data=st.data())
    def check(data):
        ex = _fresh(work)
        args = data.draw(spec_args(TRAIN, ex, work / "store.zarr"))
        run_cli(["train", *args, *([] if "--rounds" in args else ["--rounds", "2"])])

    check()


def test_fuzz_partition(work):
    @fuzz(20)
    @given(data=st.data(), plot=st.sampled_from([None, None, "plots/p", "file/p"]))
    def check(data, plot):
        ex = _fresh(work)
        args = data.draw(spec_args(PARTITION, ex, work / "store.zarr"))
        run_cli(["partition", *args, *(["--plot", str(ex / plot)] if plot else [])])

    check()


def test_fuzz_grid(work):
    @fuzz(10)
    @given(data=st.data(), seeds=st.sampled_from([None, None, "0,1", "a", "-1", ""]),
           jobs=st.sampled_from([None] * 4 + ["1", "0", "x"]), out=st.sampled_from(["grid"] * 4 + ["file", "file/below"]))
    def check(data, seeds, jobs, out):
        ex = _fresh(work)
        args = data.draw(spec_args(GRID_OPTIONS, ex, work / "store.zarr", axis=True))
        args += ["--rounds", "1"] if "--rounds" not in args else []
        run_cli(["grid", *args, "-o", str(ex / out), *(["--seeds", seeds] if seeds is not None else []),
                 *(["--jobs", jobs] if jobs is not None else [])])

    check()


def test_fuzz_store_info_and_export(work):
    store = str(work / "store.zarr")

    @fuzz(20)
    @given(entry=st.sampled_from(["", "0", "zz", "a" * 16, "../x", "é"]) | st.text(max_size=8),
           dataset=st.sampled_from(["test-toy", "nope", ""]), backbone=st.sampled_from(["tiny-timm-random", "nope", ""]),
           out=st.sampled_from(["x.npz", "x.h5", "x.csv", "x", "file", "file/x.npz", "missing/x.npz"]),
           fmt=st.sampled_from([None, "npz", "h5", "csv", ""]), splits=st.sampled_from([None, "train", "test,train", "bogus", ""]))
    def check(entry, dataset, backbone, out, fmt, splits):
        ex = _fresh(work)
        run_cli(["store", "info", entry, "--store", store])
        run_cli(["store", "export", "-d", dataset, "-b", backbone, "-o", str(ex / out), "--store", store,
                 *(["--format", fmt] if fmt is not None else []), *(["--splits", splits] if splits is not None else [])])

    check()


# ---- store import: random malformed files through the CLI ---------------------------------------------
# tests/store/test_import_validation.py fuzzes the arrays a file holds (import_file directly); this one damages
# the bytes of a valid file, names it with the other format's suffix, draws the options, and trains on
# whatever was accepted: a file import takes must not crash train later.
def _valid_file(path: Path, rows: int, width: int, label_max: int) -> Path:
    import h5py
    import numpy as np

    rng = np.random.default_rng(rows * 7 + width)
    arrays = {"train/features": rng.normal(size=(rows, width)).astype(np.float32),
              "train/labels": rng.integers(0, label_max + 1, rows), "train/domains": np.arange(rows) % 2,
              "test/features": rng.normal(size=(max(rows // 2, 1), width)).astype(np.float32),
              "test/labels": rng.integers(0, label_max + 1, max(rows // 2, 1)), "test/domains": np.zeros(max(rows // 2, 1), int)}
    if path.suffix == ".npz":
        np.savez(path, **{k.replace("/", "__"): v for k, v in arrays.items()})
    else:
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f[k] = v
    return path


def _damage(data: bytes, how: str, at: float, byte: int) -> bytes:
    i = int(at * len(data))
    return {"none": data, "truncate": data[:i], "flip": data[:i] + bytes([byte]) + data[i + 1:],
            "zero-tail": data[:i] + bytes(len(data) - i), "empty": b"", "text": b"features,labels\n1,2\n"}[how]


def test_fuzz_store_import_then_train(work):
    @fuzz(30)
    @given(fmt=st.sampled_from(["npz", "h5"]), suffix=st.sampled_from(["same", "same", "other", ".txt"]),
           how=st.sampled_from(["none"] * 6 + ["truncate", "flip", "zero-tail", "empty", "text"]),
           at=st.floats(0, 1), byte=st.integers(0, 255), rows=st.sampled_from([1, 4, 12]),
           width=st.sampled_from([4, 4, 1, 0]), label_max=st.sampled_from([0, 2]),
           dataset=st.sampled_from(["mine"] * 4 + ["", "a,b", "test-toy"]), backbone=st.sampled_from(["enc"] * 4 + ["", ".."]),
           split=st.sampled_from([None] * 4 + ["train", ""]))
    def check(fmt, suffix, how, at, byte, rows, width, label_max, dataset, backbone, split):
        ex = _fresh(work)
        raw = _damage(_valid_file(ex / f"src.{fmt}", rows, width, label_max).read_bytes(), how, at, byte)
        name = {"same": f"x.{fmt}", "other": "x.h5" if fmt == "npz" else "x.npz", ".txt": "x.txt"}[suffix]
        (ex / name).write_bytes(raw)
        store = ex / "s.zarr"
        code, _ = run_cli(["store", "import", str(ex / name), "-d", dataset, "-b", backbone, "--store", str(store),
                           *(["--split", split] if split is not None else [])])
        if code == 0:  # accepted: the store holds it intact and training on it is a result or a clear error
            run_cli(["store", "verify", "--store", str(store)])
            run_cli(["train", "--store", str(store), "-d", dataset, "-b", backbone, "-m", "fedavg", "--rounds", "1",
                     "--clients", "2", "--partition", "iid"])

    check()


# ---- grid TOML files: random keys, values and bytes through `grid --config` -----------------------------------
# tests/grids/test_toml.py holds a table of malformed files; this draws them: each top-level key from sensible
# values (listed twice) and wrong ones of every TOML type, a [set] of run options and settings, and sometimes
# damaged bytes. Whatever the file, the grid runs or says what is wrong in one message.
ANY_TOML = [5, -1, 1.5, True, "", "x", [], [1, 2], [[1]], {"a": 1}, "1979-05-27"]
FILE_VALUES = {
    "methods": [["fedavg"], "fedavg,fedproto", ["fedavg", "nope"], "nope"],
    "seeds": [[0], 7, "0,1", [0, "x"], -1],
    "jobs": [1, "1", 0, "x"],
    "backbones": [["tiny-timm-random"], "tiny-timm-random", ["a/b"], [".."]],
    "dataset": ["test-toy", "nope", "..", ".hidden"],
    "store": ["STORE", "missing.zarr"],
    "out": ["g", "file", "file/below"],
    "select": [["lr"], "alpha", ["nope"]],
    "track": [[], "bogus"],
    "keep_checkpoints": ["last", "none", "x"],
    "device": ["cpu", "auto", "gpu"],
    "engine": ["batched", "processes", "x"],
    "max_batch_cells": [2, 0, "x"],
    "prune": ["none", "halving", "x"], "reduction_factor": [3, 1, "x"], "min_rounds": [1, 0],
    "method": ["fedavg"], "rounds": [1],  # not grid keys: unknown
}
SET_VALUES = {
    "rounds": [1, [1, 2], 0, "x", [1, "y"]], "partition": ["iid", "dirichlet", "nope"], "clients": [2, [2, 3], 0],
    "alpha": [0.5, [0.1, 1.0], -1, "nan"], "lr": [0.01, ["1e-3", "1e-2"], "x", []], "subsample": [0.8, 2],
    "seed": [1], "bogus": [1], "head": ["mlp", "nope"], "validation": [True, "maybe"],
}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml_value, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if v == "1979-05-27":
        return v  # a TOML date
    return json.dumps(v)


@st.composite
def grid_files(draw, store: Path):
    """The bytes of a grid file."""
    lines = []
    for key in draw(st.lists(st.sampled_from(sorted(FILE_VALUES)), max_size=5, unique=True)):
        value = draw(st.sampled_from(FILE_VALUES[key] * 2 + ANY_TOML))
        lines.append(f"{key} = {_toml_value(str(store) if value == 'STORE' else value)}")
    sweep = draw(st.lists(st.sampled_from(sorted(SET_VALUES)), max_size=4, unique=True))
    if sweep or draw(st.booleans()):
        lines.append("[set]")
        lines += [f"{k} = {_toml_value(draw(st.sampled_from(SET_VALUES[k] * 2 + ANY_TOML)))}" for k in sweep]
        lines += [] if "rounds" in sweep else ["rounds = 1"]
    data = ("\n".join(lines) + "\n").encode()
    how = draw(st.sampled_from(["none"] * 8 + ["truncate", "flip", "bom", "utf-16", "set = 5"]))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    return {"none": data, "truncate": data[:at], "flip": data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:],
            "bom": b"\xef\xbb\xbf" + data, "utf-16": data.decode().encode("utf-16"), "set = 5": b"set = 5\n" + data}[how]


@contextlib.contextmanager
def _inside(directory: Path):
    """The working directory for the block (contextlib.chdir is Python 3.11+)."""
    before = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def test_fuzz_grid_toml(work):
    @fuzz(40)
    @given(data=st.data())
    def check(data):
        ex = _fresh(work)
        raw = data.draw(grid_files(work / "store.zarr"))
        (ex / "grid.toml").write_bytes(raw)
        text = raw.decode("utf-8", "replace")
        argv = ["grid", "-c", str(ex / "grid.toml")]
        for key, flag, value in (("store", "--store", work / "store.zarr"), ("dataset", "-d", "test-toy"),
                                 ("backbones", "-b", "tiny-timm-random"), ("methods", "-m", "fedavg"), ("out", "-o", ex / "g")):
            if not re.search(rf"^{key} ", text, re.M):
                argv += [flag, str(value)]
        with _inside(ex):  # relative paths the file names stay in the example's directory
            code, err = run_cli(argv + ["--partition", "iid", "--clients", "2"] if "[set]" not in text else argv)
        if code:
            assert len([l for l in err.splitlines() if l.startswith("error:")]) == 1, err

    check()
