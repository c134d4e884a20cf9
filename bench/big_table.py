"""Whether the worker's queries keep their speed on a jobs table of 10M rows.

Run from the project root:  .venv/bin/python bench/big_table.py [--finished 10000000] [--days 30]

Two fresh databases of one server (DATABASE_URL, else the embedded one in
.pgdata/bench), migrated alike:

  (a) the pending rows of bench/claim_flat.py (--backlog over the measured
      queue and --other-queues others, and the measured queue's --pending
      rows), the last --baseline-hours of the history below (what the status
      scrape reads: its cost follows the rate, not the rows kept), and
      --failures failed rows of the measured queue finished in the last half
      hour (what the redrive measurements redrive);
  (b) the same, and the whole history: --finished finished rows spread over
      --days days (ok, skip, fail and err, over every queue), written in
      chunks of INSERT ... SELECT FROM generate_series. Both: VACUUM ANALYZE,
      CHECKPOINT.

On both, alternating run by run so the machine's load falls on both alike:
the claim as bench/claim_flat.py times it (its code, not a copy); the /metrics
scrape and the status command end to end, through lib/; and every query they
and the operator's failed/redrive commands and the retention send, as the
pool sends them (prepared, or with their values for a query sql/ marks
"-- plan: custom"), on a connection opened as the pool opens one, each with
EXPLAIN (ANALYZE, BUFFERS) saved and any sequential scan of jobs flagged.
Writes are rolled back.

Then, on (b) only: the retention itself (queues/maintenance's loop of
job_delete_finished, each batch from where the last one stopped) until nothing
is old enough or --retention-seconds pass, its rows a second against a busy
day's writes, and the VACUUM that follows it.
"""

# ruff: noqa: E402  (monkey-patching must come before every other import)
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse
import io
import re
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg2
import psycopg2.extensions
from prometheus_client import CollectorRegistry, generate_latest

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import claim_flat as flat
from bench import harness
from bench.harness import (
    CommitRate,
    Scratch,
    Server,
    add_pgbench_seconds,
    scratch_database,
)
from lib.http.admin import FAILURES_SHOWN
from lib.http.metrics import QueueCollector
from lib.operate import commands, overview
from lib.run.steps import Committer
from lib.setup.settings import DEFAULT_RETENTION_DAYS as RETENTION_DAYS
from lib.store.db import DB
from lib.store.pool_connections import connect_options
from lib.store.sql import STATEMENTS, Q, statement
from queues.maintenance import BATCH as RETENTION_BATCH

QUEUE = flat.QUEUE
# The failures the redrive measurements work on: a name of their own on the
# measured queue, so a filter by name finds the same rows in both tables.
RECENT_NAME = f"{QUEUE}.Recent"
# What the operator's redrive sends per statement (lib/operate/commands.py).
REDRIVE_BATCH = commands.REDRIVE_BATCH
# Failures of a dedupe name redriven in one measured call: each costs a whole
# scan of jobs at (b) as the query is now, so few.
DEDUPE_IDS = 5
# The same target as claim_flat.py: at (b) at most this many times (a).
TARGET = flat.TARGET
# The peak of README's Performance table (bench/compare.py, 40 queues, one job
# at a time each, at 1b97f93): what a busy day writes if it lasts all day.
PEAK_JOBS_PER_S = 8303.0
_SEQ_JOBS = re.compile(r"Seq Scan on jobs\b")
_PLANNING = re.compile(r"^Planning Time: ([\d.]+) ms$", re.M)
_JIT = re.compile(r"Timing: .*Total ([\d.]+) ms")

