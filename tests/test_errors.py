"""fedcache's errors cross process boundaries (a grid's worker processes) whole."""
import pickle

import pytest

from fedcache import errors
from fedcache.federate.divergence import DivergedError


@pytest.mark.parametrize("error", [
    errors.DamagedCheckpointError("run/checkpoint.pt", "flipped bytes"),
    errors.DamagedFileError("run/metrics.jsonl", "line 3 is not JSON", "delete it"),
    errors.EntryNotFoundError("no entry", missing=("ds", "train"), found="test"),
    errors.DiskFullError("no space left on /tmp", "free some space", too_large=True),
    errors.PermissionDeniedError("cannot write in s.zarr", 13, "s.zarr"),
    errors.UnreadableEntryError("entry x is unreadable", "permission denied"),
    DivergedError("round 2, client 0: 'weight' became NaN/inf", in_round=2),  # the round, for a grid's diverged.json
    errors.UnknownOptionError(["round"], ["rounds", "seed"]),  # a cell's RunSpec is built in a grid's worker
])
def test_an_error_unpickles_as_it_was(error):
    """DamagedCheckpointError (a path and a problem) failed to unpickle: raised in a worker, it broke the pool."""
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)
    if isinstance(error, OSError):  # OSError's own fields are no attributes of the instance's dict
        assert (again.errno, again.strerror, again.filename) == (error.errno, error.strerror, error.filename)


def test_an_os_error_made_as_os_errors_are_keeps_its_fields():
    """A fedcache OSError without an __init__ of its own, made as OSError is (errno, text, file): pickled from its
    message alone, it lost them."""
    error = errors.DataNotFoundError(2, "no such file", "/data/x.png")
    again = pickle.loads(pickle.dumps(error))
    assert (again.errno, again.strerror, again.filename) == (2, "no such file", "/data/x.png")


def test_an_unknown_option_is_a_config_error_and_a_type_error_naming_the_one_meant():
    """One error for every call's unknown option (train's, grid's, report's, extract's): grid and report raised
    Python's TypeError, train ConfigError."""
    error = errors.UnknownOptionError(["seedz", "colour"], ["seeds", "out"], advice=lambda k: "")  # none: a close name
    assert isinstance(error, errors.ConfigError) and isinstance(error, TypeError)
    assert str(error) == "unknown option(s) colour, seedz (did you mean 'seeds'?); known: out, seeds"
    advised = errors.UnknownOptionError(["threads"], ["head"], advice=lambda k: " (threads: the command's own)")
    assert str(advised) == "unknown option(s) threads (threads: the command's own); known: head"
