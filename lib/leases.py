"""Leases on started rows: this process renews the rows it runs, and takes back
(rescues) rows whose worker stopped renewing them, wherever that worker was.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable

from gevent.event import Event

from lib.db import DB
from lib.errors import Outage
from lib.sql import Q

log = logging.getLogger("jobs.leases")

# How long a claim holds without renewal. A worker that dies leaves its rows
# for at most this long (plus one rescue period) before another takes them.
LEASE_SECONDS = 30.0

# One identity per process, written on each row it claims.
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Leases:
    def __init__(
        self,
        db: DB,
        running_ids: Callable[[], Iterable[int]],
        *,
        worker_id: str = WORKER_ID,
        lease: float = LEASE_SECONDS,
        legacy_age: float = 660.0,
    ) -> None:
        self.db = db
        self.running_ids = running_ids
        self.worker_id = worker_id
        self.lease = lease
        # Rows claimed before leases existed carry none; they are taken once
        # older than the longest job timeout plus a margin.
        self.legacy_age = legacy_age
        self.outage = Outage("leases")

    def heartbeat(self) -> int:
        """Renew the rows this process is running now (never a row whose
        outcome it failed to write: that one must be rescued)."""
        ids = sorted(self.running_ids())
        if not ids:
            return 0
        return self.db.exec(Q.job_heartbeat, {"lease": self.lease, "worker_id": self.worker_id, "ids": ids})

    def rescue(self, legacy_age: float | None = None) -> list[tuple[int, str, str, str]]:
        age = self.legacy_age if legacy_age is None else legacy_age
        rows = self.db.query(Q.job_rescue, {"legacy_age": age})
        for job_id, queue, name, status in rows:
            log.warning("queue=%s job=%s id=%d rescued from a lost worker: %s", queue, name, job_id, status)
        for queue in {r[1] for r in rows}:
            # The lost worker held the queue's slot; whoever runs the queue may go on.
            self.db.exec(Q.queue_notify, {"queue": queue})
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def run(self, stop: Event) -> None:
        """Renew and rescue until stop is set. The first rescue, at start, also
        takes every lease-less row: those belong to the service this replaced."""
        first = True
        period = self.lease / 3
        while not stop.is_set():
            try:
                self.heartbeat()
                self.rescue(0.0 if first else None)
                first = False
                self.outage.recovered()
            except Exception as exc:
                self.outage.failed(exc)
            stop.wait(period)