# The history, row i of rows finished (rows - i) / rows of the span ago: the
# oldest first, as rows reach their end in a real table. Queue by i, name and
# kind by i / queues, so every queue gets every name and kind; the kinds step
# by 37 (mod 100), so any 100 rows of a queue hold exactly 85 ok, 6 skip,
# 4 fail and 5 err, however short the slice (err rows keep their last_error,
# as the poller writes it). dedupe is given
# (false: no dedupe names here), so the row trigger that would look it up
# stays off, as for lib.insert's own statements.
HISTORY_SQL = """
INSERT INTO jobs (queue, name, args, status, run_at, created_at, started_at, finished_at, attempts, max_attempts,
                  worker_id, last_error, dedupe)
SELECT h.queue, h.queue || '.' || h.job, jsonb_build_object('i', i), h.status,
       h.at - interval '2 seconds', h.at - interval '2 seconds', h.at - interval '1 second', h.at, 1, 1,
       'bench-history', CASE WHEN starts_with(h.status, 'err: ') THEN h.status END, false
FROM generate_series(%(low)s::bigint, %(high)s::bigint) AS i,
     LATERAL (
       SELECT now() - make_interval(secs => (%(rows)s - i) * %(span)s::float8 / %(rows)s) AS at,
              (%(queues)s::text[])[1 + i %% cardinality(%(queues)s::text[])] AS queue,
              (ARRAY['Fetch', 'Post', 'Sync'])[1 + i / cardinality(%(queues)s::text[]) %% 3] AS job,
              CASE WHEN i / cardinality(%(queues)s::text[]) * 37 %% 100 < 85 THEN 'ok'
                   WHEN i / cardinality(%(queues)s::text[]) * 37 %% 100 < 91 THEN 'skip: nothing new'
                   WHEN i / cardinality(%(queues)s::text[]) * 37 %% 100 < 95 THEN 'fail: not found'
                   ELSE 'err: TimeoutError: read timed out' END AS status
     ) AS h
"""
# The failures redriven: err rows of one name of the measured queue, each its
# own args (a deduped name would keep one of identical copies), finished over
# the last half hour, attempts used up.
FAILURES_SQL = """
INSERT INTO jobs (queue, name, args, status, run_at, created_at, started_at, finished_at, attempts, max_attempts,
                  worker_id, last_error, dedupe)
SELECT %(queue)s, %(name)s, jsonb_build_object('r', i), 'err: ValueError: bench failure', at, at, at, at, 1, 1,
       'bench-history', 'err: ValueError: bench failure', false
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT now() - make_interval(secs => 1800.0 * (%(rows)s - i) / %(rows)s) AS at) AS f
"""

# ---------------------------------------------------------------- the tables


@dataclass
class Build:
    history_rows: int = 0  # finished rows of the generated history
    history_s: float = 0.0  # their INSERT ... SELECTs
    chunks_s: list[float] = field(default_factory=list)
    rest_s: float = 0.0  # the failures and the pending rows
    vacuum_s: float = 0.0  # VACUUM ANALYZE
    checkpoint: bool = False
    checkpoint_s: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)  # by kind (status prefix)
    table_mb: float = 0.0  # heap and indexes
    heap_mb: float = 0.0
    index_mb: dict[str, float] = field(default_factory=dict)


@dataclass
class Table:
    """One of the two databases: the claim's side (claim_flat's), its own
    connection for the prepared queries, and what was measured on it."""

    label: str  # "a" or "b"
    scratch: Scratch
    side: flat.Side
    conn: psycopg2.extensions.connection  # the probes' connection, autocommit unless a write is rolled back
    build: Build = field(default_factory=Build)
    failures: list[int] = field(default_factory=list)  # the redriven failures' ids, newest first
    prepared: set[str] = field(default_factory=set)
    runs: dict[str, list[float]] = field(default_factory=dict)  # probe key -> ms of each timed run
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)  # probe key -> its EXPLAIN


def history_range(rows: int, span_s: float, hours: float | None) -> tuple[int, int]:
    """The rows (low, high) of the history finished in the last hours (None: all)."""
    if hours is None:
        return 1, rows
    return max(1, rows - int(rows * hours * 3600 / span_s) + 1), rows


def fill(table: Table, args: argparse.Namespace, queues: list[str], hours: float | None) -> None:
    """The history (all of it, or its last hours), the failures, the pending
    rows of claim_flat.py; then VACUUM ANALYZE and a CHECKPOINT."""
    db, b = table.side.db, table.build
    span = args.days * 86400.0
    low, high = history_range(args.finished, span, hours)
    b.history_rows = high - low + 1
    started = time.perf_counter()
    for first in range(low, high + 1, args.chunk):
        last = min(first + args.chunk - 1, high)
        t = time.perf_counter()
        # One statement per chunk: a transaction and a transition table (the
        # insert trigger's) of bounded size, and a line of progress each.
        db.exec(HISTORY_SQL, {"low": first, "high": last, "rows": args.finished, "span": span, "queues": queues})
        b.chunks_s.append(time.perf_counter() - t)
        if high - low >= args.chunk:
            print(f"  ({table.label}) history rows {first:,}..{last:,}: {b.chunks_s[-1]:.1f} s", flush=True)
    b.history_s = time.perf_counter() - started
    started = time.perf_counter()
    db.exec(FAILURES_SQL, {"queue": QUEUE, "name": RECENT_NAME, "rows": args.failures})
    phase = table.side.phase
    others = queues[1:]
    flat.fill_backlog(db, phase.backlog, others)
    flat.top_up(db, phase.pending)
    b.rest_s = time.perf_counter() - started
    started = time.perf_counter()
    db.exec("VACUUM ANALYZE jobs, job_queues")
    b.vacuum_s = time.perf_counter() - started
    started = time.perf_counter()
    b.checkpoint = flat.checkpoint(db)
    b.checkpoint_s = time.perf_counter() - started
    b.rows = dict(db.query("SELECT split_part(status, ': ', 1), count(*) FROM jobs GROUP BY 1 ORDER BY 1"))
    b.table_mb, b.index_mb = flat.sizes(db)
    b.heap_mb = db.query_row("SELECT pg_relation_size('jobs')")[0] / (1024 * 1024)
    table.failures = [
        row[0]
        for row in db.query(
            "SELECT id FROM jobs WHERE queue = %s AND name = %s ORDER BY finished_at DESC, id DESC",
            (QUEUE, RECENT_NAME),
        )
    ]


