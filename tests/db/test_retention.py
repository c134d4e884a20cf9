import re
from datetime import UTC, datetime, timedelta

import gevent
import psycopg2
from factory import ago, make_job, make_jobs
from tests_support import count_jobs, make_poller

from lib.insert import insert
from lib.run.poller import Poller
from lib.setup.settings import Settings
from lib.store.db import DB
from lib.store.sql import Q, statement
from queues import caches, maintenance, registry


def test_retention_deletes_old_finished_rows_only(db):
    make_job(db, "r", status="ok", finished_at=ago(days=20))
    make_job(db, "r", status="err: x", finished_at=ago(days=15))
    kept = {make_job(db, "r", status="ok", finished_at=ago(days=1)).id}
    # Live rows, however old, stay: a pending one, a started one, one waiting for a retry.
    kept.add(make_job(db, "r", created_at=ago(days=90)).id)
    kept.add(make_job(db, "r", status="started", started_at=ago(days=30), finished_at=ago(days=30)).id)
    kept.add(make_job(db, "r", finished_at=ago(days=30)).id)
    assert maintenance.clean_up_jobs(db, days=14, batch=1) == "ok: deleted 2"
    left = {r[0] for r in db.query("SELECT id FROM jobs")}
    assert left == kept
    assert maintenance.clean_up_jobs(db, days=14) == "skip: nothing old enough"


def test_retention_deletes_the_steps_of_the_rows_it_deletes(db):
    """In the statement that deletes their jobs, batch by batch: no step
    outlives its job, and the steps of a kept job stay."""
    old = [make_job(db, "r", status="ok", finished_at=ago(days=20)).id for _ in range(3)]
    kept = [make_job(db, "r", status="ok", finished_at=ago(days=1)).id, make_job(db, "r").id]
    for job_id in [*old, *kept]:
        db.exec(
            "INSERT INTO job_steps (job_id, name, result) VALUES (%s, 'a', '1'), (%s, 'b', '[2]')", (job_id, job_id)
        )
    assert maintenance.clean_up_jobs(db, days=14, batch=2) == "ok: deleted 3"
    assert db.query("SELECT DISTINCT job_id FROM job_steps ORDER BY job_id") == [(i,) for i in kept]
    assert db.query_row("SELECT count(*) FROM job_steps") == (4,)


def test_retention_runs_as_a_job_of_the_maintenance_queue(db):
    insert(db, "maintenance", "maintenance.CleanUpJobs")
    assert make_poller(maintenance.make_worker(db), db).work_once() == "skip: nothing old enough"


def test_the_registry_gives_maintenance_the_retention_of_the_settings(db):
    """JOBS_RETENTION_DAYS reaches the queue through queues.registry: rows
    finished 3 days ago stay at the default (14) and go at 2 days."""
    make_job(db, "r", status="ok", finished_at=ago(days=3))

    def clean_up_with(env: dict[str, str]) -> str:
        [make] = [m for m in registry(Settings.from_env(env)) if m.__module__ == "queues.maintenance"]
        insert(db, "maintenance", "maintenance.CleanUpJobs")
        return make_poller(make(db), db).work_once()

    assert clean_up_with({}) == "skip: nothing old enough"
    assert clean_up_with({"JOBS_RETENTION_DAYS": "2"}) == "ok: deleted 1"


def test_caches_age_deletes_expired_entries(db):
    db.exec(
        "INSERT INTO cache_entries VALUES ('a', '1', now() - interval '1 minute'), ('b', '1', now() + interval '1 hour')"
    )
    assert caches.age(db, batch=1) == "ok: deleted 1"
    insert(db, "caches", "caches.Age")
    poller: Poller = make_poller(caches.make_worker(db), db)
    assert poller.work_once() == "skip: nothing expired"
    assert db.query("SELECT key FROM cache_entries") == [("b",)]


