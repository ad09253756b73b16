"""The partition charts' titles say the settings the partition ran with."""
from __future__ import annotations

from types import SimpleNamespace

from fedcache.federate.partitions import PartitionRequest
from fedcache.reports.partition_plots import _title


def title(scheme: str, n_domains: int = 1, seed: int = 0, **options) -> str:
    request = PartitionRequest.of(scheme, 5, seed=seed, **options)
    return _title(SimpleNamespace(request=request, n_clients=5), n_domains)


def test_a_default_alpha_is_in_the_title_and_inert_settings_are_not():
    """alpha 0.5 (the default) is stored as null: the chart of a Dirichlet partition said no alpha at all, while a
    domain partition's said subsample=1.0."""
    assert title("dirichlet", subsample=0.8) == "dirichlet partition, 5 clients, seed 0 (alpha=0.5, subsample=0.8)"
    assert title("dirichlet", alpha=0.1) == "dirichlet partition, 5 clients, seed 0 (alpha=0.1)"
    domain = title("domain", n_domains=5, few_shot=10, seed=1)
    assert domain.startswith("domain partition, 5 clients, seed 1 (") and "few_shot=10" in domain
    assert "subsample" not in domain and "alpha" not in domain


def _ink_in_plot(path) -> int:
    """Pixels darker than the grid lines (0.92 grey) in the middle of the figure, where the plot area is."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(path)[..., :3]
    h, w = img.shape[:2]
    middle = img[h // 4: 3 * h // 4, w // 5: 3 * w // 5]
    return int((middle.mean(-1) < 0.85).sum())


import pytest  # noqa: E402


@pytest.mark.parametrize("clients, classes_each", [(10, 100), (1000, 100), pytest.param(5000, 2, marks=pytest.mark.slow)])
def test_who_holds_which_classes_shows_at_any_number_of_clients(tmp_path, clients, classes_each):
    """From 300 clients the bubbles were too small to draw: the figure was an empty grid. Then the heatmap's
    drawing averaged clients into pixels, and 5,000 clients of 2 classes each faded to white."""
    import numpy as np

    from fedcache.federate.partitions import Partition
    from fedcache.reports.partition_plots import plot_partition

    rng = np.random.default_rng(0)
    held = [rng.choice(100, classes_each, replace=False) for _ in range(clients)]
    labels = np.concatenate([rng.choice(h, 20) for h in held])
    rows = np.array_split(np.arange(len(labels)), clients)
    part = Partition(PartitionRequest.of("iid", clients), rows, [r[:1] for r in rows])
    bubbles, _ = plot_partition(part, labels, [f"class {i}" for i in range(100)], tmp_path / "p")
    assert _ink_in_plot(bubbles) > 2000


def _charts(tmp_path, monkeypatch, request: PartitionRequest, n_classes: int = 10, n_domains: int = 5, rows: int = 10):
    """The two charts' figures of a partition of ``request`` (each client ``rows`` rows of every class, its domain's)."""
    import numpy as np

    from fedcache.federate.partitions import Partition
    from fedcache.reports import partition_plots

    figures, save = [], partition_plots._saved
    monkeypatch.setattr(partition_plots, "_saved", lambda fig, path: figures.append(fig) or save(fig, path))
    n = request.n_clients
    labels = np.tile(np.arange(n_classes), n * rows)
    domains = np.repeat(np.arange(n) % n_domains, n_classes * rows)
    clients = np.array_split(np.arange(len(labels)), n)
    part = Partition(request, clients, [c[:1] for c in clients])
    paths = partition_plots.plot_partition(part, labels, [f"c{i}" for i in range(n_classes)], tmp_path / "p", domains,
                                           [f"d{i}" for i in range(n_domains)])
    return figures, paths


def test_a_long_title_is_wrapped_inside_the_figure(tmp_path, monkeypatch):
    """A domain-dirichlet partition's title (its alpha, class budget and clients per domain) was one line wider than
    the figure, cut at both edges: `omain-dirichlet partition, ... clients_per_domain=`."""
    request = PartitionRequest.of("domain-dirichlet", 20, alpha=1.0, class_budget=10, clients_per_domain=4)
    figures, _ = _charts(tmp_path, monkeypatch, request)
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        title = fig.axes[0].title
        box, page = title.get_window_extent(renderer), fig.bbox
        assert "clients_per_domain=4" in title.get_text()
        assert page.x0 <= box.x0 and box.x1 <= page.x1, (box, page)


def test_the_size_legend_says_one_row(tmp_path, monkeypatch):
    """The bubbles' legend said `1 rows` for the smallest reference bubble."""
    figures, _ = _charts(tmp_path, monkeypatch, PartitionRequest.of("iid", 5), rows=10)
    legend = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert legend == ["10 rows", "5 rows", "1 row"]


def test_a_chart_stopped_while_it_is_saved_leaves_the_last_one_whole(tmp_path, monkeypatch):
    """The PNG was written in place: a Ctrl-C (or a kill) while it was saved left a part of one at its name, over the
    last chart, and a viewer or a report took it for the chart."""
    from pathlib import Path

    from matplotlib.figure import Figure

    from tests.faults import leftovers

    request = PartitionRequest.of("iid", 5)
    _, paths = _charts(tmp_path, monkeypatch, request)
    before = {p: p.read_bytes() for p in paths}

    def torn(self, target, **kwargs):
        data = b"\x89PNG\r\n\x1a\n a part of a chart"
        target.write(data) if hasattr(target, "write") else Path(target).write_bytes(data)
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", torn)
    with pytest.raises(KeyboardInterrupt):
        _charts(tmp_path, monkeypatch, request)
    assert {p: p.read_bytes() for p in paths} == before and leftovers(tmp_path) == []
