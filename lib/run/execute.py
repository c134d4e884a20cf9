"""The execute stage: find the job's handler, run it under the lease's fence,
the job timeout and an operator's cancel, and decide what happened: what the
row stores and when the job may run again. `decide` is the one place where
retries, dead jobs, snoozes, cancels and interruptions are settled; it
touches no database and no clock."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import gevent
from greenlet import GreenletExit

from lib.background import worker_registry
from lib.background.leases import LeaseLost, Leases
from lib.greenlets.deadline import Deadline
from lib.insert import trace_context
from lib.job import Handler, PendingJob, Snooze
from lib.job import status as st
from lib.job.text import describe
from lib.run import followups, traces
from lib.run.budget import Budgets
from lib.run.cancel import Cancels
from lib.run.queue import Queue
from lib.setup.error_reports import capture, configured_secrets, reporting, traceback_text
from lib.setup.redact import scrub
from lib.store.db import DB
from lib.store.driver_errors import is_database_error
from lib.store.retry_backoff import BASE_SECONDS as RETRY_BASE_SECONDS
from lib.store.retry_backoff import backoff

log = logging.getLogger("jobs")


class JobTimeout(BaseException):
    """The handler ran past the queue's job timeout. A BaseException, as the
    lease fence's LeaseLost is, so a handler's `except Exception` retry loop
    does not take it for one more fault to retry."""


class UnknownJob(Exception):
    """No handler of this queue has the job's name."""


class BadStatus(Exception):
    """The handler returned something that is not an ok/fail/skip status."""


class BadArgs(Exception):
    """The job's stored args cannot be read; no handler could use them."""


# What happened to a job, as the execute stage saw it.


class Returned(NamedTuple):
    status: str  # an ok, fail or skip status, already checked and cleaned


class Raised(NamedTuple):
    error: BaseException


class TimedOut(NamedTuple):
    error: JobTimeout


class Fenced(NamedTuple):
    error: LeaseLost


class Snoozed(NamedTuple):
    snooze: Snooze


class Cancelled(NamedTuple):
    """An operator cancelled the job while it ran (lib/run/cancel.py)."""

    by: str


class Interrupted(NamedTuple):
    """The worker's own kill (shutdown) cut the handler off."""


class ArgsUnreadable(NamedTuple):
    error: BadArgs


class UnknownName(NamedTuple):
    error: UnknownJob


class LeftForAnother(NamedTuple):
    """A live worker handles the job's name and this one does not."""


Happened = (
    Returned
    | Raised
    | TimedOut
    | Fenced
    | Snoozed
    | Cancelled
    | Interrupted
    | ArgsUnreadable
    | UnknownName
    | LeftForAnother
)


@dataclass(frozen=True)
class Outcome:
    status: str  # what the job reached, as the log and the throttle see it
    error: BaseException | None = None
    retry_in: float | None = None  # seconds until the retry, when one is due
    counted: bool = True  # whether this attempt counts against max_attempts
    traceback: str | None = None  # the error's, bounded (lib.setup.error_reports.traceback_text)
    hold: float = 0.0  # seconds the queue takes no job after this one, in every process
    # The jobs this outcome enqueues, in its own transaction (PendingJob.then).
    followups: tuple[Any, ...] = field(default=(), compare=False)
    # The run's trace context, taken in its span, which they store (their runs link to this one).
    followups_trace: str | None = field(default=None, compare=False)
    # What the row stores as its status and its last error; set from the above.
    stored: str = field(init=False, compare=False)
    last_error: str | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        coming_back = self.retry_in is not None
        object.__setattr__(self, "stored", st.PENDING if coming_back else self.status)
        # Kept for anything that did not end well or is coming back.
        failed = coming_back or self.status.startswith("err: ")
        object.__setattr__(self, "last_error", self.status if failed else None)


class GiveBack(NamedTuple):
    """Nothing is stored: the row goes back to pending, uncounted, for the
    worker that handles its name."""


class Abandon(NamedTuple):
    """Nothing is stored: the lease is lost, and a rescue takes the row over."""


Decision = Outcome | GiveBack | Abandon