# ---------------------------------------------------------------- the queries


@dataclass(frozen=True)
class Probe:
    """A named query of sql/, sent as the pool sends it, with the parameters a
    table gives it."""

    key: str
    label: str
    sql: str
    params: Callable[[Table], dict[str, Any]]
    repeat: int
    write: bool = False  # in a transaction that is rolled back
    setup: str | None = None  # run first, in the same transaction, untimed


def _failed_params(queue: str | None, name: str | None, limit: int | None) -> Callable[[Table], dict[str, Any]]:
    return lambda t: {"ids": None, "queue": queue, "name": name, "since": None, "limit": limit}


def _redrive_ids(n: int) -> Callable[[Table], dict[str, Any]]:
    return lambda t: {"ids": t.failures[:n], "queue": None, "name": None, "fresh": False}


def probes(args: argparse.Namespace, queues: list[str]) -> list[Probe]:
    registered = [*queues, "maintenance"]
    # A dedupe name declared inside the measured transaction (rolled back with
    # it): the rows' dedupe column is not read, redrive decides it afresh.
    dedupe = f"INSERT INTO job_dedupe_names (queue, name) VALUES ('{QUEUE}', '{RECENT_NAME}')"
    return [
        Probe("queue_stats", "queue_stats (/metrics, status)", Q.queue_stats, lambda t: {"queues": registered}, 20),
        Probe(
            "worker_list",
            "worker_list (status)",
            Q.worker_list,
            lambda t: {"now": None, "periods": overview.ALIVE_PERIODS},
            20,
        ),
        Probe("queue_unrun", "queue_unrun (status)", Q.queue_unrun, lambda t: {"registered": registered}, 20),
        Probe("failed_50", "job_failed, 50 newest (failed)", Q.job_failed, _failed_params(None, None, 50), 20),
        Probe(
            "failed_name",
            "job_failed, queue+name (redrive's list)",
            Q.job_failed,
            _failed_params(QUEUE, RECENT_NAME, None),
            10,
        ),
        Probe(
            "failed_list_none",
            "job_failed_list, a name with none (admin page)",
            Q.job_failed_list,
            # The claim's job name: never failed, so every kept failure is read to say so.
            lambda t: {"queue": QUEUE, "name": flat.NAME, "limit": FAILURES_SHOWN},
            10,
        ),
        Probe(
            "redrive_ids",
            f"job_redrive, {min(args.failures, REDRIVE_BATCH)} ids (a batch)",
            Q.job_redrive,
            _redrive_ids(REDRIVE_BATCH),
            5,
            write=True,
        ),
        Probe(
            "redrive_name",
            "job_redrive, queue+name (lib.operate.redrive)",
            Q.job_redrive,
            lambda t: {"ids": None, "queue": QUEUE, "name": RECENT_NAME, "fresh": False},
            5,
            write=True,
        ),
        Probe(
            "redrive_dedupe",
            f"job_redrive, {DEDUPE_IDS} ids of a dedupe name",
            Q.job_redrive,
            _redrive_ids(DEDUPE_IDS),
            3,
            write=True,
            setup=dedupe,
        ),
        Probe(
            "retention_batch",
            f"job_delete_finished, one batch of {RETENTION_BATCH}",
            Q.job_delete_finished,
            _retention_params(None),
            10,
            write=True,
        ),
    ]


def _retention_params(after: Any) -> Callable[[Table], dict[str, Any]]:
    """One batch of job_delete_finished from after (None: from the start, as a
    run's first batch)."""
    return lambda t: {"days": RETENTION_DAYS, "batch": RETENTION_BATCH, "after": after}


def sent(table: Table, probe: Probe, cur: psycopg2.extensions.cursor) -> str:
    """The probe's statement as lib.store.db sends it: EXECUTE of the statement
    prepared on the table's connection (once), its plan cached by the server
    as the pool's is; or, for a query the pool never prepares, its text with
    the values in, planned for them on every run."""
    params = probe.params(table)
    if probe.sql not in STATEMENTS:
        return cur.mogrify(probe.sql, params).decode()
    stmt = statement(probe.key, probe.sql)
    if stmt.name not in table.prepared:
        cur.execute(stmt.prepare)
        table.prepared.add(stmt.name)
    return cur.mogrify(stmt.execute, [params[name] for name in stmt.params]).decode()


