"""fedcache: federated learning on cached embeddings of frozen pretrained models."""
import os as _os

# The heads fedcache trains are small: each OpenMP parallel region lasts microseconds. torch's
# OpenMP threads spin for a long time between regions by default; when another busy process shares
# the cores (a grid job, a data loader, anything) they spin against it and training collapses (a
# fedpcl run went from 2.4 s to 18.6 s on 2 cores). Sleeping at once (OMP_WAIT_POLICY=PASSIVE)
# fixes that but doubles idle run times; a short spin keeps most of both (docs/performance.md).
# It only takes effect if fedcache is imported before torch, and values the user set are kept.
if "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ.setdefault("GOMP_SPINCOUNT", "10000")

__version__ = "0.1.0"

# The Python API (fedcache/api.py), imported on first use so `import fedcache` stays cheap (no torch).
# `fedcache.extract` is the extract package itself, made callable (fedcache/extract/__init__.py).
_API = ("train", "grid", "report", "TrainResult", "Table")


def __getattr__(name: str):
    if name == "extract":
        import importlib

        return importlib.import_module("fedcache.extract")
    if name in _API:
        from fedcache import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedcache' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + ["extract", *_API])