def decide(happened: Happened, attempts: int, max_attempts: int, *, retry_base: float = RETRY_BASE_SECONDS) -> Decision:
    """What to store for a job that has made `attempts` of its `max_attempts`,
    and when it may run again."""
    match happened:
        case Returned(status):
            return Outcome(status)
        case Snoozed(snooze) if snooze.hold_queue:
            # The queue waits, and the job keeps its place (retry_in 0 keeps
            # run_at): the first claim after the wait takes it again.
            return Outcome(st.clean(snooze.status), retry_in=0.0, counted=False, hold=snooze.seconds)
        case Snoozed(snooze):
            # Throttling is not failure: the attempt is not counted.
            return Outcome(st.clean(snooze.status), retry_in=snooze.seconds, counted=False)
        case Cancelled(by):
            # Counted, and never retried: the operator ended it.
            return Outcome(st.cancelled(by))
        case Interrupted():
            # Like a rescue: another worker takes the job over when attempts
            # remain, in its place in the queue (retry_in 0 keeps run_at).
            return Outcome(st.INTERRUPTED, retry_in=0.0 if attempts < max_attempts else None)
        case Fenced():
            return Abandon()
        case LeftForAnother():
            return GiveBack()
        case Raised(error) | TimedOut(error) | ArgsUnreadable(error) | UnknownName(error):
            # Stored in the row, which must hold no secret, whatever the message quotes.
            text = st.err(scrub(describe(error), configured_secrets()))
            # An error marked final (OutcomeUnknown: a second try could do the
            # work twice) ends the job though attempts remain.
            retry = attempts < max_attempts and not getattr(error, "final", False)
            retry_in = backoff(attempts, base=retry_base) if retry else None
            return Outcome(text, error, retry_in, traceback=traceback_text(error))
    raise TypeError(f"not something that happens to a job: {happened!r}")


def fault(happened: Happened) -> BaseException | None:
    """The error that stands for the job's fault, to report; None when the
    job reached an answer, was snoozed, or its run is not this worker's."""
    match happened:
        case Raised(error) | TimedOut(error) | ArgsUnreadable(error) | UnknownName(error):
            return error
    return None


def recorded(queue: str, job: PendingJob, happened: Happened, *, retry_base: float) -> Decision:
    """decide(), with the job's fault reported; when deciding fails (a bug),
    an outcome saying so, so the job still ends."""
    try:
        error = fault(happened)
        if error is not None:
            capture(error, queue=queue, job=job.name, job_id=job.id, callsite=job.callsite)
        decision = decide(happened, job.attempts, job.max_attempts, retry_base=retry_base)
        if error is not None and isinstance(decision, Outcome) and not reporting():
            # Without Sentry the log is the one place an operator finds where it failed.
            exc_info = (type(error), error, error.__traceback__)
            log.error("queue=%s job=%s id=%d raised %s", queue, job.name, job.id, decision.status, exc_info=exc_info)
        return decision
    except Exception as exc:
        status = st.err(f"the worker could not record this job's outcome: {scrub(describe(exc), configured_secrets())}")
        log.error("queue=%s job=%s id=%d %s", queue, job.name, job.id, status, exc_info=True)
        capture(exc, message="outcome not recorded", queue=queue, job=job.name, job_id=job.id)
        return Outcome(status, exc, traceback=traceback_text(exc))


# A handler that catches its JobTimeout and goes on is thrown another this
# often, until its block ends.
TIMEOUT_AGAIN_EVERY = 0.5

# Never a job's fault: the worker's own kill at shutdown, the process ending.
_NOT_THE_JOBS = (GreenletExit, KeyboardInterrupt, SystemExit)


