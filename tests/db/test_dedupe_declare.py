"""Dedupe names are declared additively, by every worker at start, and hold for
rows written before the declaration."""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import gevent
import psycopg2
import pytest
from gevent.event import Event
from tests_support import ROOT, read_until, run_python, wait_for, waiting_on

from lib.insert import insert
from lib.operate.queue_state import pause, resume
from lib.run.queue import Queue
from lib.store.db import DB
from lib.store.migrate import migrate, migrations
from lib.store.sql import Q
from worker import _queues_to_run

# A process that declares what its queue dd lists, the way a worker
# does at start, and exits.
DECLARE = """
import os

import worker
from lib.store.db import DB
from lib.run.queue import Queue

names = set(os.environ["DEDUPE_NAMES"].split(","))
db = DB.connect(os.environ["DATABASE_URL"], size=1)
handlers = {"dd.A": lambda job: "ok", "dd.B": lambda job: "ok"}
worker._queues_to_run(db, [lambda db: Queue("dd", handlers, dedupe=names)])
db.close()
"""

DEDUPE_WORKER = ROOT / "tests" / "apps" / "dedupe_worker.py"


def declare(db: DB, names: set[str]) -> None:
    """What a worker does at start for a queue dd whose definition lists names,
    and then while it runs until the declaration is done."""
    handlers = {name: lambda job: "ok" for name in ("dd.A", "dd.B", "dd.C")}
    _, _, waiting, _ = _queues_to_run(db, [lambda db: Queue("dd", handlers, dedupe=names)])
    waiting.until_done(Event())


def live(db: DB) -> list[tuple]:
    return db.query("SELECT id, name, args, status, dedupe FROM jobs ORDER BY id")


def test_two_processes_declaring_different_names_both_hold(db, database_url):
    for names in ("dd.A", "dd.B"):
        done = run_python(DECLARE, env={"DATABASE_URL": database_url, "DEDUPE_NAMES": names})
        assert done.returncode == 0, done.stderr
    assert db.query("SELECT queue, name FROM job_dedupe_names ORDER BY name") == [("dd", "dd.A"), ("dd", "dd.B")]
    for name in ("dd.A", "dd.B"):
        assert insert(db, "dd", name, {"n": 1}) is not None
        assert insert(db, "dd", name, {"n": 1}) is None, f"a second pending {name} was accepted"


def test_rows_written_before_the_declaration_are_deduped_by_it(db):
    # Written after migrate, before any worker started: nothing is declared yet.
    a1 = insert(db, "dd", "dd.A", {"n": 1})
    a2 = insert(db, "dd", "dd.A", {"n": 1})
    b_pending = insert(db, "dd", "dd.A", {"n": 2})
    b_started = insert(db, "dd", "dd.A", {"n": 2})
    b_later = insert(db, "dd", "dd.A", {"n": 2})
    other = insert(db, "dd", "dd.A", {"n": 3})
    c1 = insert(db, "dd", "dd.C", {"n": 1})  # a name no one declares
    c2 = insert(db, "dd", "dd.C", {"n": 1})
    # A copy already running wins over older pending ones: it cannot be taken back.
    db.exec("UPDATE jobs SET status = 'started', attempts = 1 WHERE id = %s", (b_started,))

    declare(db, {"dd.A"})

    assert live(db) == [
        (a1, "dd.A", {"n": 1}, "pending", True),
        (a2, "dd.A", {"n": 1}, f"skip: duplicate of job {a1}", False),
        (b_pending, "dd.A", {"n": 2}, f"skip: duplicate of job {b_started}", False),
        (b_started, "dd.A", {"n": 2}, "started", True),
        (b_later, "dd.A", {"n": 2}, f"skip: duplicate of job {b_started}", False),
        (other, "dd.A", {"n": 3}, "pending", True),
        (c1, "dd.C", {"n": 1}, "pending", False),
        (c2, "dd.C", {"n": 1}, "pending", False),
    ]
    assert db.query_row("SELECT count(*) FROM jobs WHERE status LIKE 'skip:%%' AND finished_at IS NULL")[0] == 0
    assert insert(db, "dd", "dd.A", {"n": 1}) is None
    assert insert(db, "dd", "dd.A", {"n": 2}) is None
    # Declaring again (the next start) changes nothing.
    declare(db, {"dd.A"})
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'pending'")[0] == 4


