"""An interrupt that Python dropped in a weakref's callback is raised again (fedcache/interrupts.py), for the
command line's handlers here and the Flower simulation's in tests/flower/test_simulation.py."""
from __future__ import annotations

import os
import signal
import sys
import time
import weakref
from types import SimpleNamespace

import pytest

from fedcache.interrupts import raised_again


def dropped_then_raised(signum: int = signal.SIGINT, wait: float = 5.0) -> bool:
    """``signum`` sent to this process while its main thread runs a weakref's callback, where the handler's
    KeyboardInterrupt is dropped: whether one was raised after all, within ``wait`` seconds."""

    class Held:
        pass

    def callback(ref) -> None:  # the signal's handler runs here, at the callback's next instruction
        os.kill(os.getpid(), signum)
        sum(range(1000))

    held = Held()
    ref = weakref.ref(held, callback)
    try:
        del held
        time.sleep(wait)  # the handler, run again, ends the wait
    except KeyboardInterrupt:
        return ref() is None
    return False


@pytest.fixture
def printed(monkeypatch) -> list:
    """What Python would have printed as "Exception ignored in ..."."""
    said: list = []
    monkeypatch.setattr(sys, "__unraisablehook__", said.append)
    return said


def test_other_errors_and_interrupts_not_of_its_handler_are_left_to_python(printed):
    hook = raised_again(lambda: None)
    other, theirs = SimpleNamespace(exc_type=ValueError), SimpleNamespace(exc_type=KeyboardInterrupt)
    hook(other)
    hook(theirs)
    assert printed == [other, theirs]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_commands_first_interrupt_dropped_by_python_still_stops_it(monkeypatch, printed, signum):
    """The command line's handler raises once and then ignores every later Ctrl-C and SIGTERM: its first dropped,
    the command trained on and could not be stopped but by SIGKILL."""
    from fedcache.cli import root

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(sys, "unraisablehook", raised_again(root._rearm))
    try:
        for s in before:
            signal.signal(s, root._interrupted)
        assert dropped_then_raised(signum)
        assert signal.getsignal(signal.SIGINT) is root._ignored and signal.getsignal(signal.SIGTERM) is root._ignored
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert printed == []


def test_a_command_started_ignoring_ctrl_c_is_sent_sigterm_again(monkeypatch, printed):
    """Started in the background (SIGINT ignored, as a shell does), its SIGTERM dropped is sent again as SIGTERM."""
    from fedcache.cli import root

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(sys, "unraisablehook", raised_again(root._rearm))
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, root._interrupted)
        assert dropped_then_raised(signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert printed == []
