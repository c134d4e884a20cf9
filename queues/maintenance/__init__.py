"""The maintenance queue: retention of finished job rows, and of the worker
registry's rows. No external API, no throttle.

Finished rows are kept JOBS_RETENTION_DAYS (14 by default) for the operator:
`worker.py failed`, `show`, redrive and the admin page read them.
"""

from __future__ import annotations

import logging

from lib.background import worker_registry
from lib.job import PendingJob, status
from lib.run.queue import Queue
from lib.setup.settings import DEFAULT_RETENTION_DAYS
from lib.store.db import DB
from lib.store.sql import Q

log = logging.getLogger("jobs.maintenance")

BATCH = 1000


def clean_up_jobs(db: DB, days: int = DEFAULT_RETENTION_DAYS, batch: int = BATCH) -> str:
    if days < 1:
        raise ValueError(f"retention must be at least a day, got {days}")
    # Batch by batch, each a short transaction of its own, each starting at
    # the newest finished_at the last one deleted (sql/jobs.sql says why).
    deleted, after = 0, None
    while True:
        n, after = db.query_row(Q.job_delete_finished, {"days": days, "batch": batch, "after": after})
        deleted += n
        if n < batch:
            break
    log.info("deleted %d finished jobs older than %d days", deleted, days)
    return status.ok(f"deleted {deleted}") if deleted else status.skip("nothing old enough")


def clean_up(db: DB, days: int = DEFAULT_RETENTION_DAYS) -> str:
    """The daily clean-up: finished rows older than days, then workers unseen for a day."""
    done = clean_up_jobs(db, days)
    forgotten = worker_registry.forget_gone(db)
    if not forgotten:
        return done
    log.info("forgot %d workers unseen for a day", forgotten)
    return status.ok(f"{status.detail(done)}; forgot {forgotten} workers unseen for a day")


def make_worker(db: DB, retention_days: int = DEFAULT_RETENTION_DAYS) -> Queue:
    """The queue, keeping finished rows retention_days (the settings', bound by queues.registry)."""

    def handle(job: PendingJob) -> str:
        return clean_up(db, retention_days)

    return Queue(
        "maintenance", {"maintenance.CleanUpJobs": handle}, job_timeout=3600, dedupe={"maintenance.CleanUpJobs"}
    )
