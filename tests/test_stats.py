"""lib.operate.overview: what the status command and /metrics read, on planted rows."""

from datetime import UTC, datetime, timedelta

import psycopg2

from lib.insert import insert
from lib.operate import overview
from lib.operate.queue_state import pause
from lib.store.sql import Q, statement


def _plant(db, queue: str, status: str, **cols) -> int:
    job_id = insert(db, queue, f"{queue}.N", {"n": cols.pop("n", 0)})
    sets = ", ".join(f"{k} = {v}" for k, v in {"status": f"'{status}'", **cols}.items())
    db.exec(f"UPDATE jobs SET {sets} WHERE id = %s", (job_id,))
    return job_id


def test_queue_stats_counts_each_part_of_a_queue(db):
    _plant(db, "a", "pending", run_at="now() - interval '90 seconds'", n=1)
    _plant(db, "a", "pending", run_at="now() - interval '10 seconds'", attempts=1, n=2)  # a retry now due
    _plant(db, "a", "pending", run_at="now() + interval '1 hour'", attempts=2, n=3)  # a retry waiting
    _plant(db, "a", "started", worker_id="'w1'", slot=0, n=4)
    for n, (st, ago) in enumerate(
        [
            ("ok", "1 minute"),
            ("ok: done", "2 minutes"),
            ("fail: no", "3 minutes"),
            ("skip: rate limited, resets in 5s: x", "4 minutes"),
            ("err: interrupted", "5 minutes"),
            ("err: boom", "59 minutes"),
            ("weird", "6 minutes"),
            ("ok", "61 minutes"),
            ("err: old", "2 days"),
        ]
    ):
        _plant(db, "a", st, finished_at=f"now() - interval '{ago}'", n=10 + n)
    [a] = overview.queue_stats(db)
    assert (a.queue, a.pending, a.due, a.delayed, a.running, a.retrying) == ("a", 3, 2, 1, 1, 2)
    assert 89 < a.oldest_due_age_s < 120
    # A status outside the vocabulary ("weird", written by hand) counts as err.
    assert a.done_1h == {"ok": 2, "fail": 1, "skip": 1, "err": 3}
    assert (a.paused_until, a.pause_reason, a.throttled_until) == (None, None, None)


def test_queue_stats_lists_named_and_paused_queues_with_zeros(db):
    assert overview.queue_stats(db) == []
    zero = {"ok": 0, "fail": 0, "skip": 0, "err": 0}
    until = datetime.now(UTC) + timedelta(minutes=5)
    pause(db, "p", "vendor incident", until)
    pause(db, "forever", "by hand")
    pause(db, "over", "ended already", datetime.now(UTC) - timedelta(minutes=1))
    db.exec("INSERT INTO job_queues (queue, next_claim_at) VALUES ('t', now() + interval '30 seconds')")
    got = {s.queue: s for s in overview.queue_stats(db, ["named", "p"])}
    assert list(got) == ["forever", "named", "over", "p", "t"]
    assert got["named"] == overview.QueueStats("named", 0, 0, 0, 0, None, zero, 0, None, None, None)
    assert (got["p"].paused_until, got["p"].pause_reason) == (until, "vendor incident")
    assert got["forever"].paused_until == datetime.max.replace(tzinfo=UTC)
    assert (got["over"].paused_until, got["over"].pause_reason) == (None, None)  # a pause that ended is not shown
    assert got["t"].throttled_until > datetime.now(UTC) and got["t"].paused_until is None


def test_a_queue_with_only_delayed_rows_has_no_due_age_and_a_past_throttle_is_not_shown(db):
    _plant(db, "later", "pending", run_at="now() + interval '1 hour'")
    db.exec("INSERT INTO job_queues (queue, next_claim_at) VALUES ('later', now() - interval '1 second')")
    [later] = overview.queue_stats(db)
    assert (later.pending, later.due, later.delayed, later.oldest_due_age_s) == (1, 0, 1, None)
    assert later.throttled_until is None


def test_queue_stats_stays_on_indexes_with_a_million_finished_rows(db, database_url):
    """The pool runs the query prepared and Postgres soon keeps a generic
    plan; that plan is forced and explained. The finished rows are read only
    through jobs_finished, over the last hour, never all of them."""
    with db.connection() as conn, conn.cursor() as cur:
        # No per-row triggers: they are not what this test is about, and they triple the insert time.
        # dedupe is named: the trigger that fills it in when left out runs even here (migration 015).
        cur.execute("SET session_replication_role = replica")
        cur.execute(
            "INSERT INTO jobs (queue, name, status, finished_at, attempts, dedupe) "
            "SELECT 'q' || (i % 20), 'q.N', 'ok', now() - interval '2 days' - i * interval '1 second', 1, false "
            "FROM generate_series(1, 1000000) AS i"
        )
        cur.execute("SET session_replication_role = DEFAULT")
    _plant(db, "q1", "pending")
    _plant(db, "q1", "ok", finished_at="now()")
    db.exec("ANALYZE jobs")
    query = statement("stats_explained", Q.queue_stats)
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET plan_cache_mode = force_generic_plan")
            cur.execute(query.prepare)
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + query.execute, [["q1"]])
            plan = "\n".join(row[0] for row in cur.fetchall())
    finally:
        conn.close()
    assert "Seq Scan on jobs" not in plan, plan
    assert "jobs_finished" in plan, plan
    # The whole query touches a few pages, not the million rows' thousands.
    assert int(plan.split("Buffers: shared hit=")[1].split()[0].split(",")[0]) < 200, plan
    [q1] = [s for s in overview.queue_stats(db) if s.queue == "q1"]
    assert (q1.pending, q1.done_1h["ok"]) == (1, 1)
