"""What each admin page and each live refresh costs the database on a big table.

Run from the project root:  .venv/bin/python bench/admin_size.py [--finished 10000000] [--pending 100000]

The requirement it measures: every admin page and every live refresh costs at
most 50 ms of database time with 10,000,000 finished rows and 100,000 pending.

One fresh database of the server (DATABASE_URL, else the embedded one in
.pgdata/bench), migrated, filled by INSERT ... SELECT FROM generate_series:

  * --finished finished rows over --queues queues and NAMES_PER_QUEUE names a
    queue (ok, and some skip, fail and err, each with its detail; err rows keep
    their last_error and used all their attempts), --last-hour of them (a
    tenth by default) finished in the last hour, the rest over the --days
    before it, oldest first, so ids follow time as in a real table;
  * --pending pending rows: most due (a backlog enqueued over the last 20
    minutes), a tenth scheduled up to two days ahead, a twentieth retrying
    (attempts > 0, last_error set, due or backing off), and --started started
    rows, some held by a worker that died; written in one statement with the
    last hour's finished rows, ordered by created_at, so the newest ids mix
    pending and finished rows as a live table does;
  * args {"customer_id": c, "order": n}, with a fifth as many customers as
    rows, so a search for one customer finds about five jobs;
  * workers rows (live ones, refreshed before every request, and a dead one),
    job_queues rows (a paused queue, a throttled one whose head job came back
    rate limited, a scaled one), clock_ticks of a schedule of SCHEDULE's
    entries over the 3 days the clock keeps, and job_minutes of the last
    --rollup-days (one; a live rollup keeps eight) written by the rollup's own
    queries (job_minutes_roll_up hour by hour, the backlog by
    job_minutes_backlog), up to the minute before the newest finished row: a
    page reads the last minute from jobs, as it does just before a live
    rollup's next tick.

Then VACUUM ANALYZE and a CHECKPOINT, and the admin app as a worker builds it
(lib/http/httpd.py's worker_app: Admin with the queues, their concurrency,
the registry and the schedule, under make_app and HttpServer), served in this
process on loopback. A client logs in with the token (the session cookie) and
asks for every page and refresh as a browser does (PAGES). The pool is the
project's DB, whose connections get a cursor class that notes each statement
as sent, values in, and the transaction it ran in; nothing of lib/ changes.

Each statement a request sent is run again on a connection opened as the
pool opens one (no JIT), in a transaction rolled back, after the SET LOCALs
its transaction sent (a statement cut by its statement_timeout costs that
timeout): EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON), and Planning Time +
Execution Time is its database time. A prepared statement is prepared there
too and run WARM_EXECUTIONS times first, as on a pool connection that has
served the page before (the server may then use its generic plan). A
request's time is the sum of its statements'. One warm-up round, then --rounds
rounds; the table shows each request's median. Under it, the text plan
(EXPLAIN (ANALYZE, BUFFERS)) of every statement over PLAN_OVER_MS and of the
three slowest.
"""

# ruff: noqa: E402  (monkey-patching must come before every other import)
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse
import contextlib
import json
import logging
import math
import re
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import gevent
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import requests
from gevent.event import Event

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.harness import CommitRate, Scratch, Server, add_pgbench_seconds, admin_connect, scratch_database
from lib.background.clock import Scheduled, daily, every, hourly, weekdays
from lib.background.cron import cron
from lib.background.rollup import KEEP as ROLLUP_KEEP
from lib.http import metrics
from lib.http.admin import Admin
from lib.http.admin.jobs import OUTCOMES, STATES
from lib.http.health import Health
from lib.http.httpd import HttpServer, make_app
from lib.operate import overview
from lib.store.db import DB, _Pooled
from lib.store.pool_connections import connect_options
from lib.store.sql import STATEMENTS, Q

# The requirement: database time of one page or one refresh.
TARGET_MS = 50.0
# A statement over this gets its plan printed.
PLAN_OVER_MS = 10.0
PLAN_LINES = 16  # lines of each printed plan; the three slowest get SLOWEST_LINES
SLOWEST_LINES = 40
SLOWEST = 3
# Runs of a prepared statement on the explaining connection before it is
# explained: the server plans the first five for their values, then may keep
# a generic plan, as on a pool connection that has served the page before.
WARM_EXECUTIONS = 6
NAMES_PER_QUEUE = 5
# Customers are this prime times the row number, modulo their count: every
# customer gets rows spread over the whole history.
CUSTOMER_STEP = 7919
ROWS_PER_CUSTOMER = 5
LEASE = 30.0
TOKEN = "bench-admin-" + "t0ken" * 5
# A text plan is read to its end, however long the statement takes.
PLAN_TIMEOUT = "300s"
TICK_DAYS = 3  # the clock keeps clock_ticks this long (lib/background/clock.py's KEEP_TICKS)

_EXECUTE = re.compile(r"^EXECUTE (\w+)")
# A statement the page itself sent as EXPLAIN (no ANALYZE): the planner's estimate of a count.
_ESTIMATE = re.compile(r"^\s*EXPLAIN \([^)]*\)\s*", re.IGNORECASE)
_TIMEOUT = re.compile(r"statement_timeout\s*=\s*'?(\d+)'?\s*$")
# Prepared statements by name, as lib.store.binding prepares them.
PREPARES = {s.name: s.prepare for s in STATEMENTS.values()}

# ---------------------------------------------------------------- the fill

