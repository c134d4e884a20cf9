"""What a row lock on one running job costs every other job: one real worker
process (tests/apps/many_queues_worker.py, the scenario of tests/system/test_row_lock.py)
with 40 busy no-op queues q01..q40, a 3 s lease, and a second session that
runs `BEGIN; UPDATE jobs SET priority = 5 WHERE id = L;` on a running job L
and keeps it open.

Run from the project root:  .venv/bin/python bench/row_lock.py [--lock-seconds 12]

In a scratch database of the server: the backlog, the worker, and in one run
of it:

  before    the 40 queues' jobs a second over --window seconds;
  lock      a 10 s job U on queue slow2 (max_attempts 2) starts, then a 1 s
            job L on queue slow; once L is started the second session locks
            its row for --lock-seconds; jobs a second from when L's outcome
            is due to the release, the longest any busy queue went without
            finishing a job, and the longest the lease renewal waited on a lock;
  after     jobs a second over --window seconds after the release;
  xid only  the same second session, for as long, with no row lock: BEGIN;
            SELECT txid_current(); An open transaction with an xid keeps
            every dead row version of jobs (no pruning, no killed index
            entries), which slows the claims whatever holds the lock; this
            phase measures that slowdown alone, so lock / xid only is the
            share of the rate the row lock itself leaves.

Then whether U was fenced (a fence line of the worker's log names it) or ran
twice (its start lines in the runs file). The target: lock / before >= 0.90.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.harness import (
    ROOT,
    CommitRate,
    Scratch,
    Server,
    WorkerProcess,
    add_pgbench_seconds,
    scratch_database,
    spawn,
    wait_until,
)
from lib.insert import Job, insert, insert_many
from lib.store.sql import Q

APP = ROOT / "tests" / "apps" / "many_queues_worker.py"
BUSY_QUEUES = [f"q{i:02d}" for i in range(1, 41)]
LEASE = 3.0
U_SECONDS = 10.0
L_SECONDS = 1.0
TARGET = 0.90
INSERT_CHUNK = 10_000
FENCE_LINES = ("lease could not be renewed in time", "stopped: its lease was lost")
# How often the lease renewal's waits are looked at while the lock is held.
SAMPLE_SECONDS = 0.2

STALL = """
WITH q AS (SELECT unnest(%(queues)s::text[]) AS queue),
t AS (
  SELECT queue, finished_at AS at FROM jobs
  WHERE queue = ANY(%(queues)s) AND finished_at > %(start)s AND finished_at < %(end)s
  UNION ALL SELECT queue, %(start)s FROM q
  UNION ALL SELECT queue, %(end)s FROM q
),
gaps AS (SELECT queue, lead(at) OVER (PARTITION BY queue ORDER BY at) - at AS gap FROM t)
SELECT queue, extract(epoch FROM max(gap))::float8 FROM gaps GROUP BY queue ORDER BY 2 DESC LIMIT 1
"""

HEARTBEAT_WAIT = (
    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0)::float8 FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name = 'jobs-leases' "
    "AND state = 'active' AND wait_event_type = 'Lock'"
)


@dataclass
class Window:
    start: datetime
    end: datetime
    jobs: int = 0
    jobs_per_s: float = 0.0


@dataclass
class Held:
    """A second session's open transaction, and what happened while it was open."""

    window: Window  # from when L's outcome is due (or as long after the BEGIN) to the rollback
    stall_queue: str = ""
    stall_seconds: float = 0.0
    heartbeat_wait: float = 0.0
    queues_dry: int = 0  # busy queues with no pending job left at the rollback


