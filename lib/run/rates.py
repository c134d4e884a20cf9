"""A queue's rate and budgets (lib/job/rate.py) declared under their key,
where the claim reads them (job_rates, sql/rules/rates.sql): a worker
declares its queues' at start, and tries again while it runs when a row
it writes is held."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from lib.job.rate import Budget, Rate, budget_key, limits_key
from lib.store.driver_errors import is_lock_timeout
from lib.store.sql import Q

# The logger of the queues' state (lib/operate/queue_state.py): a rate's
# declaration is read in the log beside the queue's pauses and scales.
log = logging.getLogger("jobs.queue_state")

# How long a rate's declaration may wait on a row another transaction holds.
RATE_LOCK_TIMEOUT_MS = 2000


def declare_rate(db: Any, queue: str, rate: Rate | None, budgets: Sequence[Budget] = ()) -> bool:
    """One try at writing the queue's rate and budgets (None and none: it has
    neither) under their key; False when a row it writes was held by another
    transaction past the lock timeout."""
    try:
        with db.transaction() as tx:
            tx.exec(f"SET LOCAL lock_timeout = {RATE_LOCK_TIMEOUT_MS}")
            if rate is None and not budgets:
                tx.exec(Q.rate_clear, {"queues": [queue]})
                return True
            group = limits_key(queue, rate, budgets)
            keys = []
            if rate is not None:
                keys.append(group)
                tx.exec(
                    Q.rate_declare,
                    {"key": group, "spacing": rate.spacing, "burst": rate.burst, "cost": 1, "grp": group},
                )
            for budget in budgets:
                keys.append(budget_key(group, budget.unit))
                row = {"key": keys[-1], "spacing": budget.spacing, "burst": budget.limit, "cost": budget.most}
                tx.exec(Q.rate_declare, row | {"grp": group})
            tx.exec(Q.rate_drop_others, {"grp": group, "keys": keys})
            tx.exec(Q.rate_name, {"queue": queue, "key": group})
    except Exception as exc:
        if is_lock_timeout(exc):
            return False
        raise
    said = [f"rate {rate}" for _ in [rate] if rate is not None] + [f"budget {b}" for b in budgets]
    log.info("queue=%s %s (key %s)", queue, "; ".join(said), group)
    return True
