import re

import gevent
import psycopg2
import pytest
from factory import make_job, make_jobs, read_job
from tests_support import make_poller, wait_for

from lib.insert import insert
from lib.operate.redrive import redrive
from lib.store.db import DB
from lib.store.retry_backoff import CAP_SECONDS, Backoff, backoff
from lib.store.sql import Q


def test_backoff_grows_then_caps_with_jitter_in_the_upper_half():
    assert backoff(1, rand=0.0) == 5.0 and backoff(1, rand=0.999) == pytest.approx(9.995)
    assert backoff(2, rand=0.0) == 10.0
    assert backoff(3, rand=0.5) == 30.0
    assert backoff(50, rand=0.0) == CAP_SECONDS / 2
    assert backoff(10_000, rand=0.999) <= CAP_SECONDS
    steps = [backoff(n, rand=0.0) for n in range(1, 12)]
    assert steps == sorted(steps)
    with pytest.raises(ValueError):
        backoff(0)


def test_backoff_spreads_jobs_that_failed_together():
    waits = [backoff(3) for _ in range(50)]
    # The bounds on the waits themselves: rounded, a wait just under 40 s reads 40.0.
    assert all(20.0 <= w < 40.0 for w in waits), waits
    assert len({round(w, 3) for w in waits}) > 40


def test_a_retry_loop_waits_longer_each_failure_up_to_its_cap_and_starts_over_after_a_success():
    retry = Backoff(base=1.0, cap=8.0)
    waits = [retry.failed() for _ in range(6)]
    # Steps 1, 2, 4, 8, 8, 8, each wait in the upper half of its step.
    assert [1 <= w / s <= 2 for w, s in zip(waits, [0.5, 1, 2, 4, 4, 4], strict=True)] == [True] * 6
    retry.succeeded()
    assert 0.5 <= retry.failed() < 1.0


def test_redrive_returns_failed_jobs_with_their_error_kept(db):
    def boom(job):
        raise RuntimeError("vendor down")

    poller = make_poller("q", db, {"q.N": boom, "q.M": lambda job: "ok"})
    failed = insert(db, "q", "q.N")
    other = insert(db, "q", "q.N")
    fine = insert(db, "q", "q.M")
    for _ in range(3):
        poller.work_once()
    assert redrive(db, ids=[failed, fine]).redriven == [failed]  # an ok job is not a failure
    row = db.query_row("SELECT status, attempts, max_attempts, last_error FROM jobs WHERE id = %s", (failed,))
    assert row == ("pending", 1, 2, "err: RuntimeError: vendor down")
    assert read_job(db, other).status.startswith("err:")
    # It runs again as attempt 2, and fails for good this time.
    assert poller.work_once() == "err: RuntimeError: vendor down"
    row = read_job(db, failed)
    assert (row.status, row.attempts) == ("err: RuntimeError: vendor down", 2)
    assert redrive(db, queue="q", name="q.N").redriven == [failed, other]


def test_redrive_needs_a_filter(db):
    with pytest.raises(ValueError):
        redrive(db)


def failed_copies(db, n: int, args: dict) -> list[int]:
    """n identical copies of a deduped job that each failed in turn."""
    db.exec("INSERT INTO job_dedupe_names VALUES ('d', 'd.Once') ON CONFLICT DO NOTHING")
    return [make_job(db, "d", "d.Once", args, status="err: vendor down", max_attempts=1).id for _ in range(n)]


def test_redrive_of_failed_copies_of_a_deduped_job_redrives_the_newest(db):
    older, newer = failed_copies(db, 2, {"k": 1})
    [alone] = failed_copies(db, 1, {"k": 2})
    done = redrive(db, queue="d")
    assert done.redriven == [newer, alone]
    assert done.skipped == {older: f"job {newer}, a newer failure of the same job, was redriven"}
    assert db.query("SELECT id, status FROM jobs ORDER BY id") == [
        (older, "err: vendor down"),
        (newer, "pending"),
        (alone, "pending"),
    ]
    # With a copy pending, none is redriven, and each says which copy holds it back.
    assert redrive(db, ids=[older]).skipped == {older: f"job {newer}, a copy of it, is already pending or started"}


