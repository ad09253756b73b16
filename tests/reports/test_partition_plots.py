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
