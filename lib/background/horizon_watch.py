"""The horizon watch: about once a minute, one look at what holds back the
database's MVCC horizon (lib/store/vitals.py, without sizes: no lock on
any table), and one WARNING line and one report when something has held it
past HELD_TOO_LONG, naming the holder and what ends it.

One report per hold, as Outage gives one per outage: none again while the
horizon stays held, whoever holds it; once nothing holds it past the
threshold, the next hold is reported anew. Each worker watches on its own;
the report's message is the same from every worker, so Sentry groups them,
and the holder is in its tags.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gevent.event import Event

from lib.setup import error_reports
from lib.setup.error_reports import Outage
from lib.store.db import DB
from lib.store.driver_errors import is_outage
from lib.store.vitals import Holder, Sightings, oldest, read

log = logging.getLogger("jobs.horizon")

# Held this long, the dead rows of every job that ended since stay in the
# table and its indexes, which grow until it ends: long enough that a batch
# job's transaction or a slow report is not news, short enough to be told
# before the space matters.
HELD_TOO_LONG = 600.0
# How often the watch looks: a hold is told within a minute of its passing
# the threshold, for one cheap statement a minute.
LOOK_EVERY = 60.0


class HorizonWatch:
    def __init__(
        self,
        db: DB,
        *,
        threshold: float = HELD_TOO_LONG,
        every: float = LOOK_EVERY,
        outage: Outage | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.threshold = threshold
        self.every = every
        self._database = outage or Outage("database")
        self._own = Outage("horizon watch")
        self._clock = clock
        self._sightings = Sightings()
        # The holder told of in the hold that lasts now; None: no hold past the threshold.
        self.told: Holder | None = None

    def run(self, stop: Event) -> None:
        while not stop.is_set():
            self.look()
            if stop.wait(self.every):
                return

    def look(self) -> Holder | None:
        """One look; the holder held past the threshold, if any (told of
        once per hold). A failure to read is reported once per run of them."""
        try:
            vitals = read(self.db, sizes=False)
        except Exception as exc:
            (self._database if is_outage(exc) else self._own).failed(exc)
            return None
        self._database.recovered()
        self._own.recovered()
        now = self._clock()
        self._sightings.look(vitals.holders, now)
        held = {h.key: self._sightings.held_for(h, now) or 0.0 for h in vitals.holders if h.xids is not None}
        holder = oldest(h for h in vitals.holders if held.get(h.key, 0.0) > self.threshold)
        if holder is None:
            if self.told is not None:
                log.info("database horizon released: nothing holds it past %s", _minutes(self.threshold))
            self.told = None
            return None
        if self.told is None:
            self.told = holder
            self._tell(holder, held[holder.key])
        return holder

    def _tell(self, holder: Holder, seconds: float) -> None:
        # The query stays out: it may carry an application's data; `worker.py doctor` shows it.
        # A holder whose start the role cannot see has held at least since this worker first saw it.
        how_long = _minutes(seconds) if holder.seconds is not None else f"at least {_minutes(seconds)}"
        log.warning(
            "database horizon held for %s by %s (xmin age %s): every finished job's dead rows stay"
            " until it ends; %s; worker.py doctor shows it",
            how_long,
            holder.label(),
            f"{holder.xids:,}",
            holder.remedy(),
        )
        error_reports.capture_message(
            f"database horizon held for over {_minutes(self.threshold)}",
            level="warning",
            holder=holder.label(),
            holder_kind=holder.kind,
        )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.1f}s"
