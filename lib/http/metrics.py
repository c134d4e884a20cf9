"""The worker's Prometheus metrics.

Two sorts. What this process did (jobs finished, retries, snoozes, rescues,
checkout waits) is reported where it happens, to lib.setup.counters, which hands it to
the one-line functions below once this module is loaded (the HTTP endpoints
load it), into metric objects shared by the whole process. What is true now (each
queue's rows, the pool, the listener, the supervisor's restarts) is read when
/metrics is scraped, by collectors bound to the worker's own objects.

Nothing here uses prometheus-client's global default registry: registry()
builds a fresh one per HTTP app, so a test makes its own and sees only what
it registered (the process-wide counters go up for every test, so tests
compare values before and after).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lib.job import status as st
from lib.setup import counters
from lib.setup.error_reports import Outage

# Not lib.store.db: it calls in here where the pool's events happen, so the one
# place that knows the driver's errors is handed in (registry's conn_failure).

# Each counter would otherwise carry a *_created series per label set, which
# no dashboard of this worker reads and which doubles the scrape.
disable_created_metrics()

# A scrape every few seconds from several scrapers costs the database one
# query per this many seconds, however many scrapes come.
STATS_TTL = 5.0

# Job durations run from milliseconds to the default job timeout (600 s).
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# A checkout waits on a free connection; anything past a second is a pool too small.
_WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30)

FINISHED = Counter(
    "jobs_finished", "Jobs this process finished, by queue and kind of status.", ["queue", "kind"], registry=None
)
DURATION = Histogram(
    "jobs_duration_seconds",
    "How long each attempt this process ran took, outcome written or not.",
    ["queue"],
    buckets=_DURATION_BUCKETS,
    registry=None,
)
RETRIES = Counter("jobs_retries", "Attempts this process sent back to pending to run again.", ["queue"], registry=None)
SNOOZES = Counter(
    "jobs_snoozes", "Jobs this process sent back by a Snooze (the attempt not counted).", ["queue"], registry=None
)
RESCUES = Counter("jobs_rescues", "Started rows of lost workers this process took back.", ["queue"], registry=None)
CHECKOUT_WAIT = Histogram(
    "jobs_pool_checkout_wait_seconds",
    "How long a checkout waited for a free connection of the pool.",
    buckets=_WAIT_BUCKETS,
    registry=None,
)

_EVENTS = (FINISHED, DURATION, RETRIES, SNOOZES, RESCUES, CHECKOUT_WAIT)


@functools.cache
def _child(metric: Any, *labels: str) -> Any:
    """A metric's child for these labels: looked up once, not on every job
    (labels() validates and locks each time). The label sets are few: the
    process's queues, times the kinds of a status."""
    return metric.labels(*labels)


def job_done(queue: str, outcome: Any, seconds: float) -> None:
    """An attempt ended (lib.run.execute's Outcome): a snooze, a retry, or a
    finished job counted by its kind. Never raises into the poller."""
    _child(DURATION, queue).observe(seconds)
    if not outcome.counted:
        _child(SNOOZES, queue).inc()
    elif outcome.retry_in is not None:
        _child(RETRIES, queue).inc()
    else:
        _child(FINISHED, queue, _kind(outcome.status)).inc()


def rescued(queue: str) -> None:
    RESCUES.labels(queue).inc()


def checkout_waited(seconds: float) -> None:
    CHECKOUT_WAIT.observe(seconds)


def _kind(status: str) -> str:
    try:
        return str(st.kind(status))
    except ValueError:
        # Not reachable through the poller (it builds every status); a fault if it ever is.
        return str(st.Kind.ERR)


class StateCollector(Collector):
    """The pool, the listener, the supervisor's restarts and the group
    commit's round trips, read at each scrape. Each source is optional: a
    test may serve metrics without a worker."""

    def __init__(self, db: Any = None, listener: Any = None, supervisor: Any = None, committer: Any = None) -> None:
        self.db = db
        self.listener = listener
        self.supervisor = supervisor
        self.committer = committer

    def collect(self) -> Iterator[Metric]:
        if self.db is not None:
            yield GaugeMetricFamily("jobs_pool_size", "Connections the pool may open.", value=self.db.size)
            yield GaugeMetricFamily(
                "jobs_pool_in_use", "Connections checked out of the pool now.", value=self.db.in_use
            )
        if self.listener is not None:
            connected = 1 if self.listener.listening.is_set() else 0
            yield GaugeMetricFamily(
                "jobs_listener_connected", "1 while the LISTEN connection for wakeups is up.", value=connected
            )
        if self.supervisor is not None:
            restarts = CounterMetricFamily(
                "jobs_part_restarts", "Restarts of each supervised part since the worker started.", labels=["part"]
            )
            for part, n in sorted(self.supervisor.restarts.items()):
                restarts.add_metric([part], n)
            yield restarts
        if self.committer is not None:
            # Asks over round trips: how many outcomes and claims each round
            # trip carries, the group commit's whole point under load.
            yield CounterMetricFamily(
                "jobs_group_commit_round_trips",
                "Round trips (one transaction each) that carried this process's outcomes and claims.",
                value=self.committer.batches,
            )
            yield CounterMetricFamily(
                "jobs_group_commit_asks",
                "Outcomes and claims this process sent, each alone or in a round trip with others.",
                value=self.committer.asks,
            )


