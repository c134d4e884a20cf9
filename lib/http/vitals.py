"""The database's vitals on /metrics (lib/store/vitals.py): how long the
horizon has been held and by what kind of holder, the jobs table's dead and
live rows and size, the NOTIFY queue's use and the transaction-ID ages.

One statement per scrape, kept VITALS_TTL seconds however many scrapers ask
(lib.http.metrics.Cached); its one lock, the sizes' AccessShareLock, waits
at most vitals.SIZES_LOCK_TIMEOUT_MS, past which the sizes are left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lib.http.metrics import Cached
from lib.setup.error_reports import Outage
from lib.store import vitals
from lib.store.vitals import Sightings, Vitals

# The figures move over minutes (a held horizon, dead rows, sizes): a
# scrape every few seconds need not ask the catalogs each time.
VITALS_TTL = 15.0


class VitalsCollector(Collector):
    """jobs_db_* gauges. A horizon holder whose start the role cannot see (a
    slot, a standby, another role's session) counts from when this process
    first saw it hold, so it has held at least that long."""

    def __init__(
        self,
        db: Any,
        *,
        ttl: float = VITALS_TTL,
        outage: Outage | None = None,
        conn_failure: Callable[[BaseException], bool] = lambda exc: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self._clock = clock
        self._sightings = Sightings()
        self._cache = Cached(
            self._fetch, "metrics: database vitals", ttl=ttl, outage=outage, conn_failure=conn_failure, clock=clock
        )

    def _fetch(self) -> tuple[Vitals, float]:
        found = vitals.read(self.db)
        now = self._clock()
        self._sightings.look(found.holders, now)
        held = found.horizon()
        return found, (self._sightings.held_for(held, now) or 0.0) if held is not None else 0.0

    def collect(self) -> Iterator[Metric]:
        read = self._cache.read()
        yield GaugeMetricFamily(
            "jobs_db_vitals_up", "1 when the database's vitals could be read.", value=int(read is not None)
        )
        if read is None:
            return
        v, held_for = read
        held = v.horizon()
        kind = held.kind if held is not None else "none"
        seconds = GaugeMetricFamily(
            "jobs_db_horizon_age_seconds",
            "How long the oldest holder of the MVCC horizon (holder: transaction, prepared, slot, standby or none)"
            " has held it; for one whose start the role cannot see, since this process first saw it.",
            labels=["holder"],
        )
        seconds.add_metric([kind], held_for)
        yield seconds
        xids = GaugeMetricFamily(
            "jobs_db_horizon_age_xids",
            "Transactions since the xmin of the horizon's oldest holder: how far back dead rows are kept.",
            labels=["holder"],
        )
        xids.add_metric([kind], held.xids if held is not None and held.xids is not None else 0)
        yield xids
        yield GaugeMetricFamily(
            "jobs_db_notify_queue_usage", "The NOTIFY queue's share in use (0 to 1).", value=v.notify_usage
        )
        yield GaugeMetricFamily(
            "jobs_db_database_xid_age", "age(datfrozenxid) of the database.", value=v.database_xid_age
        )
        if not v.has_jobs:
            return
        yield from _table(v)


def _table(v: Vitals) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "jobs_db_jobs_dead_rows", "Dead rows of the jobs table (n_dead_tup).", value=v.dead_rows or 0
    )
    yield GaugeMetricFamily(
        "jobs_db_jobs_live_rows", "Live rows of the jobs table (n_live_tup).", value=v.live_rows or 0
    )
    if v.jobs_xid_age is not None:
        yield GaugeMetricFamily("jobs_db_jobs_xid_age", "age(relfrozenxid) of the jobs table.", value=v.jobs_xid_age)
    if v.table_bytes is not None:
        yield GaugeMetricFamily("jobs_db_jobs_table_bytes", "The jobs table's own size.", value=v.table_bytes)
    if v.total_bytes is not None:
        yield GaugeMetricFamily(
            "jobs_db_jobs_total_bytes", "The jobs table's size with its indexes and TOAST.", value=v.total_bytes
        )