def test_two_started_copies_keep_running_and_one_holds_the_name(db):
    # Concurrency 2 may have started two identical copies before the name was declared.
    first = insert(db, "dd", "dd.A", {"n": 1})
    second = insert(db, "dd", "dd.A", {"n": 1})
    insert(db, "dd", "dd.A", {"n": 1})  # waiting
    db.exec("UPDATE jobs SET status = 'started', attempts = 1 WHERE id IN (%s, %s)", (first, second))
    declare(db, {"dd.A"})
    assert [row[3:] for row in live(db)] == [
        ("started", True),
        ("started", False),
        (f"skip: duplicate of job {first}", False),
    ]
    assert insert(db, "dd", "dd.A", {"n": 1}) is None


def waiting_on_a_lock(db: DB, application_name: str) -> bool:
    return bool(
        db.query(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            (application_name,),
        )
    )


def test_a_row_inserted_while_its_name_is_declared_is_deduped(db, database_url):
    # An application's transaction wrote the row before the name was declared
    # and commits after: the declaration must not miss it.
    app = psycopg2.connect(database_url)
    declarer = DB.connect(database_url, size=1, application_name="jobs-test-declarer")
    try:
        with app.cursor() as cur:
            early = insert(cur, "dd", "dd.A", {"n": 1})
        declaring = gevent.spawn(declare, declarer, {"dd.A"})
        wait_for(lambda: declaring.dead or waiting_on_a_lock(db, "jobs-test-declarer"))
        waited = not declaring.dead
        app.commit()
        declaring.get(timeout=30)
    finally:
        app.close()
        declarer.close()
    assert db.query_row("SELECT status, dedupe FROM jobs WHERE id = %s", (early,)) == ("pending", True)
    assert insert(db, "dd", "dd.A", {"n": 1}) is None
    assert waited  # for the application's transaction, not past it


@pytest.fixture
def runs_table(db):
    db.exec("DROP TABLE IF EXISTS dedupe_runs")
    db.exec("CREATE TABLE dedupe_runs (job_id bigint, name text, args jsonb)")
    yield db
    db.exec("DROP TABLE dedupe_runs")


def start_dedupe_worker(database_url: str, names: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(DEDUPE_WORKER)],
        env={**os.environ, "DATABASE_URL": database_url, "DEDUPE_NAMES": names, "LOG_LEVEL": "INFO"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def declared(db: DB, name: str) -> bool:
    return bool(db.query("SELECT 1 FROM job_dedupe_names WHERE queue = 'dd' AND name = %s", (name,)))


def test_two_workers_with_different_dedupe_names_run_each_job_once(runs_table, database_url):
    db = runs_table
    pause(db, "dd", "held by the test until both workers have started")
    # Copies written before any worker started.
    a1, a1_copy, b1, b1_copy, a2 = (
        insert(db, "dd", name, {"n": n})
        for name, n in [("dd.A", 1), ("dd.A", 1), ("dd.B", 1), ("dd.B", 1), ("dd.A", 2)]
    )
    workers = [start_dedupe_worker(database_url, "dd.A")]
    try:
        wait_for(lambda: declared(db, "dd.A"))
        workers.append(start_dedupe_worker(database_url, "dd.B"))
        wait_for(lambda: declared(db, "dd.B"))
        # Copies written once both run: refused, whichever worker declared the name.
        assert insert(db, "dd", "dd.A", {"n": 1}) is None
        assert insert(db, "dd", "dd.B", {"n": 1}) is None
        resume(db, "dd")
        db.exec(Q.queue_notify, {"queue": "dd"})
        wait_for(lambda: db.query_row("SELECT count(*) FROM jobs WHERE status IN ('pending', 'started')")[0] == 0)
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=30)[0] for proc in workers]
    finally:
        for proc in workers:
            proc.kill()
    assert [proc.returncode for proc in workers] == [0, 0], outputs
    runs = Counter((name, args["n"]) for name, args in db.query("SELECT name, args FROM dedupe_runs"))
    assert runs == {("dd.A", 1): 1, ("dd.B", 1): 1, ("dd.A", 2): 1}
    assert db.query("SELECT id, status FROM jobs ORDER BY id") == [
        (a1, "ok"),
        (a1_copy, f"skip: duplicate of job {a1}"),
        (b1, "ok"),
        (b1_copy, f"skip: duplicate of job {b1}"),
        (a2, "ok"),
    ]


def migrated_to(url: str, version: int, tmp_path) -> DB:
    """A pool on a database migrated only up to version, as an older release left it."""
    for number, _, path in migrations():
        if number <= version:
            shutil.copy(path, tmp_path / path.name)
    db = DB.connect(url, size=2)
    migrate(db, tmp_path, rules=None)
    return db


