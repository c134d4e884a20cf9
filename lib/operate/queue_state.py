"""Pause and resume a queue for every worker process."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from lib.store.sql import Q

log = logging.getLogger("jobs.queue_state")


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


def logger(queues: Collection[str]) -> Callable[[str], None]:
    """For the worker's listener: log each pause and resume (of any worker's
    doing, or an operator's) of the queues this worker runs, so its log says
    why a queue stopped and started."""

    def said(payload: str) -> None:
        try:
            change = json.loads(payload)
            queue, event = change["queue"], change["event"]
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable queue state notification: %.200r", payload)
            return
        if queue not in queues:
            return
        if event == "paused":
            until = "resumed" if str(change.get("until")).startswith("infinity") else change.get("until")
            log.info("queue=%s paused until %s: %s", queue, until, change.get("reason"))
        else:
            log.info("queue=%s %s", queue, event)

    return said
