"""What every benchmark records beside its numbers, and how it writes them."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def meta() -> dict:
    """The machine facts that change timings: torch build and threads, cores, OMP setting, when."""
    import torch

    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "python": platform.python_version(),
            "load_average_at_end": round(os.getloadavg()[0], 2), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}


def earlier_metas(earlier: dict, cases: list[str]) -> dict[str, dict | None]:
    """The meta of the run that measured each of ``cases`` in ``earlier``, a result file that a run of some cases
    (``--only``) updates: its ``meta_of_case`` where it kept the case from a run before it, else its ``meta``."""
    return {c: (earlier.get("meta_of_case") or {}).get(c, earlier.get("meta")) for c in cases}


def write(res: dict, out: Path) -> None:
    res["meta"] = meta()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


def features(store: Path, data: tuple[str, str]) -> None:
    """A benchmark's features (dataset, backbone): extracted into ``store`` the first time, read from it after (a
    copied store is used as it is, on a machine that cannot load the backbone)."""
    import fedcache

    if not stored(store, data):
        fedcache.extract_features(data[0], [data[1]], store=store)


def stored(store: Path, data: tuple[str, str]) -> bool:
    """Whether ``store`` holds test features of (dataset, backbone)."""
    from fedcache.errors import EntryNotFoundError
    from fedcache.store.feature_store import FeatureStore

    if not store.exists():
        return False
    try:
        return bool(FeatureStore(store, create=False).find(data[0], "test", data[1]))
    except EntryNotFoundError:  # the store has other features
        return False