def test_the_upgrade_dedupes_rows_that_slipped_past_a_name_turned_off(empty_database, tmp_path):
    db = migrated_to(empty_database, 8, tmp_path)
    try:
        # Written as lib.insert wrote them then (its functions came in 015).
        write = """INSERT INTO jobs (queue, name, args) VALUES ('dd', 'dd.A', '{"n": 1}') ON CONFLICT DO NOTHING RETURNING id"""
        db.exec("INSERT INTO job_dedupe_names VALUES ('dd', 'dd.A')")
        (kept,) = db.query_row(write)
        # Another process's declaration had deleted the name for a while.
        db.exec("DELETE FROM job_dedupe_names")
        (slipped,) = db.query_row(write)
        db.exec("INSERT INTO job_dedupe_names VALUES ('dd', 'dd.A')")
        assert "009_dedupe_clock_entries" in migrate(db)
        assert db.query("SELECT id, status, dedupe FROM jobs ORDER BY id") == [
            (kept, "pending", True),
            (slipped, f"skip: duplicate of job {kept}", False),
        ]
    finally:
        db.close()


def test_an_insert_that_waited_for_a_declaration_dedupes_under_it(db, database_url):
    # The declaration holds jobs locked while an insert through the project's
    # DB (run as EXECUTE of a prepared statement) waits: once in, the insert
    # must read the name it waited for, not a snapshot from before.
    declarer = psycopg2.connect(database_url)
    inserter = DB.connect(database_url, size=1, application_name="jobs-test-inserter")
    try:
        insert(inserter, "dd", "dd.B", {"n": 0})  # prepared, as a worker's connection has it
        with declarer.cursor() as cur:
            cur.execute("SELECT jobs_dedupe_declare('dd', ARRAY['dd.A'])")
        inserting = gevent.spawn(insert, inserter, "dd", "dd.A", {"n": 1}, callsite="test")
        wait_for(lambda: inserting.dead or waiting_on_a_lock(db, "jobs-test-inserter"))
        waited = not inserting.dead
        declarer.commit()
        job_id = inserting.get(timeout=30)
    finally:
        declarer.close()
        inserter.close()
    assert db.query_row("SELECT status, dedupe FROM jobs WHERE id = %s", (job_id,)) == ("pending", True)
    assert insert(db, "dd", "dd.A", {"n": 1}) is None
    assert waited


def heartbeat_seconds(database_url: str, job_id: int) -> float:
    """How long a running worker's lease renewal of a started row takes (inf: over 10 s)."""
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SET statement_timeout = '10s'")
            began = time.monotonic()
            try:
                cur.execute("UPDATE jobs SET lease_until = now() + interval '1 minute' WHERE id = %s", (job_id,))
            except psycopg2.errors.QueryCanceled:
                return float("inf")
            return time.monotonic() - began
    finally:
        conn.close()


def test_a_declaration_waiting_for_an_open_transaction_holds_up_no_heartbeat(runs_table, database_url):
    db = runs_table
    running = insert(db, "hb", "hb.N", {})
    db.exec(
        "UPDATE jobs SET status = 'started', attempts = 1, worker_id = 'another', slot = 0,"
        " lease_until = now() + interval '1 minute' WHERE id = %s",
        (running,),
    )
    # Held, so that the row written meanwhile is still live when the name is declared.
    pause(db, "dd", "held by the test")
    app = psycopg2.connect(database_url)
    proc = None
    try:
        with app.cursor() as cur:
            # Open: the declaration's LOCK TABLE jobs must wait for it.
            early = insert(cur, "dd", "dd.A", {"n": 1})
        proc = start_dedupe_worker(database_url, "dd.A")
        wait_for(lambda: waiting_on(db, "relation", "jobs"), 30, every=0.01)
        assert heartbeat_seconds(database_url, running) < 1
        # The worker runs its queue while its declaration waits.
        started = read_until(proc, "running 1 queues")
        assert "queue=dd dedupe names dd.A waits to be declared" in started
        assert not declared(db, "dd.A")
        app.commit()
        read_until(proc, "queue=dd dedupe names dd.A declared")
        assert db.query_row("SELECT status, dedupe FROM jobs WHERE id = %s", (early,)) == ("pending", True)
        assert insert(db, "dd", "dd.A", {"n": 1}) is None
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
    finally:
        app.close()
        if proc is not None:
            proc.kill()
    assert proc.returncode == 0, output
    assert " died: " not in output
