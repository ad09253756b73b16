"""What the report's figures draw, read back from the matplotlib artists (no pixels): every group is visible,
axes stay readable, legends are in the table's order."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedcache.reports import figures
from fedcache.reports.layout import Layout
from fedcache.reports.runs import Group, Run


def run(method: str, lr: str, seed: int, accs, *, stopped_at=None, loss=None, setting=None, validation=False) -> Run:
    history = [{"round": r + 1, "accuracy": a, "train_loss": (loss[r] if loss else 1.0 / (r + 1)),
                "bytes_up": 1000 * (r + 1), "bytes_down": 1000 * (r + 1)} for r, a in enumerate(accs)]
    summary = {"method": method, "mean_accuracy": accs[-1], "per_client_accuracy": [accs[-1]] * 3, "seed": seed}
    if stopped_at is not None:
        summary["stopped_at"] = stopped_at
    config = {"train": {"validation": True}} if validation else {}  # a --select grid's first stage
    return Run(Path(f"{method}-{lr}-{seed}"), summary, history, config, setting or {"rounds": "6", "lr": lr})


def group(*runs: Run) -> Group:
    return Group(runs[0].label, list(runs))


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figures the report's figure functions draw, instead of their PNG bytes."""
    figs = []
    monkeypatch.setattr(figures, "_png", lambda fig: figs.append(fig) or b"")
    return figs


def test_a_candidate_cut_after_one_round_is_drawn(drawn):
    """--prune halving cuts most candidates at the first rung: one point each, which a line without a marker
    does not draw at all (4 of a 6-candidate group were invisible)."""
    gs = [group(*(run("fedavg", lr, s, [10.0 + i], stopped_at=1) for s in (0, 1))) for i, lr in enumerate(["1e-4", "3e-4"])]
    gs.append(group(*(run("fedavg", "1e-3", s, [30.0, 40.0, 50.0, 55.0]) for s in (0, 1))))
    layout = Layout.of(gs)
    figures.accuracy_per_round(gs, layout)
    (ax,) = [a for a in drawn[0].axes if a.get_visible()]
    for g in gs[:2]:
        y = g.mean("mean_accuracy")
        points = [line for line in ax.get_lines() if list(line.get_xdata()) == [1] and list(line.get_ydata()) == [y]]
        assert any(line.get_marker() not in (None, "None", "", " ") for line in points), g.label


def test_a_long_y_label_of_a_one_row_figure_is_wrapped_to_the_panel(drawn):
    """A --select grid's 'test and validation accuracy %, mean over clients' ran past the top of a one-row figure;
    'validation accuracy %, mean over clients' is as long as the panel is tall."""
    gs = [group(*(run(m, "1e-3", s, [30.0, 40.0], validation=True) for s in (0, 1))) for m in ("fedavg", "fedprox")]
    figures.accuracy_per_round(gs, Layout.of(gs))
    ax = drawn[0].axes[0]
    lines = ax.get_ylabel().splitlines()
    assert len(lines) > 1 and all(len(line) <= figures.YLABEL_CHARS for line in lines)
    drawn[0].canvas.draw()
    label, box = ax.yaxis.label.get_window_extent(), ax.get_window_extent()
    assert label.height <= box.height, (label.height, box.height)


def _split_group(method: str, split: str, alpha: str) -> Group:
    setting = {"split": split, "alpha": alpha, "lr": "1e-3"}
    return group(*(run(method, "1e-3", s, [30.0, 40.0], setting=setting, validation=split == "validation") for s in (0, 1)))


@pytest.mark.parametrize("alphas", [["1"], ["0.1", "1"]])
def test_each_panel_of_a_select_report_says_which_split_it_shows(drawn, alphas):
    """A --select grid's report has a panel per split, each with one split's runs: every y axis read "test and
    validation accuracy %". One row: each panel says its own; a row per split: its first panel says it."""
    gs = [_split_group(m, split, a) for split in ("test", "validation") for a in alphas for m in ("fedavg", "fedprox")]
    layout = Layout.of(gs)
    figures.accuracy_per_round(gs, layout)
    figures.final_accuracy(gs, layout)
    for fig in drawn:
        said = {}
        for ax in (a for a in fig.axes if a.get_visible()):
            split = ax.get_title().split(",")[0].removeprefix("split=")
            label = ax.get_ylabel().replace("\n", " ")
            assert {"test", "validation"} - {split} & set(label.split()) == set(), (ax.get_title(), label)
            said.setdefault(split, []).append(label)
        assert not [t for t in fig.texts if "accuracy" in t.get_text()]  # no label of the whole figure, which shows both
        assert all(sum(f"{split} accuracy %" in label for label in labels) == (len(labels) if len(alphas) == 1 else 1)
                   for split, labels in said.items()), said


