"""Rows this poller hands back without an outcome: a job it claimed but will
not run (claimed at shutdown, or of a name another worker handles), and the
word to other workers that its queue's slot is free."""

from __future__ import annotations

import logging

from lib.background.leases import Leases
from lib.job import PendingJob
from lib.store.db import DB
from lib.store.driver_errors import is_database_error
from lib.store.sql import Q

log = logging.getLogger("jobs")


class Releaser:
    def __init__(self, queue: str, db: DB, leases: Leases) -> None:
        self.queue = queue
        self.db = db
        self.leases = leases
        # Job names given back to the workers that handle them, said once each.
        self._left_names: set[str] = set()

    def release(self, job: PendingJob) -> None:
        """A job claimed at shutdown goes back to pending, uncounted."""
        try:
            self._release(job)
        except Exception as exc:
            # The lease runs out and the rescue takes the row back instead.
            log.warning("queue=%s id=%d claimed at shutdown, not given back: %s", self.queue, job.id, exc)

    def give_back(self, job: PendingJob) -> None:
        """A job of a name this worker does not handle and a live worker does
        goes back to pending, uncounted and in its place, for that worker."""
        if job.name not in self._left_names:
            self._left_names.add(job.name)
            log.info("queue=%s job=%s is left to the workers that handle it (this one does not)", self.queue, job.name)
        try:
            self._release(job)
        except Exception as exc:
            if not is_database_error(exc):
                raise
            # The lease runs out and the rescue takes the row back instead.
            log.warning("queue=%s id=%d not given back: %s", self.queue, job.id, exc)
            return
        # A worker that handles it may be idle until its fallback poll.
        self.hand_over()

    def hand_over(self) -> None:
        """Tell the other workers the queue has a free slot, so one may claim
        now rather than at its next fallback poll."""
        try:
            self.db.exec(Q.queue_notify, {"queue": self.queue})
        except Exception as exc:
            log.info("queue=%s could not tell other workers it is free: %s", self.queue, exc)

    def _release(self, job: PendingJob) -> None:
        self.db.exec(Q.job_release, {"id": job.id, "worker_id": self.leases.worker_id, "attempts": job.attempts})
