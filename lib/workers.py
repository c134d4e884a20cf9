"""The worker registry: each worker process writes a row at start (its id,
host, pid and queues), moves last_seen on from its lease keeper while it
runs (in the transaction of each rescue, at least once a lease), and deletes
the row when it stops cleanly. The status command reads it (lib/stats.py) to
show every worker on every host, and which dead ones still hold started
rows; the maintenance queue forgets rows unseen for a day."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from lib.sql import Q

log = logging.getLogger("jobs.workers")

# A worker unseen this long is gone (a host that was cut off for a day writes
# its row again at its next refresh).
FORGET_AFTER_DAYS = 1


def register(db: Any, worker_id: str, queues: Sequence[str], lease: float) -> Callable[..., None]:
    """Write this worker's row; the refresh to call every rescue period (it
    writes the row again if it was forgotten meanwhile), on the runner it is
    given (the lease keeper's rescue transaction) or the pool."""
    row = {
        "id": worker_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "queues": sorted(queues),
        # The database's clock, as for last_seen: hosts' clocks may disagree with it.
        "started_at": db.query_row("SELECT now()")[0],
        "lease": lease,
    }
    db.exec(Q.worker_seen, row)

    def refresh(runner: Any = None) -> None:
        (runner or db).exec(Q.worker_seen, row)

    return refresh


def unregister(db: Any, worker_id: str) -> None:
    """Take a worker that stopped cleanly out of the registry, unless it left
    started rows behind: then it stays listed, as dead, until they are rescued."""
    try:
        db.exec(Q.worker_remove, {"id": worker_id})
    except Exception as exc:  # the database is down at shutdown: the row ages out instead
        log.warning("worker %s left in the registry: %s", worker_id, exc)


def forget_gone(db: Any, days: int = FORGET_AFTER_DAYS) -> int:
    """Delete the rows of workers unseen for days (never one named by a
    started row); how many."""
    return db.exec(Q.worker_forget, {"days": days})
