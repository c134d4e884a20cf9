"""Cancel jobs by id, for the command line and the admin page. A pending job
ends at once; a started one is asked to stop, and the worker running it,
whichever process on whichever host, interrupts its handler and ends it
(lib/run/cancel.py); a job that has ended is left as it is."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lib.job import status as st
from lib.store.sql import Q


@dataclass
class CancelResult:
    """What a cancel did to each id asked for, each list in id order."""

    ended: list[int] = field(default_factory=list)  # pending: ended now
    stopping: list[int] = field(default_factory=list)  # started: its worker stops it
    left: dict[int, str] = field(default_factory=dict)  # ended before: the status it has
    unknown: list[int] = field(default_factory=list)  # no such job


def cancel(db: Any, ids: Iterable[int], by: str) -> CancelResult:
    """End the pending jobs of ids, and ask the workers running the started
    ones to stop them, in one transaction: the NOTIFY that tells the workers
    goes out with the request it announces. A job claimed meanwhile is asked
    to stop, not left to run: the person asked for it to end."""
    ids = sorted(set(ids))
    with db.transaction() as tx:
        ended = sorted(i for (i,) in tx.query(Q.job_cancel, {"ids": ids, "status": st.cancelled(by)}))
        stopping = sorted(i for (i,) in tx.query(Q.job_cancel_running, {"ids": ids, "by": by}))
    rest = sorted(set(ids) - set(ended) - set(stopping))
    # Read after the cancel: a job that ended meanwhile shows how it ended.
    statuses = dict(db.query(Q.job_statuses, {"ids": rest})) if rest else {}
    return CancelResult(
        ended, stopping, {i: statuses[i] for i in rest if i in statuses}, [i for i in rest if i not in statuses]
    )
