"""A greenlet that does a piece of work each time it is asked, and stays a
moment for the next ask instead of ending.

Starting a greenlet costs more than the switch to one that waits: each new
greenlet maps a fresh Python frame stack and unmaps it when it ends, which
for short jobs is much of the worker's CPU. The group commit's
sender and each slot's outcome writer run in one of these: a busy worker
asks them every job, an idle one lets them end.
"""

from __future__ import annotations

from collections.abc import Callable

import gevent
import gevent.pool
from gevent.event import Event

from lib.greenlets.deadline import Deadline, Expired

# Seconds a greenlet on standby waits for the next ask before it ends.
LINGER = 1.0


class Standby:
    def __init__(
        self,
        work: Callable[[], None],
        pending: Callable[[], bool],
        group: gevent.pool.Group | None = None,
    ) -> None:
        """work() does all there is to do; pending() says whether there is
        any. A group, when given, holds the greenlet while it lives."""
        self._work = work
        self._pending = pending
        self._spawn = gevent.spawn if group is None else group.spawn
        self._greenlet: gevent.Greenlet | None = None
        self._asked = Event()
        self._closed = False
        # The linger, restarted on every ask (lib/greenlets/deadline.py).
        self._linger = Deadline(LINGER)

    def ask(self) -> None:
        """Have work() run on the hub's next turn (asks made in this one share the run)."""
        if self._greenlet is None or self._greenlet.dead:
            self._closed = False
            self._greenlet = self._spawn(self._run)
        else:
            self._asked.set()

    def close(self) -> None:
        """End the greenlet once the work asked for is done, without lingering."""
        self._closed = True
        self._asked.set()

    def _run(self) -> None:
        while True:
            self._work()
            self._asked.clear()
            if not self._closed:
                self._linger.seconds = LINGER
                try:
                    with self._linger:
                        self._asked.wait()
                except Expired:
                    pass  # nothing came
            # No switch between this last look and the greenlet's end, so an
            # ask is never left with no greenlet to do it.
            if not self._pending():
                return