def test_a_diverging_settings_training_loss_does_not_flatten_the_others(drawn):
    """lr=3e4 with SGD: a finite loss of 1e7 put every other curve on 0 of a linear axis."""
    gs = [group(*(run("fedavg", "1e-1", s, [50.0, 60.0, 61.0], loss=[1.3, 1.0, 0.8]) for s in (0, 1))),
          group(*(run("fedavg", "3e4", s, [10.0, 11.0, 11.0], loss=[2e7, 2.5e7, 2.4e7]) for s in (0, 1)))]
    figures.train_loss_per_round(gs, Layout.of(gs))
    ax = drawn[0].axes[0]
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel()
    figures.train_loss_per_round(gs[:1], Layout.of(gs[:1]))  # a loss within a decade stays linear
    assert drawn[1].axes[0].get_yscale() == "linear" and "log" not in drawn[1].axes[0].get_ylabel()
    # a halving cut's vertical line (y 0..1 in axes units) is no loss of 1: small losses within a decade stay linear
    cut = [group(*(run("fedavg", lr, s, accs, loss=loss, stopped_at=stop) for s in (0, 1)))
           for lr, accs, loss, stop in (("1e-1", [50.0, 60.0, 61.0], [0.02, 0.01, 0.005], None),
                                        ("1e-2", [40.0], [0.03], 1))]
    figures.train_loss_per_round(cut, Layout.of(cut))
    assert drawn[2].axes[0].get_yscale() == "linear"


def test_a_log_scale_is_said_once_per_row_with_its_label(drawn):
    gs = [group(*(run("fedavg", lr, s, [50.0, 60.0, 61.0], loss=loss, setting={"alpha": a, "lr": lr}) for s in (0, 1)))
          for a in ("0.1", "1") for lr, loss in (("1e-1", [1.3, 1.0, 0.8]), ("3e4", [2e7, 2.5e7, 2.4e7]))]
    figures.train_loss_per_round(gs, Layout.of(gs))
    assert [ax.get_ylabel() for ax in drawn[0].axes] == ["training loss (log scale)", ""]


def test_the_legend_lists_methods_in_order_each_with_its_settings_in_order(drawn):
    """Panels saw the chosen lr first (test) and the others later (validation): the legend was in that order."""
    setting = lambda split, lr: {"split": split, "lr": lr}  # noqa: E731
    gs = [group(run("fedavg", "1e-3", 0, [40.0], setting=setting("test", "1e-3"))),
          group(run("fedprox", "1e-2", 0, [45.0], setting=setting("test", "1e-2"))),
          *(group(run(m, lr, 0, [40.0], setting=setting("validation", lr))) for m in ("fedavg", "fedprox") for lr in ("1e-3", "1e-2"))]
    layout = Layout.of(gs)
    figures.accuracy_per_round(layout.ordered(gs), layout)
    names = [t.get_text() for t in drawn[0].legends[0].get_texts()]
    assert names == ["fedavg lr=1e-3", "fedavg lr=1e-2", "fedprox lr=1e-3", "fedprox lr=1e-2"]


def test_bytes_per_round_are_read_in_units(drawn):
    """256,200 B a round was ticked 250000, 200000, ...: a reader counted zeros."""
    g = group(run("fedavg", "1e-3", 0, [40.0, 50.0]))
    g.runs[0].history = [{"round": r, "accuracy": 40.0, "bytes_up": 256_200 * r, "bytes_down": 256_200 * r} for r in (1, 2)]
    figures.bytes_per_round([g], Layout.of([g]))
    ax = drawn[0].axes[0]
    drawn[0].canvas.draw()
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert any(t.endswith(" kB") for t in ticks) and not any(t.isdigit() and len(t) > 4 for t in ticks), ticks


def test_a_boxs_median_and_mean_stand_out_on_every_methods_colour(drawn):
    """The median was tab:orange and the mean tab:green: on fedprox's orange box (and a third method's green one)
    they could not be seen."""
    from matplotlib.colors import to_rgba

    gs = [group(run(m, "1e-3", 0, [40.0 + i])) for i, m in enumerate(("fedavg", "fedprox", "fedproto"))]
    for g in gs:
        g.runs[0].summary["per_client_accuracy"] = [20.0, 35.0, 50.0, 60.0, 70.0]
    figures.client_distribution(gs, Layout.of(gs))
    ax = drawn[0].axes[0]
    boxes = {to_rgba(p.get_facecolor())[:3] for p in ax.patches}
    marks = [line for line in ax.get_lines() if len(line.get_xdata()) in (1, 2)]
    for line in marks:
        colour = to_rgba(line.get_color())[:3]
        assert colour not in boxes, line


