"""fedcache's errors cross process boundaries (a grid's worker processes) whole."""
import pickle

import pytest

from fedcache import errors


@pytest.mark.parametrize("error", [
    errors.DamagedCheckpointError("run/checkpoint.pt", "flipped bytes"),
    errors.DamagedFileError("run/metrics.jsonl", "line 3 is not JSON", "delete it"),
    errors.EntryNotFoundError("no entry", missing=("ds", "train"), found="test"),
    errors.DiskFullError("no space left on /tmp", "free some space", too_large=True),
    errors.PermissionDeniedError("cannot write in s.zarr", 13, "s.zarr"),
    errors.UnreadableEntryError("entry x is unreadable", "permission denied"),
])
def test_an_error_unpickles_as_it_was(error):
    """DamagedCheckpointError (a path and a problem) failed to unpickle: raised in a worker, it broke the pool."""
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error) and again.args == error.args
    assert {k: v for k, v in vars(again).items()} == vars(error)