INSERT_COLUMNS = """
INSERT INTO jobs (queue, name, args, status, run_at, created_at, started_at, finished_at, attempts, max_attempts,
                  worker_id, slot, lease_until, last_error, dedupe)
SELECT queue, name, args, status, run_at, created_at, started_at, finished_at, attempts, 3,
       worker_id, slot, lease_until, last_error, false
"""
# Finished row i of the table's numbering, finished at {finished}. Queue by i,
# name by i / queues, kind by i / (queues * names) and by i: every queue and
# name gets every kind, 85 ok, 6 skip, 4 fail and 5 err in every 100, mixed
# row by row. Run at created_at, started up to 2.4 s later, running up to 2 s.
# dedupe is given (false), so the row trigger that would look it up stays
# off, as for lib.insert's own statements.
FINISHED_SELECT = """
SELECT h.queue, h.queue || '.Job' || (i / %(queue_count)s %% %(names)s) AS name,
       jsonb_build_object('customer_id', 1 + i * %(step)s %% %(customers)s, 'order', i) AS args,
       h.status, h.started - h.latency AS run_at, h.started - h.latency AS created_at, h.started AS started_at,
       h.finished AS finished_at, CASE WHEN starts_with(h.status, 'err: ') THEN 3 ELSE 1 END AS attempts,
       'bench-host-' || i %% 4 || ':' || (4100 + i %% 4) AS worker_id, NULL::int AS slot,
       NULL::timestamptz AS lease_until, CASE WHEN starts_with(h.status, 'err: ') THEN h.status END AS last_error
FROM generate_series(%(low)s::bigint, %(high)s::bigint) AS i,
     LATERAL (SELECT {finished} AS finished, (i / (%(queue_count)s * %(names)s) * 37 + i * 13) %% 100 AS k) AS f,
     LATERAL (
       SELECT (%(queues)s::text[])[1 + i %% %(queue_count)s] AS queue, f.finished,
              f.finished - make_interval(secs => 0.05 + i %% 97 / 50.0) AS started,
              make_interval(secs => i %% 13 / 5.0) AS latency,
              CASE WHEN f.k < 85 THEN 'ok'
                   WHEN f.k < 91 THEN 'skip: nothing new'
                   WHEN f.k < 95 THEN (ARRAY['fail: customer not found', 'fail: order cancelled'])[1 + i %% 2]
                   ELSE (ARRAY['err: TimeoutError: read timed out', 'err: HTTPError: 502 Bad Gateway'])[1 + i %% 2]
              END AS status
     ) AS h
"""
# The history before the last hour, chunk by chunk, each spread by its own
# now() over --days up to an hour ago: the next chunk starts where it stopped.
OLDER = "now() - interval '1 hour' - make_interval(secs => (%(older)s - i) * %(span)s::float8 / %(older)s)"
# The last hour, up to the minute boundary `end` (a minute ahead when written,
# past by the time a page is asked for).
RECENT = "%(end)s::timestamptz - make_interval(secs => (%(high)s - i) * 3600.0 / %(recent)s)"

# Pending row j: queue by j, name by j / queues, kind by j / (queues * names):
# a twentieth retrying, a tenth scheduled, the rest due.
PENDING_SELECT = """
SELECT c.queue, c.queue || '.Job' || (j / %(queue_count)s %% %(names)s),
       jsonb_build_object('customer_id', 1 + (%(finished)s + j) * %(step)s %% %(customers)s, 'order', %(finished)s + j),
       'pending'::text,
       CASE c.kind WHEN 'due' THEN c.due_at
                   WHEN 'scheduled' THEN %(end)s::timestamptz + make_interval(mins => (1 + j * 7 %% 2880)::int)
                   ELSE %(end)s::timestamptz + make_interval(mins => (j %% 30 - 10)::int) END,
       CASE c.kind WHEN 'due' THEN c.due_at ELSE c.enqueued_at END,
       NULL::timestamptz, NULL::timestamptz, CASE c.kind WHEN 'retrying' THEN 1 + (j %% 2)::int ELSE 0 END,
       NULL::text, NULL::int, NULL::timestamptz,
       CASE c.kind WHEN 'retrying' THEN 'err: TimeoutError: read timed out' END
FROM generate_series(1, %(pending)s::bigint) AS j,
     LATERAL (
       SELECT (%(queues)s::text[])[1 + j %% %(queue_count)s] AS queue,
              CASE j / (%(queue_count)s * %(names)s) %% 20 WHEN 0 THEN 'retrying' WHEN 1 THEN 'scheduled'
                   WHEN 2 THEN 'scheduled' ELSE 'due' END AS kind,
              %(end)s::timestamptz - interval '1 minute'
                - make_interval(secs => (%(pending)s - j) * 1200.0 / %(pending)s) AS due_at,
              %(end)s::timestamptz - interval '1 minute'
                - make_interval(secs => (%(pending)s - j) * 3540.0 / %(pending)s) AS enqueued_at
     ) AS c
"""
# Started row s: a slot of its queue each, one in ten held by the dead worker
# (its lease run out, waiting for the rescue), the rest by the live ones.
STARTED_SELECT = """
SELECT (%(queues)s::text[])[1 + s %% %(queue_count)s],
       (%(queues)s::text[])[1 + s %% %(queue_count)s] || '.Job' || (s / %(queue_count)s %% %(names)s),
       jsonb_build_object('customer_id', 1 + (%(finished)s + %(pending)s + s) * %(step)s %% %(customers)s,
                          'order', %(finished)s + %(pending)s + s),
       'started'::text, t.started - interval '2 seconds', t.started - interval '2 seconds', t.started,
       NULL::timestamptz, 1,
       CASE WHEN s %% 10 = 0 THEN %(dead)s ELSE (%(live)s::text[])[1 + s %% cardinality(%(live)s::text[])] END,
       (s / %(queue_count)s)::int,
       CASE WHEN s %% 10 = 0 THEN %(end)s::timestamptz - interval '5 minutes'
            ELSE %(end)s::timestamptz + interval '1 hour' END,
       NULL::text
FROM generate_series(1, %(started)s::bigint) AS s,
     LATERAL (SELECT %(end)s::timestamptz - interval '1 minute' - make_interval(secs => (s %% 50)::int) AS started) AS t
"""
OLDER_SQL = INSERT_COLUMNS + "FROM (" + FINISHED_SELECT.format(finished=OLDER) + ") AS r"
RECENT_SQL = (
    INSERT_COLUMNS
    + "FROM ("
    + FINISHED_SELECT.format(finished=RECENT)
    + " UNION ALL "
    + PENDING_SELECT
    + " UNION ALL "
    + STARTED_SELECT
    + ") AS r ORDER BY created_at"
)
# The throttled queue's head job (the next the claim takes) came back rate limited.
RATE_LIMITED_SQL = """
UPDATE jobs SET attempts = 1, last_error = 'skip: rate limited: 429 Too Many Requests, retry after 60s'
WHERE id = (SELECT id FROM jobs WHERE status = 'pending' AND queue = %(queue)s
            ORDER BY priority DESC, run_at, id LIMIT 1)
"""
# The last rolled-up minute's backlog, for every earlier minute of the day:
# the rows job_minutes_backlog would have written at each.
BACKLOG_COPY_SQL = """
INSERT INTO job_minutes (queue, minute, backlog)
SELECT b.queue, m, b.backlog
FROM job_minutes b, generate_series(%(since)s::timestamptz, %(last)s::timestamptz - interval '1 minute',
                                    interval '1 minute') AS m
WHERE b.minute = %(last)s AND b.backlog IS NOT NULL
ON CONFLICT (queue, minute) DO UPDATE SET backlog = excluded.backlog
"""
# The jobs by the jobs page's states (lib/http/admin/jobs.py's state_of).
STATE_COUNTS_SQL = """
SELECT count(*) FILTER (WHERE status = 'pending' AND NOT (attempts > 0 AND last_error IS NOT NULL) AND run_at <= now()),
       count(*) FILTER (WHERE status = 'pending' AND NOT (attempts > 0 AND last_error IS NOT NULL) AND run_at > now()),
       count(*) FILTER (WHERE status = 'pending' AND attempts > 0 AND last_error IS NOT NULL),
       count(*) FILTER (WHERE status = 'started'),
       count(*) FILTER (WHERE status = 'ok'),
       count(*) FILTER (WHERE starts_with(status, 'skip: ')),
       count(*) FILTER (WHERE starts_with(status, 'fail: ')),
       count(*) FILTER (WHERE starts_with(status, 'err: ')),
       count(*) FILTER (WHERE status NOT IN ('pending', 'started')
                          AND finished_at >= %(end)s::timestamptz - interval '1 hour'),
       count(DISTINCT queue), count(DISTINCT name), count(DISTINCT args->'customer_id')
FROM jobs
"""
STATE_NAMES = (
    "due",
    "scheduled",
    "retrying",
    "started",
    "ok",
    "skip",
    "fail",
    "err",
    "finished in the hour before the fill's end",
    "queues",
    "names",
    "customers",
)
LAST_HOUR_SQL = (
    "SELECT count(*) FROM jobs WHERE status NOT IN ('pending', 'started') AND finished_at >= now() - interval '1 hour'"
)