class Run:
    """One autocommit connection of the benchmark's own to the scratch database."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg2.connect(url, application_name="jobs-bench")
        self.conn.autocommit = True

    def one(self, sql: str, params: Any = None) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()

    def now(self) -> datetime:
        return self.one("SELECT clock_timestamp()")[0]

    def status(self, job_id: int) -> str:
        return self.one("SELECT status FROM jobs WHERE id = %s", (job_id,))[0]

    def measure(self, window: Window) -> Window:
        sql = "SELECT count(*) FROM jobs WHERE queue = ANY(%s) AND finished_at >= %s AND finished_at < %s"
        window.jobs = int(self.one(sql, (BUSY_QUEUES, window.start, window.end))[0])
        window.jobs_per_s = window.jobs / (window.end - window.start).total_seconds()
        return window


def fill(url: str, per_queue: int) -> None:
    conn = psycopg2.connect(url)
    try:
        jobs = [Job(q, "noop.Run") for q in BUSY_QUEUES for _ in range(per_queue)]
        for start in range(0, len(jobs), INSERT_CHUNK):
            insert_many(conn, jobs[start : start + INSERT_CHUNK])
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE jobs")
    finally:
        conn.close()


def start_worker(url: str, work: Path) -> WorkerProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "JOBS_HTTP_ADDR": "off",
        "DATABASE_URL": url,
        "JOBS_LEASE_SECONDS": str(LEASE),
        "LOG_LEVEL": "WARNING",
        "RUNS_FILE": str(work / "runs"),
    }
    return spawn([sys.executable, str(APP)], env, work / "worker.log")


def hold(run: Run, url: str, statement: str, params: Any, seconds: float) -> Held:
    """Run statement in a second session and keep its transaction open for
    seconds; the window measured starts L_SECONDS after it, when L's outcome is due."""
    locker = psycopg2.connect(url, application_name="jobs-bench-locker")
    longest = 0.0
    try:
        with locker.cursor() as cur:
            cur.execute(statement, params)
        taken = run.now()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            longest = max(longest, float(run.one(HEARTBEAT_WAIT)[0]))
            time.sleep(SAMPLE_SECONDS)
        released = run.now()
        sql = (
            "SELECT count(*) FROM unnest(%s::text[]) q "
            "WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.queue = q AND j.status = 'pending')"
        )
        dry = int(run.one(sql, (BUSY_QUEUES,))[0])
        locker.rollback()
    finally:
        locker.close()
    return Held(Window(taken + timedelta(seconds=L_SECONDS), released), heartbeat_wait=longest, queues_dry=dry)


def finish_held(run: Run, held: Held) -> None:
    """Its window's rate and longest stall, once the batches it held have committed."""
    run.measure(held.window)
    queue, seconds = run.one(STALL, {"queues": BUSY_QUEUES, "start": held.window.start, "end": held.window.end})
    held.stall_queue, held.stall_seconds = queue, float(seconds)


def window(run: Run, seconds: float) -> Window:
    start = run.now()
    time.sleep(seconds)  # the window measured, not a wait for anything
    return Window(start, run.now())


def u_record(work: Path, u: int) -> tuple[int, bool]:
    """How many times U started, and whether the worker fenced it."""
    runs = (work / "runs").read_text().splitlines()
    starts = sum(1 for line in runs if line.split()[:1] == ["start"] and line.split()[2] == str(u))
    log = (work / "worker.log").read_text()
    fenced = any(any(f in line for f in FENCE_LINES) and re.search(rf"\bid={u}\b", line) for line in log.splitlines())
    return starts, fenced


def wind_down(run: Run, proc: WorkerProcess, jobs: list[int]) -> int:
    """Wait for U and L to end, pause the rest of the backlog, let the started
    jobs end, and stop the worker; its exit code."""
    for job_id in jobs:
        wait_until(lambda j=job_id: run.status(j) not in ("pending", "started"), 60, f"job {job_id} to end")
    for q in BUSY_QUEUES:
        run.one(Q.queue_pause, {"queue": q, "until": None, "reason": "bench/row_lock.py: done"})
    wait_until(lambda: run.one("SELECT count(*) FROM jobs WHERE status = 'started'")[0] == 0, 60, "no started job")
    return proc.stop()