class Executor:
    def __init__(
        self,
        queue: Queue,
        db: DB,
        leases: Leases,
        budgets: Budgets | None = None,
        known: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        # The job names of every queue the worker defines, that a follow-up
        # may name without asking the database (None: any name goes).
        self.known = known
        self.queue = queue.name
        self.retry_base = queue.retry_base
        self.budgets = budgets
        self.db = db
        self.dispatch = dict(queue.dispatch)
        self.leases = leases
        self.job_timeout = queue.job_timeout
        # The job each slot's handler is running now, and the greenlet it runs
        # in: only that handler may be fenced.
        self._running: dict[int, tuple[PendingJob, Any]] = {}
        # Each slot's limit on its handler, restarted for every job.
        self._deadlines: dict[int, Deadline] = {}
        # The operator's cancel of each slot's job, thrown into its handler as the timeout is.
        self._cancels = Cancels(self._running, TIMEOUT_AGAIN_EVERY)
        # OpenTelemetry's tracer when the program set one up: each run a span.
        self.tracer = traces.tracer()

    def run(self, job: PendingJob, slot: int) -> Decision:
        """Run the job, and decide what its row stores, with the follow-ups
        its outcome writes (none for a cancelled job: an operator's cancel
        ends it with nothing after it). The worker's own kill goes on up."""
        span = None if self.tracer is None else traces.start_run(self.tracer, self.queue, job)
        if span is None:
            return self._decided(job, slot)
        with traces.current(span):
            try:
                decision = self._decided(job, slot)
            except BaseException:
                traces.end_run(span, None, None)
                raise
        match decision:
            case Outcome(status=status, error=error):
                traces.end_run(span, status, error)
            case GiveBack():
                traces.end_run(span, "given back", None)
            case Abandon():
                traces.end_run(span, "lease lost", None)
        return decision

    def _decided(self, job: PendingJob, slot: int) -> Decision:
        happened = self.execute(job, slot)
        decision = recorded(self.queue, job, happened, retry_base=self.retry_base)
        if job.followups and isinstance(decision, Outcome) and not isinstance(happened, Cancelled):
            try:
                jobs = followups.to_write(job, decision.status, decision.retry_in, self.known, self.db)
            except Exception as exc:
                return recorded(self.queue, job, Raised(exc), retry_base=self.retry_base)
            if jobs:
                return replace(decision, followups=jobs, followups_trace=trace_context())
        return decision

    def execute(self, job: PendingJob, slot: int) -> Happened:
        """Run the job's handler. The job's lease is held from here until the
        outcome is written or given up on (Steps.write). The worker's own
        kill goes on up."""
        if job.name not in self.dispatch and self._handled_elsewhere(job):
            return LeftForAnother()
        self.leases.hold(
            job.id,
            job.claimed_at or time.monotonic(),
            lambda: self._fence(slot, job),
            lambda by: self._cancels.ask(slot, job, by),
        )
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
        if slot in self._cancels.asked and (cancelled_by := self._cancels.done(slot, job)) is not None:
            # Cancelled between its claim and here: it never begins.
            return Cancelled(cancelled_by)
        # The job as held (the fence and the cancel look for it), not the handler's copy.
        self._running[slot] = (job, gevent.getcurrent())
        deadline = self._deadlines.get(slot)
        if deadline is None:
            deadline = self._deadlines[slot] = Deadline(
                self.job_timeout, self._timed_out, again_every=TIMEOUT_AGAIN_EVERY
            )
        result: object = None
        raised: BaseException | None = None
        try:
            with deadline:
                result = handler(job if self.budgets is None else replace(job, budgets=self.budgets))
        except _NOT_THE_JOBS:
            raise
        except BaseException as exc:  # a gevent.Timeout of its own and any other BaseException are the job's fault
            raised = exc
        finally:
            self._running.pop(slot, None)
            cancelled_by = self._cancels.done(slot, job) if slot in self._cancels.asked else None
        if isinstance(raised, LeaseLost):
            return Fenced(raised)
        if cancelled_by is not None:
            # Whatever it raised or returned once cancelled, the operator's cancel ended it.
            return Cancelled(cancelled_by)
        if raised is not None:
            if deadline.expired is None or isinstance(raised, JobTimeout):
                return _raised(raised)
            # Whatever it raised once its time was up, the timeout ended it.
            return TimedOut(deadline.expired)
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
    try:
        return Returned(st.returned(result))
    except ValueError as exc:
        return Raised(BadStatus(str(exc)))
