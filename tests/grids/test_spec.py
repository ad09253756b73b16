"""A grid's specification (fedcache/grids/spec.py): its cells are the cartesian product, bad options say how to
fix them, every train option is a grid option and may be an axis, and every cell runs as the grid says (trackers,
checkpoints)."""
from __future__ import annotations

import json
import re

import pytest

from fedcache.cli import main
from fedcache.errors import ConfigError
from fedcache.grids import GridSpec, cells, load_toml
from fedcache.spec import parse_axes as parse_sweep
from fedcache.table import Table
from tests.conftest import BACKBONE


def test_cells_are_the_cartesian_product(tmp_path):
    spec = GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg", "fedprox"], out=tmp_path,
                    seeds=[0, 1, 2], sweep=parse_sweep(["lr=1e-3,1e-2", "alpha=0.1,1", "partition=dirichlet"]))
    grid = cells(spec)
    assert len(grid) == 2 * 2 * 2 * 3
    assert len({c.name for c in grid}) == len(grid)
    assert grid[0].name == "fedavg__lr=1e-3__alpha=0.1__partition=dirichlet__seed=0"


def test_bad_grid_options_say_how_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="--method"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path, sweep={"method": ["x"]})
    with pytest.raises(ConfigError, match="key=v1,v2"):
        parse_sweep(["lr"])
    bad = tmp_path / "g.toml"
    bad.write_text('dataset = "d"\nmethod = ["fedavg"]\n')
    with pytest.raises(ConfigError, match="unknown key.*method"):
        load_toml(bad)


def test_one_setting_given_under_two_names_or_twice_is_refused(tmp_path, capsys):
    """Each used to pass: two axes over one setting labelled the cells with one and trained them with the other
    (a grid file's lr beside --set optim.lr), and a value given twice dropped one without a word."""
    with pytest.raises(ConfigError, match=r"lr and optim.lr name the same setting of fedavg \(optim.lr\)"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path / "g",
                 sweep={"lr": ["0.1", "0.01"], "optim.lr": ["0.5"]})
    with pytest.raises(ConfigError, match="--set lr is given twice"):
        parse_sweep(["lr=1e-3", "lr=1e-1"])
    base = ["grid", "--store", str(tmp_path), "-d", "d", "-b", "b", "-m", "fedavg", "-o", str(tmp_path / "g")]
    assert main([*base, "--set", "rounds=6", "--rounds", "3"]) == 2
    assert "rounds is given both as --set rounds=... and as its own option" in capsys.readouterr().err
    assert main([*base, "--head", "linear,mlp", "--set", "head=linear,mlp"]) == 2  # not "head and head.name"
    assert ("--set head and --head name the same setting of fedavg (head.name); give it once"
            in capsys.readouterr().err)


def _option_names(command) -> set[str]:
    return {o for p in command.params for o in p.opts + p.secondary_opts}


def test_every_train_option_is_a_grid_option_under_the_same_name():
    import typer.main

    from fedcache.cli import GRID_SKIPS, app

    commands = typer.main.get_command(app).commands
    train, grid = commands["train"], commands["grid"]
    skipped = {o for p in train.params if p.name in GRID_SKIPS for o in p.opts + p.secondary_opts}
    assert _option_names(train) - skipped <= _option_names(grid)
    assert skipped == {"--resume", "--engine", "--overwrite", "--track-dir"}


def test_the_issue_s_grid_command_runs_with_train_options_as_axes(toy_store, tmp_path, capsys):
    out = tmp_path / "g"
    code = main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg,fedproto",
                 "--partition", "domain", "--few-shot", "5", "--rounds", "2", "--set", "lr=0.001,0.01",
                 "--seeds", "0,1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = Table.from_csv(out / "results.csv").to_records()
    assert len(rows) == 2 * 2 * 2 and {r["rounds"] for r in rows} == {2}
    md = (out / "table.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| method"))
    assert "lr=0.001" in header and "lr=0.01" in header and "rounds" not in header  # only axes label columns
    caption = md.splitlines()[0]
    assert all(f in caption for f in ("rounds=2", "partition=domain", "few_shot=5", "test-toy", "seeds 0,1"))
    # Printed as table.md holds it: a log (console 160 wide) must not wrap a long row or caption.
    printed = capsys.readouterr().out.splitlines()
    assert max(map(len, md.splitlines())) > 160 and all(line in printed for line in md.splitlines()), printed
    # Without --clients a domain partition gives one client per domain (test-toy has two).
    config = json.loads(next((out / "cells").glob("*/config.json")).read_text())
    assert config["partition"]["request"]["n_clients"] == 2


