"""fedcache: federated learning on cached embeddings of frozen pretrained models."""
# fedcache leaves OpenMP's waiting policy to torch: no spin setting is better both on an idle machine
# and on one shared with a busy process (CHANGELOG.md, "Measurements and investigations").

__version__ = "0.1.0"

# The Python API (fedcache/api.py), imported on first use so `import fedcache` stays cheap (no torch).
# (`fedcache.extract` is the extract package: a function of that name would be shadowed by it as soon as
# any of its modules is imported, hence `extract_features`.)
_API = ("extract_features", "train", "grid", "report", "TrainResult", "Table")


def __getattr__(name: str):
    if name in _API:
        from fedcache import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedcache' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))
