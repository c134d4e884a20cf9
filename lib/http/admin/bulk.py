"""Bulk actions on the jobs list: retry every failed job, or cancel every
pending one, that the list's filters match.

The page first shows how many jobs the action will touch (the jobs list's
own count, under its cap and the page's budget, else the planner's estimate)
and asks once. The action reads the ids the filters match (the jobs list's
own query), refuses more than BULK_CAP of them, so no slip acts on millions
of rows, and is then one statement over those ids: job_cancel, which ends
the pending ones and leaves a job claimed meanwhile to run (the pending jobs
are what the page counted and asked about; one job's page stops a running
one), or redrive, with its rules for deduped jobs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from lib.http.admin import jobs
from lib.http.admin.jobs import Filters
from lib.job import status as st
from lib.operate.redrive import redrive
from lib.store.sql import Q

log = logging.getLogger("jobs.admin")

ACTIONS = ("retry", "cancel")
BULK_CAP = jobs.COUNT_CAP
BULK_TIMEOUT_MS = 30_000

# The state each action acts on, under the state the list is filtered by
# (none: the list's filter leaves it nothing to act on).
_ACTS_ON = {
    "retry": {None: "failed", "failed": "failed", "err": "failed", "done": "failed"},
    "cancel": {None: "pending", "pending": "pending", "scheduled": "scheduled", "retrying": "retrying"},
}


class TooMany(Exception):
    """The filters match more than BULK_CAP jobs: nothing is done."""


@dataclass(frozen=True)
class Preview:
    action: str
    filters: Filters
    state: str | None  # the state acted on; None: the filters leave none
    count: int | None  # jobs it would touch now, up to BULK_CAP + 1; None: neither counted nor estimated
    estimated: bool = False  # count is the planner's estimate: counting took longer than the page's budget

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
    asked = {**values, "state": state}
    counted = jobs.count_one(db, asked, BULK_CAP, timeout_ms=jobs.PAGE_BUDGET_MS)
    if counted is None:
        return Preview(action, filters, state, jobs.estimate(db, asked), estimated=True)
    return Preview(action, filters, state, counted)


def act(db: Any, action: str, filters: Filters, operator: str) -> str:
    """Do it, as one statement; what was done, for the page to say."""
    filters = filters_of(filters)
    values = jobs.params(filters)
    state = _ACTS_ON[action].get(filters.state)
    if state is None:
        return f"nothing to {action}: the {filters.state} jobs are not {'failed' if action == 'retry' else 'pending'}"
    try:
        ids = _matched(db, {**values, "state": state})
    except TooMany:
        return f"nothing done: over {BULK_CAP:,} jobs match; narrow the filters"
    message = _retry(db, ids) if action == "retry" else _cancel(db, ids, operator)
    log.info("admin bulk %s by %s, filters %s: %s", action, operator, filters.query() or "none", message)
    return message


def _matched(db: Any, values: dict[str, Any]) -> list[int]:
    """The ids of the jobs the filters match, newest first; TooMany past BULK_CAP."""
    with db.transaction() as tx:
        tx.exec(f"SET LOCAL statement_timeout = {BULK_TIMEOUT_MS}")
        rows = tx.query(Q.admin_job_list, {**values, "before": None, "limit": BULK_CAP + 1})
    if len(rows) > BULK_CAP:
        raise TooMany
    return [row[0] for row in rows]


def _cancel(db: Any, ids: list[int], operator: str) -> str:
    reason = st.cancelled(f"an operator on the admin page ({operator})")
    ended = db.query(Q.job_cancel, {"ids": ids, "status": reason}) if ids else []
    return f"cancelled {len(ended)} jobs: {reason}"


def _retry(db: Any, ids: list[int]) -> str:
    if not ids:
        return "retried 0 jobs"
    done = redrive(db, ids=ids)
    retried, skipped = len(done.redriven), len(done.skipped)
    return f"retried {retried} jobs" + (f"; skipped {skipped}, of which a copy runs or was retried" if skipped else "")
