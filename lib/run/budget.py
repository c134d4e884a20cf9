"""A queue's budgets as its jobs spend them: PendingJob.spent settles what
the claim reserved of each (sql/rules/rates.sql), so the bucket holds what the
jobs really spent, across every process."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lib.job.job import PendingJob
from lib.job.rate import Budget, budget_key
from lib.store.driver_errors import is_database_error
from lib.store.sql import Q

log = logging.getLogger("jobs")

# How long a report waits on a budget's row that another transaction holds
# (a claim of the same budget holds it for a round trip).
SPEND_LOCK_TIMEOUT_MS = 2000


def _units(unit: str, amount: Any) -> float:
    if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount):
        raise ValueError(f"{unit}: a number of units, not {amount!r}")
    return max(0.0, float(amount))


class Budgets:
    """A queue's budgets, as PendingJob.spent and limits_left report to them."""

    def __init__(self, queue: str, db: Any, group: str, budgets: Sequence[Budget]) -> None:
        self.queue = queue
        self.db = db
        self.group = group
        self.by_unit = {b.unit: b for b in budgets}

    def spend(self, job: PendingJob, units: Mapping[str, float]) -> None:
        for unit, amount in units.items():
            budget = self._budget(unit)
            amount = _units(unit, amount)
            settled = unit in job.reported
            job.reported[unit] = job.reported.get(unit, 0.0) + amount
            over = job.reported[unit] - budget.most
            if over > 0 and over <= amount:
                log.warning(
                    "queue=%s id=%d spent %g %s, over the %d its claim reserved: the budget may be overdrawn by %g",
                    self.queue, job.id, job.reported[unit], unit, budget.most, over,
                )  # fmt: skip
            # The first report settles the claim's reservation; a later one is spent anew.
            units_now = amount if settled else amount - budget.most
            params = {"key": budget_key(self.group, unit), "units": units_now, "settled": settled}
            self._write(job, Q.budget_spend, params)

    def follow(self, job: PendingJob, left: Mapping[str, float]) -> None:
        for unit, amount in left.items():
            if unit not in self.by_unit:
                continue  # a limit the API reports that the queue does not budget
            self._write(job, Q.budget_left, {"key": budget_key(self.group, unit), "left": _units(unit, amount)})

    def _budget(self, unit: str) -> Budget:
        budget = self.by_unit.get(unit)
        if budget is None:
            known = ", ".join(sorted(self.by_unit))
            raise ValueError(f"queue {self.queue} has no budget of {unit!r}; its budgets are {known}")
        return budget

    def _write(self, job: PendingJob, sql: str, params: dict[str, Any]) -> None:
        try:
            self.db.lock_bounded(SPEND_LOCK_TIMEOUT_MS).exec(sql, params)
        except Exception as exc:
            if not is_database_error(exc):
                raise
            # The job's work is done; only the bucket's record of it is not.
            # Unsettled, its reservation stands, which errs on the safe side.
            log.warning("queue=%s id=%d could not record its budget %s: %s", self.queue, job.id, params["key"], exc)
