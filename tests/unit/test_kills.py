"""Kills held back while a greenlet is in a section (lib/greenlets/kills.py):
what an outcome's write relies on at the end of the shutdown window."""

import gevent
import pytest
from gevent.event import Event
from greenlet import GreenletExit

from lib.greenlets.kills import Kills


def _in_section(kills: Kills, steps: list[str], inside: Event, go_on: Event, raises: Exception | None = None) -> None:
    steps.append("before")
    with kills:
        inside.set()
        go_on.wait()
        steps.append("section done")
        if raises is not None:
            raise raises
    steps.append("after")


def test_a_greenlet_in_its_section_is_killed_as_it_leaves_it_not_in_it():
    kills, steps, inside, go_on = Kills(), [], Event(), Event()
    greenlet = gevent.spawn(_in_section, kills, steps, inside, go_on)
    assert inside.wait(5)
    killing = gevent.spawn(kills.kill, [greenlet], 5)
    gevent.sleep(0.05)
    assert not greenlet.dead and not killing.dead
    go_on.set()
    killing.get(timeout=5)
    assert greenlet.dead and isinstance(greenlet.value, GreenletExit)
    assert steps == ["before", "section done"]


def test_a_greenlet_outside_any_section_is_killed_at_once_beside_one_held():
    kills, steps, inside, go_on = Kills(), [], Event(), Event()
    held = gevent.spawn(_in_section, kills, steps, inside, go_on)
    assert inside.wait(5)
    outside = gevent.spawn(gevent.sleep, 60)
    gevent.sleep(0)
    killing = gevent.spawn(kills.kill, [held, outside], 5)
    gevent.sleep(0.05)
    assert outside.dead and isinstance(outside.value, GreenletExit)
    assert not held.dead
    go_on.set()
    killing.get(timeout=5)
    assert held.dead and steps == ["before", "section done"]


def test_a_greenlet_that_enters_its_section_in_the_turn_of_the_kill_is_held_too():
    """Woken in the same turn of the hub as the kill is asked (its wake-up
    queued first), it is inside its section by the time the kill is thrown:
    the look and the throw happen together, in the hub."""
    kills, steps, inside, go_on = Kills(), [], Event(), Event()
    start = Event()

    def waits_then_writes() -> None:
        start.wait()
        _in_section(kills, steps, inside, go_on)

    greenlet = gevent.spawn(waits_then_writes)
    gevent.sleep(0)
    held = []

    def finish() -> None:
        inside.wait()
        gevent.sleep(0.05)
        held.append(not greenlet.dead)
        go_on.set()

    gevent.spawn(finish)
    gevent.sleep(0)
    start.set()
    with gevent.Timeout(5):
        kills.kill([greenlet])  # asked in this very turn, after the wake-up
    assert held == [True]
    assert greenlet.dead and steps == ["before", "section done"]


def test_a_section_that_raises_with_a_kill_held_ends_in_the_kill():
    kills, steps, inside, go_on = Kills(), [], Event(), Event()
    greenlet = gevent.spawn(_in_section, kills, steps, inside, go_on, ValueError("the write failed"))
    assert inside.wait(5)
    killing = gevent.spawn(kills.kill, [greenlet], 5)
    gevent.sleep(0)
    go_on.set()
    killing.get(timeout=5)
    assert isinstance(greenlet.value, GreenletExit)
    assert steps == ["before", "section done"]


def test_a_section_left_with_no_kill_asked_goes_on_and_raises_what_it_raised():
    kills, steps, inside, go_on = Kills(), [], Event(), Event()
    go_on.set()
    _in_section(kills, steps, inside, go_on)
    assert steps == ["before", "section done", "after"]
    with pytest.raises(ValueError):
        _in_section(kills, steps, inside, go_on, ValueError("its own"))
    # Nothing of either section is left behind to kill the next greenlet there.
    assert kills._inside == {}


def test_a_greenlet_not_started_yet_never_starts():
    kills, ran = Kills(), []
    greenlet = gevent.Greenlet(ran.append, 1)
    with gevent.Timeout(5):
        kills.kill([greenlet])
    assert greenlet.dead
    greenlet.start()
    gevent.sleep(0.05)
    assert ran == []
