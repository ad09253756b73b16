"""A grid's table (fedcache/grids/table.py): mean (sample std) over seeds, the best of each data setting in bold."""
from __future__ import annotations

from fedcache.grids import summary_markdown
from fedcache.table import Table


def test_table_marks_the_best_mean_of_each_data_setting():
    """Every method with each of its own settings (lr) competes inside a data setting (alpha), as in the report."""
    rows = [{"method": m, "alpha": a, "lr": lr, "seed": s, "mean_accuracy": acc + 10 * s} for m, a, lr, s, acc in
            [("a", "1", "1", s, acc) for s, acc in ((0, 50.0), (1, 50.0))] + [
             (m, a, lr, s, acc) for m, a, lr, acc in [("b", "1", "1", 60.0), ("a", "1", "2", 80.0), ("b", "1", "2", 10.0),
                                                       ("a", "5", "1", 20.0), ("b", "5", "1", 30.0), ("a", "5", "2", 25.0),
                                                       ("b", "5", "2", 28.0)] for s in (0, 1)]]
    md = summary_markdown(Table(rows))
    assert "| a | 55.00 (7.07) | **85.00 (7.07)** | 25.00 (7.07) | 30.00 (7.07) |" in md  # sample std (ddof=1) over seeds
    assert "| b | 65.00 (7.07) | 15.00 (7.07) | **35.00 (7.07)** | 33.00 (7.07) |" in md  # one best per alpha, not per lr
    assert md.startswith("mean accuracy % (each run's mean over clients of their accuracy at its last evaluation), "
                         "mean (sample std, ddof=1) over seeds")  # read without summary.json beside it
    assert md.endswith("\n\nIn bold: the highest mean of each alpha, among the results whose every seed ran to the end.")


def test_a_lone_result_has_no_best():
    rows = [{"method": "a", "alpha": a, "seed": 0, "mean_accuracy": acc} for a, acc in [("1", 50.0), ("2", 60.0)]]
    rows += [{"method": "b", "alpha": "1", "seed": 0, "mean_accuracy": 40.0}]
    md = summary_markdown(Table(rows))
    assert "| a | **50.00 (one seed)** | 60.00 (one seed) |" in md  # alpha=2: a alone, nothing to beat
    assert "| b | 40.00 (one seed) | - |" in md
    assert "**" not in summary_markdown(Table(rows[:1]))
    assert "In bold" not in summary_markdown(Table(rows[:1]))  # nothing bold, nothing to explain


def test_seeds_that_diverged_are_named_and_never_the_best():
    """A mean over the seeds that did not diverge would pass for all of them (and was bold as the best)."""
    rows = [{"method": m, "lr": lr, "seed": s, "mean_accuracy": acc, "diverged": acc is None} for m, lr, s, acc in
            [("a", "1", 0, 90.0), ("a", "1", 1, None), ("b", "1", 0, 70.0), ("b", "1", 1, 72.0),
             ("a", "2", 0, None), ("a", "2", 1, None), ("b", "2", 0, 10.0), ("b", "2", 1, 20.0)]]
    md = summary_markdown(Table(rows))
    assert "| a | 90.00 (one seed), 1 of 2 seeds diverged | diverged (2 seeds) |" in md
    assert "| b | **71.00 (1.41)** | 15.00 (7.07) |" in md  # a's 90 is of one seed: neither marked nor a contender
    alone = [r for r in rows if (r["method"], r["lr"]) != ("b", "2")]  # b lr=1 against a's diverged seeds only
    # Where they diverged, where the grid recorded it (results.csv's diverged_round; an older grid kept none).
    rounds = {("a", "1", 1): 4, ("a", "2", 0): 2, ("a", "2", 1): 7}
    md = summary_markdown(Table([{**r, "diverged_round": rounds.get((r["method"], r["lr"], r["seed"]))} for r in rows]))
    assert "| a | 90.00 (one seed), 1 of 2 seeds diverged in round 4 | diverged (2 seeds in rounds 2, 7) |" in md
    assert "**" not in summary_markdown(Table(alone))


def test_a_swept_rounds_is_a_column_when_the_axes_are_known():
    """``rounds`` is also a figure's name: without the grid's axes its cells were pooled as if they were seeds."""
    rows = [{"method": "a", "rounds": r, "seed": s, "mean_accuracy": float(r + s)} for r in (3, 9) for s in (0, 1)]
    assert "| a | 3.50 (0.71) | **9.50 (0.71)** |" in summary_markdown(Table(rows), axes=["rounds"])
    assert "rounds=3" in summary_markdown(Table(rows), axes=["rounds"])


def test_a_table_names_an_option_as_typed_and_its_cell_folders_keep_their_key(tmp_path):
    """`grid --head mlp` is the axis head.name (option_axes: `head` is also a setting's name), and its cells' folders
    say so: resuming finds them by those names. The table is read by people, who typed --head: it says head=mlp.
    partition.alpha stays qualified beside perfedavg, whose own alpha a bare `alpha=1` would be read as."""
    from fedcache.api import grid_spec
    from fedcache.grids import cells
    from fedcache.grids.table import grid_caption

    spec = grid_spec(store=tmp_path, dataset="d", backbones="b", methods="fedavg,perfedavg", out=tmp_path / "g",
                     option_axes={"partition": ["dirichlet"], "head": ["mlp"], "alpha": ["1"]})
    assert "fixed: partition=dirichlet, head=mlp, partition.alpha=1;" in grid_caption(spec)
    assert all("__head.name=mlp__" in c.name for c in cells(spec))
    rows = [{"method": "fedavg", "head.name": h, "optim.lr": lr, "seed": 0, "mean_accuracy": acc}
            for h, lr, acc in [("linear", "0.1", 50.0), ("mlp", "0.01", 60.0)]]
    md = summary_markdown(Table(rows), axes=["head.name"], beside=["optim.lr"])
    assert "| method | head=linear | head=mlp |" in md and "head.name" not in md
    assert "| fedavg | 50.00 (one seed), optim.lr=0.1 | **60.00 (one seed), optim.lr=0.01** |" in md  # a setting as typed


def test_a_cells_progress_line_names_an_option_as_typed(tmp_path, caplog):
    """The log's and the progress bar's line for a finished cell said head.name=mlp, where table.md says head=mlp."""
    import logging

    from fedcache.api import grid_spec
    from fedcache.grids import _logged_cells

    spec = grid_spec(store=tmp_path, dataset="d", backbones="b", methods="fedavg", out=tmp_path / "g",
                     option_axes={"head": ["linear", "mlp"]})
    said = []
    row = {"method": "fedavg", "head.name": "mlp", "seed": 0, "mean_accuracy": 60.0}
    with caplog.at_level(logging.INFO, logger="fedcache.grids"):
        _logged_cells(spec, lambda done, total, row, text: said.append(text))(1, 2, row)
    assert said == ["fedavg head=mlp seed 0: 60.0%"] and "cell 1/2 finished: fedavg head=mlp seed 0" in caplog.text
