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

from fedcache.interrupts import RaisedAgain


def dropped_then_raised(hook: RaisedAgain, signum: int = signal.SIGINT, wait: float = 5.0) -> bool:
    """``signum`` sent to this process while its main thread runs a weakref's callback, where the handler's
    KeyboardInterrupt is dropped: whether one was raised after all, within ``wait`` seconds. Returns once ``hook``
    has sent what it was asked to: one sent after the test put its handlers back would reach pytest's."""

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
    finally:
        hook.wait_sent(30)
    return False


@pytest.fixture
def printed(monkeypatch) -> list:
    """What Python would have printed as "Exception ignored in ..."."""
    said: list = []
    monkeypatch.setattr(sys, "__unraisablehook__", said.append)
    return said


def test_other_errors_and_interrupts_not_of_its_handler_are_left_to_python(printed):
    hook = RaisedAgain(lambda dropped: None)
    other, theirs = SimpleNamespace(exc_value=ValueError()), SimpleNamespace(exc_value=KeyboardInterrupt())
    hook(other)
    hook(theirs)
    assert printed == [other, theirs]


def test_a_keyboard_interrupt_the_commands_handler_did_not_raise_is_not_sent_again(monkeypatch, printed):
    """Once the command's handler has raised (its KeyboardInterrupt on its way), another dropped in a finalizer (a
    library's own) would have interrupted the command's clean-up a second time."""
    from fedcache.cli import root

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in before:
            signal.signal(s, root._interrupted)
        with pytest.raises(KeyboardInterrupt):
            root._interrupted(signal.SIGINT, None)
        theirs, hook = SimpleNamespace(exc_value=KeyboardInterrupt()), RaisedAgain(root._rearm)
        hook(theirs)
        sent_again = False
        try:
            hook.wait_sent(30)
        except KeyboardInterrupt:
            sent_again = True
        assert printed == [theirs] and not sent_again and signal.getsignal(signal.SIGINT) is root._ignored
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_commands_first_interrupt_dropped_by_python_still_stops_it(monkeypatch, printed, signum):
    """The command line's handler raises once and then ignores every later Ctrl-C and SIGTERM: its first dropped,
    the command trained on and could not be stopped but by SIGKILL."""
    from fedcache.cli import root

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = RaisedAgain(root._rearm)
    monkeypatch.setattr(sys, "unraisablehook", hook)
    try:
        for s in before:
            signal.signal(s, root._interrupted)
        assert dropped_then_raised(hook, signum)
        assert signal.getsignal(signal.SIGINT) is root._ignored and signal.getsignal(signal.SIGTERM) is root._ignored
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert printed == []


def test_a_command_started_ignoring_ctrl_c_is_sent_sigterm_again(monkeypatch, printed):
    """Started in the background (SIGINT ignored, as a shell does), its SIGTERM dropped is sent again as SIGTERM."""
    from fedcache.cli import root

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = RaisedAgain(root._rearm)
    monkeypatch.setattr(sys, "unraisablehook", hook)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, root._interrupted)
        assert dropped_then_raised(hook, signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert printed == []


def test_an_interrupt_raised_while_another_dropped_error_is_printed_is_sent_again(monkeypatch):
    """The handler's KeyboardInterrupt, raised while Python printed another finalizer's error, escaped the hook
    unsaid: the command's handlers ignored everything from then on, and it trained to the end."""
    raised, asked = KeyboardInterrupt(), []

    def printing(unraisable):
        if not asked:
            raise raised  # the signal's handler ran here
    monkeypatch.setattr(sys, "__unraisablehook__", printing)
    hook = RaisedAgain(lambda dropped: asked.append(dropped) or None)
    hook(SimpleNamespace(exc_value=ValueError()))
    assert asked == [raised]


@pytest.mark.parametrize("at", [0, 1, 2, 3])  # installing SIGINT's, SIGTERM's; putting back SIGINT's, SIGTERM's
def test_a_pending_interrupt_as_held_sets_a_handler_leaves_every_handler_right(monkeypatch, at):
    """``signal.signal`` runs a pending signal's handler first; its KeyboardInterrupt left one signal held and the
    other not, or held's handler in place for good (a later SIGTERM swallowed)."""
    from fedcache import interrupts

    def mine(signum, frame):
        raise KeyboardInterrupt

    before = {s: signal.getsignal(s) for s in interrupts.HELD}
    real, calls = signal.signal, [0]

    def pending(signum, handler):
        calls[0] += 1
        if calls[0] == at + 1:
            raise KeyboardInterrupt  # the pending handler raised; this handler is not set
        return real(signum, handler)

    try:
        for s in interrupts.HELD:
            real(s, mine)
        monkeypatch.setattr(signal, "signal", pending)
        with pytest.raises(KeyboardInterrupt):
            with interrupts.held():
                inside = {s: signal.getsignal(s) for s in interrupts.HELD}
        monkeypatch.undo()
        assert all(signal.getsignal(s) is mine for s in interrupts.HELD)
        if at >= 2:  # raised as the handlers were put back: the block ran held
            assert all(inside[s] is not mine for s in interrupts.HELD)
    finally:
        for s, handler in before.items():
            real(s, handler)