def test_redrive_that_meets_a_copy_inserted_meanwhile_skips_instead_of_failing(db, database_url):
    [failed] = failed_copies(db, 1, {"k": 1})
    app = psycopg2.connect(database_url)
    operator = DB.connect(database_url, size=1, application_name="jobs-test-redrive")
    try:
        with app.cursor() as cur:
            copy = insert(cur, "d", "d.Once", {"k": 1})  # not committed: the redrive cannot see it yet
        redriving = gevent.spawn(redrive, operator, ids=[failed])
        wait_for(
            lambda: (
                redriving.dead
                or db.query(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'jobs-test-redrive' AND wait_event_type = 'Lock'"
                )
            )
        )
        waited = not redriving.dead
        app.commit()
        done = redriving.get(timeout=30)
    finally:
        app.close()
        operator.close()
    assert done.redriven == []
    assert done.skipped == {failed: f"job {copy}, a copy of it, is already pending or started"}
    assert waited  # on the uncommitted copy, which the first try could not see


def test_a_live_copy_is_one_the_dedupe_index_holds(db, database_url):
    """A failure is held back for a live copy that jobs_dedupe holds: every
    copy written since its name was declared. A second copy that was started
    before the declaration runs on unmarked (migration 009); an insert of the
    job is accepted beside it, and so is the redrive."""
    [failed] = failed_copies(db, 1, {"k": 1})
    db.exec("DELETE FROM job_dedupe_names")  # declared below, over copies written before
    first, second = (make_job(db, "d", "d.Once", {"k": 1}, status="started", slot=slot).id for slot in range(2))
    db.query_row(Q.dedupe_declare, {"queue": "d", "names": ["d.Once"]})
    assert db.query("SELECT id, dedupe FROM jobs WHERE status = 'started' ORDER BY id") == [
        (first, True),
        (second, False),
    ]
    assert redrive(db, ids=[failed]).skipped == {failed: f"job {first}, a copy of it, is already pending or started"}

    db.exec("UPDATE jobs SET status = 'ok', finished_at = now() WHERE id = %s", (first,))
    app = psycopg2.connect(database_url)
    try:
        with app.cursor() as cur:
            assert insert(cur, "d", "d.Once", {"k": 1}) is not None
    finally:
        app.rollback()
        app.close()
    assert redrive(db, ids=[failed]).redriven == [failed]
    assert db.query_row("SELECT status, dedupe FROM jobs WHERE id = %s", (failed,)) == ("pending", True)
    assert insert(db, "d", "d.Once", {"k": 1}) is None  # the redriven copy holds the name now


def test_the_live_copy_look_up_reads_the_dedupe_index_not_the_table(db):
    """Each failure of a deduped name looks for a live copy of itself: through
    jobs_dedupe, never by reading jobs whole (at 10M rows that scan took a
    second per failure). The redrive as the pool sends it, explained and
    rolled back, next to 20,000 finished rows."""
    failed = failed_copies(db, 1, {"k": 1}) + failed_copies(db, 1, {"k": 2})
    make_jobs(db, 20000, "d", "d.Once", [{"n": i} for i in range(1, 20001)], status="ok", dedupe=True)
    db.exec("ANALYZE jobs")
    with db.connection() as conn, conn.cursor() as cur:
        conn.autocommit = False
        try:
            sent = cur.mogrify(Q.job_redrive, {"ids": failed, "queue": None, "name": None, "fresh": False}).decode()
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sent)
            plan = "\n".join(row[0] for row in cur.fetchall())
        finally:
            conn.rollback()
            conn.autocommit = True
    assert "jobs_dedupe" in plan, plan
    assert not re.search(r"Seq Scan on jobs\b", plan), plan
