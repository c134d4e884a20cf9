"""Pause, resume and scale a queue for every worker process."""

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


def scale(db: Any, queue: str, to: int | None, by: str) -> None:
    """Every process runs at most `to` of the queue's jobs at once (None: as
    many as its definition says) from the next claim on; the caller keeps
    `to` within the definition's concurrency, the most a process runs."""
    if to is not None and (isinstance(to, bool) or not isinstance(to, int) or to < 1):
        raise ValueError(f"a queue's concurrency is a whole number, at least 1: {to!r}")
    if not by.strip():
        raise ValueError("a scale needs who set it, for the operators who find it")
    db.exec(Q.queue_scale, {"queue": queue, "to": to, "by": by})


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
        if event == "scaled":
            to = change.get("to") or "its definition's"
            log.info("queue=%s concurrency set to %s by %s", queue, to, change.get("by"))
        elif event == "paused":
            until = "resumed" if str(change.get("until")).startswith("infinity") else change.get("until")
            log.info("queue=%s paused until %s: %s", queue, until, change.get("reason"))
        else:
            log.info("queue=%s %s", queue, event)

    return said
