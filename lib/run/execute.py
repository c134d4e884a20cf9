"""The execute stage: find the job's handler and run it under the lease's
fence and the job timeout; say what happened, for the outcome stage."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import gevent
from greenlet import GreenletExit

from lib.background import worker_registry
from lib.background.leases import LeaseLost, Leases
from lib.greenlets.deadline import Deadline
from lib.job import Handler, PendingJob, Snooze
from lib.job import status as st
from lib.job.text import safe_text
from lib.run.budget import Budgets
from lib.run.outcome import (
    ArgsUnreadable,
    BadArgs,
    BadStatus,
    Fenced,
    Happened,
    JobTimeout,
    LeftForAnother,
    Raised,
    Returned,
    Snoozed,
    TimedOut,
    UnknownJob,
    UnknownName,
)
from lib.store.db import DB
from lib.store.driver_errors import is_database_error

log = logging.getLogger("jobs")

# A handler that catches its JobTimeout and goes on is thrown another this
# often, until its block ends.
TIMEOUT_AGAIN_EVERY = 0.5

# Never a job's fault: the worker's own kill at shutdown, the process ending.
_NOT_THE_JOBS = (GreenletExit, KeyboardInterrupt, SystemExit)


class Executor:
    def __init__(
        self,
        queue: str,
        db: DB,
        dispatch: Mapping[str, Handler],
        leases: Leases,
        *,
        job_timeout: float,
        budgets: Budgets | None = None,
    ) -> None:
        self.queue = queue
        self.budgets = budgets
        self.db = db
        self.dispatch = dict(dispatch)
        self.leases = leases
        self.job_timeout = job_timeout
        # The job each slot's handler is running now, and the greenlet it runs
        # in: only that handler may be fenced.
        self._running: dict[int, tuple[PendingJob, Any]] = {}
        # Each slot's limit on its handler, restarted for every job.
        self._deadlines: dict[int, Deadline] = {}

    def execute(self, job: PendingJob, slot: int) -> Happened:
        """Run the job's handler. The job's lease is held from here until the
        poller releases it, once the outcome is written or given up on. The
        worker's own kill goes on up."""
        if job.name not in self.dispatch and self._handled_elsewhere(job):
            return LeftForAnother()
        self.leases.hold(job.id, job.claimed_at or time.monotonic(), lambda: self._fence(slot, job))
        if job.args_error is not None:
            return ArgsUnreadable(BadArgs(job.args_error))
        handler = self.dispatch.get(job.name)
        if handler is None:
            return UnknownName(UnknownJob(f"unknown job {job.name!r} for queue {self.queue}"))
        return self._call(handler, job, slot)

    def _handled_elsewhere(self, job: PendingJob) -> bool:
        """Whether a live worker handles the name (one of a newer release,
        during a rolling upgrade). False when that cannot be learnt: the job
        ends as an unknown job, and a typo never stalls its queue."""
        try:
            return worker_registry.handled_elsewhere(self.db, self.queue, job.name)
        except Exception as exc:
            if not is_database_error(exc):
                raise
            log.warning("queue=%s id=%d cannot learn whether a worker handles it: %s", self.queue, job.id, exc)
            return False

    def _call(self, handler: Handler, job: PendingJob, slot: int) -> Happened:
        if self.budgets is not None:
            job = replace(job, budgets=self.budgets)
        self._running[slot] = (job, gevent.getcurrent())
        deadline = self._deadlines.get(slot)
        if deadline is None:
            deadline = self._deadlines[slot] = Deadline(
                self.job_timeout, self._timed_out, again_every=TIMEOUT_AGAIN_EVERY
            )
        try:
            with deadline:
                result = handler(job)
        except _NOT_THE_JOBS:
            raise
        except BaseException as exc:  # a gevent.Timeout of its own and any other BaseException are the job's fault
            if deadline.expired is None or isinstance(exc, JobTimeout | LeaseLost):
                return _raised(exc)
            # Whatever it raised once its time was up, the timeout ended it.
            return TimedOut(deadline.expired)
        finally:
            self._running.pop(slot, None)
        if deadline.expired is not None:
            # It caught its timeout and returned: the job still ran out of time.
            return TimedOut(deadline.expired)
        return _returned(result)

    def _timed_out(self) -> JobTimeout:
        return JobTimeout(f"timed out after {self.job_timeout:g}s")

    def _fence(self, slot: int, job: PendingJob) -> None:
        """Stop this job's handler: its lease could not be renewed in time.
        Thrown from the hub, where the check and the throw cannot be split by
        a switch: a handler that has just returned is left alone (its outcome
        write only lands if the row is still this worker's)."""

        def throw() -> None:
            running = self._running.get(slot)
            if running is not None and running[0] is job:
                running[1].throw(LeaseLost(f"lease of job {job.id} not renewed in time"))

        gevent.get_hub().loop.run_callback(throw)


def _raised(exc: BaseException) -> Happened:
    if isinstance(exc, LeaseLost):
        return Fenced(exc)
    if isinstance(exc, JobTimeout):
        return TimedOut(exc)
    if isinstance(exc, Snooze):
        return Snoozed(exc)
    return Raised(exc)


def _returned(result: object) -> Happened:
    """A status the handler may return, or the fault of returning another."""
    if not isinstance(result, str):
        return Raised(BadStatus(f"handler returned {type(result).__name__}, not a status string"))
    # A plain str from here (a subclass's own methods are not called), one
    # that Postgres can store: no NUL, no lone surrogate.
    result = safe_text(result)
    try:
        kind = st.kind(result)
    except ValueError:
        return Raised(BadStatus(f"handler returned {result!r:.100}, not a status"))
    if kind not in (st.Kind.OK, st.Kind.FAIL, st.Kind.SKIP):
        # A fault recorded without an exception would reach nobody.
        return Raised(BadStatus(f"handler returned {result!r:.100}; a fault must be raised"))
    return Returned(st.clean(result))
