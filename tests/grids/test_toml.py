"""Grid TOML files (fedcache/grids/spec.py, load_toml): checked by the validator the command line's values pass.
A malformed file is one line naming the file and the key (or what is wrong with the file), exit 1 or 2, no
traceback, and no grid directory made; the file forms that mean what the command line means are taken.
(tests/test_cli_fuzz.py fuzzes such files.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from fedcache.errors import ConfigError
from fedcache.grids import GridSpec, load_toml
from fedcache.grids.spec import Names
from tests.conftest import BACKBONE
from tests.faults import one_error_line, run_cli

BASE = 'methods = ["fedavg"]\n'  # a case that is not about the methods names one, so that only its fault is wrong
RUN = "[set]\nrounds = 1\npartition = \"iid\"\nclients = 2\n"

# (id, the file's text (bytes: written as they are; None: a directory), what the one line must name)
CASES = [
    # the file itself
    ("a directory", None, "{path} is a directory"),
    ("not UTF-8", b'methods = ["fedavg"]\n\xff\xfe\n', "{path} is not UTF-8 text (byte 0xff at offset 21)"),
    ("UTF-16", 'methods = ["fedavg"]\n'.encode("utf-16"), "{path} is not UTF-8 text"),
    ("a syntax error", "methods = [\n", "{path} is not valid TOML"),
    ("a key twice", BASE + "jobs = 1\njobs = 2\n", "{path} is not valid TOML"),
    ("a missing file", "MISSING", "{path} does not exist"),
    ("an unknown key", 'method = "fedavg"\n', "grid file {path}: unknown key(s) method"),
    ("a run option at the top", BASE + "rounds = 5\n", "grid file {path}: unknown key(s) rounds (a run option: put it under [set]); known: "),
    # the issue's ten (but two: seeds = 7 and jobs = '2' mean what --seeds 7 and --jobs 2 mean: taken, below)
    ("methods = 5", "methods = 5\n", "grid file {path}: methods=5: expected text"),
    ("methods = [1, 2]", "methods = [1, 2]\n", "grid file {path}: methods=1: expected text"),
    ("a [prune] table", BASE + "[prune]\nkind = 'halving'\n",
     "grid file {path}: prune is a table ([prune] or {...}), and it takes a value: write prune = ... at the top"),
    ("out = 5", BASE + "out = 5\n", "grid file {path}: out=5: expected a path"),
    ("store = ['a']", BASE + "store = ['a']\n", "grid file {path}: store=['a']: expected a path"),
    ("backbones = 7", BASE + "backbones = 7\n", "grid file {path}: backbones=7: expected text"),
    ("set = 5", BASE + "set = 5\n", "grid file {path}: set=5: expected a table ([set] with key = value lines)"),
    # methods
    ("a misspelt method", 'methods = ["fedavgg"]\n', "grid file {path}: unknown method 'fedavgg'. Did you mean 'fedavg'"),
    ("one setting under two names", BASE + "[set]\nlr = [0.1, 0.01]\n[set.optim]\nlr = [0.2]\n",
     "grid file {path}: lr and optim.lr name the same setting of fedavg (optim.lr); give it once"),
    ("methods = true", "methods = true\n", "grid file {path}: methods=True: expected text"),
    ("methods = table", "methods = {a = 1}\n", "grid file {path}: methods is a table ([methods] or {...}), and it takes a value"),
    ("methods nested", 'methods = [["fedavg"]]\n', "grid file {path}: methods=['fedavg']: expected text"),
    ("an unknown method", 'methods = ["fedavg", "nope"]\n' + RUN, "unknown method 'nope'"),
    ("methods = []", "methods = []\n" + RUN, "grid file {path}: methods=[]: give at least one"),
    # seeds
    ("seeds = 'a'", BASE + 'seeds = "a"\n', "grid file {path}: seeds='a': expected an integer"),
    ("seeds = [0, 'x']", BASE + 'seeds = [0, "x"]\n', "grid file {path}: seeds='x': expected an integer"),
    ("seeds = -1", BASE + "seeds = -1\n", "grid file {path}: seeds=-1: must be >= 0"),
    ("seeds = 1.5", BASE + "seeds = 1.5\n", "grid file {path}: seeds=1.5: expected an integer"),
    ("seeds = [true]", BASE + "seeds = [true]\n", "grid file {path}: seeds=True: expected an integer"),
    ("seeds = []", BASE + "seeds = []\n" + RUN, "grid file {path}: seeds=[]: give at least one"),
    ("seeds twice", BASE + "seeds = [0, 0]\n" + RUN, "grid file {path}: seeds=[0, 0]: '0' and '0' are one value"),
    # echoed as the file wrote them: seeds = "" was "seeds=[]", and [1, 1.0] "seeds=[1, 1]: '1' and '1'"
    ("seeds = ''", BASE + 'seeds = ""\n' + RUN, 'grid file {path}: seeds="": give at least one'),
    ("methods = ' , '", 'methods = " , "\n' + RUN, 'grid file {path}: methods=" , ": give at least one'),
    ("seeds = [1, 1.0]", BASE + "seeds = [1, 1.0]\n" + RUN, "grid file {path}: seeds=[1, 1.0]: '1' and '1.0' are one value"),
    ("seeds = '1, 1'", BASE + "seeds = '1, 1'\n" + RUN, "grid file {path}: seeds=\"1, 1\": '1' and '1' are one value"),
    # Python reads 1_0 as 10: the grid kept "1_0" (results.csv, the cells' folders) and trained 10
    ("seeds = '1_0'", BASE + "seeds = '1_0'\n" + RUN, "grid file {path}: seeds='1_0': expected an integer in plain digits: write 10"),
    # jobs
    ("jobs = 'x'", BASE + "jobs = 'x'\n", "grid file {path}: jobs='x': expected an integer"),
    ("jobs = 0", BASE + "jobs = 0\n", "grid file {path}: jobs=0: must be >= 1"),
    ("jobs = -3", BASE + "jobs = -3\n", "grid file {path}: jobs=-3: must be >= 1"),
    ("jobs = 1.5", BASE + "jobs = 1.5\n", "grid file {path}: jobs=1.5: expected an integer"),
    ("jobs = [1]", BASE + "jobs = [1]\n", "grid file {path}: jobs=[1]: expected an integer"),
    ("jobs = true", BASE + "jobs = true\n", "grid file {path}: jobs=True: expected an integer"),
    # where it reads and writes
    ("out = ['a']", BASE + "out = ['a']\n", "grid file {path}: out=['a']: expected a path"),
    ("out = ''", BASE + "out = ''\n", "grid file {path}: out='': give a path"),
    ("store = 5", BASE + "store = 5\n", "grid file {path}: store=5: expected a path"),
    ("store = ''", BASE + "store = ''\n", "grid file {path}: store='': give a path"),
    ("a store that is not there", BASE + "store = 'missing.zarr'\n" + RUN, "no feature store at missing.zarr"),
    # the data
    ("backbones nested", BASE + 'backbones = [["a"]]\n', "grid file {path}: backbones=['a']: expected text"),
    ("a backbone that is a path", BASE + 'backbones = ["a/b"]\n' + RUN, "--backbones (data.backbones) 'a/b': a name cannot hold a path separator"),
    ("backbones = []", BASE + "backbones = []\n" + RUN, "grid file {path}: backbones=[]: give at least one"),
    ("dataset = 5", BASE + "dataset = 5\n", "grid file {path}: dataset=5: expected text"),
    ("dataset = '..'", BASE + "dataset = '..'\n" + RUN, "--dataset (data.dataset) '..': '.' and '..' are directories, not names"),
    ("dataset = ['a']", BASE + "dataset = ['a']\n", "grid file {path}: dataset=['a']: expected text"),
    ("a dataset not in the store", BASE + "dataset = 'nope'\n" + RUN, "features of nope"),
    # how it runs
    ("select = 5", BASE + "select = 5\n", "grid file {path}: select=5: expected text"),
    ("select of no axis", BASE + "select = ['lr']\n" + RUN, 'grid file {path}: select=["lr"]: lr is not an axis of this grid'),
    ("track = 5", BASE + "track = 5\n", "grid file {path}: track=5: expected text"),
    ("an unknown tracker", BASE + "track = 'bogus'\n" + RUN, 'grid file {path}: track="bogus": unknown tracker'),
    ("unknown trackers", BASE + "track = ['bogus', 'tensorboard', 'zz']\n" + RUN,
     'grid file {path}: track=["bogus", "zz"]: unknown tracker; known: mlflow, tensorboard'),
    ("keep_checkpoints = 'x'", BASE + "keep_checkpoints = 'x'\n", "grid file {path}: keep_checkpoints='x': must be one of last, none, all"),
    ("device = 5", BASE + "device = 5\n", "grid file {path}: device=5: expected text"),
    # named by the file's key, before torch loads (a cell named it `--device (engine.device)='gpu'`)
    ("device = 'gpu'", BASE + "device = 'gpu'\n" + RUN, 'grid file {path}: device="gpu": must be auto, cpu, cuda, cuda:N or mps$'),
    ("engine = 'x'", BASE + "engine = 'x'\n", "grid file {path}: engine='x': must be one of batched, processes"),
    ("max_batch_cells = 0", BASE + "max_batch_cells = 0\n", "grid file {path}: max_batch_cells=0: must be >= 1"),
    ("max_batch_cells = 'x'", BASE + "max_batch_cells = 'x'\n", "grid file {path}: max_batch_cells='x': expected an integer"),
    ("max_batch_cells with the processes engine", BASE + "engine = 'processes'\nmax_batch_cells = 2\n" + RUN,
     "grid file {path}: max_batch_cells bounds the batched engine's batches, and engine=\"processes\" trains each cell "
     'as its own run; leave it out, or use engine = "batched"'),
    ("prune = 'sometimes'", BASE + "prune = 'sometimes'\n", "grid file {path}: prune='sometimes': must be one of none, halving"),
    ("reduction_factor = 1", BASE + "reduction_factor = 1\n", "grid file {path}: reduction_factor=1: must be >= 2"),
    ("prune without select", BASE + "prune = 'halving'\n" + RUN, 'grid file {path}: prune="halving" cuts the candidates of select; name the axes to choose, '
     'e.g. lr = [1e-3, 1e-2] under [set] and select = ["lr"]'),
    ("min_rounds without prune", BASE + "min_rounds = 2\n" + RUN, 'grid file {path}: min_rounds sets how successive halving cuts; add prune = "halving"'),
    ("reduction_factor without prune", BASE + "reduction_factor = 2\nmin_rounds = 2\n" + RUN,
     'grid file {path}: reduction_factor and min_rounds set how successive halving cuts; add prune = "halving" (with '
     'select), or leave them out'),
    ("reduction_factor = 3, its default, without prune", BASE + "reduction_factor = 3\n" + RUN,
     "grid file {path}: reduction_factor sets how successive halving cuts"),
    ("prune with track", BASE + "prune = 'halving'\nselect = ['lr']\ntrack = ['jsonl']\n[set]\nlr = [0.1, 0.01]\nrounds = 2\n",
     'grid file {path}: prune="halving" with track: '),
    ("select of one value", BASE + "select = ['lr']\n[set]\nlr = 0.1\nrounds = 1\n",
     'grid file {path}: select=["lr"]: lr has one value (0.1), so there is nothing to choose; give the values to choose '
     'from (lr = ["v1", "v2"] under [set]) or drop select'),
    ("a setting some methods lack", 'methods = ["fedavg", "fedprox"]\n' + RUN + "mu = [0.1, 1]\n",
     "grid file {path}'s [set] mu: a setting of fedprox only; fedavg has no mu. Sweep it in a grid of fedprox "
     '(methods = ["fedprox"])'),
    ("an axis the partition ignores", BASE + RUN + "alpha = [0.1, 1]\n",
     "grid file {path}'s [set] alpha=[0.1, 1]: the partition scheme iid ignores alpha, so each value would train the same "
     'cells; drop the axis, or sweep it with a scheme that reads it (partition = "dirichlet" or partition = '
     '"domain-dirichlet" under [set])'),
    # advice to write a key is a line to paste under [set] (it said "[set] method.momentum=...", "method.alpha=...")
    ("a key two settings share", 'methods = ["flesd"]\n' + RUN + "momentum = [0.5, 0.9]\n",
     "grid file {path}'s [set] momentum is ambiguous: both method and optim have a 'momentum' setting; write "
     '"method.momentum" = ... or "optim.momentum" = ... under [set]$'),
    # quoted: bare, partition.alpha is TOML's table partition, refused beside RUN's partition = "iid"
    ("a key a run option and a setting share", 'methods = ["perfedavg"]\n' + RUN + "alpha = [0.1, 0.2]\n",
     "grid file {path}'s [set] alpha is ambiguous: it is the run option partition.alpha and a setting of perfedavg "
     '(method.alpha); write "partition.alpha" = ... or "method.alpha" = ... under [set]$'),
    ("select of one value by its dotted key", BASE + "select = ['partition.alpha']\n[set]\npartition = 'dirichlet'\n"
     '"partition.alpha" = 0.1\n', 'choose from ("partition.alpha" = ["v1", "v2"] under [set]) or drop select'),
    ("select twice", BASE + "select = ['lr', 'lr']\n[set]\nlr = [0.1, 0.01]\nrounds = 1\n",
     'grid file {path}: select=["lr", "lr"]: \'lr\' and \'lr\' are one value; give each value once'),
    # the axes
    ("set = [1]", BASE + "set = [1]\n", "grid file {path}: set=[1]: expected a table"),
    ("set.lr a table", BASE + "[set]\nlr = {a = 1}\n" + RUN[6:], "grid file {path}'s [set] lr.a: unknown prefix 'lr'; use one of method., optim., head., data., partition., schedule., engine."),
    # A list in the list is one value of a setting that takes several numbers (betas); in a list of lists, refused.
    ("set.lr nested", BASE + "[set]\nlr = [[1]]\n", "grid file {path}'s [set] lr='(1)': expected a finite number"),
    ("set.lr nested twice", BASE + "[set]\nlr = [[[1]]]\n",
     "grid file {path}'s [set] lr=[[[1]]]: expected a value or a list of values"),
    ("set.lr a date", BASE + "[set]\nlr = 1979-05-27\n", "grid file {path}'s [set] lr=1979-05-27: expected a value"),
    ("a table below set", BASE + "[set.nested]\na = [[[1]]]\n", "grid file {path}'s [set] nested.a=[[[1]]]: expected a value"),
    ("set.lr = []", BASE + "[set]\nlr = []\nrounds = 1\n", "grid file {path}'s [set] lr=[]: give a value or a list of values"),
    ("set.alpha = [1.0, 1]", BASE + "[set]\nalpha = [1.0, 1]\nrounds = 1\n",
     "grid file {path}'s [set] alpha=[1.0, 1]: '1.0' and '1' are one value"),
    ("set.clients = '1_0'", BASE + "[set]\nrounds = 1\npartition = 'iid'\nclients = '1_0'\n",
     "grid file {path}'s [set] clients='1_0': expected an integer in plain digits: write 10"),
    ("set.lr twice", BASE + "[set]\nlr = ['1e-3', 0.001]\nrounds = 1\n", "grid file {path}'s [set] lr=[\"1e-3\", 0.001]: '1e-3' and '0.001' are one value"),
    ("set.lr = 'x'", BASE + "[set]\nlr = 'x'\nrounds = 1\n", "grid file {path}'s [set] lr='x': expected a finite number"),
    ("set.lr comma text", BASE + "[set]\nlr = '0.1,0.01'\nrounds = 1\n",
     "grid file {path}'s [set] lr='0.1,0.01': expected a finite number; several values are a list in a grid file: lr = [0.1, 0.01]"),
    ("set.key hyphen and underscore", BASE + "[set]\nlocal-epochs = 1\nlocal_epochs = 2\n",
     "grid file {path}'s [set] local-epochs and local_epochs are one key (local_epochs); give it once"),
    ("set.rounds = 0", BASE + "[set]\nrounds = 0\n", "grid file {path}'s [set] rounds=0: must be >= 1"),
    ("an unknown setting", BASE + "[set]\nbogus = 1\nrounds = 1\n", "grid file {path}'s [set] bogus: unknown key"),
    ("set.seed", BASE + "[set]\nseed = 1\n", "grid file {path}'s [set] seed: not an axis; seeds is a key of the grid itself: write seeds = ... at the top of the file, above [set]"),
    ("set.out", BASE + "[set]\nout = 'x'\n", "grid file {path}'s [set] out: not an axis; out is a key of the grid itself"),
    ("set.seeds", BASE + "[set]\nseeds = [1, 2]\n", "grid file {path}'s [set] seeds: not an axis; seeds is a key of the grid itself"),
    ("set.jobs", BASE + "[set]\njobs = 2\n", "grid file {path}'s [set] jobs: not an axis; jobs is a key of the grid itself"),
    ("set.select", BASE + "[set]\nselect = ['lr']\n", "grid file {path}'s [set] select: not an axis; select is a key of the grid itself"),
    ("a key twice, said as that", BASE + "jobs = 1\njobs = 2\n", "jobs is given twice (the second at line 3); give each key once"),
    # not "partition.alpha is given twice": TOML reads the dotted key as a table partition, which the text is not
    ("a dotted key beside a value of its first part", BASE + "[set]\npartition = 'dirichlet'\npartition.alpha = [0.1, 1]\n",
     'partition.alpha makes partition a table, and partition = ... gives it a value (lines 3 and 4); quote the dotted '
     'key: "partition.alpha" = ...$'),
    ("a dotted key before a value of its first part", BASE + "[set]\npartition . alpha = 1\nrounds = 1\npartition = 'iid'\n",
     'partition.alpha makes partition a table, and partition = ... gives it a value (lines 3 and 5)'),
    ("an unknown key, suggested", BASE + "keep-checkpoints = 'none'\n", "unknown key(s) keep-checkpoints (did you mean keep_checkpoints?)"),
    ("an unknown partition", BASE + "[set]\npartition = 'nope'\nrounds = 1\n", "nope"),
    ("a valid text with commas beside a bad value", BASE + "[set]\nrounds = 1\noptimizer = 'adam'\nbetas = '0.9,0.999'\nlr = -1\n",
     "grid file {path}'s [set] lr=-1: must be > 0$"),
    ("first values refused together", 'methods = ["fedavg-ssl"]\n' + RUN + 'lr = [0.1, 0.2]\nhead = "mlp"\n',
     "error: fedavg-ssl runs with the linear head only, not 'mlp'; drop grid file {path}'s [set] head (in a grid"),
    ("alpha below 0", BASE + "[set]\npartition = 'dirichlet'\nalpha = -1\nrounds = 1\n", "grid file {path}'s [set] alpha=-1.0: must be > 0"),
    # "several values are a list in a grid file: lr = [(0.1, 0.2)]": no TOML, and no more values than the file's
    ("set.lr a list in the list", BASE + "[set]\nlr = [[0.1, 0.2]]\nrounds = 1\n",
     "grid file {path}'s [set] lr='(0.1,0.2)': expected a finite number; a list inside the list is one value of several "
     "numbers (as Adam's betas); several values are written as one flat list, e.g. lr = [0.1, 0.2]$"),
    # a 5,000-character key was repeated whole: one line of 5,000 characters
    ("a very long key under set", BASE + "[set]\n" + "x" * 5000 + " = 1\n",
     "grid file {path}'s [set] " + "x" * 30 + "... (5,000 characters): unknown key. Known keys"),
    ("a very long key at the top", BASE + "y" * 3000 + " = 1\n",
     "grid file {path}: unknown key(s) " + "y" * 30 + "... (3,000 characters); known: "),
    # the command's own option: "did you mean 'head'?" under [set], a bare unknown key at the top
    ("threads at the top", BASE + "threads = 2\n",
     "grid file {path}: unknown key(s) threads (the torch threads of the fedcache command's process: give --threads N"),
    ("threads under set", BASE + "[set]\nthreads = 2\n",
     "grid file {path}'s [set] threads: not an axis; threads is the torch threads of the fedcache command's process"),
]


def test_the_table_holds_every_kind_the_issue_counted():
    assert len(CASES) >= 54 and len({c[0] for c in CASES}) == len(CASES)


def _write(tmp_path: Path, text) -> Path:
    path = tmp_path / "grid.toml"
    if text is None:
        path.mkdir()
    elif text == "MISSING":
        pass
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _command(path: Path, text, toy_store: Path, out: Path) -> list:
    """The grid command of a case: the file, and on the command line what the file does not give (a flag would
    override the file's value)."""
    given = text if isinstance(text, str) else ""
    argv = ["grid", "-c", path]
    for key, flag, value in (("store", "--store", toy_store), ("dataset", "-d", "test-toy"), ("backbones", "-b", BACKBONE),
                             ("out", "-o", out)):
        if not any(line.startswith(f"{key} ") for line in given.splitlines()):
            argv += [flag, value]
    return argv


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_malformed_grid_file_is_one_line_naming_the_key(case, toy_store, tmp_path, capsys, monkeypatch):
    _, text, expected = case
    monkeypatch.chdir(tmp_path)  # a relative path the file gives stays in the test's directory
    path, out = _write(tmp_path, text), tmp_path / "g"
    code, err = run_cli(_command(path, text, toy_store, out), capsys)
    line = one_error_line(err)
    # The file and its key, or the option the key sets (--rounds for [set] rounds), or the unknown name itself; a
    # case's text ending in $ ends the line.
    want = expected.replace("{path}", str(path))
    assert code in (1, 2) and (line.endswith(want[:-1]) if want.endswith("$") else want in line), line
    # Nothing half-made: no grid directory, not even the grid's plan of a fault found once the store is read.
    assert not out.exists()


def test_a_key_the_command_line_gives_over_the_file_is_named_by_its_flag(toy_store, tmp_path, capsys):
    """Messages name a grid file's keys as the file spells them, and a flag that replaced one as the flag."""
    path = _write(tmp_path, BASE + "min_rounds = 2\n" + RUN)
    argv = _command(path, BASE, toy_store, tmp_path / "g")
    code, err = run_cli(argv, capsys)
    assert code == 2 and f"grid file {path}: min_rounds sets how" in one_error_line(err)
    code, err = run_cli(argv + ["--min-rounds", "3"], capsys)
    line = one_error_line(err)
    assert code == 2 and line.startswith("error: --min-rounds sets how successive halving cuts; add prune = "), line
    code, err = run_cli(argv + ["--reduction-factor", "3"], capsys)  # the default, given on purpose
    assert code == 2 and f"grid file {path}: --reduction-factor and min_rounds set how" in err


def test_the_file_forms_of_command_line_values_are_taken(tmp_path):
    """One value for a list (as --seeds 7), text for a number (as --jobs 2), comma text for a list."""
    (tmp_path / "a.toml").write_text('methods = "fedavg,fedprox"\nbackbones = "b"\nseeds = 7\njobs = "2"\n'
                                     'store = "s.zarr"\ndataset = "d"\nout = "g"\n[set]\nlr = 0.1\n')
    (tmp_path / "b.toml").write_text('methods = ["fedavg", "fedprox"]\nbackbones = ["b"]\nseeds = [7]\njobs = 2\n'
                                     'store = "s.zarr"\ndataset = "d"\nout = "g"\n[set]\nlr = [0.1]\n')
    a, b = GridSpec(**load_toml(tmp_path / "a.toml")), GridSpec(**load_toml(tmp_path / "b.toml"))
    assert a == b and a.seeds == [7] and a.jobs == 2 and a.methods == ["fedavg", "fedprox"]


def test_a_grid_an_older_fedcache_started_with_unused_prune_options_resumes(toy_store, tmp_path, capsys):
    """--min-rounds without --prune, refused now, was taken before: its grid (grid.json records it) still resumes."""
    import json

    out = tmp_path / "g"
    argv = ["grid", "--store", toy_store, "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--rounds", "1",
            "--partition", "iid", "--clients", "2", "-o", out]
    assert run_cli(argv, capsys)[0] == 0
    spec = json.loads((out / "grid.json").read_text())
    (out / "grid.json").write_text(json.dumps({**spec, "min_rounds": 2}))  # as the older fedcache recorded it
    assert run_cli(argv + ["--min-rounds", "2"], capsys)[0] == 0
    code, err = run_cli(argv + ["--min-rounds", "3"], capsys)
    assert code == 2 and "--min-rounds sets how successive halving cuts" in err


def test_the_advice_to_an_ambiguous_key_pasted_under_set_is_taken(tmp_path):
    """`alpha` beside `partition = "dirichlet"` was advised as `partition.alpha = ... under [set]`: pasted, TOML
    refused the file (partition both a text and a table). Each alternative, pasted in place of alpha, is a grid."""
    from fedcache.api import grid_spec

    path, head = tmp_path / "g.toml", 'methods = "perfedavg"\n[set]\npartition = "dirichlet"\n'
    path.write_text(head + "alpha = [0.1, 1]\n")
    with pytest.raises(ConfigError, match=r"write (.*) under \[set\]$") as said:
        grid_spec(config=path, store=tmp_path, dataset="d", backbones="b", out=tmp_path / "g")
    lines = said.value.args[0].rpartition("write ")[2].removesuffix(" under [set]").split(" or ")
    for line, key in zip(lines, ["partition.alpha", "method.alpha"], strict=True):
        path.write_text(head + line.replace("...", "[0.1, 1]") + "\n")
        assert load_toml(path)["sweep"] == {"partition": "dirichlet", key: [0.1, 1]}


@pytest.mark.parametrize("text, key", [("[set]\noptim.momentum = [0.5, 0.9]\n", "optim.momentum"),
                                       ("[set.optim]\nmomentum = [0.5, 0.9]\n", "optim.momentum"),
                                       ("[set]\nmethod.mu = [0.5, 0.9]\n", "method.mu"),
                                       ("[set.method]\nmu = [0.5, 0.9]\n", "method.mu")])
def test_a_dotted_key_under_set_is_the_set_key_of_that_spelling(text, key, tmp_path):
    """TOML reads ``optim.momentum = ...`` (and a [set.optim] table) as a table: it is --set optim.momentum. The
    ``method.`` section too, though a bare ``method`` under [set] is the grid's own ``methods`` misplaced."""
    (tmp_path / "g.toml").write_text('methods = "fedprox"\nbackbones = "b"\nstore = "s.zarr"\ndataset = "d"\nout = "g"\n' + text)
    assert load_toml(tmp_path / "g.toml")["sweep"] == {key: [0.5, 0.9]}


def test_padding_around_a_key_or_a_value_under_set_is_no_part_of_it(tmp_path):
    (tmp_path / "g.toml").write_text('methods = "fedavg"\nbackbones = "b"\nstore = "s.zarr"\ndataset = "d"\nout = "g"\n'
                                     '[set]\n"lr " = ["0.1 ", " 0.01"]\n')
    assert GridSpec(**load_toml(tmp_path / "g.toml")).sweep == {"lr": ["0.1", "0.01"]}


def test_a_file_with_a_byte_order_mark_is_read(tmp_path):
    (tmp_path / "g.toml").write_bytes(b"\xef\xbb\xbf" + b'methods = "fedavg"\nseeds = 3\n')
    assert load_toml(tmp_path / "g.toml")["seeds"] == [3]


def test_the_issue_s_seeds_and_jobs_run(toy_store, tmp_path, capsys):
    (tmp_path / "g.toml").write_text(f'store = "{toy_store}"\ndataset = "test-toy"\nbackbones = "{BACKBONE}"\n'
                                     f'methods = "fedavg"\nseeds = 7\njobs = "1"\nout = "{tmp_path / "g"}"\n{RUN}')
    code, err = run_cli(["grid", "-c", tmp_path / "g.toml"], capsys)
    assert code == 0, err
    assert (tmp_path / "g" / "cells" / "fedavg__rounds=1__partition=iid__clients=2__seed=7" / "summary.json").exists()


# After "grid file PATH": its [set] key, one phrasing whatever is wrong with it ("grid file g.toml: unknown [set]
# key(s) lrr", "grid file g.toml: [set] lr.a" were others; "under [set]: [set] lr.a" said the table twice).
BAD_UNDER_SET = [("rounds = 'ten'", "'s [set] rounds='ten': expected an integer"),  # named by its key in the file
                 ("lrr = 0.1", "'s [set] lrr: unknown key (did you mean 'lr'?)"),
                 ("lr = {a = 1}", "'s [set] lr.a: unknown prefix 'lr'; use one of method., optim., head., data., "),
                 ("lr = [-0.1, 0.01]", "'s [set] lr=-0.1: must be > 0")]


@pytest.mark.parametrize("bad, said", BAD_UNDER_SET)
def test_a_bad_value_under_set_names_the_file(bad, said, toy_store, tmp_path, capsys):
    """Checked only as its cells were made, a [set] value was named as if given on the command line; then as a flag
    after the file's name (--set lr=-0.1), though the value was the file's: it is named by its key there."""
    path = tmp_path / "g.toml"
    path.write_text(BASE + f"[set]\n{bad}\nclients = 2\n")
    code, err = run_cli(_command(path, path.read_text(), toy_store, tmp_path / "g"), capsys)
    assert code in (1, 2) and f"grid file {path}{said}" in one_error_line(err)
    assert one_error_line(err).count("[set]") == 1, err
    assert not (tmp_path / "g").exists()
    # Given again on the command line, the file's value is not the one used, so not the one refused.
    if bad.startswith("lr = ["):
        code, err = run_cli(_command(path, path.read_text(), toy_store, tmp_path / "g") + ["--set", "lr=0.01",
                                                                                         "--rounds", "1"], capsys)
        assert code == 0, err


@pytest.mark.parametrize("bad, said", BAD_UNDER_SET)
def test_a_bad_value_under_set_is_named_by_the_file_s_key_in_python(bad, said, toy_store, tmp_path):
    """fedcache.grid(config=...): the value came from the file, not a sweep= the caller never passed (nor an unknown
    key of a sweep)."""
    import fedcache

    path = tmp_path / "g.toml"
    path.write_text(BASE + f"[set]\n{bad}\nclients = 2\n")
    with pytest.raises(ConfigError) as err:
        fedcache.grid(config=path, store=toy_store, dataset="test-toy", backbones=BACKBONE, out=tmp_path / "g")
    assert str(err.value).startswith(f"grid file {path}{said}") and str(err.value).count("[set]") == 1, str(err.value)
    assert not (tmp_path / "g").exists()


def test_toml_values_are_spelled_as_the_command_line_spells_them(tmp_path):
    """true names its cells as --validation does (not True); an integral number is an integer (rounds = 2.0 is
    --rounds 2, as jobs = 2.0 at the top is --jobs 2), and alpha = [0.1, 1.0] is --alpha 0.1,1."""
    (tmp_path / "g.toml").write_text('methods = "fedavg"\nbackbones = "b"\nstore = "s.zarr"\ndataset = "d"\nout = "g"\n'
                                     '[set]\nvalidation = true\nrounds = 2.0\npartition = "dirichlet"\nalpha = [0.1, 1.0]\n')
    assert GridSpec(**load_toml(tmp_path / "g.toml")).sweep == {"validation": ["true"], "rounds": ["2"], "partition": ["dirichlet"], "alpha": ["0.1", "1"]}


def test_a_grid_resumes_from_another_spelling_of_its_values(toy_store, tmp_path, capsys):
    """--set lr=1e-3 on the command line, lr = [0.001] (or lr = [1e-3], which TOML reads as 0.001) in the file:
    one grid, resumed under the folder names it started with, not refused as another grid."""
    out = tmp_path / "g"
    argv = ["grid", "--store", toy_store, "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--rounds", "1",
            "--partition", "iid", "--clients", "2", "-o", out]
    assert run_cli(argv + ["--set", "lr=1e-3"], capsys)[0] == 0
    (tmp_path / "g.toml").write_text(f'{BASE}[set]\nlr = [1e-3]\n')
    code, err = run_cli(argv + ["-c", tmp_path / "g.toml"], capsys)
    assert code == 0, err
    names = [p.name for p in (out / "cells").iterdir()]
    assert len(names) == 1 and "lr=1e-3" in names[0]


@pytest.mark.parametrize("fault", ["dataset = 'nope'\n", "select = ['lr']\n[set]\nlr = [0.1, 0.01]\n"])
def test_a_grid_refused_once_the_store_is_read_leaves_nothing(fault, toy_store, tmp_path, capsys):
    """An unknown dataset, or --select without spare rows, is found after the grid's plan is written: the plan,
    its stages' and the parents the grid made are removed with it."""
    text = f'store = "{toy_store}"\nbackbones = "{BACKBONE}"\nmethods = "fedavg"\nout = "{tmp_path / "runs" / "g"}"\n'
    text += ("" if fault.startswith("dataset") else 'dataset = "test-toy"\n') + fault
    (tmp_path / "g.toml").write_text(text + ("" if "[set]" in fault else "[set]\n") + "rounds = 1\npartition = 'iid'\nclients = 2\n")
    code, err = run_cli(["grid", "-c", tmp_path / "g.toml"], capsys)
    assert code in (1, 2) and one_error_line(err)
    assert not (tmp_path / "runs").exists()
    # A directory that held something before is not this grid's to tidy.
    (tmp_path / "runs" / "g").mkdir(parents=True)
    (tmp_path / "runs" / "g" / "notes.txt").write_text("mine")
    code, err = run_cli(["grid", "-c", tmp_path / "g.toml"], capsys)
    assert code in (1, 2) and (tmp_path / "runs" / "g" / "notes.txt").read_text() == "mine"


def test_a_grid_saved_by_an_older_fedcache_resumes_under_its_spelling(tmp_path):
    """True, 1.0 and 1e-3 in an older grid.json (its cell folders' names) against true, 1 and 0.001 now."""
    import json

    from fedcache.grids.run import in_saved_order

    out = tmp_path / "g"
    out.mkdir()
    (out / "grid.json").write_text(json.dumps({"sweep": {"lr": ["1e-3", "0.1"], "validation": ["True"], "rounds": ["1.0"]}}))
    spec = GridSpec(methods=["fedavg"], backbones=["b"], store=tmp_path / "s.zarr", dataset="d", out=out,
                    sweep={"rounds": [1.0], "validation": [True], "lr": [0.001, 0.1]})
    assert spec.sweep == {"rounds": ["1"], "validation": ["true"], "lr": ["0.001", "0.1"]}
    assert in_saved_order(spec).sweep == {"lr": ["1e-3", "0.1"], "validation": ["True"], "rounds": ["1.0"]}


def test_an_empty_grid_file_is_said_as_that(tmp_path, capsys):
    (tmp_path / "g.toml").write_text("")
    code, err = run_cli(["grid", "-c", tmp_path / "g.toml"], capsys)
    assert code == 2 and f"grid file {tmp_path / 'g.toml'} (the file is empty) gives no dataset, backbones" in one_error_line(err)


def test_a_grid_file_without_a_store_takes_fedcache_store(toy_store, tmp_path, capsys, monkeypatch):
    """As the command line does without --store (its help says so): FEDCACHE_STORE, below the file's store."""
    monkeypatch.setenv("FEDCACHE_STORE", str(toy_store))
    monkeypatch.setattr("fedcache.cli.grid.DEFAULT_STORE", toy_store)  # read at import, as the command reads it
    (tmp_path / "g.toml").write_text(f'dataset = "test-toy"\nbackbones = "{BACKBONE}"\n{BASE}out = "{tmp_path / "g"}"\n{RUN}')
    code, err = run_cli(["grid", "-c", tmp_path / "g.toml"], capsys)
    assert code == 0, err


def test_the_command_line_overrides_a_files_setting_given_under_another_name(tmp_path):
    """optim.lr in the file, --set lr on the command line: one setting, and the command line wins as it does
    under the same name (it was refused as the setting given twice)."""
    from fedcache.api import grid_spec

    (tmp_path / "g.toml").write_text(f'{BASE}backbones = "b"\nstore = "s.zarr"\ndataset = "d"\nout = "{tmp_path / "g"}"\n'
                                     '[set]\noptim.lr = [0.1, 0.2]\nlocal-epochs = 2\nrounds = 3\n')
    spec = grid_spec(tmp_path / "g.toml", settings=["lr=0.01", "local_epochs=1"])
    assert spec.sweep == {"rounds": ["3"], "lr": ["0.01"], "local_epochs": ["1"]}
    with pytest.raises(ConfigError, match="lr and optim.lr name the same setting of fedavg"):
        grid_spec(tmp_path / "g.toml", settings=["lr=0.01", "optim.lr=0.02"])


def test_the_command_line_turns_off_a_switch_a_grid_file_turns_on(tmp_path, monkeypatch):
    """--no-validation is hidden from grid's help (its column left the options' names no room in 80 columns), and
    still overrides a file's validation = true."""
    import fedcache.cli.grid as cli_grid
    from fedcache.cli import main

    seen = {}
    monkeypatch.setattr(cli_grid, "_spec_of", lambda *a: seen.update(a[-1]) or (_ for _ in ()).throw(SystemExit(0)))
    (tmp_path / "g.toml").write_text(f'{BASE}[set]\nvalidation = true\n')
    with pytest.raises(SystemExit):
        main(["grid", "-c", str(tmp_path / "g.toml"), "--no-validation"])
    assert seen["validation"] is False and "no_validation" not in seen
    assert main(["grid", "-c", str(tmp_path / "g.toml"), "--validation", "--no-validation"]) == 2


def test_two_set_keys_ending_alike_are_each_named_by_its_own_key(toy_store, tmp_path):
    """flesd has a method.momentum and an optim.momentum: as two axes of a grid file they were one name to its
    messages (keyed by the last part), so a bad one could be named as the other; before the cells and in one."""
    import fedcache
    from fedcache.wording import setting

    path = tmp_path / "g.toml"
    path.write_text('methods = ["flesd"]\n[set]\n"optim.momentum" = [0.9]\n"method.momentum" = [-1]\nclients = 2\n')
    with pytest.raises(ConfigError) as err:
        fedcache.grid(config=path, store=toy_store, dataset="test-toy", backbones=BACKBONE, out=tmp_path / "g")
    assert str(err.value).startswith(f"grid file {path}'s [set] method.momentum=-1"), str(err.value)
    fields = load_toml(path)
    with Names.of_file(path, fields).swept(fields["sweep"], fields["methods"]):  # as a cell's messages name them
        for key in ("optim.momentum", "method.momentum"):
            assert setting(key) == f"grid file {path}'s [set] {key}"


def test_advice_for_a_new_out_names_the_flag_where_the_command_line_gave_out_with_a_grid_file():
    """The file's `out = "DIR"` was advised, which the command line's --out would override again."""
    from fedcache.grids.spec import Names

    toml = Path("g.toml")
    assert Names(toml, frozenset({"methods"}), frozenset({"methods", "out"})).new_out() == "a new directory (--out DIR)"
    assert Names(toml, frozenset({"out"}), frozenset({"out"})).new_out() == 'a new directory (out = "DIR")'
    assert Names(toml, frozenset(), frozenset()).new_out() == 'a new directory (out = "DIR")'  # written where it is missing


@pytest.mark.parametrize("given", ["cli", "file"])
def test_a_grid_takes_each_value_of_a_tuple_setting_whole(given, toy_store, tmp_path, capsys):
    """Adam's betas could not be swept, nor set once: the grid split "0.9,0.999" into two values of one number each,
    and refused each as "expected 2 comma-separated values"; a grid file's [0.9, 0.999] alike."""
    import json

    out = tmp_path / "g"
    if given == "cli":
        args = ["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--rounds", "1",
                "--partition", "iid", "--clients", "2", "--set", "betas=(0.9,0.999),[0.5, 0.99]", "--out", str(out)]
    else:
        (tmp_path / "g.toml").write_text(f'store = "{toy_store}"\ndataset = "test-toy"\nbackbones = "{BACKBONE}"\n'
                                         f'{BASE}out = "{out}"\n{RUN}"optim.betas" = [[0.9, 0.999], [0.5, 0.99]]\n')
        args = ["grid", "-c", str(tmp_path / "g.toml")]
    code, err = run_cli(args, capsys)
    assert code == 0, err
    betas = sorted(json.loads((c / "config.json").read_text())["spec"]["optim"]["betas"] for c in (out / "cells").iterdir())
    assert betas == [[0.5, 0.99], [0.9, 0.999]]
    # Without brackets each number is a value of its own: the error says how to write one whole.
    code, err = run_cli(args[:-4] + ["--set", "betas=0.9,0.999", "--out", str(tmp_path / "h")] if given == "cli" else
                        ["grid", "-c", str(tmp_path / "g.toml"), "--set", "optim.betas=0.9,0.999", "--out",
                         str(tmp_path / "h")], capsys)
    assert code == 2 and "expected 2 comma-separated values (a grid takes each value whole, in brackets: (v1,v2),(v1,v2)" \
        in one_error_line(err), err


def test_an_axis_s_values_split_at_commas_outside_brackets():
    from fedcache.spec import parse_axes

    assert parse_axes(["betas=(0.9,0.999),(0.5, 0.99)", "lr=1e-3,1e-2"]) == {
        "betas": ["(0.9,0.999)", "(0.5, 0.99)"], "lr": ["1e-3", "1e-2"]}


def test_a_named_pipe_given_as_the_grid_file_is_refused_not_read(tmp_path, capsys):
    """A FIFO given as -c blocked the command for ever, its read waiting for a writer that never came."""
    import os
    import threading

    fifo = tmp_path / "g.toml"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer() -> None:  # ends each read that waits (a check that failed): the test then fails, not hangs
        while not stop.wait(0.2):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # only where a reader has it open
            except OSError:
                pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        code, err = run_cli(["grid", "-c", fifo], capsys)
    finally:
        stop.set()
        thread.join()
    assert code == 2 and one_error_line(err) == (f"error: --config {fifo} is a named pipe (FIFO); give a grid TOML "
                                                 "file (docs/getting-started.md)"), err


def test_a_number_the_command_line_spells_with_underscores_is_refused(toy_store, tmp_path, capsys):
    """Python reads 1_0 as 10: `--set clients=1_0` trained 10 clients and kept "1_0" in results.csv, table.md and
    the cells' folders, where `--set lr=1e-2`'s 1e-2 is a number to every reader of them."""
    out = tmp_path / "g"
    argv = ["grid", "--store", toy_store, "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--rounds", "1",
            "--partition", "iid", "--out", out]
    for given in (["--set", "clients=1_0"], ["--clients", "1_0"]):
        code, err = run_cli(argv + given, capsys)
        assert code == 2 and one_error_line(err) == ("error: --clients (partition.clients)='1_0': expected an integer "
                                                     "in plain digits: write 10"), err
        assert not out.exists()
