"""What every queue that calls a rate-limited API shares: a queue with no
token is off; what an API's error does to the job is its client's outcome
table (lib/clients/base.py, Outcome): a rate limit sends the job back until
the limit resets; a rejected token pauses the queue for an hour (one report
an hour, not one per job); bad input fails the job, unreported; a transient
fault (a 5xx, a timeout, a reset) sends it back with backoff, counted, one
report per run of failures; anything else is a fault (err, reported). A
request that gets no answer and is not safe to send twice, or whose answer
says it may have been carried out, ends the job, final, with OutcomeUnknown.
And the throttle that keeps the queue inside its limit."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from lib import status
from lib.clients.base import (
    MAX_WAIT,
    APIClient,
    InvalidArgument,
    NotConfigured,
    Outcome,
    OutcomeUnknown,
)
from lib.db import DB
from lib.errors import Outage, capture, describe
from lib.poller import Handler, PendingJob, Poller, Snooze
from lib.queue_state import AUTH_PREFIX
from lib.retry import backoff
from lib.sql import Q

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
# Waits a job sits out at a limit that asks for exponential backoff (GitHub's
# secondary limits: 1, 2, 4, 8, 16 minutes); met once more, it ends the job.
SECONDARY_TRIES = 5
SECONDARY = "secondary limit"

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
    client_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> Poller:
    """The queue's Poller, with client, else one of client_class built from
    token and base_url (the worker's settings: queues.registry); off (with the
    reason) when the token is not set or cannot be sent (the client refuses
    it when built: see NotConfigured)."""
    disabled_reason = None
    if client is None:
        try:
            client = client_class(token, base_url=base_url, **(client_options or {}))
        except NotConfigured as exc:
            disabled_reason = str(exc)
    outage = Outage(f"queue {queue}'s API")
    dispatch: dict[str, Handler] = {
        name: _guard(queue, db, client, handler, now, outage, transient_attempts) for name, handler in handlers.items()
    }
    return Poller(queue, db, dispatch, throttle=throttle, disabled_reason=disabled_reason, **options)


def _guard(
    queue: str, db: DB, client: Any, handler: ApiHandler, now: Callable[[], datetime], outage: Outage, attempts: int
) -> Handler:
    def run(job: PendingJob) -> str:
        try:
            result = handler(db, client, job)
        except InvalidArgument as exc:
            # The job's args cannot make a safe request (a '..' for a GitHub
            # owner, say): nothing was sent, and a retry sends nothing either.
            # The input is at fault, not the worker: a fail, not reported.
            return status.fail(str(exc))
        except Exception as exc:
            return _answer(queue, db, client, job, exc, now, outage, attempts)
        outage.recovered()
        return result

    return run


def _answer(
    queue: str,
    db: DB,
    client: Any,
    job: PendingJob,
    exc: Exception,
    now: Callable[[], datetime],
    outage: Outage,
    attempts: int,
) -> str:
    """What the job becomes for an error its handler raised, by the
    client's outcome table: a status, a Snooze, or the error raised again
    (a fault: err, reported)."""
    if isinstance(client, APIClient) and client.answered_unknown(exc):
        raise _outcome_unknown(exc, "the answer says the request may have been carried out")
    outcome = client.outcome(exc) if isinstance(client, APIClient) else None
    if outcome is None and _is_network_failure(exc):
        if not client.may_repeat(exc):
            raise _outcome_unknown(exc, "the request was sent and no answer came back")
        outcome = Outcome.TRANSIENT
    if outcome is not Outcome.TRANSIENT:
        outage.recovered()
    if outcome is Outcome.BAD_INPUT:
        return status.fail(str(exc))
    if outcome is Outcome.RATE_LIMIT:
        raise _rate_limited(db, job, exc, now)
    if outcome is Outcome.BAD_TOKEN:
        until = now() + AUTH_PAUSE
        if db.query_row(Q.queue_pause_once, {"queue": queue, "until": until, "reason": f"{AUTH_PREFIX}{exc}"}):
            log.error("queue=%s paused for %s: %s", queue, AUTH_PAUSE, exc)
            capture(exc, message="API rejected the token; queue paused", queue=queue, job=job.name)
        # The job itself is not at fault: it runs when the pause ends.
        raise Snooze(AUTH_PAUSE.total_seconds(), status.skip(f"token rejected, queue paused: {exc}")) from exc
    if outcome is Outcome.TRANSIENT:
        tries = _tries(db, job, TRANSIENT) + 1
        if tries < attempts:
            outage.failed(exc, queue=queue)
            wait = max(_wait(exc, now, default=0.0), backoff(tries, base=TRANSIENT_BASE, cap=TRANSIENT_CAP))
            raise Snooze(wait, status.skip(f"{TRANSIENT} (try {tries} of {attempts}), again in {wait:.0f}s: {exc}"))
    raise exc


def _outcome_unknown(exc: Exception, what: str) -> OutcomeUnknown:
    """The error that ends the job when the request may have been carried
    out: final (the poller does not retry it), reported once."""
    unknown = OutcomeUnknown(f"{what} ({describe(exc)})")
    unknown.__cause__ = exc
    return unknown


def _is_network_failure(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, requests.RequestException)


def _rate_limited(db: DB, job: PendingJob, exc: Exception, now: Callable[[], datetime]) -> BaseException:
    """The Snooze for a rate limit; for one the API asks to back off from
    exponentially (backoff_from), longer each time it is met in a row, and
    the error itself once it has been met SECONDARY_TRIES times."""
    wait = _wait(exc, now)
    detail = str(exc)
    backoff_from = getattr(exc, "backoff_from", None)
    if backoff_from is not None:
        tries = _tries(db, job, SECONDARY) + 1
        if tries > SECONDARY_TRIES:
            return exc
        wait = max(wait, backoff_from.total_seconds() * 2 ** (tries - 1))
        wait = min(wait, MAX_WAIT.total_seconds())
        detail = f"{SECONDARY} (try {tries} of {SECONDARY_TRIES}): {exc}"
    snooze = Snooze(wait, status.rate_limited(wait, detail))
    snooze.__cause__ = exc
    return snooze


def _wait(exc: BaseException, now: Callable[[], datetime], default: float = DEFAULT_RESET) -> float:
    """Seconds until the error's reset_at (retry-after and the like), else default."""
    reset_at = getattr(exc, "reset_at", None)
    wait = (reset_at - now()).total_seconds() if reset_at else default
    # The clients bound reset_at by their own clock; bound the wait by ours
    # too, so no client can park a job (and its queue) for long.
    return min(max(wait, 0.0), MAX_WAIT.total_seconds())


def _tries(db: DB, job: PendingJob, what: str) -> int:
    """How many times in a row the job came back for `what`, read from the
    status it last came back with: a Snooze does not count an attempt, so
    the count travels in that status."""
    row = db.query_row(Q.job_last_error, {"id": job.id})
    found = re.search(re.escape(what) + r" \(try (\d+) of \d+\)", (row[0] or "") if row else "")
    return int(found.group(1)) if found else 0


def throttle_for(per_minute: float) -> Callable[[str, BaseException | None, float], float]:
    """A throttle that spaces jobs to per_minute and, after a rate-limited
    status, waits until the limit resets. Pure: no clock."""
    min_job_time = 60.0 / per_minute

    def throttle(status_: str, error: BaseException | None, elapsed: float) -> float:
        reset = status.rate_limit_wait(status_)
        if reset is not None:
            return max(reset, min_job_time - elapsed)
        return max(0.0, min_job_time - elapsed)

    return throttle
