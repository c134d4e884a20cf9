"""The database's bad day ends by itself: a real worker process, its database
turned read-only for a spell (its sessions ended, as a failover or a restart
ends them) or refusing every new connection, then itself again. Nothing
lasting: outcomes refused during the spell are stored once it ends, work
resumes within seconds with no restart, and the spell is one report.

The database is the one the suite made for this test, owned by the role the
worker runs as: its owner turns it read-only (ALTER DATABASE ... SET
default_transaction_read_only) and limits its connections, as a managed
Postgres does when its disk fills or another application holds every slot.
"""

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pytest
from chaos_server import worker_env
from sentry_server import SentryServer
from tests_support import ROOT, wait_for

from lib.insert import Job, insert_many
from lib.store.db import DB

BAD_DAY_WORKER = ROOT / "tests" / "apps" / "bad_day_worker.py"
QUEUES = [f"bd{n}" for n in range(4)]
# The worker's own sessions (its pool, the listener, the lease renewal), not the test's.
WORKER_SESSIONS = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name IN ('jobs', 'jobs-listener', 'jobs-leases')"
)
# Work resumes within this long of the database being itself again.
RESUMES_WITHIN = 5.0


@pytest.fixture
def sentry() -> Iterator[SentryServer]:
    server = SentryServer()
    yield server
    server.close()


@contextmanager
def bad_day_worker(url: str, tmp_path: Path, **env: str) -> Iterator[tuple[subprocess.Popen, Path]]:
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(BAD_DAY_WORKER)],
            env=worker_env(url, JOBS_HTTP_ADDR="off", RETURNS_FILE=str(tmp_path / "returned"), **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "listening for wakeups" in log_path.read_text(), 30, what="the worker to listen")
        yield proc, log_path
        assert proc.poll() is None, log_path.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == 0, log_path.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()


def returned(tmp_path: Path) -> set[int]:
    path = tmp_path / "returned"
    return {int(line.split()[1]) for line in path.read_text().splitlines()} if path.exists() else set()


def owner_session(url: str) -> psycopg2.extensions.connection:
    """The database owner's own session, opened while the database is itself:
    it stays writable through a read-only spell (the setting is read when a
    session starts) and keeps its place while new connections are refused."""
    conn = psycopg2.connect(url, application_name="jobs-test-owner")
    conn.autocommit = True
    return conn


def run(conn: psycopg2.extensions.connection, sql: str, params: tuple = ()) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def statuses(db: DB, ids: list[int]) -> dict[int, str]:
    return dict(db.query("SELECT id, status FROM jobs WHERE id = ANY(%s)", (ids,)))


def test_a_read_only_spell_ends_by_itself(database_url, db, tmp_path, sentry):
    """Four slow jobs run when the database turns read-only for 8 s; their
    handlers return during the spell, their outcomes are refused, and are
    stored ok once it ends (the lease, 20 s, outlasts it). Jobs enqueued as it
    ends start within seconds. The spell, met by every part (claims,
    outcomes, lease renewals, the rescue, the clock), is one Sentry event."""
    owner = owner_session(database_url)
    name = run(owner, "SELECT current_database()")[0][0]
    try:
        with bad_day_worker(
            database_url, tmp_path, JOBS_LEASE_SECONDS="20", BAD_DAY_SLEEP="3", SENTRY_DSN=sentry.dsn
        ) as (_, log_path):
            slow = insert_many(db, [Job(q, "bd.Run") for q in QUEUES])
            wait_for(lambda: set(statuses(db, slow).values()) == {"started"}, 15, what="the slow jobs to start")
            run(owner, f"ALTER DATABASE {name} SET default_transaction_read_only = on")
            run(owner, WORKER_SESSIONS)
            spell_began = time.monotonic()
            wait_for(lambda: returned(tmp_path) >= set(slow), 15, what="the slow jobs' handlers to return")
            assert set(statuses(db, slow).values()) == {"started"}, "an outcome was written while read-only"
            time.sleep(max(0.0, 8.0 - (time.monotonic() - spell_began)))
            run(owner, f"ALTER DATABASE {name} RESET default_transaction_read_only")
            (writable_at,) = run(owner, "SELECT now()")[0]
            probes = insert_many(db, [Job(q, "bd.Run") for q in QUEUES])
            wait_for(lambda: set(statuses(db, probes).values()) == {"ok"}, 30, what="the probe jobs to run")
            started = db.query("SELECT max(started_at) FROM jobs WHERE id = ANY(%s)", (probes,))[0][0]
            assert (started - writable_at).total_seconds() < RESUMES_WITHIN
            assert statuses(db, slow) == dict.fromkeys(slow, "ok"), statuses(db, slow)
        text = log_path.read_text()
        events = [e for e in sentry.events if e.get("level") != "info"]
        assert len(events) == 1, [e.get("contexts", {}).get("what") for e in events]
        assert text.count("database failing") == 1, text[-3000:]
        assert "err: interrupted" not in text and "rescued" not in text, text[-3000:]
        # The refusals are told once each, on one line: no statement's text in the log.
        assert "CONTEXT" not in text and "each alone" not in text, text[-3000:]
    finally:
        run(owner, f"ALTER DATABASE {name} RESET default_transaction_read_only")
        owner.close()


def test_queues_claim_within_seconds_of_connections_coming_back(database_url, db, tmp_path):
    """Another application holds every connection for 40 s (the worker's are
    ended with them) while a job runs in two of the four queues: their
    outcomes, and the claims that go with them, fail and back off, and the
    listener cannot reconnect. Jobs enqueued meanwhile in every queue (on a
    session opened before, their wakeups heard by nobody) start within
    seconds of a connection being possible again, whatever backoff the
    queues and the listener had grown to, idle queues too."""
    owner = owner_session(database_url)
    name = run(owner, "SELECT current_database()")[0][0]
    try:
        with bad_day_worker(database_url, tmp_path, JOBS_LEASE_SECONDS="90", BAD_DAY_SLEEP="2") as (_, log_path):
            running = insert_many(db, [Job(q, "bd.Run") for q in QUEUES[:2]])
            wait_for(lambda: set(statuses(db, running).values()) == {"started"}, 15, what="the jobs to start")
            run(owner, f"ALTER DATABASE {name} CONNECTION LIMIT 0")
            run(owner, WORKER_SESSIONS)
            wait_for(lambda: returned(tmp_path) >= set(running), 15, what="the running jobs' handlers to return")
            with owner, owner.cursor() as cur:  # one transaction: the jobs commit together
                waiting = insert_many(cur, [Job(q, "bd.Run") for q in QUEUES])
            owner.autocommit = True
            time.sleep(40)
            run(owner, f"ALTER DATABASE {name} CONNECTION LIMIT -1")
            (possible_at,) = run(owner, "SELECT now()")[0]
            wait_for(lambda: set(statuses(db, waiting).values()) == {"ok"}, 60, what="the waiting jobs to run")
            started = db.query("SELECT max(started_at) FROM jobs WHERE id = ANY(%s)", (waiting,))[0][0]
            assert (started - possible_at).total_seconds() < RESUMES_WITHIN, log_path.read_text()[-3000:]
            assert statuses(db, running) == dict.fromkeys(running, "ok")
    finally:
        owner.autocommit = True
        run(owner, f"ALTER DATABASE {name} CONNECTION LIMIT -1")
        owner.close()
