"""Declaring the queues' dedupe names at start without holding up running
workers: a new name takes a lock on jobs (jobs_dedupe_declare, sql/rules/dedupe.sql)
that waits for every open transaction that wrote jobs, and every other
writer of jobs waits behind it. The function gives up after a short
lock_timeout; what had to wait is tried again, with capped,
jittered backoff, in a supervised part of its own, while the worker runs.

The queue may run meanwhile. A name already declared holds whatever any
worker does: every insert reads job_dedupe_names in its own statement
(jobs_insert; the row trigger for other writers: sql/rules/insert.sql) and
the unique index jobs_dedupe refuses a second live copy. A name not yet
declared is what it is before any worker declares it: its rows are written
unmarked, and the declaration, when it commits, marks the live ones and
skips their waiting copies, keeping a started copy, which cannot be taken
back (jobs_dedupe_mark).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from gevent.event import Event

from lib.setup.error_reports import Outage
from lib.store.driver_errors import is_database_error, is_lock_timeout
from lib.store.retry_backoff import Backoff
from lib.store.sql import Q

log = logging.getLogger("jobs.dedupe")

# Each try holds other writers of jobs back for the lock_timeout at most:
# spaced out, so they run between tries.
RETRY_BASE = 0.5
RETRY_CAP = 30.0


def declare(db: Any, queue: str, names: Iterable[str]) -> bool:
    """One try at adding the names to the queue's dedupe names; False when
    the lock on jobs was not granted in time."""
    try:
        added, skipped = db.query_row(Q.dedupe_declare, {"queue": queue, "names": sorted(names)})
    except Exception as exc:
        if is_lock_timeout(exc):
            return False
        raise
    if added:
        log.info("queue=%s dedupes %s from now on; %d waiting copies skipped", queue, ", ".join(added), skipped)
    return True


class Waiting:
    """The declarations that could not take their locks at start (a queue's
    dedupe names, its rate): each what it declares, for the log, and one try
    at it, True when done."""

    def __init__(self, db: Any, outage: Outage | None = None) -> None:
        self.db = db
        self.outage = outage or Outage("database")
        self.left: list[tuple[str, Callable[[], bool]]] = []

    def add(self, what: str, attempt: Callable[[], bool]) -> None:
        log.info("%s waits to be declared behind open transactions; the queue runs meanwhile", what)
        self.left.append((what, attempt))

    def add_names(self, queue: str, names: frozenset[str]) -> None:
        self.add(f"queue={queue} dedupe names {', '.join(sorted(names))}", lambda: declare(self.db, queue, names))

    def run(self, stop: Event) -> None:
        """The supervised part: declare them all, then wait for the stop (a
        part that returns while the worker runs is taken for dead)."""
        self.until_done(stop)
        stop.wait()

    def until_done(self, stop: Event) -> None:
        retry = Backoff(base=RETRY_BASE, cap=RETRY_CAP)
        while self.left and not stop.wait(retry.failed()):
            what, attempt = self.left[0]
            try:
                done = attempt()
            except Exception as exc:
                if not is_database_error(exc):
                    raise
                self.outage.failed(exc)
                continue
            self.outage.recovered()
            if done:
                self.left.pop(0)
                log.info("%s declared", what)
                retry.succeeded()
