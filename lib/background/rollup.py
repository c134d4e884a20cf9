"""The per-minute rollup that the admin page's charts read (job_minutes,
migration 024): at each minute boundary one worker counts what ended in the
last few minutes, from the rows themselves, and notes the backlog due.

Every worker runs it; the first to take the rollup's turn (an advisory
transaction lock, never waited for) in a minute does the work, and the
others find the turn taken and leave it. Each roll-up replaces the last
ROLL_BACK minutes, so a row whose transaction committed after its minute
was first rolled up (finished_at is that transaction's start) is counted
at the next one. Minutes while no worker ran keep no row: a gap in a chart.

A failure is logged and reported once per run of failures (an outage of
the database is the worker's one database report), and the next minute
tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from gevent.event import Event

from lib.background.clock import MINUTE, each_minute, floor_minute
from lib.background.db_time import DatabaseTime
from lib.setup.error_reports import Outage
from lib.store.db import DB
from lib.store.driver_errors import is_outage
from lib.store.sql import Q

log = logging.getLogger("jobs.rollup")

# pg_try_advisory_xact_lock's key for the rollup's turn: any number no other
# lock of the worker uses.
ROLLUP_KEY = 0x726F6C6C  # "roll"
ROLL_BACK = 3  # minutes replaced at each roll-up
KEEP = timedelta(days=8)  # a week of charts, and a day to spare
# How long a roll-up may wait on a job_minutes row another transaction holds.
LOCK_TIMEOUT = 2.0


class Rollup:
    def __init__(self, db: DB, *, outage: Outage | None = None, now: Callable[[], datetime] | None = None) -> None:
        self.db = db
        # The minutes are the database's, as the finished_at they count are.
        self.now = now or DatabaseTime(db)
        self._database = outage or Outage("database")
        self._own = Outage("rollup")

    def run(self, stop: Event) -> None:
        each_minute(self.tick, stop, self.now, "rollup", unread=self._database)

    def tick(self, minute: datetime) -> None:
        try:
            self.roll_up(minute)
        except Exception as exc:
            (self._database if is_outage(exc) else self._own).failed(exc)
            return
        self._database.recovered()
        self._own.recovered()

    def roll_up(self, minute: datetime) -> bool:
        """Roll up the ROLL_BACK minutes before `minute`, and note the backlog
        as the last one's; False when another worker has the turn."""
        minute = floor_minute(minute)
        with self.db.transaction() as tx:
            tx.exec(f"SET LOCAL lock_timeout = {int(LOCK_TIMEOUT * 1000)}")
            if not tx.query_row("SELECT pg_try_advisory_xact_lock(%s)", (ROLLUP_KEY,))[0]:
                return False
            tx.exec(Q.job_minutes_roll_up, {"from": minute - ROLL_BACK * MINUTE, "to": minute})
            tx.exec(Q.job_minutes_backlog, {"minute": minute - MINUTE})
            if minute.minute == 0:
                tx.exec(Q.job_minutes_prune, {"before": minute - KEEP})
        return True
