"""Reports made in native threads, sent from the hub's thread.

In a patched process sentry-sdk's locks, queue and sending thread are
gevent's, and gevent's belong to the hub of the thread that makes or waits on
them. A report made in a native thread (the lease renewal, the hub watch)
would give that thread a hub of its own whose loop never runs: its sending
greenlet would never send that report, nor any later one, and the thread
could wait on it for ever. So a native thread hands each report to the hub's
thread and goes on at once; there each is sent from a greenlet of its own,
so a send that fails or hangs holds that report alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import gevent
import gevent.monkey
from gevent.hub import Hub

from lib.setup import error_reports

log = logging.getLogger("jobs.errors")

# The native thread's identity, not the greenlet's (which patched get_ident answers).
_thread_ident = gevent.monkey.get_original("_thread", "get_ident")
_native_lock = gevent.monkey.get_original("_thread", "allocate_lock")

# Reports handed over and not yet begun: while the hub is held, a thread
# that reports over and over fills this much memory, no more.
MOST_WAITING = 100


class HubReports:
    """The hand-off of reports from native threads to the hub's thread."""

    def __init__(self, hub: Hub, most_waiting: int = MOST_WAITING) -> None:
        self._loop = hub.loop
        self._hub_thread = hub.thread_ident
        self._most_waiting = most_waiting
        self._waiting = 0
        # Native: taken by native threads and the hub's thread alike, for a count.
        self._lock = _native_lock()

    def hand_off(self, send: Callable[[], None]) -> bool:
        """Take send to the hub's thread, unless this is it (False: the caller
        sends it itself). Never waits on the hub."""
        if _thread_ident() == self._hub_thread:
            return False
        if not self._count_in():
            log.warning("a report from a native thread is dropped: %d wait for the hub", self._most_waiting)
            return True
        try:
            self._loop.run_callback_threadsafe(self._begin, send)
        except Exception as exc:  # the loop is gone (the process is ending): nowhere to send it
            self._count_out()
            log.warning("a report from a native thread is dropped: %s", exc)
        return True

    def _count_in(self) -> bool:
        with self._lock:
            if self._waiting >= self._most_waiting:
                return False
            self._waiting += 1
            return True

    def _count_out(self) -> None:
        with self._lock:
            self._waiting -= 1

    def _begin(self, send: Callable[[], None]) -> None:
        # A loop callback, in the hub itself, must not wait: the send gets a greenlet.
        self._count_out()
        gevent.spawn(_send, send)


def _send(send: Callable[[], None]) -> None:
    try:
        send()
    except Exception:  # a report's own fault stops no part, and no later report
        log.exception("a report could not be sent")


def send_from_hub() -> HubReports:
    """From now on, send every report made in a native thread from this
    thread's hub (the worker's: worker.run calls this before its parts start)."""
    reports = HubReports(gevent.get_hub())
    error_reports.send_through(reports.hand_off)
    return reports