def test_a_grid_sends_each_cell_to_tensorboard(toy_store, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "g"
    assert main(["grid", "--store", str(toy_store), "-d", "test-toy", "-b", BACKBONE, "-m", "fedavg", "--partition", "iid",
                 "--clients", "2", "--rounds", "2", "--seeds", "0,1", "--track", "tensorboard", "--keep-checkpoints", "none",
                 "-o", str(out)]) == 0
    assert not list((out / "cells").glob("*/checkpoint*.pt"))  # every cell, not only a train run, keeps none
    runs = sorted(p.name for p in (out / "tensorboard").iterdir())
    assert runs == sorted(p.name for p in (out / "cells").iterdir()) and len(runs) == 2
    events = EventAccumulator(str(out / "tensorboard" / runs[0]))
    events.Reload()
    assert [e.step for e in events.Scalars("accuracy")] == [1, 2]


def test_an_axis_that_no_partition_scheme_of_the_grid_reads_is_refused(tmp_path):
    """--partition domain --alpha 0.1,1 made one cell twice, shown as a comparison of alphas."""
    def grid(**sweep):
        return GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path, sweep=sweep)

    with pytest.raises(ConfigError, match=r"^--alpha 0.1,1: the partition scheme domain ignores alpha.*"
                                          r"\(--partition dirichlet or domain-dirichlet\)"):
        grid(partition=["domain"], alpha=["0.1", "1"])
    with pytest.raises(ConfigError, match="the partition scheme iid ignores shards"):
        grid(shards=["2", "4"])  # the default scheme, iid
    grid(partition=["iid", "dirichlet"], alpha=["0.1", "1"])  # dirichlet reads it: a grid people make
    # One value is refused as train refuses it (the grid said alpha 0.1 and ran the domain split), unless a grid
    # started with it (an older fedcache's) is continued: dropping it would make it another grid.
    with pytest.raises(ConfigError, match=r"^--alpha 0.1: the partition scheme domain ignores alpha, so the cells would "
                                          r"be the same without it; drop it, or use it with a scheme that reads it"):
        grid(partition=["domain"], alpha=["0.1"])
    (tmp_path / "grid.json").write_text("{}")
    grid(partition=["domain"], alpha=["0.1"])


def test_the_scheme_advice_to_a_python_caller_is_python(tmp_path):
    """It said sweep={'partition': "'dirichlet' or 'domain-dirichlet'"}: one string, the two names quoted inside."""
    from fedcache.wording import keyword_names

    with keyword_names(), pytest.raises(ConfigError) as err:
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path,
                 sweep={"partition": ["domain"], "alpha": ["0.1", "1"]})
    assert str(err.value).endswith("with a scheme that reads it "
                                   "(sweep={'partition': 'dirichlet'} or sweep={'partition': 'domain-dirichlet'})"), err.value


def test_a_value_given_twice_is_refused(tmp_path):
    """--seeds 0,0,1 counted seed 0 twice in the table's mean; lr=1e-3,0.001 made two cells of one value."""
    def grid(seeds=(0,), **sweep):
        return GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path, seeds=list(seeds),
                        sweep=sweep)

    with pytest.raises(ConfigError, match=r"--seeds=0,0,1: '0' and '0' are one value; give each value once"):
        grid(seeds=(0, 0, 1))
    with pytest.raises(ConfigError, match=r"--set lr=1e-3,0.001: '1e-3' and '0.001' are one value"):
        grid(lr=["1e-3", "0.001"])
    grid(seeds=(0, 1), lr=["1e-3", "1e-2"], head=["linear", "mlp"])


