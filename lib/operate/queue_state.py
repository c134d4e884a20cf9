"""Pause, resume and scale a queue for every worker process, and declare its rate."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any

from lib.job.rate import Budget, Rate, budget_key, limits_key
from lib.store.driver_errors import is_lock_timeout
from lib.store.sql import Q

log = logging.getLogger("jobs.queue_state")

# How long a rate's declaration may wait on a row another transaction holds.
RATE_LOCK_TIMEOUT_MS = 2000


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


def declare_rate(db: Any, queue: str, rate: Rate | None, budgets: Sequence[Budget] = ()) -> bool:
    """One try at writing the queue's rate and budgets (None and none: it has
    neither) under their key; False when a row it writes was held by another
    transaction past the lock timeout."""
    try:
        with db.transaction() as tx:
            tx.exec(f"SET LOCAL lock_timeout = {RATE_LOCK_TIMEOUT_MS}")
            if rate is None and not budgets:
                tx.exec(Q.rate_clear, {"queues": [queue]})
                return True
            group = limits_key(queue, rate, budgets)
            keys = []
            if rate is not None:
                keys.append(group)
                tx.exec(
                    Q.rate_declare,
                    {"key": group, "spacing": rate.spacing, "burst": rate.burst, "cost": 1, "grp": group},
                )
            for budget in budgets:
                keys.append(budget_key(group, budget.unit))
                row = {"key": keys[-1], "spacing": budget.spacing, "burst": budget.limit, "cost": budget.most}
                tx.exec(Q.rate_declare, row | {"grp": group})
            tx.exec(Q.rate_drop_others, {"grp": group, "keys": keys})
            tx.exec(Q.rate_name, {"queue": queue, "key": group})
    except Exception as exc:
        if is_lock_timeout(exc):
            return False
        raise
    said = [f"rate {rate}" for _ in [rate] if rate is not None] + [f"budget {b}" for b in budgets]
    log.info("queue=%s %s (key %s)", queue, "; ".join(said), group)
    return True