Stats = Callable[[Any, Iterable[str]], Sequence[Any]]
T = TypeVar("T")


class Cached(Generic[T]):
    """What fetch() read, kept ttl seconds: however many scrapers ask, the
    database answers once per ttl. A failure is reported once per run of
    them (a lost connection as the database's outage, shared with the rest
    of the worker) and read as None, so the rest of the scrape still answers."""

    def __init__(
        self,
        fetch: Callable[[], T],
        what: str,
        *,
        ttl: float,
        outage: Outage | None,
        conn_failure: Callable[[BaseException], bool],
        clock: Callable[[], float],
    ) -> None:
        self.fetch = fetch
        self.ttl = ttl
        # A lost connection is the database's outage, shared with the rest of the worker.
        self.outage = outage or Outage("database")
        self.fault = Outage(what)
        self.conn_failure = conn_failure
        self._clock = clock
        self._cached: tuple[float, T] | None = None
        # Scrapes that come together wait for one query instead of sending one
        # each (cooperative under the worker's monkey-patching).
        self._lock = threading.Lock()

    def read(self) -> T | None:
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < self.ttl:
                return self._cached[1]
            try:
                found = self.fetch()
            except Exception as exc:
                (self.outage if self.conn_failure(exc) else self.fault).failed(exc)
                self._cached = None
                return None
            self.outage.recovered()
            self.fault.recovered()
            self._cached = (now, found)
            return found


class QueueCollector(Collector):
    """Database-wide gauges per queue, from one query per scrape (queue_stats),
    kept STATS_TTL seconds. When the query fails, the scrape still answers with
    the process's own metrics, jobs_queue_stats_up 0 says why the queue
    gauges are missing, and the failure is reported once per run."""

    def __init__(
        self,
        db: Any,
        stats: Stats,
        queues: Iterable[str] = (),
        *,
        ttl: float = STATS_TTL,
        outage: Outage | None = None,
        conn_failure: Callable[[BaseException], bool] = lambda exc: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.stats = stats
        self.queues = sorted(set(queues))
        self._cache = Cached(
            lambda: self.stats(self.db, self.queues),
            "metrics: queue stats",
            ttl=ttl,
            outage=outage,
            conn_failure=conn_failure,
            clock=clock,
        )
        self.outage, self.fault = self._cache.outage, self._cache.fault

    def _read(self) -> Sequence[Any] | None:
        return self._cache.read()

    def collect(self) -> Iterator[Metric]:
        found = self._read()
        yield GaugeMetricFamily(
            "jobs_queue_stats_up",
            "1 when the queue gauges could be read from the database.",
            value=int(found is not None),
        )
        if found is None:
            return
        gauges = {
            "pending": GaugeMetricFamily("jobs_queue_pending", "Pending rows, due or not.", labels=["queue"]),
            "due": GaugeMetricFamily("jobs_queue_due", "Pending rows due now.", labels=["queue"]),
            "running": GaugeMetricFamily("jobs_queue_running", "Started rows.", labels=["queue"]),
            "age": GaugeMetricFamily(
                "jobs_queue_oldest_due_age_seconds",
                "How long the oldest due row has waited past its run_at (0: none due).",
                labels=["queue"],
            ),
            "paused": GaugeMetricFamily("jobs_queue_paused", "1 while the queue is paused.", labels=["queue"]),
            "keys": GaugeMetricFamily(
                "jobs_queue_keys", "Keys (insert's key=) with pending or started rows.", labels=["queue"]
            ),
        }
        for s in found:
            gauges["pending"].add_metric([s.queue], s.pending)
            gauges["due"].add_metric([s.queue], s.due)
            gauges["running"].add_metric([s.queue], s.running)
            gauges["age"].add_metric([s.queue], s.oldest_due_age_s or 0.0)
            # queue_stats gives the pause in force only: one that ended reads None.
            gauges["paused"].add_metric([s.queue], int(s.paused_until is not None))
            gauges["keys"].add_metric([s.queue], s.keys)
        yield from gauges.values()


def registry(
    db: Any = None,
    *,
    stats: Stats | None = None,
    queues: Iterable[str] = (),
    listener: Any = None,
    supervisor: Any = None,
    committer: Any = None,
    outage: Outage | None = None,
    conn_failure: Callable[[BaseException], bool] = lambda exc: False,
) -> CollectorRegistry:
    """A new registry with this process's counters and the collectors bound to
    the objects given (queue gauges need db and stats)."""
    reg = CollectorRegistry()
    for metric in _EVENTS:
        reg.register(metric)
    reg.register(StateCollector(db, listener, supervisor, committer))
    if db is not None and stats is not None:
        reg.register(QueueCollector(db, stats, queues, outage=outage, conn_failure=conn_failure))
    return reg


# Loaded (by the HTTP endpoints, or a test), this module counts what the
# worker's parts report to lib.setup.counters.
counters.counted_by(sys.modules[__name__])
