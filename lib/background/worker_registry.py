"""The worker registry: each worker process writes a row at start (its id,
host, pid, queues and the job names it handles in each), moves last_seen on
from its lease keeper while it runs (in the transaction of each rescue, at
least once a lease), and deletes the row when it stops cleanly. The status command reads it (lib/operate/overview.py) to
show every worker on every host, and which dead ones still hold started
rows; the maintenance queue forgets rows unseen for a day."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lib.store.sql import Q

log = logging.getLogger("jobs.workers")

# A worker refreshes its row at least once a lease (every third of one while
# it runs jobs); one unseen for this many of its leases (three refreshes
# missed) is taken for dead.
ALIVE_PERIODS = 3.0

# A worker unseen this long is gone (a host that was cut off for a day writes
# its row again at its next refresh).
FORGET_AFTER_DAYS = 1


def register(
    db: Any,
    worker_id: str,
    queues: Sequence[str],
    lease: float,
    handles: Iterable[tuple[str, Iterable[str]]] = (),
) -> Callable[..., None]:
    """Write this worker's row; the refresh to call every rescue period (it
    writes the row again if it was forgotten meanwhile), on the runner it is
    given (the lease keeper's rescue transaction) or the pool. handles: each
    poller's (queue, job names), so that another worker leaves it the jobs
    of names it alone handles (handled_elsewhere)."""
    by_queue: dict[str, set[str]] = {}
    for queue, names in handles:
        by_queue.setdefault(queue, set()).update(names)
    row = {
        "id": worker_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "queues": sorted(queues),
        "handles": json.dumps({queue: sorted(names) for queue, names in sorted(by_queue.items())}),
        # The database's clock, as for last_seen: hosts' clocks may disagree with it.
        "started_at": db.query_row("SELECT now()")[0],
        "lease": lease,
    }
    db.exec(Q.worker_seen, row)

    def refresh(runner: Any = None) -> None:
        (runner or db).exec(Q.worker_seen, row)

    return refresh


def handled_elsewhere(db: Any, queue: str, name: str) -> bool:
    """Whether a live worker (alive as the status command reads it) handles
    the job name on the queue. Asked by a worker that does not, so any that
    does is another one: the asker leaves such a job to it instead of ending it."""
    return db.query_row(Q.worker_handles_elsewhere, {"queue": queue, "name": name, "periods": ALIVE_PERIODS})[0]


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
