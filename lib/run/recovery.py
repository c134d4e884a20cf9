"""The database's return, noticed at once. While the database's outage lasts
(unreachable, refusing connections, read-only), the pollers wait out a
backoff that grows to their fallback poll; one probe a second asks whether
the database takes writes again, and wakes every poller the moment it does,
so that work resumes within seconds of the end of a spell, whatever the
number of queues, at the cost of one round trip a second while it lasts."""

from __future__ import annotations

import logging
from collections.abc import Callable

import gevent
from gevent.event import Event

from lib.setup.error_reports import Outage
from lib.store.db import DB
from lib.store.driver_errors import is_database_error
from lib.store.sql import Q

log = logging.getLogger("jobs.recovery")

PROBE_EVERY = 1.0
# A probe that gets no answer in this long counts as "not yet".
PROBE_TIMEOUT = 5.0


class Recovery:
    def __init__(self, db: DB, outage: Outage, wake_all: Callable[[], None]) -> None:
        self.db = db
        self.outage = outage
        self.wake_all = wake_all

    def run(self, stop: Event) -> None:
        # The last failure a wakeup has answered: a probe runs only after a
        # failure newer than it, so a healthy worker sends no probe at all.
        answered = 0.0
        while not stop.wait(PROBE_EVERY):
            last = self.outage.last_failed
            if last is None or last <= answered:
                continue
            if self.writable():
                answered = last
                self.wake_all()

    def writable(self) -> bool:
        """Whether a connection to the database can be had and takes writes.
        A session that is read-only is closed, not kept: the pool would hand
        it out again after the database is writable."""
        try:
            with gevent.Timeout(PROBE_TIMEOUT), self.db.connection() as conn:
                with conn.cursor() as cur:
                    cur.execute(Q.database_writable)
                    (writable,) = cur.fetchone()
                if not writable:
                    conn.close()
                return bool(writable)
        except gevent.Timeout:
            return False
        except Exception as exc:
            if not is_database_error(exc):
                raise
            return False