@dataclass
class Layout:
    """The table's shape, from the options."""

    finished: int
    recent: int  # of the finished, those of the last hour
    pending: int
    started: int
    days: float
    queues: list[str]
    customers: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> Layout:
        rows = args.finished + args.pending + args.started
        customers = max(1, rows // ROWS_PER_CUSTOMER)
        # A count the step divides would give some customers every row.
        while math.gcd(customers, CUSTOMER_STEP) != 1:
            customers += 1
        recent = args.finished // 10 if args.last_hour is None else args.last_hour
        queues = [f"queue_{n:02d}" for n in range(args.queues)]
        return cls(args.finished, recent, args.pending, args.started, args.days, queues, customers)

    @property
    def older(self) -> int:
        return self.finished - self.recent

    def names(self, queue: str) -> list[str]:
        return [f"{queue}.Job{n}" for n in range(NAMES_PER_QUEUE)]

    def params(self) -> dict[str, Any]:
        return {
            "queues": self.queues,
            "queue_count": len(self.queues),
            "names": NAMES_PER_QUEUE,
            "step": CUSTOMER_STEP,
            "customers": self.customers,
            "finished": self.finished,
            "pending": self.pending,
            "started": self.started,
        }

    # The queues whose state the pages show: one asked for by the pages, one
    # throttled by its API's rate limit, one paused, one scaled down.
    @property
    def shown(self) -> str:
        return self.queues[3 % len(self.queues)]

    @property
    def throttled(self) -> str:
        return self.queues[5 % len(self.queues)]

    @property
    def paused(self) -> str:
        return self.queues[6 % len(self.queues)]

    @property
    def scaled(self) -> str:
        return self.queues[7 % len(self.queues)]


def schedule(layout: Layout) -> list[Scheduled]:
    """A schedule of every kind of cadence, on the bench's queues and names."""
    q = layout.queues

    def entry(n: int, at: Any, **options: Any) -> Scheduled:
        queue = q[n % len(q)]
        return Scheduled(queue, f"{queue}.Job{n % NAMES_PER_QUEUE}", at, **options)

    return [
        entry(0, every(1)),
        entry(1, every(5)),
        entry(2, every(15), args={"customer_id": 1}),
        entry(3, hourly(7)),
        entry(4, daily(3, 17), catch_up=True),
        entry(8, cron("*/10 * * * *")),
        entry(9, cron("0 9 * * 1-5", tz="Europe/Paris")),
        entry(10, weekdays(daily(8, 0))),
        entry(11, every(30)),
        entry(12, every(2)),
    ]


@dataclass(frozen=True)
class WorkerRow:
    id: str
    host: str
    pid: int


LIVE_WORKERS = [WorkerRow(f"bench-host-{n}:{4100 + n}:{n:08x}", f"bench-host-{n}", 4100 + n) for n in range(4)]
DEAD_WORKER = WorkerRow("bench-host-9:4199:deadbeef", "bench-host-9", 4199)


def worker_params(layout: Layout, worker: WorkerRow, started_at: datetime) -> dict[str, Any]:
    """worker_seen's values: each worker runs every queue and handles every name."""
    handles = {queue: layout.names(queue) for queue in layout.queues}
    return {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": layout.queues,
        "started_at": started_at,
        "lease": LEASE,
        "handles": json.dumps(handles),
    }


@dataclass
class Build:
    end: str = ""  # the newest finished row's moment; the rollup stops a minute before it
    older_s: float = 0.0
    older_vacuum_s: float = 0.0
    recent_s: float = 0.0
    rest_s: float = 0.0
    rollup_s: float = 0.0
    vacuum_s: float = 0.0
    checkpoint_s: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    job_minutes: int = 0
    clock_ticks: int = 0
    table_mb: float = 0.0
    heap_mb: float = 0.0
    index_mb: dict[str, float] = field(default_factory=dict)


def one(conn: psycopg2.extensions.connection, sql: str, params: Any = None) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def run(conn: psycopg2.extensions.connection, sql: str, params: Any = None) -> None:
    with conn.cursor() as cur:
        cur.execute(sql, params)


def fill(conn: psycopg2.extensions.connection, layout: Layout, chunk: int, rollup_days: int) -> Build:
    """Every row of the table and the small tables, in the order a live table
    would have them; VACUUM ANALYZE and CHECKPOINT. conn: autocommit."""
    b = Build()
    base = layout.params()
    started = time.perf_counter()
    span = layout.days * 86400.0 - 3600.0
    for low in range(1, layout.older + 1, chunk):
        high = min(low + chunk - 1, layout.older)
        t = time.perf_counter()
        # One statement per chunk: a transaction and a transition table (the
        # insert trigger's) of bounded size, and a line of progress each.
        run(conn, OLDER_SQL, {**base, "low": low, "high": high, "older": layout.older, "span": span})
        print(f"  finished rows {low:,}..{high:,}: {time.perf_counter() - t:.1f} s", flush=True)
    b.older_s = time.perf_counter() - started
    t = time.perf_counter()
    # The bulk's visibility map and hint bits now, so the last VACUUM reads
    # only the last hour's pages and the pages are asked for soon after it.
    run(conn, "VACUUM jobs")
    b.older_vacuum_s = time.perf_counter() - t
    end = one(conn, "SELECT date_trunc('minute', now()) + interval '1 minute'")[0]
    b.end = end.isoformat()
    t = time.perf_counter()
    values = {
        **base,
        "low": layout.older + 1,
        "high": layout.finished,
        "recent": max(layout.recent, 1),
        "end": end,
        "live": [w.id for w in LIVE_WORKERS],
        "dead": DEAD_WORKER.id,
    }
    run(conn, RECENT_SQL, values)
    b.recent_s = time.perf_counter() - t
    print(f"  the last hour, pending and started rows: {b.recent_s:.1f} s", flush=True)
    t = time.perf_counter()
    small_tables(conn, layout, end)
    b.rest_s = time.perf_counter() - t
    t = time.perf_counter()
    b.job_minutes = roll_up(conn, end, rollup_days)
    b.rollup_s = time.perf_counter() - t
    t = time.perf_counter()
    run(conn, "VACUUM ANALYZE")
    b.vacuum_s = time.perf_counter() - t
    t = time.perf_counter()
    run(conn, "CHECKPOINT")
    b.checkpoint_s = time.perf_counter() - t
    b.rows = dict(zip(STATE_NAMES, one(conn, STATE_COUNTS_SQL, {"end": end}), strict=True))
    b.clock_ticks = one(conn, "SELECT count(*) FROM clock_ticks")[0]
    mb = 1024 * 1024
    b.table_mb = one(conn, "SELECT pg_total_relation_size('jobs')")[0] / mb
    b.heap_mb = one(conn, "SELECT pg_relation_size('jobs')")[0] / mb
    with conn.cursor() as cur:
        cur.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index"
            " WHERE indrelid = 'jobs'::regclass ORDER BY 1"
        )
        b.index_mb = {name: size / mb for name, size in cur.fetchall()}
    return b