def run_once(table: Table, probe: Probe, explain: bool = False) -> tuple[float, str | None]:
    """One execution (or its EXPLAIN (ANALYZE, BUFFERS)): its milliseconds, and
    the plan. A write runs in a transaction rolled back."""
    conn = table.conn
    with conn.cursor() as cur:
        statement_text = sent(table, probe, cur)
        if probe.write or probe.setup:
            conn.autocommit = False
        try:
            if probe.setup:
                cur.execute(probe.setup)
            started = time.perf_counter()
            cur.execute(("EXPLAIN (ANALYZE, BUFFERS) " if explain else "") + statement_text)
            rows = cur.fetchall() if cur.description else []
            ms = 1000 * (time.perf_counter() - started)
        finally:
            if probe.write or probe.setup:
                conn.rollback()
                conn.autocommit = True
    return ms, "\n".join(r[0] for r in rows) if explain else None


def plan_record(plan: str) -> dict[str, Any]:
    """The plan, and what the report reads from it."""
    seq = [line.strip() for line in plan.splitlines() if _SEQ_JOBS.search(line)]
    planning = _PLANNING.search(plan)
    jit = _JIT.search(plan)
    return {
        "execution_ms": flat.execution_ms(plan),
        "planning_ms": float(planning.group(1)) if planning else None,
        "jit_ms": float(jit.group(1)) if jit else None,
        "buffers": flat.buffers(plan),
        # Each line that scans jobs sequentially, "(never executed)" when the
        # plan holds it but this run did not reach it (a subplan behind a filter).
        "seq_scans_of_jobs": seq,
        "plan": plan,
    }


def time_probes(tables: list[Table], all_probes: list[Probe]) -> None:
    """Each probe: an untimed run (the PREPARE, the caches), then its runs
    alternating between the tables, then its EXPLAIN on each."""
    for probe in all_probes:
        print(f"  {probe.label} ...", flush=True)
        for table in tables:
            run_once(table, probe)
            table.runs[probe.key] = []
        for i in range(probe.repeat):
            for table in flat.in_turn(tables, i):
                table.runs[probe.key].append(run_once(table, probe)[0])
        for table in tables:
            plan = run_once(table, probe, explain=True)[1]
            assert plan is not None
            table.plans[probe.key] = plan_record(plan)


# ---------------------------------------------------------------- end to end


@dataclass
class EndToEnd:
    metrics_ms: list[float] = field(default_factory=list)
    status_ms: list[float] = field(default_factory=list)
    metrics_bytes: int = 0
    status_lines: int = 0


def scrape_metrics(db: DB, queues: list[str]) -> bytes:
    """The /metrics body's queue gauges, read afresh: a collector with no cache,
    as the first scrape after lib.http.metrics.STATS_TTL finds it."""
    registry = CollectorRegistry()
    registry.register(QueueCollector(db, overview.queue_stats, queues, ttl=0.0))
    return generate_latest(registry)


def run_status(db: DB, queues: list[str]) -> str:
    """`python worker.py status` after its parsing: lib.operate.commands.status with the
    registry's queues, printing to a buffer."""
    out = io.StringIO()
    commands.status(db, SimpleNamespace(json=False), out, queues=queues)
    return out.getvalue()


def time_end_to_end(tables: list[Table], queues: list[str], repeat: int) -> dict[str, EndToEnd]:
    found = {t.label: EndToEnd() for t in tables}
    registered = [*queues, "maintenance"]
    for table in tables:  # untimed: each pool connection prepares its statements
        scrape_metrics(table.side.db, registered)
        run_status(table.side.db, registered)
    for i in range(repeat):
        for table in flat.in_turn(tables, i):
            e = found[table.label]
            started = time.perf_counter()
            e.metrics_bytes = len(scrape_metrics(table.side.db, registered))
            e.metrics_ms.append(1000 * (time.perf_counter() - started))
            started = time.perf_counter()
            e.status_lines = run_status(table.side.db, registered).count("\n")
            e.status_ms.append(1000 * (time.perf_counter() - started))
    return found


# ---------------------------------------------------------------- retention


@dataclass
class Retention:
    days: int
    batch: int
    old_rows: int = 0  # finished rows older than the retention at the start
    deleted: int = 0
    seconds: float = 0.0
    finished: bool = False  # every old row deleted (else the time ran out)
    rows_per_s: float = 0.0
    batch_ms: list[float] = field(default_factory=list)
    # rows/s over each tenth of the batches: whether it slows as it goes
    rows_per_s_by_tenth: list[float] = field(default_factory=list)
    vacuum_s: float = 0.0
    # one batch: before the loop; after it, from where it stopped and from the
    # start (the next run's first batch); after VACUUM
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    sizes_after: dict[str, float] = field(default_factory=dict)
    table_mb_after: float = 0.0
    peak_jobs_per_s: float = 0.0
    busy_day_rows: float = 0.0
    busy_day_delete_h: float = 0.0
    history_day_rows: float = 0.0
    history_day_delete_s: float = 0.0