def scenario(scratch: Scratch, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    print(f"{40 * args.jobs_per_queue:,} no-op jobs over 40 queues ...", flush=True)
    fill(scratch.url, args.jobs_per_queue)
    run = Run(scratch.url)
    proc = start_worker(scratch.url, work)
    try:
        wait_until(lambda: run.one("SELECT count(*) > 2000 FROM jobs WHERE finished_at IS NOT NULL")[0], 60, "work")
        print("before ...", flush=True)
        before = window(run, args.window)
        u = insert(run.conn, "slow2", "slow.Sleep", {"seconds": U_SECONDS}, max_attempts=2)
        wait_until(lambda: run.status(u) == "started", 30, "U to start")
        l_id = insert(run.conn, "slow", "slow.Sleep", {"seconds": L_SECONDS}, max_attempts=2)
        wait_until(lambda: run.status(l_id) == "started", 30, "L to start")
        print(f"row lock on job {l_id} for {args.lock_seconds:g} s ...", flush=True)
        lock = hold(run, scratch.url, "UPDATE jobs SET priority = 5 WHERE id = %s", (l_id,), args.lock_seconds)
        after = window(run, args.window)
        print(f"an open transaction with an xid, no row lock, for {args.lock_seconds:g} s ...", flush=True)
        xid_only = hold(run, scratch.url, "SELECT txid_current()", None, args.lock_seconds)
        for held in (lock, xid_only):
            finish_held(run, held)
        run.measure(before)
        run.measure(after)
        exit_code = wind_down(run, proc, [u, l_id])
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()
        run.conn.close()
    u_starts, u_fenced = u_record(work, u)
    log = (work / "worker.log").read_text()
    return {
        "before": stored(before),
        "lock": stored(lock),
        "after": stored(after),
        "xid_only": stored(xid_only),
        "ratio": lock.window.jobs_per_s / before.jobs_per_s if before.jobs_per_s else 0.0,
        "ratio_to_xid_only": lock.window.jobs_per_s / xid_only.window.jobs_per_s if xid_only.window.jobs_per_s else 0.0,
        "u": {"id": u, "starts": u_starts, "fenced": u_fenced},
        "worker": {"exit_code": exit_code, "died": " died: " in log},
    }


def stored(phase: Window | Held) -> dict[str, Any]:
    """The phase as the record keeps it: times as ISO text."""

    def text(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: text(v) for k, v in value.items()}
        return value.isoformat() if isinstance(value, datetime) else value

    return text(asdict(phase))


def print_table(result: dict[str, Any]) -> None:
    options = result["options"]
    print(f"jobs         {40 * options['jobs_per_queue']:,} no-op jobs over 40 queues; lease {LEASE:g} s")
    print()
    header = f"{'phase':<10}{'seconds':>8}{'jobs/s':>9}{'x before':>9}{'longest stall':>15}{'heartbeat wait':>16}"
    print(header)
    print("-" * len(header))
    before = result["before"]["jobs_per_s"]
    for name in ("before", "lock", "after", "xid_only"):
        phase = result[name]
        w = phase.get("window", phase)
        seconds = (datetime.fromisoformat(str(w["end"])) - datetime.fromisoformat(str(w["start"]))).total_seconds()
        stall = f"{phase['stall_seconds']:.1f}s {phase['stall_queue']}" if "window" in phase else ""
        wait = f"{phase['heartbeat_wait']:.1f}s" if "window" in phase else ""
        share = w["jobs_per_s"] / before if before else 0.0
        print(f"{name.replace('_', ' '):<10}{seconds:>8.1f}{w['jobs_per_s']:>9,.0f}{share:>9.2f}{stall:>15}{wait:>16}")
    dry = result["lock"]["queues_dry"]
    if dry:
        print(f"\n{dry} busy queues ran out of work during the lock: raise --jobs-per-queue")
    print()
    print(summary(result))


def summary(result: dict[str, Any]) -> str:
    u = result["u"]
    xid_only = result["xid_only"]["window"]["jobs_per_s"]
    met = "met" if result["ratio"] >= TARGET else "NOT met"
    worker = result["worker"]
    clean = "exited 0" if worker["exit_code"] == 0 and not worker["died"] else f"exit {worker['exit_code']}, died"
    return (
        f"row lock: {result['before']['jobs_per_s']:,.0f} jobs/s before, "
        f"{result['lock']['window']['jobs_per_s']:,.0f} during (x{result['ratio']:.2f}, target x{TARGET:.2f} {met}), "
        f"{result['after']['jobs_per_s']:,.0f} after; an xid alone, no row lock: {xid_only:,.0f} "
        f"(x{xid_only / result['before']['jobs_per_s'] if result['before']['jobs_per_s'] else 0:.2f}), "
        f"the lock leaves x{result['ratio_to_xid_only']:.2f} of it; "
        f"U {'FENCED' if u['fenced'] else 'not fenced'}, ran {u['starts']}x; "
        f"commit rate {result['commit_rate']['tps']:,.0f}/s; worker {clean}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock-seconds", type=float, default=12.0, help="how long each second session stays open")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of the before and after windows")
    parser.add_argument(
        "--jobs-per-queue", type=int, default=8000, help="backlog of each busy queue; enough for the whole run"
    )
    add_pgbench_seconds(parser, default=5)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measure(server: Server, rate: CommitRate) -> dict[str, Any]:
        with scratch_database(server) as scratch, tempfile.TemporaryDirectory() as tmp:
            return scenario(scratch, args, Path(tmp))

    return harness.run("row_lock", args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
