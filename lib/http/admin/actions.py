"""The forms of the queues and failures pages: pause and resume a queue, retry failures."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from lib.http.admin.filters import BadFilter, parse_id, readable
from lib.http.admin.render import PREFIX, done, ids_text, present, when
from lib.http.web import Request, Response
from lib.operate.queue_state import pause, resume, scale
from lib.operate.redrive import redrive

log = logging.getLogger("jobs.admin")

MAX_PAUSE_MINUTES = 525600  # a year, as the CLI


def scale_queue(db: Any, request: Request, operator: str, concurrency: Mapping[str, int]) -> Response:
    """Set a queue's concurrency for every worker, up to its definition's (a
    queue this worker runs: the definition is here), or back to it."""
    queue, asked = request.field("queue") or "", (request.field("concurrency") or "").strip()
    readable({"queue": queue})
    back = f"{PREFIX}/queue?{urlencode({'queue': queue})}"
    most = concurrency.get(queue)
    if most is None:
        return done(back, f"nothing done: this worker does not run {queue!r}; scale it where it runs, or with the CLI")
    # ASCII digits alone: int() refuses "²", which str.isdigit takes, and thousands of digits.
    whole = asked.isascii() and asked.isdigit() and len(asked) <= 6
    to = None if asked in ("", "default") else int(asked) if whole else 0
    if to is not None and not 1 <= to <= most:
        return done(back, f"nothing done: {queue} runs from 1 to {most} jobs at once (its definition's concurrency)")
    scale(db, queue, to, f"admin {operator}")
    log.info("admin scaled queue=%s to %s by %s", queue, to or "its definition's", operator)
    return done(back, f"{queue} runs {to or most} at a time in every worker's next claim")


def retry_failures(db: Any, request: Request) -> Response:
    """Retry the failures chosen on the failures page: by id, or all of a queue or name."""
    queue, name = request.field("queue"), request.field("name")
    readable({"queue": queue, "name": name})
    given = request.form().get("id", [])
    ids = [i for i in map(parse_id, given) if i is not None]
    if len(ids) != len(given):
        raise BadFilter("id: a job id is a whole number")
    back = f"{PREFIX}/failures" + (f"?{urlencode(present(queue=queue, name=name))}" if queue or name else "")
    if ids:
        result = redrive(db, ids=ids)
    elif queue or name:
        result = redrive(db, queue=queue, name=name)
    else:
        # redrive refuses it too: a slip must not retry every failure ever kept.
        return done(back, "choose jobs, or filter by queue or name, to retry a set")
    log.info("admin retried %s (queue=%s name=%s): %s", ids or "a set", queue, name, result.redriven)
    message = f"retried {len(result.redriven)} jobs" + (f": {ids_text(result.redriven)}" if result.redriven else "")
    if result.skipped:
        message += f"; skipped {len(result.skipped)}: " + "; ".join(f"{i}: {w}" for i, w in result.skipped.items())
    # Back to the page the button was on (a job's page, say), never to another site.
    asked = request.field("back")
    return done(asked if asked and asked.startswith(f"{PREFIX}/") else back, message)


def _back(request: Request) -> str:
    """The page the form was on (a queue's page, say), never another site."""
    asked = request.field("back")
    return asked if asked and asked.startswith(f"{PREFIX}/") else f"{PREFIX}/"


def pause_queue(db: Any, queue: str, request: Request, operator: str, *, pausable: Collection[str]) -> Response:
    """Pause a queue for the minutes given (none: until resumed), with a
    reason, which the pause keeps with who paused it. Only a queue a worker
    runs, or would run (registered and on): a pause of a queue nothing runs
    would say it holds something it does not."""
    readable({"queue": queue})
    back = _back(request)
    if queue not in pausable:
        return done(back, f"not paused: no live worker runs {queue}, and it is no registered queue that is on")
    reason = request.field("reason")
    if reason is None or not reason.strip() or not reason.isprintable():
        return done(back, f"not paused: {queue} needs a reason an operator can read")
    minutes_text = request.field("minutes")
    until = None
    if minutes_text is not None and minutes_text.strip():
        try:
            minutes = float(minutes_text)
        except ValueError:
            minutes = -1.0
        if not 0 < minutes <= MAX_PAUSE_MINUTES:
            return done(back, f"not paused: minutes above 0, at most {MAX_PAUSE_MINUTES}")
        until = datetime.now(UTC) + timedelta(minutes=minutes)
    pause(db, queue, f"{reason} ({operator}, admin page)", until)
    log.info("admin paused queue=%s until %s by %s: %s", queue, until or "resumed", operator, reason)
    return done(back, f"paused {queue} until {when(until) if until else 'resumed'}: {reason}")


def resume_queue(db: Any, queue: str, request: Request, operator: str) -> Response:
    readable({"queue": queue})
    resumed = resume(db, queue)
    log.info("admin resumed queue=%s by %s", queue, operator)
    return done(_back(request), f"resumed {queue}" if resumed else f"{queue} was not paused")