def test_the_best_bars_star_stays_inside_its_panel_and_the_grid_behind_the_bars(drawn):
    gs = [group(*(run(m, "1e-3", s, [a + s]) for s in (0, 1))) for m, a in (("fedavg", 60.0), ("fedprox", 69.0))]
    figures.final_accuracy(gs, Layout.of(gs))
    fig = drawn[0]
    fig.canvas.draw()
    ax = fig.axes[0]
    (star,) = [t for t in ax.texts if t.get_text() == figures.BEST]
    assert star.get_window_extent().y1 <= ax.get_window_extent().y1, "the star runs past the panel's top"
    assert ax.get_axisbelow() is True


def test_a_bar_of_one_seed_has_no_error_bar(drawn):
    """Its std of 0 drew a cap on the bar, under a caption that says "One seed per bar (no error bars)"; a bar of
    two seeds keeps its own."""
    import numpy as np

    gs = [group(run("fedavg", "1e-3", 0, [60.0])), group(*(run("fedprox", "1e-3", s, [69.0 + 4 * s]) for s in (0, 1)))]
    figures.final_accuracy(gs, Layout.of(gs))
    fig = drawn[0]
    fig.canvas.draw()
    bars = next(c for c in fig.axes[0].containers if getattr(c, "errorbar", None))
    _, caps, (lines,) = bars.errorbar.lines  # caps: the bottom and top caps' markers, at each bar's x
    capped = sorted({x for cap in caps for x, y in zip(cap.get_xdata(), cap.get_ydata()) if np.isfinite(y)})
    assert capped == [1] and [len(seg) for seg in lines.get_segments()] == [0, 2], lines.get_segments()


def _pixels(png: bytes, colour, tolerance: float = 0.03) -> int:
    """How many pixels of ``png`` are ``colour`` (antialiased edges aside)."""
    import io

    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    rgb = imread(io.BytesIO(png))[..., :3]
    return int((np.abs(rgb - np.array(to_rgb(colour))).max(-1) < tolerance).sum())


@pytest.mark.parametrize("draw, same", [(figures.bytes_per_round, "fedavg up = fedprox up"),
                                        (figures.accuracy_per_round, "fedavg = fedprox")])
def test_lines_that_coincide_all_show_and_are_named(draw, same):
    """fedavg and fedprox send the same bytes: fedprox's line was drawn over fedavg's, which left a legend entry and
    no line (mu=0 makes their accuracy the same too)."""
    gs = [group(*(run(m, "1e-3", s, [30.0 + r for r in range(8)]) for s in (0, 1))) for m in ("fedavg", "fedprox")]
    gs.append(group(*(run("fedproto", "1e-3", s, [60.0 + r for r in range(8)]) for s in (0, 1))))
    for g in gs:  # down other than up (the next test has them equal); fedproto sends other bytes
        for r in g.runs:
            r.history = [{**line, "bytes_down": 2 * line["bytes_up"]} for line in r.history]
    for r in gs[2].runs:
        r.history = [{**line, "bytes_up": 300 * line["round"], "bytes_down": 600 * line["round"]} for line in r.history]
    layout = Layout.of(gs)
    blue = layout.styles(gs)["fedavg"].color
    alone = _pixels(draw(gs[:1], Layout(layout.fixed, (), (), ("fedavg",), "test")).png, blue)
    both = draw(gs, layout)
    assert _pixels(both.png, blue) > 0.3 * alone, "fedavg's line is hidden under fedprox's"
    assert same in both.note and "fedproto" not in both.note
    assert draw(gs[1:], Layout.of(gs[1:])).note == ""  # nothing coincides: nothing to say


def test_a_methods_down_line_equal_to_its_up_line_shows_and_is_named():
    """fedavg sends as many bytes down as up: its faint down line, drawn over its bold up line of the same colour,
    did not show at all (one line, where the y label promises a faint one for down)."""
    from matplotlib.colors import to_rgb

    g = group(*(run("fedavg", "1e-3", s, [30.0 + r for r in range(8)]) for s in (0, 1)))
    layout = Layout.of([g])
    blue = layout.styles([g])["fedavg"].color
    faint = tuple(0.35 * c + 0.65 for c in to_rgb(blue))  # down's alpha over the white panel
    fig = figures.bytes_per_round([g], layout)
    # A thin line's pixels are partly covered (antialiased): a looser match, which a bold line's edges do not reach.
    assert _pixels(fig.png, faint, 0.08) > 0.2 * _pixels(fig.png, blue), "fedavg's down line is hidden under its up"
    assert "fedavg up = fedavg down" in fig.note
    g.runs[0].history = g.runs[1].history = [{**line, "bytes_down": 2 * line["bytes_up"]} for line in g.runs[0].history]
    assert figures.bytes_per_round([g], layout).note == ""  # apart: both show, nothing to say
