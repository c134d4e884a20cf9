"""The queues page's rows: every queue an operator must see, and what runs it.

A queue is listed when a live worker runs it, when it is registered (on or
off: the worker hands the admin page its registry, each queue with why it is
off), or when it has rows or state (sql/stats.sql's queue_stats). Each says
which of these it is, so a queue with rows that nothing runs is marked as
such and offered no pause as if it ran.

The numbers come from queue_stats (pending and started rows through their
partial indexes, the last hour's outcomes through jobs_finished) and from the
per-minute rollup (job_minutes: the rate of the last minutes); the state from
job_queues, and for a queue held by an API's rate limit the status of the job
at its head (jobs_claim).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lib.job import status as st
from lib.operate.overview import QueueStats, WorkerInfo
from lib.store.sql import Q

# The rate is jobs finished a minute over this many rolled-up minutes.
RATE_MINUTES = 15

# The pending rows a queues page reads in all, shared among the queues with
# some: what bounds its cost when every backlog row must be checked in the
# heap (a busy table between vacuums), where counting them all would grow
# with the backlog. A queue past its share shows "N+" (docs/performance.md).
PENDING_ROWS = 20_000

# What runs a queue, as the page marks it.
RUNNING = "running"  # a live worker runs it
OFF = "off"  # registered, off in this worker (no token), and no live worker runs it
IDLE = "idle"  # registered and on, but no live worker runs it (JOBS_QUEUES leaves it out)
UNRUN = "unrun"  # rows or state, and no registered queue nor live worker is it


@dataclass(frozen=True)
class QueueRow:
    stats: QueueStats
    run: str  # RUNNING, OFF, IDLE or UNRUN
    why: str | None  # why it is off
    workers: int  # live workers that run it
    rate: float | None  # finished a minute over the last RATE_MINUTES; None: nothing rolled up
    rate_limited: str | None  # the head job's status while an API's rate limit holds the queue

    @property
    def queue(self) -> str:
        return self.stats.queue

    @property
    def pausable(self) -> bool:
        """A pause means something: a worker runs the queue, or would if it were on here."""
        return self.run in (RUNNING, IDLE)


def rows(
    db: Any,
    stats: Callable[..., Sequence[QueueStats]],
    workers: Sequence[WorkerInfo],
    *,
    registered: Iterable[str],
    off: Mapping[str, str],
    now: datetime,
) -> list[QueueRow]:
    """Every queue to show, by name."""
    running = Counter(q for w in workers if w.alive for q in set(w.queues))
    registered = set(registered) | set(off)
    found = stats(db, sorted(registered | set(running)), rows=PENDING_ROWS)
    names = [s.queue for s in found]
    rates = {
        queue: (finished, minutes)
        for queue, finished, minutes in db.query(
            Q.admin_queue_rates, {"queues": names, "since": now - timedelta(minutes=RATE_MINUTES)}
        )
    }
    # The rollup wrote a row for every queue ('') in each minute it ran.
    rolled = rates.get("", (0, 0))[1]
    throttled = [s.queue for s in found if s.throttled_until is not None]
    limited = dict(db.query(Q.admin_queue_rate_limited, {"queues": throttled})) if throttled else {}
    shown = []
    for s in found:
        if running[s.queue]:
            run = RUNNING
        elif s.queue in off:
            run = OFF
        elif s.queue in registered:
            run = IDLE
        else:
            run = UNRUN
        finished = rates.get(s.queue, (0, 0))[0]
        shown.append(
            QueueRow(
                stats=s,
                run=run,
                why=off.get(s.queue) if run == OFF else None,
                workers=running[s.queue],
                rate=finished / rolled if rolled else None,
                rate_limited=limited.get(s.queue),
            )
        )
    return shown


def rate_limit_text(status: str) -> str:
    """A rate-limited status as the state column says it: its detail after the kind."""
    return status.removeprefix(st.RATE_LIMITED).lstrip(", ") or status
