"""What every queue that calls a rate-limited API shares: a queue with no
token is off; what an API's error does to the job is its client's outcome
table (lib/clients/outcomes.py, Outcome): a rate limit holds the queue until
the limit resets, in every process, with the job first in line; a rejected
token pauses the queue for an hour (one report an hour, not one per job);
bad input fails the job, unreported; a transient fault (a 5xx, a timeout, a
reset) sends it back with backoff, counted, one report per run of failures; anything else is a fault (err, reported). A
request that gets no answer and is not safe to send twice, or whose answer
says it may have been carried out, ends the job, final, with OutcomeUnknown.
And the throttle that keeps the queue inside its limit."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lib.clients import limits
from lib.clients.api_errors import InvalidArgument, NotConfigured, OutcomeUnknown
from lib.clients.base import APIClient
from lib.clients.outcomes import Outcome
from lib.clients.resets import MAX_WAIT
from lib.job import Handler, PendingJob, Snooze, status
from lib.job.text import describe
from lib.run.queue import AUTH_PREFIX, Queue
from lib.setup.error_reports import Outage, capture, reported
from lib.store.db import DB
from lib.store.retry_backoff import backoff
from lib.store.sql import Q

log = logging.getLogger("jobs.api")

AUTH_PAUSE = timedelta(hours=1)
# When an API says "slow down" without saying until when.
DEFAULT_RESET = 60.0
# Tries a job makes at a transient fault (a 5xx, a timeout, a reset), by
# default: the last one that fails ends it (err, reported). The waits between
# grow from TRANSIENT_BASE to TRANSIENT_CAP, with jitter, or retry-after.
TRANSIENT_ATTEMPTS = 5
TRANSIENT_BASE = 10.0
TRANSIENT_CAP = 600.0
TRANSIENT = "transient fault"
# A rate limit met again and again: each wait is the API's own (retry-after,
# a reset; the clients fill in the documented minimum where it names none,
# else DEFAULT_RESET), and at least twice the wait before it. A job that has
# waited RATE_LIMIT_BUDGET at limits in a row and is limited once more ends
# (err, reported): a limit that never lifts is a person's to look at. The
# first wait is always the API's word, however long (a daily window).
RATE_LIMIT_BUDGET = timedelta(minutes=30)

ApiHandler = Callable[[DB, Any, PendingJob], str]


def make_api_worker(
    queue: str,
    db: DB,
    client: APIClient | None,
    client_class: type[APIClient],
    handlers: Mapping[str, ApiHandler],
    throttle: Callable[[str, BaseException | None, float], float],
    *,
    token: str | None = None,
    base_url: str | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    transient_attempts: int = TRANSIENT_ATTEMPTS,
    rate_limit_budget: timedelta = RATE_LIMIT_BUDGET,
    client_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> Queue:
    """The queue's definition, with client, else one of client_class built from
    token and base_url (the worker's settings: queues.registry); off (with the
    reason) when the token is not set or cannot be sent (the client refuses
    it when built: see NotConfigured)."""
    disabled_reason = None
    if client is None:
        try:
            client = client_class(token, base_url=base_url, **(client_options or {}))
        except NotConfigured as exc:
            disabled_reason = str(exc)
    policy = _Policy(queue, db, client, now, Outage(f"queue {queue}'s API"), transient_attempts, rate_limit_budget)
    dispatch: dict[str, Handler] = {name: _guard(policy, handler) for name, handler in handlers.items()}
    return Queue(queue, dispatch, throttle=throttle, disabled_reason=disabled_reason, **options)


@dataclass(frozen=True)
class _Policy:
    """What one API queue does with its handlers' errors (make_api_worker)."""

    queue: str
    db: DB
    client: Any
    now: Callable[[], datetime]
    outage: Outage
    transient_attempts: int
    rate_limit_budget: timedelta


def _guard(policy: _Policy, handler: ApiHandler) -> Handler:
    def run(job: PendingJob) -> str:
        left: dict[str, int] = {}
        try:
            with limits.telling(left):
                result = handler(policy.db, policy.client, job)
        except InvalidArgument as exc:
            # The job's args cannot make a safe request (a '..' for a GitHub
            # owner, say): nothing was sent, and a retry sends nothing either.
            # The input is at fault, not the worker: a fail, not reported.
            return status.fail(str(exc))
        except Exception as exc:
            # What the API said is left (a 429: nothing until the reset)
            # holds the queue's budgets in every process.
            job.limits_left(**left)
            return _answer(policy, job, exc)
        job.limits_left(**left)
        policy.outage.recovered()
        return result

    return run


def _answer(policy: _Policy, job: PendingJob, exc: Exception) -> str:
    """What the job becomes for an error its handler raised, by the
    client's outcome table: a status, a Snooze, or the error raised again
    (a fault: err, reported)."""
    client = policy.client
    if isinstance(client, APIClient) and client.answered_unknown(exc):
        raise _outcome_unknown(exc, "the answer says the request may have been carried out")
    outcome = client.outcome(exc) if isinstance(client, APIClient) else None
    if outcome is None and _is_network_failure(exc):
        if not client.may_repeat(exc):
            raise _outcome_unknown(exc, "the request was sent and no answer came back")
        outcome = Outcome.TRANSIENT
    if outcome is not Outcome.TRANSIENT:
        policy.outage.recovered()
    if outcome is Outcome.BAD_INPUT:
        return status.fail(str(exc))
    if outcome is Outcome.RATE_LIMIT:
        raise _rate_limited(policy, job, exc)
    if outcome is Outcome.BAD_TOKEN:
        raise _paused(policy, job, exc)
    if outcome is Outcome.TRANSIENT:
        raise _transient(policy, job, exc)
    raise exc


