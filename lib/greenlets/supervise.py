"""Every long-lived greenlet of the worker runs under a Supervisor: a part that
dies of a bug is logged, restarted with capped backoff, and reported once per
run of failures, so a worker never looks alive with a dead part inside.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import gevent
from gevent import Greenlet
from gevent.event import Event
from greenlet import GreenletExit

from lib.setup.error_reports import Outage

log = logging.getLogger("jobs.supervise")

FIRST_DELAY = 1.0
MAX_DELAY = 60.0
# A part that ran this long since its last restart was healthy: its next death
# starts a new run of failures (reported again, restarted without delay).
HEALTHY_AFTER = 60.0

Part = Callable[[Event], None]


class Supervisor:
    def __init__(
        self,
        stop: Event,
        *,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
        healthy_after: float = HEALTHY_AFTER,
    ) -> None:
        self.stop = stop
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.healthy_after = healthy_after
        self.greenlets: dict[str, Greenlet] = {}
        self.restarts: dict[str, int] = {}
        # How many times each part has been started (restarts + 1 while it runs).
        self.runs: dict[str, int] = {}

    def spawn(self, name: str, part: Part) -> Greenlet:
        """Run part(stop) in a greenlet of its own until stop is set."""
        if name in self.greenlets:
            raise ValueError(f"a part named {name!r} is already supervised")
        self.restarts[name] = 0
        self.runs[name] = 0
        greenlet = gevent.spawn(self._keep, name, part)
        greenlet.name = name
        self.greenlets[name] = greenlet
        return greenlet

    def _keep(self, name: str, part: Part) -> None:
        failures = Outage(f"{name} crashed")
        delay = self.first_delay
        while not self.stop.is_set():
            began = time.monotonic()
            self.runs[name] += 1
            try:
                part(self.stop)
                if self.stop.is_set():
                    return
                error: BaseException = RuntimeError(f"{name} returned while the worker runs")
            except (GreenletExit, KeyboardInterrupt, SystemExit):
                # The worker's own kill at shutdown, or the process ending.
                raise
            except BaseException as exc:  # any other death of a part is a bug to report
                error = exc
            if time.monotonic() - began >= self.healthy_after:
                failures.recovered()
                delay = self.first_delay
            self.restarts[name] += 1
            log.error(
                "%s died: %s: %s; restart %d in %.2gs",
                name,
                type(error).__name__,
                error,
                self.restarts[name],
                delay,
                exc_info=error,
            )
            failures.failed(error, part=name)
            self._pause(delay)
            delay = min(delay * 2, self.max_delay)

    def _pause(self, delay: float) -> None:
        """The backoff before a restart; whatever is thrown at the part
        meanwhile (but a kill) only ends the pause early."""
        try:
            self.stop.wait(delay)
        except (GreenletExit, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            log.error("supervisor: %s: %s while waiting to restart", type(exc).__name__, exc)

    def alive(self) -> bool:
        return all(not g.dead for g in self.greenlets.values())
