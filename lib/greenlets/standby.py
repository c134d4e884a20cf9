"""A greenlet that does a piece of work each time it is asked, and stays a
moment for the next ask instead of ending.

Starting a greenlet costs more than the switch to one that waits: each new
greenlet maps a fresh Python frame stack and unmaps it when it ends, which
for short jobs is much of the worker's CPU. The group commit's
sender runs in one of these: a busy worker asks it every job, an idle one
lets it end.
"""

from __future__ import annotations

from collections.abc import Callable

import gevent
from gevent.event import Event

from lib.greenlets.deadline import Deadline, Expired

# Seconds a greenlet on standby waits for the next ask before it ends.
LINGER = 1.0


class Standby:
    def __init__(self, work: Callable[[], None], pending: Callable[[], bool]) -> None:
        """work() does all there is to do; pending() says whether there is any."""
        self._work = work
        self._pending = pending
        self._greenlet: gevent.Greenlet | None = None
        self._asked = Event()
        # The linger, restarted on every ask (lib/greenlets/deadline.py).
        self._linger = Deadline(LINGER)

    def ask(self) -> None:
        """Have work() run on the hub's next turn (asks made in this one share the run)."""
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)
        else:
            self._asked.set()

    def _run(self) -> None:
        while True:
            self._work()
            self._asked.clear()
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
