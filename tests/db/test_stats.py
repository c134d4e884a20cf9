"""lib.operate.overview: what the status command and /metrics read, on planted rows."""

from datetime import UTC, datetime, timedelta

import psycopg2
from factory import ago, later, make_job, make_jobs

from lib.operate import overview
from lib.operate.queue_state import pause
from lib.store.sql import Q, statement


def test_queue_stats_counts_each_part_of_a_queue(db):
    make_job(db, "a", run_at=ago(seconds=90))
    make_job(db, "a", run_at=ago(seconds=10), attempts=1)  # a retry now due
    make_job(db, "a", run_at=later(hours=1), attempts=2)  # a retry waiting
    make_job(db, "a", status="started", worker_id="w1")
    for status, finished in [
        ("ok", ago(minutes=1)),
        ("ok: done", ago(minutes=2)),
        ("fail: no", ago(minutes=3)),
        ("skip: rate limited, resets in 5s: x", ago(minutes=4)),
        ("err: interrupted", ago(minutes=5)),
        ("err: boom", ago(minutes=59)),
        ("weird", ago(minutes=6)),
        ("ok", ago(minutes=61)),
        ("err: old", ago(days=2)),
    ]:
        make_job(db, "a", status=status, finished_at=finished)
    [a] = overview.queue_stats(db)
    assert (a.queue, a.pending, a.due, a.delayed, a.running, a.retrying) == ("a", 3, 2, 1, 1, 2)
    assert 89 < a.oldest_due_age_s < 120
    # A status outside the vocabulary ("weird", written by hand) counts as err.
    assert a.done_1h == {"ok": 2, "fail": 1, "skip": 1, "err": 3}
    assert (a.paused_until, a.pause_reason, a.throttled_until) == (None, None, None)


def test_done_in_the_hour_reads_rolled_up_minutes_and_only_the_rows_finished_since(db):
    """Whole minutes come from job_minutes up to the last one the rollup wrote;
    jobs is read only after it. A row finished before that minute's end is the
    rollup's to count (planted here without its minute, it is not counted)."""
    rolled = "date_trunc('minute', now()) - interval '10 minutes'"
    db.exec(
        "INSERT INTO job_minutes (queue, minute, ok, fail, skip, err) VALUES "
        f"('a', {rolled}, 500, 0, 0, 7), ('', {rolled}, 500, 0, 0, 7), "
        "('a', date_trunc('minute', now()) - interval '2 hours', 1000, 0, 0, 0)"
    )
    make_job(db, "a", status="ok", finished_at=ago(minutes=20))  # before the last rolled minute
    make_job(db, "a", status="ok", finished_at=ago(minutes=2))  # since it
    make_job(db, "a", status="fail: no", finished_at=ago(seconds=5))
    [a] = overview.queue_stats(db)
    assert a.done_1h == {"ok": 501, "fail": 1, "skip": 0, "err": 7}


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
    make_job(db, "later", run_at=later(hours=1))
    db.exec("INSERT INTO job_queues (queue, next_claim_at) VALUES ('later', now() - interval '1 second')")
    [delayed] = overview.queue_stats(db)
    assert (delayed.pending, delayed.due, delayed.delayed, delayed.oldest_due_age_s) == (1, 0, 1, None)
    assert delayed.throttled_until is None


def test_queue_stats_stays_on_indexes_with_a_million_finished_rows(db, admin_db, database_url):
    """The pool runs the query prepared and Postgres soon keeps a generic
    plan; that plan is forced and explained. The finished rows are read only
    through jobs_finished, over the last hour, never all of them."""
    with admin_db.connection() as conn, conn.cursor() as cur:
        # No per-row triggers: they are not what this test is about, and they triple the insert time.
        # dedupe is named: the trigger that fills it in when left out runs even here (sql/rules/triggers.sql).
        cur.execute("SET session_replication_role = replica")
        cur.execute(
            "INSERT INTO jobs (queue, name, status, finished_at, attempts, dedupe) "
            "SELECT 'q' || (i % 20), 'q.N', 'ok', now() - interval '2 days' - i * interval '1 second', 1, false "
            "FROM generate_series(1, 1000000) AS i"
        )
        cur.execute("SET session_replication_role = DEFAULT")
    make_job(db, "q1")
    make_job(db, "q1", status="ok")
    db.exec("ANALYZE jobs")
    query = statement("stats_explained", Q.queue_stats)
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET plan_cache_mode = force_generic_plan")
            cur.execute(query.prepare)
            values = {"queues": ["q1"], "rows": None}
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + query.execute, [values[p] for p in query.params])
            plan = "\n".join(row[0] for row in cur.fetchall())
    finally:
        conn.close()
    assert "Seq Scan on jobs" not in plan, plan
    assert "jobs_finished" in plan, plan
    # The whole query touches a few pages, not the million rows' thousands.
    assert int(plan.split("Buffers: shared hit=")[1].split()[0].split(",")[0]) < 200, plan
    [q1] = [s for s in overview.queue_stats(db) if s.queue == "q1"]
    assert (q1.pending, q1.done_1h["ok"]) == (1, 1)


def plant_pending(db, queue: str, due: int, scheduled: int, retrying_due: int = 0) -> None:
    """Pending rows of one queue: due ones (the first retrying_due of them
    back after a failure), then scheduled ones an hour ahead."""
    run_at = [ago(minutes=1) + timedelta(milliseconds=i) for i in range(1, due + 1)] + [later(hours=1)] * scheduled
    attempts = [1] * retrying_due + [0] * (due + scheduled - retrying_due)
    make_jobs(db, due + scheduled, queue, "n", run_at=run_at, attempts=attempts)


def test_pending_counts_stop_at_each_queues_share_of_the_rows_given(db):
    """With rows, each queue with pending rows reads at most its even share
    (at least 100), earliest run_at first: a queue past it says where the count
    stopped, and its due rows are still exact when a scheduled row was read."""
    plant_pending(db, "backlog", due=150, scheduled=0)  # all due, past its share
    plant_pending(db, "mixed", due=80, scheduled=70, retrying_due=5)  # past its share, due under it
    plant_pending(db, "small", due=30, scheduled=10)  # under its share
    got = {s.queue: s for s in overview.queue_stats(db, rows=300)}  # three queues: 100 each
    assert (got["backlog"].counted_to, got["backlog"].pending, got["backlog"].due) == (100, 101, 101)
    assert (got["mixed"].counted_to, got["mixed"].pending, got["mixed"].due) == (100, 101, 80)
    assert (got["mixed"].delayed, got["mixed"].retrying) == (21, 5)
    small = got["small"]
    assert (small.counted_to, small.pending, small.due, small.delayed) == (None, 40, 30, 10)
    # The oldest due row is the first read: exact however far the count went.
    assert 59 < got["backlog"].oldest_due_age_s < 90
    # A larger budget shares out more; none counts every row.
    wide = {s.queue: s for s in overview.queue_stats(db, rows=600)}
    assert (wide["backlog"].counted_to, wide["backlog"].pending) == (None, 150)
    assert (wide["mixed"].counted_to, wide["mixed"].pending, wide["mixed"].delayed) == (None, 150, 70)
    exact = {s.queue: s for s in overview.queue_stats(db)}
    assert [(s.pending, s.due, s.counted_to) for s in exact.values()] == [
        (150, 150, None),
        (150, 80, None),
        (40, 30, None),
    ]