def _paused(policy: _Policy, job: PendingJob, exc: Exception) -> Snooze:
    """Pause the queue for AUTH_PAUSE, reported once; the job itself is not
    at fault: it runs when the pause ends."""
    until = policy.now() + AUTH_PAUSE
    if policy.db.query_row(
        Q.queue_pause_once, {"queue": policy.queue, "until": until, "reason": f"{AUTH_PREFIX}{exc}"}
    ):
        log.error("queue=%s paused for %s: %s", policy.queue, AUTH_PAUSE, exc)
        capture(exc, message="API rejected the token; queue paused", queue=policy.queue, job=job.name)
    snooze = Snooze(AUTH_PAUSE.total_seconds(), status.skip(f"token rejected, queue paused: {exc}"))
    snooze.__cause__ = exc
    return snooze


def _transient(policy: _Policy, job: PendingJob, exc: Exception) -> BaseException:
    """The Snooze for a transient fault, with backoff, until the queue's
    tries are spent; then the error itself. Either way the run of failures
    is reported once (policy.outage), so the job it ends is not reported again."""
    policy.outage.failed(exc, queue=policy.queue)
    reported(exc)
    tries = _transient_tries(policy.db, job) + 1
    if tries >= policy.transient_attempts:
        return exc
    wait = max(_wait(exc, policy.now, default=0.0), backoff(tries, base=TRANSIENT_BASE, cap=TRANSIENT_CAP))
    snooze = Snooze(
        wait, status.skip(f"{TRANSIENT} (try {tries} of {policy.transient_attempts}), again in {wait:.0f}s: {exc}")
    )
    snooze.__cause__ = exc
    return snooze


def _outcome_unknown(exc: Exception, what: str) -> OutcomeUnknown:
    """The error that ends the job when the request may have been carried
    out: final (the poller does not retry it), reported once."""
    unknown = OutcomeUnknown(f"{what} ({describe(exc)})")
    unknown.__cause__ = exc
    return unknown


def _is_network_failure(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, requests.RequestException)


def _rate_limited(policy: _Policy, job: PendingJob, exc: Exception) -> BaseException:
    """The Snooze for a rate limit (see RATE_LIMIT_BUDGET): the API's wait,
    else DEFAULT_RESET, and at least twice the last wait when the job was
    limited last time too; the error itself once the waits in a row have
    reached the budget."""
    tries, waited, last = _rate_limit_run(policy.db, job)
    if tries and waited >= policy.rate_limit_budget.total_seconds():
        return exc
    wait = min(max(_wait(exc, policy.now), 2 * last), MAX_WAIT.total_seconds())
    detail = f"try {tries + 1}, {waited + wait:.0f}s in a row: {exc}" if tries else str(exc)
    # The limit is the API key's, so the queue's: every process waits it out,
    # and this job stays the queue's next.
    snooze = Snooze(wait, status.rate_limited(wait, detail), hold_queue=True)
    snooze.__cause__ = exc
    return snooze


def _wait(exc: BaseException, now: Callable[[], datetime], default: float = DEFAULT_RESET) -> float:
    """Seconds until the error's reset_at (retry-after and the like), else default."""
    reset_at = getattr(exc, "reset_at", None)
    wait = (reset_at - now()).total_seconds() if reset_at else default
    # The clients bound reset_at by their own clock; bound the wait by ours
    # too, so no client can park a job (and its queue) for long.
    return min(max(wait, 0.0), MAX_WAIT.total_seconds())


def _last_status(db: DB, job: PendingJob) -> str:
    """The status the job last came back with: a Snooze does not count an
    attempt, so the count of tries in a row travels in that status."""
    row = db.query_row(Q.job_last_error, {"id": job.id})
    return (row[0] or "") if row else ""


def _transient_tries(db: DB, job: PendingJob) -> int:
    """How many transient faults in a row the job has met."""
    found = re.search(re.escape(TRANSIENT) + r" \(try (\d+) of \d+\)", _last_status(db, job))
    return int(found.group(1)) if found else 0


def _rate_limit_run(db: DB, job: PendingJob) -> tuple[int, float, float]:
    """The rate limits in a row the job has met: how many, the seconds waited
    for them in all, and the last wait; (0, 0, 0) when it last came back for
    anything else. The first of a run says only its wait."""
    last = _last_status(db, job)
    wait = status.rate_limit_wait(last)
    if wait is None:
        return 0, 0.0, 0.0
    found = re.search(r"resets in \d+s: try (\d+), (\d+)s in a row: ", last)
    return (int(found.group(1)), float(found.group(2)), wait) if found else (1, wait, wait)


def throttle_for(per_minute: float | None) -> Callable[[str, BaseException | None, float], float]:
    """A throttle that spaces jobs to per_minute (None: not at all, for a
    queue whose Rate spaces them across processes) and, after a rate-limited
    status, waits until the limit resets. Pure: no clock."""
    min_job_time = 0.0 if per_minute is None else 60.0 / per_minute

    def throttle(status_: str, error: BaseException | None, elapsed: float) -> float:
        reset = status.rate_limit_wait(status_)
        if reset is not None:
            return max(reset, min_job_time - elapsed)
        return max(0.0, min_job_time - elapsed)

    return throttle
