"""fedcache/borrowed.py: what a dependency changes in the caller's process is put back, through public APIs."""
from __future__ import annotations

import multiprocessing
import signal

import pytest

from fedcache.borrowed import handler_kept, start_method_unset


@pytest.fixture
def start_method():
    """This process's start method, unset for the test and put back after it."""
    was = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(None, force=True)
    yield
    multiprocessing.set_start_method(was, force=True)


def test_an_unset_start_method_is_unset_again(start_method):
    with start_method_unset():
        multiprocessing.Lock()  # what numcodecs and a DataLoader do: the default context, fixed by its first use
        assert multiprocessing.get_start_method(allow_none=True) is not None
    assert multiprocessing.get_start_method(allow_none=True) is None


def test_a_start_method_the_caller_set_stays(start_method):
    multiprocessing.set_start_method("spawn")
    with start_method_unset():
        multiprocessing.Lock()
    assert multiprocessing.get_start_method(allow_none=True) == "spawn"


def test_a_start_method_another_thread_chose_in_the_block_stays(start_method):
    """The block ends by unsetting the method: one that another thread of the caller chose meanwhile (other than
    the default, which a first use fixes anyway) was unset with it."""
    if len(multiprocessing.get_all_start_methods()) < 2:
        pytest.skip("one start method here")
    other = multiprocessing.get_all_start_methods()[1]
    with start_method_unset():
        multiprocessing.set_start_method(other)  # as another thread does, unaware of the block
    assert multiprocessing.get_start_method(allow_none=True) == other


def test_overlapping_blocks_of_two_threads_leave_the_method_unset(start_method):
    """Two threads of the caller each in a block (a grid starting workers, a store read): the second found the
    method fixed by the first's work, so the last to leave left it fixed. Interleaved by hand in one thread."""
    first, second = start_method_unset(), start_method_unset()
    first.__enter__()
    multiprocessing.Lock()
    second.__enter__()
    first.__exit__(None, None, None)
    multiprocessing.Lock()
    second.__exit__(None, None, None)
    assert multiprocessing.get_start_method(allow_none=True) is None


def test_a_handler_installed_in_the_block_is_removed_and_the_caller_s_put_back():
    def callers(signum, frame):
        pass

    before = signal.signal(signal.SIGCHLD, callers)
    try:
        with handler_kept(signal.SIGCHLD):
            signal.signal(signal.SIGCHLD, lambda s, f: None)
        assert signal.getsignal(signal.SIGCHLD) is callers
    finally:
        signal.signal(signal.SIGCHLD, before)


SEEDED_DRAW = """
import random, sys
random.seed(0)
if sys.argv[1] == "probe":
    import numpy as np
    from fedcache.federate.probe import fit_probe
    fit_probe(np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2)
print(random.random())
"""


def test_a_linear_probe_leaves_the_scripts_random_where_its_seed_put_it():
    """scikit-learn's first import pulled in rich, which drew from Python's global generator: a seeded script's
    next draw after its first probe differed. In fresh processes, since this one may have imported both already."""
    import subprocess
    import sys

    def draw(what: str) -> str:
        return subprocess.run([sys.executable, "-c", SEEDED_DRAW, what], capture_output=True, text=True,
                              check=True).stdout
    assert draw("probe") == draw("none")
