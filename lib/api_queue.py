"""What every queue that calls a rate-limited API shares: a queue with no
token is off; a rate limit sends the job back until the limit resets; a
rejected token pauses the queue for an hour (one report an hour, not one per
job); and the throttle that keeps the queue inside its limit."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from lib import status
from lib.clients.base import (
    MAX_WAIT,
    APIClient,
    AuthError,
    InvalidArgument,
    NotConfigured,
    OverloadedError,
    RateLimitError,
)
from lib.db import DB
from lib.errors import capture
from lib.poller import Handler, PendingJob, Poller, Snooze
from lib.queue_state import AUTH_PREFIX
from lib.sql import Q

log = logging.getLogger("jobs.api")

AUTH_PAUSE = timedelta(hours=1)
# When an API says "slow down" without saying until when.
DEFAULT_RESET = 60.0

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
    **options: Any,
) -> Poller:
    """The queue's Poller, with client, else one of client_class built from
    token and base_url (the worker's settings: queues.registry); off (with the
    reason) when the token is not set or cannot be sent (the client refuses
    it when built: see NotConfigured)."""
    disabled_reason = None
    if client is None:
        try:
            client = client_class(token, base_url=base_url)
        except NotConfigured as exc:
            disabled_reason = str(exc)
    dispatch: dict[str, Handler] = {name: _guard(queue, db, client, handler, now) for name, handler in handlers.items()}
    return Poller(queue, db, dispatch, throttle=throttle, disabled_reason=disabled_reason, **options)


def _guard(queue: str, db: DB, client: Any, handler: ApiHandler, now: Callable[[], datetime]) -> Handler:
    def run(job: PendingJob) -> str:
        try:
            return handler(db, client, job)
        except InvalidArgument as exc:
            # The job's args cannot make a safe request (a '..' for a GitHub
            # owner, say): nothing was sent, and a retry sends nothing either.
            # The input is at fault, not the worker: a fail, not reported.
            return status.fail(str(exc))
        except (RateLimitError, OverloadedError) as exc:
            wait = (exc.reset_at - now()).total_seconds() if exc.reset_at else DEFAULT_RESET
            # The clients bound reset_at by their own clock; bound the wait
            # by ours too, so no client can park a job (and its queue) for long.
            wait = min(max(wait, 0.0), MAX_WAIT.total_seconds())
            raise Snooze(wait, status.rate_limited(wait, str(exc))) from exc
        except AuthError as exc:
            until = now() + AUTH_PAUSE
            if db.query_row(Q.queue_pause_once, {"queue": queue, "until": until, "reason": f"{AUTH_PREFIX}{exc}"}):
                log.error("queue=%s paused for %s: %s", queue, AUTH_PAUSE, exc)
                capture(exc, message="API rejected the token; queue paused", queue=queue, job=job.name)
            # The job itself is not at fault: it runs when the pause ends.
            raise Snooze(AUTH_PAUSE.total_seconds(), status.skip(f"token rejected, queue paused: {exc}")) from exc

    return run


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
