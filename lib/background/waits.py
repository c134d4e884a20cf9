"""The release of jobs that wait for others (insert's after=, sql/rules/waits.sql):
once every job one waits for has ended, it is due (or, when one ended other
than ok, it ends as a skip naming it). The end of a job others wait for
notifies every worker (jobs_waits); each looks at once, and the releases of
two workers pass over each other's waiters. A worker also looks each time
its LISTEN connection comes up, at start and after a loss, for an end it
did not hear (once it listens, so that no end falls between); with no LISTEN
connection, at start and every `every` seconds. It sends nothing while no
wait ends, so an idle worker costs the database nothing here.

A failed look (a row another transaction holds past the lock timeout, the
database away) is tried again with backoff; an outage is the worker's one
report."""

from __future__ import annotations

import logging

import gevent
from gevent.event import Event

from lib.setup.error_reports import Outage
from lib.store.db import DB
from lib.store.driver_errors import is_database_error, is_outage
from lib.store.retry_backoff import Backoff
from lib.store.sql import Q

log = logging.getLogger("jobs.waits")

# How long a release may wait on a lock (a waiter's row held elsewhere is passed over).
LOCK_TIMEOUT_MS = 2000
# Seconds until another look, when a waiter's row was held by another transaction.
HELD_AGAIN = 1.0


class Waits:
    def __init__(self, db: DB, outage: Outage | None = None, *, every: float | None = None) -> None:
        """every: seconds between looks when no LISTEN connection tells this
        worker of ends (behind a pooler in transaction mode); None: none."""
        self.db = db
        self.every = every
        self.outage = outage or Outage("release waiting jobs")
        self._asked = Event()
        if every is not None:
            # No listener to say when it listens: the first look comes at start.
            # Else the listener asks for it once it listens (worker.py's
            # wake_all), so that no end falls between; a look at once would
            # also open a connection beside the pollers' first claims.
            self._asked.set()
        self.held = 0  # waiters the last look passed over, their rows held elsewhere

    def wake(self) -> None:
        """A job others wait for has ended, or the wakeups came back: look now."""
        self._asked.set()

    def run(self, stop: Event) -> None:
        retry = Backoff(cap=10.0)
        while not stop.is_set():
            gevent.wait([stop, self._asked], timeout=self.every, count=1)
            if stop.is_set():
                return
            self._asked.clear()
            try:
                released = self.release()
            except Exception as exc:
                if not is_database_error(exc):
                    raise
                if is_outage(exc):
                    self.outage.failed(exc)
                else:
                    log.warning("waiting jobs not released yet, trying again: %s", exc)
                self._asked.set()
                stop.wait(retry.failed())
                continue
            retry.succeeded()
            if released:
                log.info("released %d waiting jobs", released)
            if self.held:
                # Nothing will notify when that transaction ends: look again soon.
                stop.wait(HELD_AGAIN)
                self._asked.set()

    def release(self) -> int:
        """Release every waiting job whose jobs have ended; how many. Those
        whose rows another transaction holds are left for a later look (held)."""
        with self.db.lock_bounded(LOCK_TIMEOUT_MS).transaction() as tx:
            released, self.held = tx.query_row(Q.job_release_waiters)
        return released