def by_tenth(batch_ms: list[float], batch: int) -> list[float]:
    """Rows a second over each tenth of the batches: whether it slows as it goes."""
    tenth = max(1, len(batch_ms) // 10)
    return [batch * tenth / (sum(batch_ms[i : i + tenth]) / 1000) for i in range(0, len(batch_ms) - tenth + 1, tenth)]


def retention(table: Table, args: argparse.Namespace, batch_probe: Probe) -> Retention:
    """queues/maintenance's clean_up_jobs loop (its query, its batch, each batch
    its own transaction through the pool, from the newest finished_at the last
    one deleted), timed batch by batch, until a batch comes back short or the
    time is up; then VACUUM, as autovacuum would."""
    db = table.side.db
    r = Retention(RETENTION_DAYS, RETENTION_BATCH, peak_jobs_per_s=args.peak_jobs_per_s)
    r.old_rows = db.query_row(
        "SELECT count(*) FROM jobs WHERE status NOT IN ('pending', 'started')"
        " AND finished_at < now() - make_interval(days => %s)",
        (RETENTION_DAYS,),
    )[0]
    r.plans["before"] = plan_record(run_once(table, batch_probe, explain=True)[1] or "")
    print(f"  deleting {r.old_rows:,} rows older than {RETENTION_DAYS} days, batch {RETENTION_BATCH} ...", flush=True)
    params: dict[str, Any] = {"days": RETENTION_DAYS, "batch": RETENTION_BATCH, "after": None}
    stopped_at = None
    started = time.perf_counter()
    while True:
        t = time.perf_counter()
        n, params["after"] = db.query_row(Q.job_delete_finished, params)
        r.batch_ms.append(1000 * (time.perf_counter() - t))
        stopped_at = params["after"] or stopped_at
        r.deleted += n
        if n < RETENTION_BATCH:
            r.finished = True
            break
        if time.perf_counter() - started > args.retention_seconds:
            break
    r.seconds = time.perf_counter() - started
    r.rows_per_s = r.deleted / r.seconds if r.seconds else 0.0
    r.rows_per_s_by_tenth = by_tenth(r.batch_ms, RETENTION_BATCH)
    where = replace(batch_probe, key="retention_where_stopped", params=_retention_params(stopped_at))
    r.plans["after the loop, from where it stopped"] = plan_record(run_once(table, where, explain=True)[1] or "")
    r.plans["after the loop, from the start"] = plan_record(run_once(table, batch_probe, explain=True)[1] or "")
    print(f"  deleted {r.deleted:,} in {r.seconds:.1f} s; VACUUM jobs ...", flush=True)
    started = time.perf_counter()
    db.exec("VACUUM jobs")
    r.vacuum_s = time.perf_counter() - started
    r.plans["after VACUUM"] = plan_record(run_once(table, batch_probe, explain=True)[1] or "")
    r.table_mb_after, r.sizes_after = flat.sizes(db)
    # A busy day: the peak rate all day long, as rows to delete once they age out.
    r.busy_day_rows = args.peak_jobs_per_s * 86400
    r.busy_day_delete_h = r.busy_day_rows / r.rows_per_s / 3600 if r.rows_per_s else float("inf")
    # The history's own day, the load a table of this size was built from.
    r.history_day_rows = args.finished / args.days
    r.history_day_delete_s = r.history_day_rows / r.rows_per_s if r.rows_per_s else float("inf")
    return r


# ---------------------------------------------------------------- the run


def measure(scratches: list[Scratch], args: argparse.Namespace) -> dict[str, Any]:
    queues = [QUEUE] + [f"q{n:02d}" for n in range(args.other_queues)]
    backlog = flat.backlog_of(args)
    tables: list[Table] = []
    try:
        for label, scratch, hours in zip(("a", "b"), scratches, (args.baseline_hours, None), strict=True):
            db = DB.connect(scratch.url, size=1, application_name="jobs-bench")
            phase = flat.Phase(label, 0, args.pending, backlog)
            # Opened as the pool opens its connections (no JIT, say).
            conn = psycopg2.connect(scratch.url, **connect_options("jobs-bench", scratch.url))
            conn.autocommit = True
            table = Table(label, scratch, flat.Side(phase, db, Committer(db)), conn)
            tables.append(table)
            kept = f"the last {hours:g} h of the history" if hours is not None else "the whole history"
            print(f"({label}) filling: {kept}, {args.failures} failures, {backlog.rows + args.pending} pending ...")
            started = time.perf_counter()
            fill(table, args, queues, hours)
            phase.finished = table.build.history_rows + args.failures
            print(f"({label}) filled in {time.perf_counter() - started:.1f} s", flush=True)
        sides = [t.side for t in tables]
        print(f"timing {args.claims} claims alone, outcomes alone and outcome + next claim on each ...", flush=True)
        flat.time_sends(sides, args.claims)
        print("EXPLAIN (ANALYZE, BUFFERS) and auto_explain of the claim on each ...", flush=True)
        claim_plans, nested, missing = {}, {}, None
        for table in tables:
            claim_plans[table.label] = flat.server_side(table.side)
            nested[table.label], missing = flat.nested_plans(table.scratch.url)
        print(f"timing the /metrics scrape and the status command, {args.repeat} each ...", flush=True)
        end_to_end = time_end_to_end(tables, queues, args.repeat)
        print("timing and explaining each query ...", flush=True)
        all_probes = probes(args, queues)
        time_probes(tables, all_probes)
        left = tables[1].side.db.query_row("SELECT count(*) FROM jobs WHERE status = 'started'")[0]
        if left:
            raise RuntimeError(f"{left} rows were left started: a measurement was not rolled back")
        print("retention on (b) ...", flush=True)
        batch_probe = next(p for p in all_probes if p.key == "retention_batch")
        kept = retention(tables[1], args, batch_probe)
    finally:
        for table in tables:
            table.side.db.close()
            table.conn.close()
    return {
        "tables": tables,
        "claim_explain": claim_plans,
        "nested": nested,
        "auto_explain_missing": missing,
        "end_to_end": end_to_end,
        "probes": all_probes,
        "retention": kept,
    }


# ---------------------------------------------------------------- report


def _ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a and b is not None else None


def _spread(ms: list[float]) -> dict[str, float]:
    return asdict(flat.Spread.of(ms))


def report(found: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    tables: list[Table] = found["tables"]
    a, b = tables
    rows: list[dict[str, Any]] = []

    def row(key: str, label: str, sa: dict[str, float] | None, sb: dict[str, float] | None, **more: Any) -> None:
        rows.append(
            {
                "key": key,
                "label": label,
                "a": sa,
                "b": sb,
                "ratio": _ratio(sa["p50"] if sa else None, sb["p50"] if sb else None),
                **more,
            }
        )

    pa, pb = a.side.phase, b.side.phase
    for key, label, attr in (
        ("step", "claim: outcome + next claim (client)", "step_ms"),
        ("claim", "claim alone (client)", "claim_ms"),
        ("outcome", "outcome alone (client)", "outcome_ms"),
        ("claim_srv", "claim execution (srv)", "claim_exec_ms"),
        ("claim_buffers", "claim buffers (srv, count)", "claim_buffers"),
    ):
        sa, sb = getattr(pa, attr), getattr(pb, attr)
        row(key, label, asdict(sa) if sa else None, asdict(sb) if sb else None)
    nested_seq = {
        label: [
            f"#{i + 1} {n['statement'][:60]}"
            for i, n in enumerate(logged)
            if any(s.startswith("Seq Scan on jobs") for s in n["scans"])
        ]
        for label, logged in found["nested"].items()
    }
    e2e: dict[str, EndToEnd] = found["end_to_end"]
    row("metrics", "/metrics scrape (queue gauges)", _spread(e2e["a"].metrics_ms), _spread(e2e["b"].metrics_ms))
    row("status", "status command", _spread(e2e["a"].status_ms), _spread(e2e["b"].status_ms))
    for probe in found["probes"]:
        row(
            probe.key,
            probe.label,
            _spread(a.runs[probe.key]),
            _spread(b.runs[probe.key]),
            plan_a={k: v for k, v in a.plans[probe.key].items() if k != "plan"},
            plan_b={k: v for k, v in b.plans[probe.key].items() if k != "plan"},
        )
    flagged = [
        {"query": p.key, "label": p.label, "table": t.label, "lines": t.plans[p.key]["seq_scans_of_jobs"]}
        for p in found["probes"]
        for t in tables
        if t.plans[p.key]["seq_scans_of_jobs"]
    ]
    kept: Retention = found["retention"]
    return {
        "options": {
            "finished": args.finished,
            "days": args.days,
            "chunk": args.chunk,
            "baseline_hours": args.baseline_hours,
            "failures": args.failures,
            "backlog": args.backlog,
            "queue_due": args.queue_due,
            "queue_delayed": args.queue_delayed,
            "other_queues": args.other_queues,
            "pending": args.pending,
            "claims": args.claims,
            "repeat": args.repeat,
            "retention_seconds": args.retention_seconds,
            "retention_days": RETENTION_DAYS,
            "retention_batch": RETENTION_BATCH,
            "peak_jobs_per_s": args.peak_jobs_per_s,
        },
        "builds": {t.label: asdict(t.build) for t in tables},
        "claim_phases": {t.label: asdict(t.side.phase) for t in tables},
        "rows": rows,
        "target": TARGET,
        "flagged": flagged,
        "nested_seq_scans": nested_seq,
        "plans": {t.label: t.plans for t in tables},
        "claim_explain": found["claim_explain"],
        "nested": found["nested"],
        "auto_explain_missing": found["auto_explain_missing"],
        "end_to_end": {k: asdict(v) for k, v in e2e.items()},
        "retention": asdict(kept),
    }


def slower(row: dict[str, Any], target: float) -> bool:
    """Above the target ratio, and for a time by 1 ms or more: a sub-millisecond
    query moves by more than 20% with the machine's load alone."""
    if row["ratio"] is None or row["ratio"] <= target:
        return False
    return "buffers" in row["key"] or row["b"]["p50"] - row["a"]["p50"] >= 1.0


def _cell(s: dict[str, float] | None, key: str, digits: int) -> str:
    return f"{'n/a':>10}" if s is None else f"{s[key]:>10.{digits}f}"


def _seq_note(plan: dict[str, Any]) -> str:
    executed = [s for s in plan["seq_scans_of_jobs"] if "never executed" not in s]
    return "SEQ SCAN of jobs" + ("" if executed else " (not reached)")


def _plan_note(r: dict[str, Any]) -> str:
    plan = r.get("plan_b")
    if plan is None:
        return ""
    notes = [_seq_note(plan)] if plan["seq_scans_of_jobs"] else []
    if plan["jit_ms"]:
        notes.append(f"JIT {plan['jit_ms']:.0f} ms")
    notes.append(f"{plan['buffers']} buf")
    return ", ".join(notes)


def print_table(result: dict[str, Any]) -> None:
    o = result["options"]
    ba, bb = result["builds"]["a"], result["builds"]["b"]
    print(
        f"\n(a) {ba['history_rows']:,} history rows (its last {o['baseline_hours']:g} h),"
        f" (b) {bb['history_rows']:,} (over {o['days']} days); both {o['failures']} failures,"
        f" {o['backlog'] + o['pending']:,} pending"
    )
    print(
        f"ms; client times alternate between (a) and (b); claims as claim_flat.py ({o['claims']} each),"
        f" queries as the pool sends them, {o['repeat']} runs (redrive 5, dedupe 3, retention 10), writes rolled back"
    )
    print(f"{'':<46}{'(a) p50':>10}{'(a) p99':>10}{'(b) p50':>10}{'(b) p99':>10}{'(b)/(a)':>9}  plan at (b)")
    for r in result["rows"]:
        digits = 0 if "buffers" in r["key"] else 3
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        mark = " *" if slower(r, result["target"]) else ""
        print(
            f"{r['label'][:45]:<46}{_cell(r['a'], 'p50', digits)}{_cell(r['a'], 'p99', digits)}"
            f"{_cell(r['b'], 'p50', digits)}{_cell(r['b'], 'p99', digits)}{ratio + mark:>9}  {_plan_note(r)}"
        )
    print(f"  * above {result['target']:g}x and (for times) 1 ms or more slower: it does not keep its speed at (b)")
    print_retention(result)
    print_build(result)
    print_flags(result)


def print_retention(result: dict[str, Any]) -> None:
    r = result["retention"]
    print(
        f"\nretention on (b) (queues/maintenance: job_delete_finished, {r['days']} days, batches of {r['batch']}):"
        f" {r['old_rows']:,} rows old enough"
    )
    state = "all deleted" if r["finished"] else "stopped at the time limit"
    print(
        f"  deleted {r['deleted']:,} in {r['seconds']:.1f} s ({state}): {r['rows_per_s']:,.0f} rows/s;"
        f" batch p50 {flat.percentile(r['batch_ms'], 50):.1f} ms, first {r['batch_ms'][0]:.1f}, last"
        f" {r['batch_ms'][-1]:.1f}"
    )
    print("  rows/s by tenth of the batches: " + ", ".join(f"{v:,.0f}" for v in r["rows_per_s_by_tenth"]))
    for when, p in r["plans"].items():
        print(
            f"  one batch {when}: {p['execution_ms']:.1f} ms execution, {p['planning_ms'] or 0:.1f} ms planning,"
            f" {p['buffers']} buffers{'; SEQ SCAN of jobs' if p['seq_scans_of_jobs'] else ''}"
        )
    print(f"  VACUUM jobs after it: {r['vacuum_s']:.1f} s")
    print(
        f"  a busy day ({r['peak_jobs_per_s']:,.0f} jobs/s, the Performance peak, for 24 h) writes"
        f" {r['busy_day_rows'] / 1e6:,.0f}M rows: {r['busy_day_delete_h']:.1f} h of deleting at this rate"
    )
    print(f"  this history's day ({r['history_day_rows']:,.0f} rows) takes {r['history_day_delete_s']:.0f} s")


def print_build(result: dict[str, Any]) -> None:
    print()
    for label, b in result["builds"].items():
        rows = ", ".join(f"{k} {v:,}" for k, v in b["rows"].items())
        indexes = ", ".join(f"{k} {v:.1f}" for k, v in b["index_mb"].items() if v >= 0.05)
        print(f"({label}) rows: {rows}")
        print(
            f"    history {b['history_s']:.1f} s, the rest {b['rest_s']:.1f} s, vacuum analyze {b['vacuum_s']:.1f} s,"
            f" checkpoint {b['checkpoint_s']:.1f} s; jobs {b['table_mb']:.0f} MB (heap {b['heap_mb']:.0f})"
            f" with indexes (MB: {indexes})"
        )
    after = result["retention"]
    indexes = ", ".join(f"{k} {v:.1f}" for k, v in after["sizes_after"].items() if v >= 0.05)
    print(f"(b) after retention and VACUUM: jobs {after['table_mb_after']:.0f} MB with indexes (MB: {indexes})")


def print_flags(result: dict[str, Any]) -> None:
    print("\nplans that scan jobs sequentially:")
    if not result["flagged"]:
        print("  none")
    for f in result["flagged"]:
        print(f"  ({f['table']}) {f['label']}:")
        for line in f["lines"]:
            print(f"      {line}")
    if result["auto_explain_missing"]:
        print(f"  the claim's nested statements: not seen ({result['auto_explain_missing']})")
    else:
        for label, seq in result["nested_seq_scans"].items():
            print(f"  ({label}) the claim's nested statements (auto_explain): {', '.join(seq) if seq else 'none'}")


def print_plans(result: dict[str, Any]) -> None:
    print("\nEXPLAIN (ANALYZE, BUFFERS) at (b), as the pool sends them (writes rolled back):")
    for key, p in result["plans"]["b"].items():
        print(f"\n-- {key}")
        print(p["plan"])
    for when, p in result["retention"]["plans"].items():
        if when.startswith("after the loop"):
            print(f"\n-- retention, one batch {when} (before VACUUM)")
            print(p["plan"])


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--finished", type=int, default=10_000_000, help="finished rows of (b)'s history (default %(default)s)")
    add("--days", type=float, default=30, help="days the history spreads over (default %(default)s)")
    add("--chunk", type=int, default=1_000_000, help="history rows per INSERT statement (default %(default)s)")
    add(
        "--baseline-hours",
        type=float,
        default=1.0,
        help="(a) holds this many last hours of the history (0: none; default %(default)s)",
    )
    add("--failures", type=int, default=REDRIVE_BATCH, help="failed rows redriven, in both (default %(default)s)")
    add("--backlog", type=int, default=100_000, help="pending rows beyond the queue's own (default %(default)s)")
    add("--queue-due", type=int, default=5_000, help="of the backlog, due on the measured queue (default %(default)s)")
    add("--queue-delayed", type=int, default=3_000, help="of the backlog, delayed on it (default %(default)s)")
    add("--other-queues", type=int, default=39, help="queues besides the measured one (default %(default)s)")
    add("--pending", type=int, default=700, help="the measured queue's own pending rows (default %(default)s)")
    add("--claims", type=int, default=300, help="timed claims of each kind, as claim_flat.py (default %(default)s)")
    add("--repeat", type=int, default=20, help="timed runs of each read query (default %(default)s)")
    add(
        "--retention-seconds",
        type=float,
        default=600,
        help="stop the retention's loop after this long (default %(default)s)",
    )
    add(
        "--peak-jobs-per-s",
        type=float,
        default=PEAK_JOBS_PER_S,
        help="the write rate of a busy day (default %(default)s: README's Performance peak)",
    )
    add_pgbench_seconds(parser)
    args = parser.parse_args(argv)
    if args.finished < 1 or args.days <= RETENTION_DAYS:
        parser.error(f"--finished >= 1 and --days > {RETENTION_DAYS} (the retention), so it has rows to delete")
    if args.failures < DEDUPE_IDS or args.claims < 1 or args.repeat < 1 or args.chunk < 1:
        parser.error(f"--failures >= {DEDUPE_IDS}, --claims, --repeat, --chunk >= 1")
    least = 2 * (args.claims + flat.WARMUP) + flat.rounds_of(args.claims) + 1
    if args.pending < least:
        parser.error(f"--pending >= {least} for {args.claims} claims")
    if min(args.queue_due, args.queue_delayed) < 0 or args.backlog < args.queue_due + args.queue_delayed:
        parser.error("--backlog must hold --queue-due and --queue-delayed")
    if args.other_queues < 1:
        parser.error("--other-queues >= 1")
    if args.baseline_hours <= 0:
        args.baseline_hours = 0.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measured(server: Server, rate: CommitRate) -> dict[str, Any]:
        with ExitStack() as stack:
            scratches = [stack.enter_context(scratch_database(server)) for _ in range(2)]
            print(f"bench databases (a) {scratches[0].name}, (b) {scratches[1].name}", flush=True)
            result = report(measure(scratches, args), args)
        print_plans(result)
        return result

    return harness.run("big_table", args, measured, print_table)


if __name__ == "__main__":
    sys.exit(main())