def test_a_method_given_twice_is_refused(tmp_path):
    """-m fedavg,fedavg trained each cell twice and showed one seed's result as a mean (std 0.00) of two."""
    with pytest.raises(ConfigError, match=r"--method=fedavg,fedprox,fedavg: 'fedavg' and 'fedavg' are one value"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg", "fedprox", "fedavg"], out=tmp_path)



@pytest.mark.parametrize("given, message", [
    ({"methods": []}, r"--method=\[\]: give at least one"),
    ({"backbones": []}, r"--backbones=\[\]: give at least one"),
    ({"seeds": []}, r"--seeds=\[\]: give at least one"),
    ({"backbones": ["b", "b"]}, r"--backbones=b,b: 'b' and 'b' are one value"),
    ({"sweep": {"lr": []}}, r"--set lr=\[\]: give a value or a list of values"),
    ({"sweep": {"seed": ["1", "2"]}}, r"--set seed: not an axis; give methods with --method, seeds with --seeds"),
    # a switch takes no list on the command line (--validation true,false is an extra argument): --set it is
    ({"sweep": {"validation": ["true", "true"]}}, r"^--set validation=true,true: 'true' and 'true' are one value"),
    ({"sweep": {"alpha": ["1", "1"]}}, r"^--alpha 1,1: '1' and '1' are one value"),
    ({"engine": "processes", "max_batch_cells": 2}, r"--max-batch-cells bounds the batched engine's batches, and "
                                                    r"--engine processes trains each cell as its own run; leave it out, "
                                                    r"or use --engine batched"),
])
def test_what_the_command_line_gives_is_checked_as_a_grid_file_is_named_by_its_flags(tmp_path, given, message):
    """One check for both (grids.spec.check_lists): a grid file's messages name its keys (tests/grids/test_toml.py)."""
    fields = {"store": tmp_path, "dataset": "d", "backbones": ["b"], "methods": ["fedavg"], "out": tmp_path, **given}
    with pytest.raises(ConfigError, match=message):
        GridSpec(**fields)

def test_a_setting_axis_that_some_methods_lack_names_them(tmp_path):
    def grid(methods, **sweep):
        return GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=methods, out=tmp_path, sweep=sweep)

    with pytest.raises(ConfigError, match=r"--set mu: a setting of fedprox only; fedavg has no mu\. Sweep it in a grid "
                                          r"of fedprox \(--method fedprox\)"):
        grid(["fedavg", "fedprox"], mu=["0.01", "0.1"])
    with pytest.raises(ConfigError, match="a setting of fedprox only"):
        grid(["fedavg", "fedprox"], **{"method.mu": ["0.01", "0.1"]})
    with pytest.raises(ConfigError, match=r"--set mu: a setting of fedprox only; fedavg has no mu\. Set it in a grid "
                                          r"of fedprox \(--method fedprox\), and the others in a grid of their own "
                                          r"\(to report both together, link them into one folder"):
        grid(["fedavg", "fedprox"], mu=["0.01"])  # a fixed value: nothing is swept
    grid(["fedprox"], mu=["0.01", "0.1"])
    grid(["fedavg", "fedprox"], lr=["0.01", "0.1"])  # every method's optimizer


@pytest.mark.parametrize("methods", [["fedavg", "fedproto"], ["fedproto", "fedavg"]])
def test_a_setting_no_method_of_the_grid_has_is_said_with_the_nearest_method_s_keys(tmp_path, methods):
    """A typo of fedproto's lam in a grid of fedavg then fedproto was said with fedavg's keys and no suggestion."""
    with pytest.raises(ConfigError, match=r"^--set lamm: unknown key \(did you mean 'lam'\?\)\. No method of the grid "
                                          r"has it; known keys of fedproto -- method: lam, "):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=methods, out=tmp_path, sweep={"lamm": ["1"]})


