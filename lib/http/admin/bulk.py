"""Bulk actions on the jobs list: retry every failed job, or cancel every
pending one, that the list's filters match.

The page first shows how many jobs the action will touch (the jobs list's
own count, under its cap and timeout) and asks once; the action is then one
statement over the same filters (admin_job_bulk_retry or
admin_job_bulk_cancel), in a transaction that is rolled back when it matched
more than BULK_CAP jobs, so no slip acts on millions of rows. A retry
follows redrive's rules for deduped jobs; a cancel leaves a job claimed
meanwhile to run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from lib.http.admin import jobs
from lib.http.admin.jobs import Filters
from lib.job import status as st
from lib.store.db import is_unique_violation
from lib.store.sql import Q

log = logging.getLogger("jobs.admin")

ACTIONS = ("retry", "cancel")
BULK_CAP = jobs.COUNT_CAP
BULK_TIMEOUT_MS = 30_000
# A copy of a deduped job inserted while the retry runs is seen only by the
# next try, as redrive does.
TRIES = 3

# The state each action acts on, under the state the list is filtered by
# (none: the list's filter leaves it nothing to act on).
_ACTS_ON = {
    "retry": {None: "failed", "failed": "failed", "err": "failed", "done": "failed"},
    "cancel": {None: "pending", "pending": "pending", "scheduled": "scheduled", "retrying": "retrying"},
}


class TooMany(Exception):
    """The statement matched more than BULK_CAP jobs; rolled back."""


@dataclass(frozen=True)
class Preview:
    action: str
    filters: Filters
    state: str | None  # the state acted on; None: the filters leave none
    count: int | None  # jobs it would touch now, up to BULK_CAP + 1; None: the count took too long

    @property
    def allowed(self) -> bool:
        return self.state is not None and self.count is not None and 0 < self.count <= BULK_CAP


def filters_of(filters: Filters) -> Filters:
    """The filters a bulk action takes: every job they match, not one page."""
    return replace(filters, before=None)


def preview(db: Any, action: str, filters: Filters) -> Preview:
    """How many jobs the action would touch; BadFilter for filters the list refuses."""
    filters = filters_of(filters)
    values = jobs.params(filters)
    state = _ACTS_ON[action].get(filters.state)
    if state is None:
        return Preview(action, filters, None, 0)
    counted = jobs.count_one(db, {**values, "state": state}, BULK_CAP)
    return Preview(action, filters, state, counted)


def act(db: Any, action: str, filters: Filters, operator: str) -> str:
    """Do it, as one statement; what was done, for the page to say."""
    filters = filters_of(filters)
    values = jobs.params(filters)
    state = _ACTS_ON[action].get(filters.state)
    if state is None:
        return f"nothing to {action}: the {filters.state} jobs are not {'failed' if action == 'retry' else 'pending'}"
    values = {**values, "state": state, "cap": BULK_CAP}
    try:
        message = _retry(db, values) if action == "retry" else _cancel(db, values, operator)
    except TooMany:
        return f"nothing done: over {BULK_CAP:,} jobs match; narrow the filters"
    log.info("admin bulk %s by %s, filters %s: %s", action, operator, filters.query() or "none", message)
    return message


def _cancel(db: Any, values: dict[str, Any], operator: str) -> str:
    reason = st.skip(f"cancelled by an operator on the admin page ({operator})")
    with db.transaction() as tx:
        tx.exec(f"SET LOCAL statement_timeout = {BULK_TIMEOUT_MS}")
        ended = tx.query(Q.admin_job_bulk_cancel, {**values, "status": reason})
        if len(ended) > BULK_CAP:
            raise TooMany
    return f"cancelled {len(ended)} jobs: {reason}"


def _retry(db: Any, values: dict[str, Any]) -> str:
    for attempt in range(TRIES):
        try:
            with db.transaction() as tx:
                tx.exec(f"SET LOCAL statement_timeout = {BULK_TIMEOUT_MS}")
                rows = tx.query(Q.admin_job_bulk_retry, values)
                if len(rows) > BULK_CAP:
                    raise TooMany
            break
        except Exception as exc:
            if not is_unique_violation(exc) or attempt == TRIES - 1:
                raise
    retried = sum(1 for _, why in rows if why is None)
    skipped = len(rows) - retried
    return f"retried {retried} jobs" + (f"; skipped {skipped}, of which a copy runs or was retried" if skipped else "")
