"""A row lock that another session holds on one running job reaches no other
job, with a real worker process on 43 queues and a 3 s lease: while psql's
`BEGIN; UPDATE jobs SET priority = 5 WHERE id = L;` stays open for 12 s,

- the 40 busy no-op queues, whose outcomes and claims go in the same group
  commit as L's outcome, never stop: none goes 2 s without finishing a job,
  and together they keep a tenth of their rate;
- an unrelated 10 s job U of another queue runs once and is never fenced
  (its lease is renewed in the same heartbeat as L's);
- the lease renewal never waits on the lock;

and once the lock is gone L ends, nothing stays started, and the worker exits
0 on SIGTERM with no part of it died.

The scenario runs once for the module; each test asserts one of these."""

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psycopg2
import pytest
from tests_support import ROOT, wait_for

from lib.insert import Job, insert, insert_many
from lib.store.db import DB
from lib.store.sql import Q

APP = ROOT / "tests" / "apps" / "many_queues_worker.py"
LEASE = 3.0
LOCK_SECONDS = 12.0
BEFORE_SECONDS = 3.0
U_SECONDS = 10.0
# L ends soon after the lock is taken, so its outcome is sent while the lock holds.
L_SECONDS = 1.0
BUSY_QUEUES = [f"q{i:02d}" for i in range(1, 41)]
# Enough to last the run at the rate of a small machine: a queue that ran dry
# would lower the rate during the lock for a reason of its own (the test
# checks that none did).
JOBS_PER_QUEUE = 4000
# The heartbeat may wait this long on some lock (a claim's brief one); not the lock's 12 s.
WAIT_BOUND = 2.0
# A busy queue finishes jobs many times a second; this long without one is a stall.
STALL_BOUND = 2.0
# The lock's transaction holds an xid, so while it is open no dead row version
# of the table can be pruned or its index entries killed: every claim walks
# over the entries its queue's earlier jobs left in the claim index, and the
# rate falls for that reason alone, row lock or not. The bound is for the
# lock's blocking (a rate of nearly nothing), not for that slowdown.
RATE_BOUND = 0.1
FENCE_LINES = ("lease could not be renewed in time", "stopped: its lease was lost")


@dataclass
class Scenario:
    u: int
    l: int  # noqa: E741
    before: float  # busy queues' jobs a second before the lock
    during: float  # and while it was held, once L's outcome was due
    stall: tuple[str, float]  # the busy queue that went longest without finishing a job while it was held, and how long
    l_ran_into_lock: bool  # L's handler was still running when the lock was taken
    queues_dry: list[str]  # busy queues with no pending job left when the lock ended
    heartbeat_wait: float  # the longest the lease renewal's statement waited on a lock meanwhile
    u_starts: int
    u_row: tuple
    l_row: tuple
    started_left: int
    exit_code: int
    log: str


def busy_finished(db: DB, start, end) -> int:
    return db.query_row(
        "SELECT count(*) FROM jobs WHERE queue = ANY(%s) AND finished_at >= %s AND finished_at < %s",
        (BUSY_QUEUES, start, end),
    )[0]


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


def longest_stall(db: DB, start, end) -> tuple[str, float]:
    """The busy queue that went longest between start and end without finishing a job (the window's edges count), and how long."""
    return db.query_row(STALL, {"queues": BUSY_QUEUES, "start": start, "end": end})


def server_now(db: DB):
    return db.query_row("SELECT clock_timestamp()")[0]


def fill(database_url: str) -> None:
    conn = psycopg2.connect(database_url)
    try:
        jobs = [Job(q, "noop.Run") for q in BUSY_QUEUES for _ in range(JOBS_PER_QUEUE)]
        for start in range(0, len(jobs), 10_000):
            insert_many(conn, jobs[start : start + 10_000])
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE jobs")
    finally:
        conn.close()


def holds(predicate, timeout: float) -> bool:
    """Whether predicate comes to hold within timeout (polled): the tests
    assert on what was found, so a job that never ends fails its own test."""
    try:
        wait_for(predicate, timeout)
    except AssertionError:
        return False
    return True


def status_of(db: DB, job_id: int) -> str:
    return db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0]


def heartbeat_wait(db: DB) -> float:
    """How long the lease renewal's statement has waited on a lock now (0: it waits on none)."""
    return db.query_row(
        "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'jobs-leases' "
        "AND state = 'active' AND wait_event_type = 'Lock'"
    )[0]


def hold_lock(db: DB, database_url: str, job_id: int) -> tuple:
    """Lock the job's row as a psql session would, for LOCK_SECONDS; the
    server times it was taken and let go, and the longest heartbeat wait seen."""
    locker = psycopg2.connect(database_url, application_name="row-lock-test")
    longest = 0.0
    try:
        with locker.cursor() as cur:
            cur.execute("UPDATE jobs SET priority = 5 WHERE id = %s", (job_id,))
        taken = server_now(db)
        taken_wall = time.time()
        end = time.monotonic() + LOCK_SECONDS
        while time.monotonic() < end:
            longest = max(longest, float(heartbeat_wait(db)))
            time.sleep(0.2)
        released = server_now(db)
        dry = [
            q
            for q in BUSY_QUEUES
            if not db.query_row("SELECT EXISTS (SELECT 1 FROM jobs WHERE queue = %s AND status = 'pending')", (q,))[0]
        ]
        locker.rollback()
    finally:
        locker.close()
    return taken, taken_wall, released, longest, dry