def small_tables(conn: psycopg2.extensions.connection, layout: Layout, end: datetime) -> None:
    """The throttled queue's rate-limited head, job_queues, workers, clock_ticks."""
    run(conn, RATE_LIMITED_SQL, {"queue": layout.throttled})
    run(
        conn,
        "INSERT INTO job_queues (queue, paused_until, pause_reason) VALUES (%s, 'infinity', %s)",
        (layout.paused, "bench: paused by an operator (session 0bad5eed, admin page)"),
    )
    run(
        conn,
        "INSERT INTO job_queues (queue, next_claim_at) VALUES (%s, now() + interval '6 hours')",
        (layout.throttled,),
    )
    run(
        conn,
        "INSERT INTO job_queues (queue, scaled_to, scaled_by, scaled_at) VALUES (%s, 2, 'bench', now())",
        (layout.scaled,),
    )
    for worker in [*LIVE_WORKERS, DEAD_WORKER]:
        run(conn, Q.worker_seen, worker_params(layout, worker, end - timedelta(hours=2)))
    run(conn, "UPDATE workers SET last_seen = now() - interval '10 minutes' WHERE id = %s", (DEAD_WORKER.id,))
    # Each entry's minutes of the days the clock keeps, as clock_fire writes them.
    last = end - timedelta(minutes=1)
    minutes = [last - timedelta(minutes=k) for k in range(TICK_DAYS * 1440)]
    names, entries, ticks = [], [], []
    for scheduled in schedule(layout):
        for minute in minutes:
            if scheduled.at(minute):
                names.append(scheduled.name)
                entries.append(scheduled.key)
                ticks.append(minute)
    run(
        conn,
        "INSERT INTO clock_ticks (name, entry, minute) SELECT * FROM unnest(%s::text[], %s::text[], %s::timestamptz[])",
        (names, entries, ticks),
    )


def roll_up(conn: psycopg2.extensions.connection, end: datetime, days: int) -> int:
    """job_minutes of the days before the newest row's minute, by the rollup's
    own statements, an hour at a time; the rows written."""
    last = end - timedelta(minutes=1)  # the newest finished rows' minute: not rolled up
    since = last - timedelta(days=days)
    for hour in range(24 * days):
        start = since + timedelta(hours=hour)
        run(conn, Q.job_minutes_roll_up, {"from": start, "to": start + timedelta(hours=1)})
    backlog_at = last - timedelta(minutes=1)
    run(conn, Q.job_minutes_backlog, {"minute": backlog_at})
    run(conn, BACKLOG_COPY_SQL, {"since": since, "last": backlog_at})
    return int(one(conn, "SELECT count(*) FROM job_minutes")[0])


# ---------------------------------------------------------------- what the pool sends


@dataclass
class Sent:
    text: str  # as sent, its values in
    tx: int | None  # the transaction it ran in; None: autocommit


class Recorder:
    """The statements the pool sends while one request is served. The HTTP
    server runs in this process, and nothing else uses the pool meanwhile."""

    def __init__(self) -> None:
        self.sent: list[Sent] | None = None
        self._transactions = 0
        self._open: dict[int, int] = {}  # id(connection) -> the transaction it is in

    def note(self, cur: psycopg2.extensions.cursor, query: Any, params: Any) -> None:
        if self.sent is None:
            return
        conn = cur.connection
        tx = None
        if not conn.autocommit:
            # The driver sends BEGIN before the first statement of a transaction.
            if conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE:
                self._transactions += 1
                self._open[id(conn)] = self._transactions
            tx = self._open.get(id(conn))
        text = cur.mogrify(query, params) if params is not None else query
        self.sent.append(Sent(text.decode() if isinstance(text, bytes) else str(text), tx))


RECORDER = Recorder()


class RecordingCursor(psycopg2.extensions.cursor):
    def execute(self, query: Any, params: Any = None) -> None:
        RECORDER.note(self, query, params)
        super().execute(query, params)


