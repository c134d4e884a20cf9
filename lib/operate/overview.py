"""What every worker is doing, read from the jobs table and the small tables
beside it (job_queues, workers): the operator's status command and /metrics.

Each query reads jobs only through a partial index (see sql/stats.sql), so a
status check stays cheap with millions of finished rows kept for retention.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.background.worker_registry import ALIVE_PERIODS
from lib.job import status
from lib.store.sql import Q

# The outcomes counted, in the order they are shown.
OUTCOMES = (status.Kind.OK, status.Kind.FAIL, status.Kind.SKIP, status.Kind.ERR)


@dataclass(frozen=True)
class QueueStats:
    queue: str
    pending: int  # all pending rows
    due: int  # pending with run_at <= now()
    delayed: int  # pending with run_at > now()
    running: int  # started rows
    oldest_due_age_s: float | None  # now() - min(run_at) over due rows
    done_1h: dict[str, int]  # finished in the last hour by kind: "ok", "fail", "skip", "err" (all four)
    retrying: int  # pending rows with attempts > 0 (back after a failure or a rescue)
    paused_until: datetime | None  # datetime.max (UTC) for a pause until resumed
    pause_reason: str | None
    throttled_until: datetime | None  # job_queues.next_claim_at when in the future
    scaled_to: int | None = None  # the concurrency set at run time (`scale`); None: the definition's
    scaled_by: str | None = None
    keys: int = 0  # keys (insert's key=) with pending or started rows
    # Set when the pending rows were counted only up to this many (a page's
    # share of its row budget): pending, due, delayed, retrying and keys are
    # then at least what they say, and due is exact while under it.
    counted_to: int | None = None
    cancelling: int = 0  # started rows an operator asked to cancel, their workers stopping them
    waiting: int = 0  # delayed rows that wait for other jobs to end (insert's after=)


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    started_at: datetime
    last_seen: datetime
    queues: list[str]
    alive: bool  # last_seen within a few of its lease periods
    holding: int  # started rows whose worker_id is this id


def queue_stats(db: Any, queues: Iterable[str] = (), rows: int | None = None) -> list[QueueStats]:
    """Every queue with pending, started or recently finished rows or
    job_queues state, plus the names given (with zeros when they have none),
    sorted by name. A queue whose only rows finished over an hour ago is not
    found unless named: finding it would read every finished row. With rows,
    the pending rows read stop near that many in all, shared evenly among the
    queues that have some (see counted_to); without, every one is counted."""
    found_rows = db.query(Q.queue_stats, {"queues": sorted(set(queues)), "rows": rows})
    found = [
        QueueStats(
            queue=queue,
            pending=pending,
            due=due,
            delayed=pending - due,
            running=running,
            oldest_due_age_s=oldest,
            done_1h=_by_kind(done),
            retrying=retrying,
            paused_until=paused_until,
            pause_reason=pause_reason,
            throttled_until=throttled_until,
            scaled_to=scaled_to,
            scaled_by=scaled_by,
            keys=keys,
            counted_to=counted_to,
            cancelling=cancelling,
            waiting=waiting,
        )
        for (
            queue,
            pending,
            due,
            running,
            cancelling,
            oldest,
            done,
            retrying,
            paused_until,
            pause_reason,
            throttled_until,
            scaled_to,
            scaled_by,
            keys,
            counted_to,
            waiting,
        ) in found_rows
    ]
    return sorted(found, key=lambda s: s.queue)


def _by_kind(by_prefix: dict[str, int]) -> dict[str, int]:
    """Counts by status prefix (what precedes ": ", or a bare "ok") as counts
    by kind of lib.job.status. A prefix outside the vocabulary (a status written
    by hand) is counted as err: it is a fault for someone to look at."""
    counts = {str(k): 0 for k in OUTCOMES}
    for prefix, n in by_prefix.items():
        kind = status.Kind(prefix) if prefix in iter(status.Kind) else status.Kind.ERR
        counts[kind if kind in OUTCOMES else status.Kind.ERR] += n
    return counts


def workers(db: Any, *, now: datetime | None = None) -> list[WorkerInfo]:
    """The registered workers seen lately (alive), and the others still named
    by started rows (dead, until their rows are rescued), oldest start first."""
    rows = db.query(Q.worker_list, {"now": now, "periods": ALIVE_PERIODS})
    return [
        WorkerInfo(id=i, host=h, pid=p, started_at=s, last_seen=seen, queues=list(q), alive=a, holding=n)
        for i, h, p, s, seen, q, a, n in rows
    ]


# job_get's columns, in its order.
JOB_COLUMNS = (
    *("id", "queue", "name", "status", "args", "priority", "run_at", "attempts", "max_attempts"),
    *("last_error", "callsite", "worker_id", "slot", "lease_until", "dedupe"),
    *("created_at", "started_at", "finished_at", "last_traceback", "attempt_errors", "key", "cancel_requested"),
)


def job(db: Any, job_id: int) -> dict[str, Any] | None:
    """One job, every column (args included: only for a person who asked), or None."""
    row = db.query_row(Q.job_get, {"id": job_id})
    if row is None:
        return None
    found = dict(zip(JOB_COLUMNS, row, strict=True))
    # Each attempt's error, oldest first (migration 025); [] for a job none failed.
    found["attempt_errors"] = found["attempt_errors"] or []
    return found


# The steps a job's page and `show` list, the first stored first.
STEPS_SHOWN = 100


@dataclass(frozen=True)
class JobSteps:
    """A job's steps (PendingJob.step) as stored: the first STEPS_SHOWN, each
    (name, stored_at, result), and how many there are."""

    listed: list[tuple[str, datetime, Any]]
    total: int


def job_steps(db: Any, job_id: int) -> JobSteps:
    rows = db.query(Q.job_steps_listed, {"id": job_id, "limit": STEPS_SHOWN})
    return JobSteps([(name, at, result) for name, at, result, _ in rows], rows[0][3] if rows else 0)


@dataclass(frozen=True)
class JobWaits:
    """A job's waits now (insert's after=): the jobs it waits for that have
    not ended, and the jobs that wait for it, each (id, status), at most
    STEPS_SHOWN of each."""

    waits_for: list[tuple[int, str | None]]
    waited_by: list[tuple[int, str | None]]


def job_waits(db: Any, job_id: int) -> JobWaits:
    rows = db.query(Q.job_waits_listed, {"id": job_id, "limit": STEPS_SHOWN})
    return JobWaits([(i, s) for mine, i, s in rows if mine], [(i, s) for mine, i, s in rows if not mine])


def age(seconds: float | None) -> str:
    """A duration as a person reads it: 42s, 3m12s, 2h05m, 3d04h; "-" for none."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def unrun_queues(db: Any, registered: Iterable[str]) -> list[tuple[str, int]]:
    """(queue, due pending rows) of each queue with due rows that is none of
    the registered ones: a typo in an enqueue, or a queue taken out of the
    registry with rows left."""
    return [(q, n) for q, n in db.query(Q.queue_unrun, {"registered": sorted(registered)})]


def unrun_line(unrun: Iterable[tuple[str, int]]) -> str:
    """The one line that names them, for the worker's log and status."""
    return "queues no worker runs: " + ", ".join(f"{q} ({n} pending)" for q, n in unrun)