def test_claim_stays_on_its_index_with_many_finished_rows(db, database_url):
    """The claim reads the partial index of pending rows, so finished rows do
    not enter it (the benchmark shows the time with a million). The claim runs
    inside jobs_step, whose statements Postgres runs on generic plans,
    made without the parameters' values: those are the plans forced here. The
    pages a claim touches are counted (EXPLAIN's buffers include the
    function's own statements): a handful, where reading the finished rows
    would touch hundreds."""
    make_jobs(db, 50000, "big", "big.N", status="ok")
    insert(db, "big", "big.N")
    db.exec("ANALYZE jobs")
    pages = db.query_row("SELECT relpages FROM pg_class WHERE relname = 'jobs'")[0]
    params = {"queue": "big", "id": None, "slot": 0, "worker_id": "w", "lease": 30, "max_attempts": 1}
    claim = statement("claim_explained", Q.job_claim)
    conn = psycopg2.connect(database_url)
    touched = []
    try:
        with conn.cursor() as cur:
            cur.execute("SET plan_cache_mode = force_generic_plan")
            cur.execute(claim.prepare)
            # Explained with ANALYZE, so it runs: inside a transaction that is
            # rolled back. Twice: the first call also reads the catalogs.
            for _ in range(2):
                cur.execute("SAVEPOINT s")
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + claim.execute, [params[name] for name in claim.params])
                plan = "\n".join(row[0] for row in cur.fetchall())
                cur.execute("ROLLBACK TO SAVEPOINT s")
                touched.append(sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", plan.splitlines()[1])))
    finally:
        conn.rollback()
        conn.close()
    assert "jobs_step" in plan, plan
    assert pages > 300, pages  # what reading the finished rows would cost
    assert touched[1] < 60, (touched, plan)
    assert count_jobs(db, "status = 'started'") == 0


def test_the_rescue_reads_the_started_rows_alone_with_many_finished_rows(db):
    """The rescue looks among the started rows (one a running job) through
    the partial index of started rows: with 50,000 finished rows beside two
    started ones, one of them lost, it touches a handful of pages where
    reading the finished rows would touch hundreds."""
    make_jobs(db, 50000, "big", "big.N", status="ok")
    lost = make_job(db, "big", status="started", lease_until=ago(seconds=60), max_attempts=3).id
    make_job(db, "other", status="started")
    db.exec("ANALYZE jobs")
    pages = db.query_row("SELECT relpages FROM pg_class WHERE relname = 'jobs'")[0]
    params = {"worker_id": "rescuer", "held": [], "skip": [], "only": None, "legacy_age": 3600}
    with db.connection() as conn, conn.cursor() as cur:
        conn.autocommit = False
        try:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + cur.mogrify(Q.job_rescue, params).decode())
            plan = "\n".join(row[0] for row in cur.fetchall())
            cur.execute("SELECT id FROM jobs WHERE status = 'pending'")
            rescued = [row[0] for row in cur.fetchall()]
        finally:
            conn.rollback()
            conn.autocommit = True
    # The statement's own line, which counts what its parts touched.
    touched = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", plan.splitlines()[1]))
    assert rescued == [lost]
    assert pages > 300, pages  # what reading the finished rows would cost
    assert touched < 60, (touched, plan)


def test_retention_deletes_every_row_of_an_instant_a_batch_boundary_splits(db):
    """Each batch starts at the newest finished_at the last one deleted and
    takes that instant's rows again: with batches of two, the three rows that
    finished in one instant straddle a boundary, and all go."""
    second = datetime(2020, 1, 1, tzinfo=UTC)
    make_job(db, "r", status="ok", finished_at=second)
    for _ in range(3):
        make_job(db, "r", status="ok", finished_at=second + timedelta(seconds=1))
    make_job(db, "r", status="err: x", finished_at=second + timedelta(seconds=2))
    kept = [make_job(db, "r", status="ok").id, make_job(db, "r").id]
    assert maintenance.clean_up_jobs(db, days=14, batch=2) == "ok: deleted 5"
    assert db.query("SELECT id FROM jobs ORDER BY id") == [(kept[0],), (kept[1],)]


def test_retention_passes_over_a_row_a_redrive_holds_without_waiting(db, database_url):
    """A batch chooses its rows while a redrive holds one of them: the batch
    takes the others without waiting for that transaction, and the redriven
    row is pending once the redrive commits."""
    ids = [make_job(db, "r", status="err: x", finished_at=datetime(2020, 1, 1, tzinfo=UTC)).id for _ in range(3)]
    app = psycopg2.connect(database_url)
    cleaner = DB.connect(database_url, size=1, application_name="jobs-test-retention")
    try:
        with app.cursor() as cur:
            cur.execute(Q.job_redrive, {"ids": [ids[0]], "queue": None, "name": None, "fresh": False})
        with gevent.Timeout(10):
            done = maintenance.clean_up_jobs(cleaner, days=14)
        app.commit()
    finally:
        app.close()
        cleaner.close()
    assert done == "ok: deleted 2"
    assert db.query("SELECT id, status FROM jobs") == [(ids[0], "pending")]


def test_a_batch_is_planned_without_reading_the_entries_the_last_ones_left_dead(db):
    """Until a VACUUM, every row a batch deleted leaves dead index entries at
    the low end of jobs_pkey (the oldest rows have the lowest ids). A batch
    that joined jobs with itself on id was planned by reading that end for
    its estimates: 14,576 pages, 47 ms a batch after 5.3M rows. After 50,000
    rows, planning the next batch touches a few pages."""
    start = datetime(2020, 1, 1, tzinfo=UTC)
    finished = [start + timedelta(seconds=i) for i in range(1, 50001)]
    make_jobs(db, 50000, "r", "r.N", status="ok", finished_at=finished, dedupe=False)
    db.exec("ANALYZE jobs")
    assert maintenance.clean_up_jobs(db, days=14) == "ok: deleted 50000"
    with db.connection() as conn, conn.cursor() as cur:
        conn.autocommit = False
        try:
            cur.execute(
                "EXPLAIN (ANALYZE, BUFFERS) "
                + cur.mogrify(Q.job_delete_finished, {"days": 14, "batch": 1000, "after": None}).decode()
            )
            plan = "\n".join(row[0] for row in cur.fetchall())
        finally:
            conn.rollback()
            conn.autocommit = True
    planning = re.search(r"^Planning:\n\s+Buffers: (.*)$", plan, re.M)
    read = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", planning.group(1))) if planning else 0
    assert read < 100, plan