class RecordingDB(DB):
    """The project's pool, its connections' cursors noting what they send."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aborted: list[str] = []  # connections checked in inside an aborted transaction, and why

    def _open(self) -> _Pooled:
        pooled = super()._open()
        pooled.conn.cursor_factory = RecordingCursor
        return pooled

    def _checkin(self, pooled: _Pooled, exc: BaseException | None, reserved: bool = False) -> None:
        super()._checkin(pooled, exc, reserved)
        conn = pooled.conn
        if conn.closed or conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            return
        # The pool closes a connection the server holds in a transaction the
        # driver took for ended (lib/store/db.py's check-in); one that would
        # still be handed out is noted for the report and closed here, so the
        # requests after it are measured, not answered with its failure.
        why = "" if exc is None else f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        self.aborted.append(why)
        with contextlib.suppress(ValueError):
            self._idle.remove(pooled)
        conn.close()


def _pattern(sql: str) -> tuple[str, re.Pattern[str]]:
    """A named query as a pattern of its text with the values in, each value a
    group; and the text before its first value, which a match starts with."""
    seen: set[str] = set()

    def value(found: re.Match[str]) -> str:
        name = found.group(1)
        if name in seen:
            return f"(?P={name})"
        seen.add(name)
        return f"(?P<{name}>.*?)"

    pattern = re.sub(r"%\\\((\w+)\\\)s", value, re.escape(sql)).replace("%%", "%")
    return sql.split("%(", 1)[0].replace("%%", "%"), re.compile(pattern, re.S)


_PATTERNS = {name: _pattern(getattr(Q, name)) for name in sorted(Q.names())}


def identify(text: str) -> tuple[str, dict[str, str]]:
    """The named query of sql/ a statement is, and its values as written
    (NULL ones left out); for another statement, its text cut short."""
    if _ESTIMATE.match(text):
        name, values = identify(_ESTIMATE.sub("", text, count=1))
        return f"estimate of {name}", values
    found = _EXECUTE.match(text)
    if found:
        return found.group(1), {"values": text[found.end() :].strip()[1:-1]}
    for name, (prefix, pattern) in _PATTERNS.items():
        match = pattern.fullmatch(text) if text.startswith(prefix) else None
        if match:
            return name, {k: v for k, v in match.groupdict().items() if v != "NULL"}
    return " ".join(text.split())[:60], {}


def kind_of(text: str) -> str:
    head = text.lstrip()[:8].upper()
    if head.startswith("PREPARE"):
        return "prepare"
    if head.startswith(("SET ", "RESET")):
        return "setting"
    return "query"


# ---------------------------------------------------------------- the server's time


@contextmanager
def rolled_back(cur: psycopg2.extensions.cursor) -> Iterator[None]:
    cur.execute("BEGIN")
    try:
        yield
    finally:
        cur.execute("ROLLBACK")


def _timeout_ms(settings: Sequence[str]) -> float | None:
    found = [_TIMEOUT.search(s) for s in settings]
    values = [float(m.group(1)) for m in found if m]
    return values[-1] if values else None


_TABLE_SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan")


def _scans(node: dict[str, Any], found: list[str]) -> list[str]:
    """Each read of a table or an index in the plan: which, through which
    index, and how many rows it gave and dropped (over all its loops)."""
    kind = node.get("Node Type", "")
    if kind in _TABLE_SCANS:
        on = node.get("Index Name") or node.get("Relation Name") or ""
        direction = " Backward" if node.get("Scan Direction") == "Backward" else ""
        rows = int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1))
        removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
        text = f"{kind}{direction} {on} rows={rows:,}"
        if removed:
            text += f" removed={int(removed * node.get('Actual Loops', 1)):,}"
        found.append(text)
    for child in node.get("Plans", []):
        _scans(child, found)
    return found


class Explainer:
    """Runs a recorded statement again, as the pool ran it, on a connection of
    its own opened with the pool's options (JIT off)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg2.connect(url, **connect_options("jobs", url))
        self.conn.autocommit = True
        self.prepared: set[str] = set()

    def close(self) -> None:
        self.conn.close()

    def _ready(self, cur: psycopg2.extensions.cursor, text: str) -> None:
        found = _EXECUTE.match(text)
        if found is None or found.group(1) in self.prepared:
            return
        name = found.group(1)
        cur.execute(PREPARES[name])
        self.prepared.add(name)
        with rolled_back(cur):
            for _ in range(WARM_EXECUTIONS):
                cur.execute(text)

    def estimate(self, text: str, settings: Sequence[str]) -> dict[str, Any]:
        """An EXPLAIN the page sent (a count's estimate): its database time is its planning."""
        inner = _ESTIMATE.sub("", text, count=1)
        with self.conn.cursor() as cur, rolled_back(cur):
            for setting in settings:
                cur.execute(setting)
            cur.execute("EXPLAIN (SUMMARY, FORMAT JSON) " + inner)
            doc = cur.fetchone()[0]
        top = (json.loads(doc) if isinstance(doc, str) else doc)[0]
        planning = top.get("Planning Time", 0.0)
        return {
            "db_ms": planning,
            "planning_ms": planning,
            "execution_ms": 0.0,
            "cut": False,
            "scans": ["planned only"],
        }

    def explain(self, text: str, settings: Sequence[str]) -> dict[str, Any]:
        """Its database time: Planning + Execution Time of EXPLAIN (ANALYZE,
        BUFFERS, FORMAT JSON); a statement its statement_timeout cuts costs the timeout."""
        if _ESTIMATE.match(text):
            return self.estimate(text, settings)
        with self.conn.cursor() as cur:
            self._ready(cur, text)
            try:
                with rolled_back(cur):
                    for setting in settings:
                        cur.execute(setting)
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text)
                    doc = cur.fetchone()[0]
            except psycopg2.errors.QueryCanceled:
                timeout = _timeout_ms(settings) or 0.0
                return {"db_ms": timeout, "planning_ms": None, "execution_ms": None, "cut": True, "scans": []}
            except psycopg2.Error as exc:
                # As the pool's statement did, when it failed: no time to count.
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                return {"db_ms": 0.0, "cut": False, "scans": [], "error": first}
        top = (json.loads(doc) if isinstance(doc, str) else doc)[0]
        plan = top["Plan"]
        planning, execution = top.get("Planning Time", 0.0), top["Execution Time"]
        return {
            "db_ms": planning + execution,
            "planning_ms": planning,
            "execution_ms": execution,
            "cut": False,
            "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
            "read": plan.get("Shared Read Blocks", 0),
            "scans": _scans(plan, []),
        }

    def text_plan(self, text: str, settings: Sequence[str]) -> str:
        """EXPLAIN (ANALYZE, BUFFERS) as text, run to its end (the statement's own timeout lifted)."""
        with self.conn.cursor() as cur:
            self._ready(cur, text)
            with rolled_back(cur):
                for setting in settings:
                    cur.execute(setting)
                cur.execute(f"SET LOCAL statement_timeout = '{PLAN_TIMEOUT}'")
                if _ESTIMATE.match(text):
                    cur.execute("EXPLAIN (SUMMARY) " + _ESTIMATE.sub("", text, count=1))
                else:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + text)
                return "\n".join(row[0] for row in cur.fetchall())


# ---------------------------------------------------------------- the pages


@dataclass(frozen=True)
class Page:
    label: str
    path: str  # under the server's base, its query as a browser sends it


def _path(path: str, **query: str) -> str:
    return f"/admin{path}" + (f"?{urlencode(query)}" if query else "")


