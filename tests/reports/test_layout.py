"""How a report lays out many groups: labels name only what varies, no two labels look alike, one panel per
data setting, the best of each panel marked once."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedcache.reports import summary_rows
from fedcache.reports.layout import MAX_LABEL, Layout
from fedcache.reports.runs import Group, Run


def groups(methods, alphas=("0.1", "1"), lrs=("0.001", "0.01")) -> list[Group]:
    out = []
    for i, m in enumerate(methods):
        for a in alphas:
            for lr in lrs:
                setting = {"partition": "dirichlet", "rounds": "20", "alpha": a, "lr": lr}
                runs = [Run(Path(f"{m}-{a}-{lr}-{s}"), {"method": m, "mean_accuracy": 50.0 + i + float(lr) * 100 + s},
                            [], {}, setting) for s in (0, 1)]
                out.append(Group(runs[0].label, runs))
    return out


def test_labels_name_only_what_varies_inside_a_panel():
    gs = groups(["fedavg", "fedprox", "fedproto"])
    layout = Layout.of(gs)
    assert layout.fixed == {"partition": "dirichlet", "rounds": "20"}
    assert layout.panel_keys == ("alpha",) and layout.legend_keys == ("lr",)
    assert {layout.label(g) for g in gs} == {f"{m} lr={lr}" for m in ("fedavg", "fedprox", "fedproto") for lr in ("0.001", "0.01")}
    assert "fixed: partition=dirichlet, rounds=20" in layout.caption() and "one panel per alpha" in layout.caption()


def test_no_two_labels_share_a_look_past_the_palette():
    """22 methods x 2 lr: more methods than tab20 has colours (two share each of the first two), two looks each."""
    gs = groups([f"method-{i:02d}" for i in range(22)])
    layout = Layout.of(gs)
    styles = layout.styles(gs)
    assert len(styles) == 44 and len(set(styles.values())) == 44
    assert all(len(label) <= MAX_LABEL for label in styles)
    # One method keeps one colour in every panel; its own settings change the line, not the colour.
    by_method = {}
    for g in gs:
        by_method.setdefault(g.method, set()).add(styles[layout.label(g)].color)
    assert all(len(c) == 1 for c in by_method.values())


def test_the_best_of_each_panel_is_bold_once():
    gs = groups(["fedavg", "fedprox"])
    rows = summary_rows(gs, Layout.of(gs))
    header, body = rows[0], rows[1:]
    acc = next(i for i, h in enumerate(header) if h.endswith("accuracy %"))
    alpha = header.index("alpha")
    for a in ("0.1", "1"):
        bold = [r for r in body if r[alpha] == a and r[acc].startswith("**")]
        assert len(bold) == 1 and bold[0][0] == "fedprox" and bold[0][header.index("lr")] == "0.01"


def test_table_md_and_the_reports_table_mark_the_same_best():
    """table.md bolded the best of each column (a data setting and one lr), the report the best of each panel (the
    data setting): for the same numbers a reader saw two bests of alpha=0.1 in one and one in the other."""
    from fedcache.grids import summary_markdown
    from fedcache.reports.runs import group_runs
    from fedcache.table import Table

    means = {("fedavg", "0.1", "0.001"): 60.0, ("fedavg", "0.1", "0.01"): 50.0, ("fedprox", "0.1", "0.001"): 55.0,
             ("fedprox", "0.1", "0.01"): 58.0, ("fedavg", "1", "0.001"): 70.0, ("fedavg", "1", "0.01"): 72.0,
             ("fedprox", "1", "0.001"): 65.0, ("fedprox", "1", "0.01"): 99.0}  # fedprox's 99: 1 of 2 seeds diverged
    records, runs = [], []
    for (m, a, lr), mean in means.items():
        for s in (0, 1):
            acc = None if mean == 99.0 and s else mean + (s - 0.5)
            records.append({"method": m, "alpha": a, "lr": lr, "seed": s, "mean_accuracy": acc, "diverged": acc is None})
            summary = {"method": m, "mean_accuracy": acc} if acc is not None else {"method": m, "diverged": True}
            runs.append(Run(Path(f"{m}-{a}-{lr}-{s}"), summary, [], {}, {"alpha": a, "lr": lr}))
    md = summary_markdown(Table(records), axes=["alpha", "lr"]).splitlines()
    columns = md[2].strip("| ").split(" | ")[1:]
    in_table = {(row.strip("| ").split(" | ")[0], col) for row in md[4:]
                for col, cell in zip(columns, row.strip("| ").split(" | ")[1:]) if cell.startswith("**")}
    gs = group_runs(runs)
    rows = summary_rows(gs, Layout.of(gs))
    header, body = rows[0], rows[1:]
    acc, alpha, lr = next(i for i, h in enumerate(header) if h.endswith("accuracy %")), header.index("alpha"), header.index("lr")
    in_report = {(r[0], f"alpha={r[alpha]}, lr={r[lr]}") for r in body if r[acc].startswith("**")}
    assert in_table == in_report == {("fedavg", "alpha=0.1, lr=0.001"), ("fedavg", "alpha=1, lr=0.01")}


def test_long_labels_stay_distinct():
    """Four settings of one method vary: each label is longer than MAX_LABEL. Cut short, the groups that differ
    only past the cut shared a label, a line style and a legend entry; wrapped, each keeps its own."""
    runs = [Run(Path(f"r{i}"), {"method": "fedprox", "mean_accuracy": 50.0},
                [], {}, {"lr": lr, "mu": mu, "local_epochs": e, "batch_size": bs})
            for i, (lr, mu, e, bs) in enumerate([(lr, mu, e, bs) for lr in ("0.001", "0.01") for mu in ("0.01", "0.1")
                                                  for e in ("1", "5") for bs in ("32", "64")])]
    gs = [Group(r.label, [r]) for r in runs]
    layout = Layout.of(gs)
    labels = [layout.label(g) for g in gs]
    assert len(set(labels)) == len(gs) == 16
    assert len(set(layout.styles(gs).values())) == 16
    assert all(len(line) <= MAX_LABEL for label in labels for line in label.splitlines())
    assert all("batch_size=" in label for label in labels)  # nothing is cut off


def test_bands_and_error_bars_are_the_sample_std_over_seeds():
    """The curves' band and the bars' error bar: mean +- sample std (ddof=1) over seeds, on the rounds every seed
    evaluated (a seed that skipped round 2 leaves it out)."""
    runs = [Run(Path(f"s{s}"), {"method": "fedavg", "mean_accuracy": final}, history, {}, {})
            for s, (final, history) in enumerate([
                (60.0, [{"round": 1, "accuracy": 40.0}, {"round": 2, "accuracy": 50.0}, {"round": 3, "accuracy": 60.0}]),
                (70.0, [{"round": 1, "accuracy": 50.0}, {"round": 3, "accuracy": 70.0}])])]
    g = Group("fedavg", runs)
    rounds, mean, std = g.band("accuracy")
    assert rounds.tolist() == [1, 3] and mean.tolist() == [45.0, 65.0]
    assert std.tolist() == pytest.approx([7.0710678, 7.0710678])
    assert g.std("mean_accuracy") == pytest.approx(7.0710678) and g.mean("mean_accuracy") == 65.0


def test_a_line_style_means_one_setting_and_panels_go_in_numeric_order():
    """Runs as a --select grid's directories sort them: fedavg's lrs in one order, fedproto's in the other, and
    alpha=10 before alpha=2 as text. Each lr keeps one look across methods; panels and rows follow the values."""
    order = [("fedavg", "2", "0.01"), ("fedavg", "2", "0.001"), ("fedproto", "10", "0.001"), ("fedproto", "0.1", "0.01"),
             ("fedavg", "0.1", "0.001"), ("fedproto", "2", "0.01"), ("fedproto", "2", "0.001"), ("fedavg", "10", "0.01")]
    gs = [Group(m, [Run(Path(f"{m}{a}{lr}"), {"method": m, "mean_accuracy": 50.0}, [], {}, {"lr": lr, "alpha": a})])
          for m, a, lr in order]
    layout = Layout.of(gs)
    styles = layout.styles(gs)
    for lr in ("0.01", "0.001"):
        looks = {(styles[layout.label(g)].linestyle, styles[layout.label(g)].marker) for g in gs if g.setting["lr"] == lr}
        assert len(looks) == 1, (lr, looks)
    assert len(set(styles.values())) == 4  # 2 methods x 2 lr, no two alike
    ordered = layout.ordered(gs)
    assert [g.setting["alpha"] for g in ordered] == ["0.1", "0.1", "2", "2", "2", "2", "10", "10"]
    assert [(g.method, g.setting["lr"]) for g in ordered if g.setting["alpha"] == "2"] == [
        ("fedavg", "0.001"), ("fedavg", "0.01"), ("fedproto", "0.001"), ("fedproto", "0.01")]


def test_bytes_down_keeps_its_label_s_line_style():
    """Down was always dotted, which is also the third own setting's "up" style: up and down of one label share
    its style and colour, down drawn faint."""
    from fedcache.reports import figures
    from fedcache.reports.canvas import subplots

    lines = [{"round": r, "bytes_up": 100 * r, "bytes_down": 50 * r} for r in (1, 2, 3)]
    gs = [Group(f"fedavg lr={lr}", [Run(Path(lr), {"method": "fedavg"}, lines, {}, {"lr": lr})]) for lr in ("0.1", "0.01", "0.001")]
    layout = Layout.of(gs)
    fig, ax = subplots(figures.PANEL_SIZE)
    figures._bytes(ax, gs, layout, layout.styles(gs))
    drawn = ax.get_lines()
    assert len(drawn) == 6 and ":" in {line.get_linestyle() for line in drawn}  # one label's own style is dotted
    for up, down in zip(drawn[::2], drawn[1::2]):
        assert up.get_linestyle() == down.get_linestyle() and up.get_color() == down.get_color()
        assert down.get_alpha() < up.get_alpha() and down.get_label().startswith("_")  # no legend entry


def test_a_group_with_diverged_seeds_says_so_and_is_not_the_best():
    from fedcache.reports import _fmt
    from fedcache.reports.runs import group_runs

    runs = [Run(Path(f"{m}-{s}"), {"method": m, "mean_accuracy": acc, "bytes_up": s + 1} if acc is not None
                else {"method": m, "diverged": True}, [], {}, {"lr": "1"}) for m, s, acc in
            [("fedavg", 0, 90.0), ("fedavg", 1, None), ("fedprox", 0, 70.0), ("fedprox", 1, 70.0)]]
    gs = group_runs(runs)
    rows = summary_rows(gs, Layout.of(gs))
    header, body = rows[0], {r[0]: r for r in rows[1:]}
    acc, seeds = next(i for i, h in enumerate(header) if h.endswith("accuracy %")), header.index("seeds")
    assert body["fedavg"][acc] == "90.00 (1 of 2 seeds diverged; the mean is of the others)" and body["fedavg"][seeds] == "2"
    # A std of 0 over two seeds is shown, not dropped; not bold: the one whole result is nobody's winner (as table.md).
    assert body["fedprox"][acc] == "70.00 ± 0.00"
    assert body["fedprox"][header.index("bytes up (total)")] == "2"  # (1 + 2) / 2, rounded rather than cut
    assert _fmt(1.0) == "1.00"


def test_a_group_whose_every_seed_diverged_sends_no_number_not_zero_bytes():
    """A diverged cell has no summary: its traffic is unknown ("-"), not 0 bytes, which reads as a real figure."""
    from fedcache.reports.runs import group_runs

    runs = [Run(Path(f"{lr}-{s}"), {"method": "fedavg", "mean_accuracy": 60.0, "bytes_up": 100, "params_up_per_round": 25}
                if lr == "1" else {"method": "fedavg", "diverged": True}, [], {}, {"lr": lr}) for lr in ("1", "1e6") for s in (0, 1)]
    gs = group_runs(runs)
    header, *body = summary_rows(gs, Layout.of(gs))
    diverged = next(r for r in body if r[header.index("lr")] == "1e6")
    for column in ("params up per client/round", "params up/round", "bytes up (total)", "global %", "seconds"):
        assert diverged[header.index(column)] == "-", column
    ok = next(r for r in body if r[header.index("lr")] == "1")
    assert ok[header.index("bytes up (total)")] == "100" and ok[header.index("params up/round")] == "25"


def test_one_methods_settings_get_colours_of_their_own():
    """A --prune halving grid of one method and six lr: all six were one blue, told apart by line style alone."""
    gs = groups(["fedavg"], alphas=("1",), lrs=("1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2"))
    styles = Layout.of(gs).styles(gs)
    assert len({s.color for s in styles.values()}) == 6 and len(set(styles.values())) == 6
    two = groups(["fedavg", "fedprox"], alphas=("1",))  # several methods: still one colour per method
    assert len({s.color for s in Layout.of(two).styles(two).values()}) == 2


@pytest.mark.parametrize("methods", [["fedavg"], ["fedavg", "fedprox"]])
def test_a_label_keeps_its_look_in_a_figure_that_leaves_some_groups_out(methods):
    """The final figures leave out the candidates halving cut: each label's colour and marker were worked out again
    from the groups left, so lr=3e-3 was green in one figure and orange in the next."""
    gs = groups(methods, alphas=("1",), lrs=("1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2"))
    layout = Layout.of(gs)
    every, kept = layout.styles(gs), layout.styles(gs[2::3])
    assert kept == {label: every[label] for label in kept} and len(kept) == len(gs[2::3])


def test_the_caption_names_one_split_or_two():
    """A --select grid's report said 'evaluated on the test and validation split'."""
    def caption(on):
        return Layout(fixed={}, panel_keys=(), legend_keys=(), methods=("a",), evaluated_on=on).caption()

    assert caption("test") == "evaluated on the test split"
    assert caption("test and validation") == "evaluated on the test and validation splits"


def test_a_select_reports_accuracy_column_says_it_is_of_the_rows_split():
    """Its header said "test and validation accuracy %" above rows that are each of one split (the split column)."""
    gs = []
    for split in ("test", "validation"):
        config = {"train": {"validation": split == "validation"}}
        runs = [Run(Path(f"{split}-{s}"), {"method": "fedavg", "mean_accuracy": 50.0 + s}, [], config,
                    {"split": split, "alpha": "1"}) for s in (0, 1)]
        gs.append(Group(runs[0].label, runs))
    layout = Layout.of(gs)
    assert layout.evaluated_on == "test and validation" and layout.panel_keys == ("split",)
    header, *body = summary_rows(gs, layout)
    assert header[header.index("seeds") + 1] == "accuracy % on the row's split"
    assert [r[header.index("split")] for r in body] == ["test", "validation"]
    plain = gs[:1]  # one split, no split column: the header names it
    assert "test accuracy %" in summary_rows(plain, Layout.of(plain))[0]
