"""The outcome stage: what the handler did, and the attempts the job has
made, decide what the row stores and when the job may run again. `decide`
is the one place where retries, dead jobs, snoozes and interruptions are
settled; it touches no database and no clock."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

from lib.background.leases import LeaseLost
from lib.job import PendingJob, Snooze
from lib.job import status as st
from lib.job.text import describe
from lib.setup.error_reports import capture, configured_secrets, reporting, traceback_text
from lib.setup.redact import scrub
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


class Interrupted(NamedTuple):
    """The worker's own kill (shutdown) cut the handler off."""


class ArgsUnreadable(NamedTuple):
    error: BadArgs


class UnknownName(NamedTuple):
    error: UnknownJob


class LeftForAnother(NamedTuple):
    """A live worker handles the job's name and this one does not."""


Happened = Returned | Raised | TimedOut | Fenced | Snoozed | Interrupted | ArgsUnreadable | UnknownName | LeftForAnother


@dataclass(frozen=True)
class Outcome:
    status: str  # what the job reached, as the log and the throttle see it
    error: BaseException | None = None
    retry_in: float | None = None  # seconds until the retry, when one is due
    counted: bool = True  # whether this attempt counts against max_attempts
    traceback: str | None = None  # the error's, bounded (lib.setup.error_reports.traceback_text)
    hold: float = 0.0  # seconds the queue takes no job after this one, in every process

    @property
    def stored(self) -> str:
        return st.PENDING if self.retry_in is not None else self.status


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
