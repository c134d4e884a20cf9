"""Redrive: give failed jobs another attempt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lib.store.driver_errors import is_unique_violation
from lib.store.sql import Q

# A copy of a deduped job inserted while the redrive runs is seen only by the
# next try, which then skips that job instead of colliding with the copy.
TRIES = 3


@dataclass
class RedriveResult:
    """The ids a redrive returned to pending, and those it matched but left
    alone, each with the reason; both in id order."""

    redriven: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)


def redrive(
    db: Any,
    *,
    ids: Sequence[int] | None = None,
    queue: str | None = None,
    name: str | None = None,
    fresh: bool = False,
) -> RedriveResult:
    """Return failed (err:) jobs matching every filter given to pending, due
    now, with one more attempt allowed; their last_error stays as the record of
    what went wrong. At least one filter is required, so a slip cannot redrive
    every failure ever kept.

    A redriven job keeps its steps (PendingJob.step): what it paid for is not
    paid again. fresh: its steps are forgotten, in the statement that
    redrives it, and the job starts over.

    A deduped job allows one live copy: of its failed copies only the newest
    failure is redriven, and none while a copy is pending or started; the
    others come back in skipped, naming the copy that stands in for them."""
    if ids is None and queue is None and name is None:
        raise ValueError("redrive needs ids, a queue or a name")
    params = {"ids": list(ids) if ids is not None else None, "queue": queue, "name": name, "fresh": fresh}
    for attempt in range(TRIES):
        try:
            rows = db.query(Q.job_redrive, params)
            break
        except Exception as exc:
            if not is_unique_violation(exc) or attempt == TRIES - 1:
                raise
    result = RedriveResult()
    for job_id, why in rows:
        if why is None:
            result.redriven.append(job_id)
        else:
            result.skipped[job_id] = why
    return result