def test_select_of_one_value_and_an_empty_value_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"--select=lr: lr has one value \(1e-3\), so there is nothing to choose"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path, sweep={"lr": ["1e-3"]},
                 select=["lr"])
    with pytest.raises(ConfigError, match=r"--set lr=1e-3,,1e-2: an empty value between commas; write lr=v1,v2"):
        parse_sweep(["lr=1e-3,,1e-2"])
    assert parse_sweep(["lr=1e-3, 1e-2"]) == {"lr": ["1e-3", "1e-2"]}
    with pytest.raises(ConfigError, match=r"^--set lr='1e-3,1e-2,momentum=0.5,0.9' holds 2 pairs; give each its own: "
                                          r"--set lr=1e-3,1e-2 --set momentum=0.5,0.9$"):
        parse_sweep(["lr=1e-3,1e-2,momentum=0.5,0.9"])  # an axis lr of the values 1e-3, 1e-2, 'momentum=0.5', 0.9


def test_select_names_an_axis_by_its_short_name_where_one_axis_has_it(tmp_path):
    """grid -m fedavg,perfedavg --alpha 0.1,1 makes the axis partition.alpha (perfedavg has an alpha of its own):
    --select alpha, the name the user typed, is that axis; where two axes end in it, it is refused naming both."""
    def grid(sweep, select):
        return GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg", "perfedavg"], out=tmp_path,
                        sweep={"partition": ["dirichlet"], **sweep, "subsample": ["0.8"]}, select=select)

    assert grid({"partition.alpha": ["0.1", "1"]}, ["alpha"]).select == ["partition.alpha"]
    with pytest.raises(ConfigError, match="--select=alpha: alpha could be partition.alpha or method.alpha; select one"):
        grid({"partition.alpha": ["0.1", "1"], "method.alpha": ["0.01", "0.1"]}, ["alpha"])
    with pytest.raises(ConfigError, match="--select=alpha,partition.alpha: .* are one value"):
        grid({"partition.alpha": ["0.1", "1"]}, ["alpha", "partition.alpha"])


def test_select_names_an_option_axis_by_its_flag_s_name(tmp_path):
    """`grid --head linear,mlp --select head` was refused (axes: head.name): option_axes qualifies --head's axis, and
    head is not the last part of head.name. The name the user typed for the axis is that axis."""
    from fedcache.api import grid_spec

    spec = grid_spec(store=tmp_path, dataset="d", backbones="b", methods="fedavg", out=tmp_path / "g", select=["head"],
                     option_axes={"head": ["linear", "mlp"]})
    assert list(spec.sweep) == ["head.name"] and spec.select == ["head.name"]


def test_a_select_name_two_axes_end_with_names_both(tmp_path):
    """`-m fedavg,perfedavg --alpha 0.1,1 --set method.alpha=0.2,0.3 --select alpha` said `alpha is not an axis of
    this grid (axes: method.alpha, partition.alpha)`: it is both axes' last part. Each form advises its own line."""
    from fedcache.api import grid, grid_spec

    common = dict(store=tmp_path, dataset="d", backbones="b", methods="fedavg,perfedavg", out=tmp_path / "g")
    both = "alpha could be method.alpha or partition.alpha; select one by its full name, e.g. "
    with pytest.raises(ConfigError, match=rf"^--select=alpha: {both}--select method.alpha$"):
        grid_spec(option_axes={"partition": ["dirichlet"], "alpha": ["0.1", "1"]}, settings=["method.alpha=0.2,0.3"],
                  select=["alpha"], **common)
    with pytest.raises(ConfigError, match=rf"^--select=alpha: {both}--select partition.alpha$"):  # the one axis
        grid_spec(option_axes={"partition": ["dirichlet"], "alpha": ["0.1", "1"]}, settings=["method.alpha=0.2"],
                  select=["alpha"], **common)
    with pytest.raises(ConfigError, match=rf"^select=\['alpha'\]: {both}select=\['method.alpha'\]$"):
        grid(sweep={"partition": "dirichlet", "method.alpha": [0.2, 0.3], "partition.alpha": [0.1, 1]},
             select=["alpha"], **common)
    path = tmp_path / "g.toml"
    path.write_text('select = ["alpha"]\n[set]\npartition = "dirichlet"\n"method.alpha" = [0.2, 0.3]\n'
                    '"partition.alpha" = [0.1, 1]\n')
    with pytest.raises(ConfigError, match=rf'^grid file {re.escape(str(path))}: select=\["alpha"\]: {both}'
                                          r'select = \["method.alpha"\]$'):
        grid_spec(config=path, **common)