def run_scenario(database_url: str, tmp_path: Path) -> Scenario:
    db = DB.connect(database_url, size=2, application_name="row-lock-test")
    proc = None
    log_path = tmp_path / "worker.log"
    try:
        db.exec("TRUNCATE jobs, job_queues, job_dedupe_names, workers RESTART IDENTITY")
        fill(database_url)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, str(APP)],
                env={
                    "PATH": "/usr/bin:/bin",
                    "JOBS_HTTP_ADDR": "off",
                    "DATABASE_URL": database_url,
                    "JOBS_LEASE_SECONDS": str(LEASE),
                    "LOG_LEVEL": "WARNING",
                    "RUNS_FILE": str(tmp_path / "runs"),
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        # Under way: the busy queues have been working for a moment.
        wait_for(lambda: db.query_row("SELECT count(*) > 2000 FROM jobs WHERE finished_at IS NOT NULL")[0], 30)
        t0 = server_now(db)
        time.sleep(BEFORE_SECONDS)  # the window measured, not a wait for anything
        t1 = server_now(db)

        u = insert(db, "slow2", "slow.Sleep", {"seconds": U_SECONDS}, max_attempts=2)
        wait_for(lambda: status_of(db, u) == "started", 10)
        l_id = insert(db, "slow", "slow.Sleep", {"seconds": L_SECONDS}, max_attempts=2)
        wait_for(lambda: status_of(db, l_id) == "started", 10)
        taken, taken_wall, released, longest, dry = hold_lock(db, database_url, l_id)

        # Each ends within a lease and a run of its own once the lock is gone, or is reported as it was.
        holds(lambda: status_of(db, l_id) not in ("pending", "started"), 30)
        holds(lambda: status_of(db, u) not in ("pending", "started"), 30)
        # The rest of the backlog is not needed: pause it, and let the started jobs end.
        with db.transaction() as tx:
            for q in BUSY_QUEUES:
                tx.exec(Q.queue_pause, {"queue": q, "until": None, "reason": "test_row_lock: done"})
        holds(lambda: count_started(db) == 0, 30)
        started_left = count_started(db)
        before = busy_finished(db, t0, t1) / (t1 - t0).total_seconds()
        # From when L's outcome is due: before that, the lock is in no statement's way.
        due = taken + timedelta(seconds=L_SECONDS)
        during = busy_finished(db, due, released) / (released - due).total_seconds()

        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(timeout=30)
        runs = (tmp_path / "runs").read_text().split("\n")
        return Scenario(
            u=u,
            l=l_id,
            before=before,
            during=during,
            stall=longest_stall(db, due, released),
            l_ran_into_lock=first_stop(runs, l_id) > taken_wall,
            queues_dry=dry,
            heartbeat_wait=longest,
            u_starts=sum(1 for line in runs if line.startswith("start ") and line.split()[2] == str(u)),
            u_row=db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (u,)),
            l_row=db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (l_id,)),
            started_left=started_left,
            exit_code=exit_code,
            log=log_path.read_text(),
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        db.close()


def first_stop(runs: list[str], job_id: int) -> float:
    """When the job's first run ended, by the runs file's wall time."""
    return min(float(line.split()[3]) for line in runs if line.startswith("stop ") and line.split()[2] == str(job_id))


def assert_measured(scenario: Scenario) -> None:
    """The scenario measured what it means to: L's outcome came while the lock
    held, and no busy queue ran out of work before the lock ended."""
    assert scenario.l_ran_into_lock, "L ended before the lock was taken"
    assert scenario.queues_dry == [], f"the backlog ran out on {scenario.queues_dry}"


def count_started(db: DB) -> int:
    return db.query_row("SELECT count(*) FROM jobs WHERE status = 'started'")[0]


@pytest.fixture(scope="module")
def scenario(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    found = run_scenario(database_url, tmp_path_factory.mktemp("row_lock"))
    print(
        f"\nbusy queues: {found.before:.0f} jobs/s before the lock, {found.during:.0f} during it, "
        f"ratio {found.during / found.before:.2f}; longest stall {found.stall[1]:.1f}s ({found.stall[0]}); U={found.u} {found.u_row}, {found.u_starts} starts; "
        f"L={found.l} {found.l_row}; longest heartbeat wait {found.heartbeat_wait:.1f}s"
    )
    yield found


def test_no_busy_queue_stalls_while_one_row_is_locked(scenario):
    assert_measured(scenario)
    queue, seconds = scenario.stall
    assert seconds < STALL_BOUND, f"{queue} finished no job for {seconds:.1f}s of the lock"


def test_the_busy_queues_keep_a_tenth_of_their_rate_while_one_row_is_locked(scenario):
    assert_measured(scenario)
    ratio = scenario.during / scenario.before
    assert ratio >= RATE_BOUND, (
        f"{scenario.before:.0f} jobs/s before the lock, {scenario.during:.0f} during: {ratio:.2f}"
    )


def test_an_unrelated_job_runs_once_and_is_never_fenced_while_another_row_is_locked(scenario):
    fenced_u = [
        line
        for line in scenario.log.splitlines()
        if any(f in line for f in FENCE_LINES) and re.search(rf"\bid={scenario.u}\b", line)
    ]
    assert fenced_u == []
    assert scenario.u_starts == 1
    assert scenario.u_row == ("ok", 1)


def test_the_lease_renewal_never_waits_on_the_locked_row(scenario):
    assert scenario.heartbeat_wait < WAIT_BOUND


def test_the_locked_job_ends_and_the_worker_exits_cleanly_once_the_lock_is_gone(scenario):
    assert scenario.l_row[0] not in ("pending", "started")
    assert scenario.started_left == 0
    assert scenario.exit_code == 0, scenario.log[-3000:]
    assert " died: " not in scenario.log, scenario.log[-3000:]
