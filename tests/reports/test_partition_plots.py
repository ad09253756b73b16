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