def test_a_qualified_option_axis_is_named_as_its_user_gave_it(tmp_path):
    """`-m fedavg,perfedavg --partition iid --alpha 1` was refused as `--set partition.alpha=1`, a flag no one typed
    (option_axes qualified --alpha beside perfedavg's alpha); --set, a grid file and the API keep their own key."""
    from fedcache.api import grid, grid_spec

    common = dict(store=tmp_path, dataset="d", backbones="b", methods="fedavg,perfedavg", out=tmp_path / "g")
    ignores = "the partition scheme iid ignores alpha"
    with pytest.raises(ConfigError, match=rf"^--alpha 1: {ignores}"):
        grid_spec(option_axes={"partition": ["iid"], "alpha": ["1"]}, **common)
    with pytest.raises(ConfigError, match=r"^--head mlp,mlp: 'mlp' and 'mlp' are one value"):  # head.name, also so
        grid_spec(option_axes={"head": ["mlp", "mlp"]}, **common)
    with pytest.raises(ConfigError, match=rf"^--set partition.alpha=1: {ignores}"):
        grid_spec(option_axes={"partition": ["iid"]}, settings=["partition.alpha=1"], **common)
    with pytest.raises(ConfigError, match=rf"^sweep\['partition.alpha'\]=\[1\]: {ignores}"):
        grid(sweep={"partition": "iid", "partition.alpha": 1}, **common)
    with pytest.raises(ConfigError, match=r"^sweep\['head'\]=\['mlp', 'mlp'\]: 'mlp' and 'mlp' are one value"):
        grid(sweep={"head": ["mlp", "mlp"]}, **common)  # texts quoted, numbers not: as the call wrote them
    path = tmp_path / "g.toml"
    path.write_text('[set]\npartition = "iid"\n"partition.alpha" = 1\n')  # quoted: partition is no table
    # the file's one value as it wrote it, not as a list
    with pytest.raises(ConfigError, match=rf"^grid file {re.escape(str(path))}'s \[set\] partition.alpha=1: {ignores}"):
        grid_spec(config=path, **common)


def test_select_of_no_axis_lists_only_the_axes(tmp_path):
    """`--rounds 2 --set lr=0.1,0.01 --select mu` listed rounds among the axes: a key of one value is fixed."""
    with pytest.raises(ConfigError, match=r"mu is not an axis of this grid \(axes: lr\); give the values"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path,
                 sweep={"rounds": ["2"], "lr": ["0.1", "0.01"]}, select=["mu"])
    # A typo in the axis's key (checked later, with the methods' settings) was not named: the axis listed was all.
    with pytest.raises(ConfigError, match=r"lr is not an axis of this grid \(axes: lrr; is the axis lrr a typo of "
                                          r"lr\?\); give the values"):
        GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path,
                 sweep={"lrr": ["0.1", "0.01"]}, select=["lr"])


def test_the_axis_checks_leave_ambiguous_keys_to_routing(tmp_path):
    """perfedavg's own alpha, optim.momentum beside flesd's momentum: the grid's new checks told these users the wrong
    thing (a partition scheme that ignores alpha; a setting fedavg lacks); the cells say the key is ambiguous."""
    from fedcache.grids import train_config

    def grid(methods, **sweep):
        return GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=methods, out=tmp_path, sweep=sweep)

    for g in (grid(["perfedavg"], alpha=["0.01", "0.1"]), grid(["flesd", "fedavg"], momentum=["0.9", "0.99"])):
        with pytest.raises(ConfigError, match="is ambiguous"):
            for c in cells(g):
                train_config(g, c, None)


def test_large_whole_numbers_are_not_one_value(tmp_path):
    GridSpec(store=tmp_path, dataset="d", backbones=["b"], methods=["fedavg"], out=tmp_path,
             seeds=[2**53, 2**53 + 1])  # one float, two seeds