def pages(layout: Layout, known: dict[str, Any]) -> list[Page]:
    """Every page and refresh, with the links a browser follows: the routes
    and parameters of lib/http/admin/__init__.py and its templates."""
    q, name = layout.shown, f"{layout.shown}.Job2"
    customer = json.dumps({"customer_id": known["customer"]})
    old_since = known["end"] - timedelta(days=3)
    out = [
        Page("queues page, hour", _path("/")),
        Page("queues page, day", _path("/", window="day")),
        Page("one queue", _path("/queue", queue=q)),
        Page("jobs: no filter", _path("/jobs")),
        *(Page(f"jobs: state {s}", _path("/jobs", state=s)) for s in (*STATES, *OUTCOMES)),
        Page("jobs: queue", _path("/jobs", queue=q)),
        Page("jobs: queue, failed", _path("/jobs", queue=q, state="failed")),
        Page("jobs: name", _path("/jobs", name=name)),
        Page("jobs: queue and name", _path("/jobs", queue=q, name=name)),
        Page("jobs: name prefix", _path("/jobs", q=f"{q}.")),
        Page("jobs: args search", _path("/jobs", q=customer)),
        Page("jobs: created 2h..1h ago", _path("/jobs", since="2h", until="1h")),
        Page(
            "jobs: created in an hour 3 days ago",
            _path(
                "/jobs",
                since=old_since.strftime("%Y-%m-%d %H:%M"),
                until=(old_since + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"),
            ),
        ),
        Page("jobs: second page", _path("/jobs", before=known["next"])),
        Page("jobs: done, second page", _path("/jobs", state="done", before=known["next_done"])),
        Page("search: a job id (and its page)", _path("/jobs", q=str(known["job"]))),
        Page("one job", _path(f"/jobs/{known['job']}")),
        Page("bulk retry preview: queue", _path("/jobs/bulk", queue=q, action="retry")),
        Page("bulk cancel preview: name", _path("/jobs/bulk", name=name, action="cancel")),
        Page("failures", _path("/failures")),
        Page("failures: queue and name", _path("/failures", queue=q, name=name)),
        Page("schedule", _path("/schedule")),
        Page("workers", _path("/workers")),
        Page("live: queues page", _path("/live", page="queues")),
        Page("live: one queue", _path("/live", page="queue", queue=q)),
        Page("live: workers", _path("/live", page="workers")),
        Page("live: schedule", _path("/live", page="schedule")),
    ]
    return out


@dataclass
class Site:
    base: str
    session: requests.Session
    db: RecordingDB
    server: gevent.Greenlet


@contextmanager
def admin_site(url: str, layout: Layout) -> Iterator[Site]:
    """The admin app as lib/http/httpd.py's worker_app builds it for a worker
    that runs every queue, served on loopback; a logged-in browser session."""
    db = RecordingDB.connect(url, size=10)
    admin = Admin(
        db,
        TOKEN,
        queue_stats=overview.queue_stats,
        workers=overview.workers,
        queues=layout.queues,
        concurrency=dict.fromkeys(layout.queues, 8),
        registered=dict.fromkeys(layout.queues),
        schedule=schedule(layout),
    )
    server = HttpServer(("127.0.0.1", 0), make_app(Health(db), metrics.registry(), admin=admin))
    part = gevent.spawn(server.serve, Event())
    session = requests.Session()
    # A connection per request: the server drops one that waits past its head
    # deadline for the next request, as one does here while the statements of
    # the last are explained; a browser would open another one then too.
    session.headers["Connection"] = "close"
    try:
        if not server.serving.wait(10):
            raise RuntimeError("the admin server did not start")
        base = f"http://127.0.0.1:{server.port}"
        answer = session.post(f"{base}/admin/login", data={"token": TOKEN}, allow_redirects=False, timeout=10)
        if answer.status_code != 303 or "jobs_admin" not in session.cookies:
            raise RuntimeError(f"the login failed: {answer.status_code} {answer.text[:200]}")
        yield Site(base, session, db, part)
    finally:
        session.close()
        part.kill()
        db.close()


class Errors(logging.Handler):
    """The errors the HTTP server logs while a request is served: a page that
    fails is measured and reported with its error, not the end of the run."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@dataclass
class Answer:
    sent: list[Sent]  # what the pool sent meanwhile
    ms: float  # the request's wall time
    status: int
    text: str
    errors: list[str]  # what the server logged as errors
    aborted: list[str]  # pool connections it left in an aborted transaction


def fetch(site: Site, path: str) -> Answer:
    """One request as the browser sends it (redirects followed)."""
    errors = Errors()
    logging.getLogger("jobs").addHandler(errors)
    site.db.aborted.clear()
    RECORDER.sent = []
    started = time.perf_counter()
    try:
        answer = site.session.get(site.base + path, timeout=600)
    finally:
        sent, RECORDER.sent = RECORDER.sent, None
        logging.getLogger("jobs").removeHandler(errors)
    ms = 1000 * (time.perf_counter() - started)
    return Answer(sent, ms, answer.status_code, answer.text, errors.seen, list(site.db.aborted))


# ---------------------------------------------------------------- the rounds


def measure_once(site: Site, explainer: Explainer, page: Page) -> dict[str, Any]:
    """The page once: each statement it sent with its database time, and the sum."""
    answer = fetch(site, page.path)
    settings: dict[int, list[str]] = {}
    statements = []
    for s in answer.sent:
        kind = kind_of(s.text)
        name, values = identify(s.text)
        entry: dict[str, Any] = {"kind": kind, "name": name, "values": values, "text": s.text, "tx": s.tx}
        if kind == "setting" and s.tx is not None:
            settings.setdefault(s.tx, []).append(s.text)
        if kind == "query":
            entry["settings"] = list(settings.get(s.tx, [])) if s.tx is not None else []
            entry |= explainer.explain(s.text, entry["settings"])
        statements.append(entry)
    db_ms = sum(e.get("db_ms", 0.0) for e in statements)
    return {
        "db_ms": db_ms,
        "wall_ms": answer.ms,
        "status": answer.status,
        "errors": answer.errors,
        "aborted": answer.aborted,
        "statements": statements,
    }


def refresh_workers(conn: psycopg2.extensions.connection, layout: Layout) -> None:
    """The live workers' heartbeat, as their lease keepers write it (outside any measured request)."""
    for worker in LIVE_WORKERS:
        run(conn, Q.worker_seen, worker_params(layout, worker, datetime.now().astimezone()))


def known_values(conn: psycopg2.extensions.connection, site: Site, end: datetime) -> dict[str, Any]:
    """What the pages ask about: the newest failed job and its customer, and
    the cursors of the first pages (from their "older" links)."""
    job, customer = one(
        conn,
        "SELECT id, args->>'customer_id' FROM jobs WHERE starts_with(status, 'err: ')"
        " ORDER BY finished_at DESC LIMIT 1",
    )
    known: dict[str, Any] = {"job": job, "customer": int(customer), "end": end}
    for key, path in (("next", _path("/jobs")), ("next_done", _path("/jobs", state="done"))):
        found = re.search(r"before=(\d+)", fetch(site, path).text)
        if found is None:
            raise RuntimeError(f"{path}: no link to an older page")
        known[key] = found.group(1)
    return known


def _queries(found: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in found["statements"] if s["kind"] == "query"]


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A page's median over the rounds, its statements as the round nearest
    that median sent them, and each query's median (by position, when every
    round sent the same queries; a PREPARE comes only with a connection's first use)."""
    ms = [r["db_ms"] for r in rounds]
    median = statistics.median(ms)
    middle = min(rounds, key=lambda r: abs(r["db_ms"] - median))
    names = [s["name"] for s in _queries(middle)]
    same = all([s["name"] for s in _queries(r)] == names for r in rounds)
    statements = []
    position = 0
    for s in middle["statements"]:
        entry = {**s, "median_ms": s.get("db_ms", 0.0), "cut_rounds": int(s.get("cut", False))}
        if s["kind"] == "query":
            if same:
                each = [_queries(r)[position] for r in rounds]
                entry["median_ms"] = statistics.median(e["db_ms"] for e in each)
                entry["cut_rounds"] = sum(1 for e in each if e["cut"])
            position += 1
        statements.append(entry)
    return {
        "db_ms": median,
        "db_ms_all": ms,
        "wall_ms": statistics.median(r["wall_ms"] for r in rounds),
        # Each answer that was not a page, with what the server logged.
        "failures": [f"HTTP {r['status']}: {'; '.join(r['errors'])[:300]}" for r in rounds if r["status"] != 200],
        "aborted": [why for r in rounds for why in r["aborted"]],
        "queries": len(names),
        "others": len(middle["statements"]) - len(names),
        "statements": statements,
        "pass": median <= TARGET_MS and all(r["status"] == 200 for r in rounds),
    }


def measure(scratch: Scratch, args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.of(args)
    conn = admin_connect(scratch.url)
    explainer = Explainer(scratch.url)
    try:
        print(
            f"filling {scratch.name}: {layout.finished:,} finished ({layout.recent:,} in the last hour),"
            f" {layout.pending:,} pending, {layout.started} started ...",
            flush=True,
        )
        build = fill(conn, layout, args.chunk, args.rollup_days)
        end = datetime.fromisoformat(build.end)
        # The newest finished rows end at `end`: a page is asked for once they are past.
        while one(conn, "SELECT now() < %s", (end,))[0]:
            time.sleep(1)
        with admin_site(scratch.url, layout) as site:
            refresh_workers(conn, layout)
            known = known_values(conn, site, end)
            all_pages = pages(layout, known)
            last_hour = [one(conn, LAST_HOUR_SQL)[0]]
            rounds: dict[str, list[dict[str, Any]]] = {p.label: [] for p in all_pages}
            aborted: list[dict[str, Any]] = []
            for n in range(args.rounds + 1):
                print(f"round {n} of {args.rounds}{' (warm-up, not counted)' if n == 0 else ''} ...", flush=True)
                for page in all_pages:
                    refresh_workers(conn, layout)
                    found = measure_once(site, explainer, page)
                    aborted += [{"round": n, "label": page.label, "why": why} for why in found["aborted"]]
                    if n:
                        rounds[page.label].append(found)
            last_hour.append(one(conn, LAST_HOUR_SQL)[0])
            results = [{"label": p.label, "path": p.path, **summarise(rounds[p.label])} for p in all_pages]
            print("text plans of the slow statements ...", flush=True)
            plans = text_plans(explainer, results)
            busy = measure_busy(conn, site, explainer, all_pages, args.rounds)
        # What the plans depend on; jit is the server's, which the pool turns off for its own connections.
        names = ("shared_buffers", "work_mem", "effective_cache_size", "random_page_cost", "jit")
        settings = {name: one(conn, f"SHOW {name}")[0] for name in names}
    finally:
        explainer.close()
        conn.close()
    return {
        "layout": {**asdict(layout), "older": layout.older, "shown": layout.shown},
        "build": asdict(build),
        "server_settings": settings,
        "finished_last_hour": {"first_round": last_hour[0], "after_last_round": last_hour[1]},
        "rounds": args.rounds,
        "target_ms": TARGET_MS,
        "pages": results,
        "aborted_connections": aborted,
        "plans": plans,
        "busy": busy,
    }


# The pages that count every pending row, measured again as on a busy table.
BUSY_PAGES = ("queues page, hour", "one queue", "live: queues page", "jobs: no filter", "bulk cancel preview: name")
BUSY_SQL = "UPDATE jobs SET priority = priority WHERE status = 'pending'"


def measure_busy(
    conn: psycopg2.extensions.connection, site: Site, explainer: Explainer, all_pages: list[Page], rounds: int
) -> list[dict[str, Any]]:
    """The pages that count pending rows, after every pending row changed
    since the VACUUM (as on a busy table, where claims and inserts keep the
    pending rows' pages from being all-visible between vacuums, and their
    old versions are not yet reaped): their index-only scans read the heap."""
    print("busy: every pending row changed since the vacuum ...", flush=True)
    run(conn, BUSY_SQL)
    found = []
    for page in (p for p in all_pages if p.label in BUSY_PAGES):
        measured = [measure_once(site, explainer, page) for _ in range(rounds)]
        found.append({"label": page.label, "path": page.path, **summarise(measured)})
    return found


def text_plans(explainer: Explainer, results: list[dict[str, Any]]) -> dict[str, str]:
    """The text plan of every query over PLAN_OVER_MS and of the SLOWEST
    slowest, once per statement text; each such statement records its plan's key."""
    queries = [st for page in results for st in page["statements"] if st["kind"] == "query"]
    slowest = sorted(queries, key=lambda st: -st["median_ms"])[:SLOWEST]
    plans: dict[str, str] = {}
    keys: dict[str, str] = {}
    for st in queries:
        st["slowest"] = any(st is other for other in slowest)
        if st["median_ms"] <= PLAN_OVER_MS and not st["slowest"]:
            continue
        if st["text"] not in keys:
            keys[st["text"]] = f"P{len(keys) + 1}"
            plans[keys[st["text"]]] = explainer.text_plan(st["text"], st["settings"])
        st["plan"] = keys[st["text"]]
    return plans


# ---------------------------------------------------------------- report


def _shown(st: dict[str, Any]) -> str:
    """A statement as the report names it: its query and its values that are not NULL."""
    values = st["values"]
    if "values" in values:
        text = values["values"]
        return f"{st['name']}({text[:70]}{'...' if len(text) > 70 else ''})"
    shown = ", ".join(f"{k}={v[:40]}" for k, v in values.items() if k not in ("limit", "cap"))
    return f"{st['name']}({shown})"


def print_table(result: dict[str, Any]) -> None:
    lay, b = result["layout"], result["build"]
    rows = b["rows"]
    print(
        f"\njobs: {lay['finished']:,} finished ({rows['ok']:,} ok, {rows['skip']:,} skip, {rows['fail']:,} fail,"
        f" {rows['err']:,} err; {lay['recent']:,} written as the last hour, {lay['older']:,} over the"
        f" {lay['days']:g} days before), {rows['due'] + rows['scheduled'] + rows['retrying']:,} pending"
        f" ({rows['due']:,} due, {rows['scheduled']:,} scheduled, {rows['retrying']:,} retrying), {rows['started']}"
        f" started; {rows['queues']} queues, {rows['names']} names, {rows['customers']:,} customers"
    )
    hour = result["finished_last_hour"]
    print(
        f"finished in the last hour when asked: {hour['first_round']:,} at the first round,"
        f" {hour['after_last_round']:,} after the last; job_minutes {b['job_minutes']:,} rows"
        f" ({result['options']['rollup_days']} day(s) up to the minute before the newest rows),"
        f" clock_ticks {b['clock_ticks']:,}"
    )
    indexes = ", ".join(f"{k} {v:,.0f}" for k, v in b["index_mb"].items())
    print(f"jobs {b['table_mb']:,.0f} MB (heap {b['heap_mb']:,.0f}; indexes MB: {indexes})")
    print(
        f"fill {b['older_s'] + b['older_vacuum_s'] + b['recent_s'] + b['rest_s']:.0f} s, rollup {b['rollup_s']:.0f} s,"
        f" VACUUM ANALYZE {b['vacuum_s']:.0f} s; server: "
        + ", ".join(f"{k}={v}" for k, v in result["server_settings"].items())
    )
    print(
        f"DB ms: Planning + Execution Time of EXPLAIN (ANALYZE, BUFFERS) of each statement the request sent, run"
        f" again as sent (JIT off, as the pool; SET LOCALs replayed; a statement cut by its statement_timeout counts"
        f" the timeout), summed; the median of {result['rounds']} rounds after a warm-up round (warm cache: the pages"
        f" were read just before; shared_buffers holds part, the OS cache the rest). wall ms: the HTTP request."
    )
    print(
        f"\n{'request':<36}{'path':<52}{'stmts':>6}{'DB ms':>9}{'min-max':>16}{'wall ms':>9}"
        f"  {'<=' + format(result['target_ms'], 'g') + ' ms':<7} slowest statement"
    )
    for page in result["pages"]:
        queries = [s for s in page["statements"] if s["kind"] == "query"]
        worst = max(queries, key=lambda s: s["median_ms"], default=None)
        slow = "" if worst is None else f"{worst['median_ms']:.1f} {_shown(worst)[:60]}"
        if worst is not None and worst["cut_rounds"]:
            slow += " (cut by its timeout)"
        low, high = min(page["db_ms_all"]), max(page["db_ms_all"])
        stmts = f"{page['queries']}" + (f"+{page['others']}" if page["others"] else "")
        path = page["path"] if len(page["path"]) <= 50 else page["path"][:47] + "..."
        print(
            f"{page['label'][:35]:<36}{path:<52}{stmts:>6}{page['db_ms']:>9.1f}{f'{low:.1f}-{high:.1f}':>16}"
            f"{page['wall_ms']:>9.1f}  {'pass' if page['pass'] else 'FAIL':<7} {slow}"
        )
    failed = [p for p in result["pages"] if not p["pass"]]
    print(
        f"  stmts: statements explained (+ the SET LOCALs and PREPAREs beside them, not counted);"
        f" {len(result['pages']) - len(failed)} of {len(result['pages'])} within {result['target_ms']:g} ms"
        " and answered 200"
    )
    for page in result["pages"]:
        for failure in page["failures"]:
            print(f"  {page['label']}: {failure}")
    print(f"\nthe same on a busy table ({BUSY_SQL}, no vacuum since; {result['rounds']} rounds, no warm-up):")
    for page in result.get("busy", []):
        print(f"{page['label'][:35]:<36}{page['db_ms']:>9.1f} ms  {'pass' if page['pass'] else 'FAIL'}")
    for event in result["aborted_connections"]:
        print(
            f"  round {event['round']}, {event['label']}: the pool took back a connection inside an aborted"
            f" transaction ({event['why']}); closed here, where the pool would have handed it out again"
        )
    print_plans(result)


def print_plans(result: dict[str, Any]) -> None:
    """Each slow statement once, with every request that sent it, then its plan."""
    print(
        f"\nstatements over {PLAN_OVER_MS:g} ms (median), and the {SLOWEST} slowest, each once with the requests"
        f" that sent it: EXPLAIN (ANALYZE, BUFFERS) run again to its end (the statement's own timeout lifted),"
        f" its first {PLAN_LINES} lines ({SLOWEST_LINES} for the slowest)"
    )
    groups: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for page in result["pages"]:
        for st in page["statements"]:
            if "plan" in st:
                groups.setdefault(st["plan"], []).append((page, st))
    for key, sent in groups.items():
        first = sent[0][1]
        slowest = any(st.get("slowest") for _, st in sent)
        print(f"\n{key}: {_shown(first)}{f'  [one of the {SLOWEST} slowest]' if slowest else ''}")
        for page, st in sent:
            cut = ""
            if st["cut_rounds"]:
                cut = f", cut by its {_timeout_ms(st['settings']):g} ms timeout in {st['cut_rounds']} rounds"
            print(f"  {st['median_ms']:9.1f} ms  {page['label']}  {page['path']}{cut}")
        scans = next((st["scans"] for _, st in sent if st.get("scans")), [])
        if scans:
            print(f"  reads: {'; '.join(dict.fromkeys(scans))}")
        lines = result["plans"][key].splitlines()
        shown = lines[: SLOWEST_LINES if slowest else PLAN_LINES]
        for line in shown:
            print(f"    {line}")
        if len(shown) < len(lines):
            print(f"    ... ({len(lines) - len(shown)} more lines)")
            for line in lines[len(shown) :]:
                if line.startswith(("Planning Time", "Execution Time")):
                    print(f"    {line}")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--finished", type=int, default=10_000_000, help="finished rows (default %(default)s)")
    add("--last-hour", type=int, default=None, help="of them, finished in the last hour (default: a tenth)")
    add("--days", type=float, default=7, help="days the rest of the history spreads over (default %(default)s)")
    add("--pending", type=int, default=100_000, help="pending rows (default %(default)s)")
    add("--started", type=int, default=300, help="started rows (default %(default)s)")
    add("--queues", type=int, default=40, help=f"queues, {NAMES_PER_QUEUE} job names each (default %(default)s)")
    add("--chunk", type=int, default=1_000_000, help="history rows per INSERT statement (default %(default)s)")
    add(
        "--rollup-days",
        type=int,
        default=1,
        help=f"days of job_minutes, up to the {ROLLUP_KEEP.days} the rollup keeps (default %(default)s)",
    )
    add("--rounds", type=int, default=3, help="measured rounds, after a warm-up one (default %(default)s)")
    add_pgbench_seconds(parser)
    args = parser.parse_args(argv)
    if args.last_hour is not None and not 0 <= args.last_hour <= args.finished:
        parser.error("--last-hour is between 0 and --finished")
    if min(args.finished, args.pending, args.chunk, args.rounds) < 1 or args.days * 24 <= 1:
        parser.error("--finished, --pending, --chunk and --rounds >= 1; --days over an hour")
    if not 1 <= args.rollup_days <= min(ROLLUP_KEEP.days, args.days):
        parser.error(f"--rollup-days between 1 and {ROLLUP_KEEP.days}, within --days")
    if args.queues < 8 or args.started < 0 or args.started > args.queues * 1000:
        parser.error("--queues >= 8, and --started between 0 and 1000 a queue")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measured(server: Server, rate: CommitRate) -> dict[str, Any]:
        with scratch_database(server) as scratch:
            return measure(scratch, args)

    return harness.run("admin_size", args, measured, print_table)


if __name__ == "__main__":
    sys.exit(main())
