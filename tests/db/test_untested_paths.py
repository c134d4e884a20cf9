"""Paths no other test reached: a poller killed mid-finalize, a finalize that
fails twice in two ways, a job killed with attempts left, an idle poller's
sleep to its next delayed row, the clock stepping back, the pool's grow,
close and check-in, and an insert through a bare cursor."""

import logging
from datetime import UTC, datetime, timedelta

import gevent
import psycopg2
import psycopg2.extensions
import pytest
from gevent.event import Event
from tests_support import MON, FakeTime, Gate, count_jobs, make_poller, wait_for, waiting_on

from lib.background.clock import Clock, Scheduled
from lib.insert import insert
from lib.job import status as st
from lib.store.db import DB
from lib.store.driver_errors import PoolTimeout
from lib.store.sql import Q

# The advisory lock a test's trigger waits on. Advisory locks belong to one
# database, and each run of the suite has its own.
GATE = 7_200_001


def _gone(db: DB, pid: int) -> bool:
    return db.query_row("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == (0,)


def _job(db: DB, job_id: int) -> dict:
    row = db.query_row(
        "SELECT status, attempts, last_error, lease_until IS NOT NULL, finished_at IS NOT NULL FROM jobs WHERE id = %s",
        (job_id,),
    )
    return dict(zip(("status", "attempts", "last_error", "leased", "finished"), row, strict=True))


# The poller


@pytest.mark.parametrize("killed", ["poll", "slot"])
def test_a_poller_killed_during_its_finalize_gives_the_claimed_next_job_back(db, database_url, killed):
    """The shutdown window closes while a job's outcome is on its way with the
    claim of the slot's next job. The write lands, and the job it claimed,
    which will now never run here, is given back: pending, the attempt not
    counted, for another worker to take at once. Killed are either a
    poller's poll, with a plain kill, or its slot as the worker's shutdown
    kills it, through the runtime's kills."""
    db.exec(
        "CREATE OR REPLACE FUNCTION held_finalize() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF OLD.status = 'started' AND NEW.status = 'ok' THEN PERFORM pg_advisory_xact_lock_shared({GATE}); END IF; "
        "RETURN NEW; END $$"
    )
    db.exec("CREATE TRIGGER held_finalize BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION held_finalize()")
    first, second = insert(db, "k", "k.N"), insert(db, "k", "k.N")
    ran = []
    poller = make_poller("k", db, {"k.N": lambda job: ran.append(job.id) or "ok"}, poll_interval=60)
    try:
        with Gate(database_url, GATE) as gate, gevent.Timeout(20):
            if killed == "poll":
                polling = gevent.spawn(poller.poll, Event())
            else:
                polling = gevent.spawn(poller.run_slot, Event(), 0)
            # The first job's outcome, sent with the claim of the second, waits at the gate.
            wait_for(lambda: waiting_on(db, "advisory"))
            # The shutdown window closed.
            if killed == "poll":
                polling.kill(block=False)
            else:
                gevent.spawn(poller.runtime.kills.kill, [polling])
            # Time for the kill to reach the slot, which is still waiting for its write.
            gevent.sleep(0.2)
            assert not polling.dead and waiting_on(db, "advisory")
            gate.open()
            polling.join()
        assert polling.dead
    finally:
        db.exec("DROP TRIGGER held_finalize ON jobs")
    assert ran == [first]
    assert _job(db, first)["status"] == "ok"
    assert _job(db, second) == {
        "status": "pending",
        "attempts": 0,
        "last_error": None,
        "leased": False,
        "finished": False,
    }
    other = make_poller("k", db, {"k.N": lambda job: st.ok(f"attempt {job.attempts}")})
    assert other.work_once() == "ok: attempt 1"


def test_a_finalize_that_loses_its_connection_then_is_refused_is_reported_once(db, sentry_events, caplog):
    """The first write of the outcome loses its connection; the second, on a
    fresh one, is refused by the server. No third try: the refusal is logged
    and reported once, and the row stays started under its lease for the rescue."""
    db.exec("DROP SEQUENCE IF EXISTS finalize_tries")
    db.exec("CREATE SEQUENCE finalize_tries")
    db.exec(
        "CREATE OR REPLACE FUNCTION failing_finalize() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.status = 'ok: unlucky' THEN "
        # A sequence, not a table: its count survives the aborted transactions.
        "  IF nextval('finalize_tries') = 1 THEN "
        "    PERFORM pg_terminate_backend(pg_backend_pid()); "
        "    PERFORM pg_sleep(30); "  # the session ends at this sleep's first interrupt check
        "  END IF; "
        "  RAISE EXCEPTION 'the disk is full'; "
        "END IF; RETURN NEW; END $$"
    )
    db.exec("CREATE TRIGGER failing_finalize BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION failing_finalize()")
    poller = make_poller("f", db, {"f.N": lambda job: st.ok("unlucky")})
    job_id = insert(db, "f", "f.N")
    try:
        with caplog.at_level(logging.WARNING, logger="jobs"), gevent.Timeout(20):
            assert poller.work_once() == "ok: unlucky"
    finally:
        db.exec("DROP TRIGGER failing_finalize ON jobs")
    (tries,) = db.query_row("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM finalize_tries")
    db.exec("DROP SEQUENCE finalize_tries")
    assert tries == 2
    assert _job(db, job_id) == {
        "status": "started",
        "attempts": 1,
        "last_error": None,
        "leased": True,
        "finished": False,
    }
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "the disk is full" in errors[0], errors
    assert len(sentry_events) == 1
    assert "the disk is full" in repr(sentry_events[0]["exception"])


def test_a_job_killed_with_attempts_left_goes_back_for_another_worker(db, sentry_events):
    """The shutdown window closes while a job with attempts left runs: it is
    written off as interrupted and returned to pending, and another worker runs
    it at once. A shutdown is not a fault: nothing is reported."""
    running = Event()

    def hangs(job):
        running.set()
        gevent.sleep(60)
        return "ok"

    poller = make_poller("i", db, {"i.N": hangs}, max_attempts=2)
    job_id = insert(db, "i", "i.N")
    worker = gevent.spawn(poller.work_once)
    assert running.wait(10)
    worker.kill(timeout=10)
    assert worker.dead
    assert _job(db, job_id) == {
        "status": "pending",
        "attempts": 1,
        "last_error": st.INTERRUPTED,
        "leased": False,
        "finished": False,
    }
    assert sentry_events == []
    other = make_poller("i", db, {"i.N": lambda job: st.ok(f"attempt {job.attempts}")})
    assert other.work_once() == "ok: attempt 2"


def test_an_idle_poller_sleeps_until_its_next_delayed_row(db):
    """Nothing wakes this poller (no listener) and its fallback poll is a minute
    away; a row due in a second is claimed soon after it falls due, because the
    poller slept only until then."""
    ran = Event()
    poller = make_poller("d", db, {"d.N": lambda job: ran.set() or "ok"}, poll_interval=60)
    job_id = insert(db, "d", "d.N", run_at=datetime.now(UTC) + timedelta(seconds=1))
    stop = Event()
    polling = gevent.spawn(poller.poll, stop)
    try:
        # Half the fallback poll: only the sleep to the row's due time ends the wait in time.
        assert ran.wait(30), "not claimed before the fallback poll"
    finally:
        stop.set()
        poller.wake()
        polling.get(timeout=10)
    assert db.query_row("SELECT status, started_at >= run_at FROM jobs WHERE id = %s", (job_id,)) == ("ok", True)


# The clock


def test_the_clock_stepping_back_ticks_the_next_minute_of_the_new_time(db):
    """The wall clock steps back 70 minutes while the clock waits for 09:11: it
    ticks 08:01, the next minute of the new time, instead of waiting 70 minutes."""
    seen: list[datetime] = []
    entry = Scheduled("q", "q.Every", lambda t: seen.append(t) or False)
    stop = Event()
    at = lambda h, m, s=0: MON + timedelta(hours=h, minutes=m, seconds=s)  # noqa: E731
    now = FakeTime([at(9, 10, 30), at(8, 0, 30), at(8, 0, 30), at(8, 1), at(8, 1)], stop)
    with gevent.Timeout(10):
        Clock(db, [entry], now=now).run(stop)
    assert seen == [at(8, 1)]


def test_the_clock_keeps_pruning_clock_ticks_after_stepping_back(db):
    """A clock that ran a day ahead is corrected (NTP steps it back). It goes on
    pruning clock_ticks about once an hour of the new time, not only once the
    new time has caught up with the old one."""
    db.exec("TRUNCATE clock_ticks")
    clock = Clock(db, [Scheduled("x", "x.Never", lambda t: False)])
    ahead = MON + timedelta(hours=12)
    clock.tick(ahead)  # prunes, and notes when
    back = ahead - timedelta(days=1)
    db.exec(
        "INSERT INTO clock_ticks VALUES ('x.Old', %s), ('x.Recent', %s)",
        (back - timedelta(days=4), back - timedelta(days=1)),
    )
    clock.tick(back)
    clock.tick(back + timedelta(minutes=61))  # an hour and more since the step, by the new time
    assert db.query("SELECT name FROM clock_ticks ORDER BY name") == [("x.Recent",)]


# The pool


def test_grow_lets_more_connections_out_at_once(database_url):
    pool = DB.connect(database_url, size=1, checkout_timeout=0.5)
    try:
        with pool.connection() as first:
            with pytest.raises(PoolTimeout):  # its one connection is out
                pool.query_row("SELECT 1")
            pool.grow(1)
            with pool.connection() as second:
                assert second is not first
                with first.cursor() as a, second.cursor() as b:
                    a.execute("SELECT pg_backend_pid()")
                    b.execute("SELECT pg_backend_pid()")
                    assert a.fetchone() != b.fetchone()
        assert pool.size == 2
    finally:
        pool.close()


def test_close_with_a_connection_checked_out(database_url, db):
    """close() closes the idle connections at once; one checked out still works
    for its holder and is closed, not pooled, when it comes back; no new
    checkout is allowed."""
    pool = DB.connect(database_url, size=2)
    with pool.connection() as held:
        with pool.connection() as idle, idle.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            (idle_pid,) = cur.fetchone()
        pool.close()
        assert idle.closed
        wait_for(lambda: _gone(db, idle_pid))
        with held.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        with pytest.raises(RuntimeError, match="closed"):
            pool.query_row("SELECT 1")
    assert held.closed


@pytest.mark.parametrize("left", ["open", "failed"])
def test_a_connection_left_in_a_transaction_is_rolled_back_at_check_in(database_url, db, left):
    """A caller of connection() turned autocommit off and gave the connection
    back inside a transaction, still open or failed by a server error. Its work
    is rolled back, and the same connection is handed out again, in
    autocommit and out of any transaction."""
    pool = DB.connect(database_url, size=1)
    try:
        with pool.connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            (pid,) = cur.fetchone()
        if left == "open":
            with pool.connection() as conn, conn.cursor() as cur:
                conn.autocommit = False
                cur.execute("INSERT INTO cache_entries VALUES ('left', '1', now())")
        else:
            with pytest.raises(psycopg2.Error), pool.connection() as conn, conn.cursor() as cur:
                conn.autocommit = False
                cur.execute("INSERT INTO cache_entries VALUES ('left', '1', now())")
                cur.execute("SELECT 1 / 0")
        assert db.query("SELECT key FROM cache_entries WHERE key = 'left'") == []
        with pool.connection() as conn, conn.cursor() as cur:
            assert conn.autocommit
            assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
            cur.execute("SELECT pg_backend_pid()")
            assert cur.fetchone() == (pid,)  # kept, not discarded
    finally:
        pool.close()


# Insert


def test_insert_through_a_bare_psycopg2_cursor(db, database_url):
    """A caller that holds only a cursor enqueues inside its transaction: the
    job exists once the caller commits, is gone if it rolls back, and a copy
    the dedupe index suppresses gives None."""
    db.exec(Q.dedupe_declare, {"queue": "c", "names": ["c.Once"]})
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            assert isinstance(insert(cur, "c", "c.N", {"n": 1}), int)
            assert count_jobs(db) == 0  # not committed
            conn.rollback()
            job_id = insert(cur, "c", "c.N", {"n": 2})
            assert insert(cur, "c", "c.Once", {"n": 3}) is not None
            assert insert(cur, "c", "c.Once", {"n": 3}) is None
            conn.commit()
    finally:
        conn.close()
        db.exec(Q.dedupe_declare, {"queue": "c", "names": []})
    rows = db.query("SELECT id, name, args, callsite FROM jobs ORDER BY id")
    assert [r[:3] for r in rows] == [(job_id, "c.N", {"n": 2}), (job_id + 1, "c.Once", {"n": 3})]
    assert all(r[3].startswith("tests/db/test_untested_paths.py:") for r in rows)
