"""ThreadStop: a native thread's wait between rounds sleeps its period, and
ends the moment another thread sets the stop."""

import time

import gevent.monkey

from lib.greenlets.thread_stop import ThreadStop

_start_thread = gevent.monkey.get_original("_thread", "start_new_thread")
_native_sleep = gevent.monkey.get_original("time", "sleep")


def test_a_wait_with_no_stop_lasts_its_period():
    stop = ThreadStop()
    began = time.monotonic()
    assert stop.wait(0.2) is False
    assert time.monotonic() - began >= 0.15
    assert not stop.is_set()


def test_a_stop_set_from_another_thread_ends_a_long_wait_at_once_and_every_wait_after():
    stop = ThreadStop()
    _start_thread(lambda: (_native_sleep(0.1), stop.set()), ())
    began = time.monotonic()
    assert stop.wait(30) is True
    assert time.monotonic() - began < 5
    assert stop.is_set()
    stop.set()  # a second set is harmless
    began = time.monotonic()
    assert stop.wait(30) is True and stop.wait(30) is True
    assert time.monotonic() - began < 1
