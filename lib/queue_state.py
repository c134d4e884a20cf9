"""Pause and resume a queue for every worker process."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lib.sql import Q

# Pauses the worker takes by itself after an API rejected a token; a worker
# that starts (after the token was fixed) ends them.
AUTH_PREFIX = "auth: "


def pause(db: Any, queue: str, reason: str, until: datetime | None = None) -> None:
    """No worker claims the queue's jobs until `until` (None: until resumed)."""
    if not reason.strip():
        raise ValueError("a pause needs a reason an operator can read")
    if until is not None and until.tzinfo is None:
        raise ValueError("until must be timezone-aware")
    db.exec(Q.queue_pause, {"queue": queue, "reason": reason, "until": until})


def resume(db: Any, queue: str, *, prefix: str | None = None) -> bool:
    """End the pause (only one whose reason starts with prefix, if given);
    whether there was one."""
    return bool(db.exec(Q.queue_resume, {"queue": queue, "prefix": prefix}))


def paused(db: Any) -> list[tuple[str, str, datetime]]:
    return [(q, r, u) for q, r, u in db.query(Q.queue_paused)]
