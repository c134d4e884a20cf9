"""The caches queue: housekeeping of cache_entries. No external API, so no throttle."""

from __future__ import annotations

from lib.job import PendingJob, status
from lib.run.queue import Queue
from lib.store.db import DB
from lib.store.sql import Q

BATCH = 1000


def age(db: DB, batch: int = BATCH) -> str:
    """Delete expired entries, a batch at a time."""
    deleted = db.exec_in_batches(Q.cache_delete_expired, {"batch": batch})
    return status.ok(f"deleted {deleted}") if deleted else status.skip("nothing expired")


def make_worker(db: DB) -> Queue:
    def handle_age(job: PendingJob) -> str:
        return age(db)

    return Queue("caches", {"caches.Age": handle_age})
