"""The database's time of day, for the parts that act at minute boundaries
(the clock, the rollup).

Each worker host's clock may be wrong, and two hosts may disagree by
minutes: a clock that ticked by its host's time would fire a host's minute
at another host's wrong moment, and clock_ticks, which holds each minute to
one firing, would see two minutes. The database's clock is the one every
worker shares, and the one the rows' timestamps are written by.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from lib.store.db import DB
from lib.store.sql import Q


class DatabaseTime:
    """now(), by the database's clock. Each call asks it, so a clock that
    steps or drifts, the host's or the database's, is followed at the next
    call; a call raises when the database cannot be asked, and the caller
    then has no time to act on, never a guess."""

    def __init__(self, db: DB, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        # Intervals are measured by the monotonic clock: no host's time of day moves it.
        self.monotonic = monotonic

    def __call__(self) -> datetime:
        # A connection already checked out: the round trip timed is the
        # query's alone, never a connect's.
        with self.db.connection() as conn, conn.cursor() as cur:
            sent = self.monotonic()
            cur.execute(Q.clock_now)
            (then,) = cur.fetchone()
            answered = self.monotonic()
        # The database read its clock at about the middle of the round trip.
        return then.astimezone(UTC) + timedelta(seconds=self.monotonic() - (sent + answered) / 2)
