import logging
import time
from datetime import UTC, datetime, timedelta

import gevent
import psycopg2
import pytest
from gevent.event import Event
from tests_support import FakeTime, at, count_jobs, wait_for

from lib.background.clock import (
    FIRE_LOCK_TIMEOUT,
    Clock,
    Scheduled,
    daily,
    every,
    hourly,
)
from lib.insert import insert
from lib.store.db import DB


@pytest.fixture
def clock_db(db: DB):
    db.exec("TRUNCATE clock_ticks")
    return db


def jobs(db: DB) -> list[tuple]:
    return db.query("SELECT queue, name, args, callsite, status FROM jobs ORDER BY id")


def ticks(db: DB, name: str) -> list[datetime]:
    return [row[0] for row in db.query("SELECT minute FROM clock_ticks WHERE name = %s ORDER BY minute", (name,))]


def finish_all(db: DB) -> None:
    db.exec("UPDATE jobs SET status = 'ok', finished_at = now() WHERE status = 'pending'")


# tick, against the database.


def test_tick_enqueues_the_matching_entries_only(clock_db, caplog):
    schedule = [
        Scheduled("caches", "caches.Age", every(15)),
        Scheduled("maintenance", "maintenance.CleanUpJobs", daily(3, 17)),
        Scheduled("reports", "reports.Send", hourly(17), args={"to": "ops"}),
    ]
    clock = Clock(clock_db, schedule)
    assert clock.tick(at(0, 3, 16)) == []
    assert count_jobs(clock_db) == 0
    with caplog.at_level(logging.INFO, logger="jobs.clock"):
        ids = clock.tick(at(0, 3, 17, second=42))
    assert len(ids) == 2
    assert jobs(clock_db) == [
        ("maintenance", "maintenance.CleanUpJobs", {}, "clock:maintenance.CleanUpJobs", "pending"),
        ("reports", "reports.Send", {"to": "ops"}, "clock:reports.Send", "pending"),
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "jobs.clock"]
    assert lines == [
        f"clock job=maintenance.CleanUpJobs queue=maintenance id={ids[0]}",
        f"clock job=reports.Send queue=reports id={ids[1]}",
    ]
    assert ticks(clock_db, "maintenance.CleanUpJobs") == [at(0, 3, 17)]
    assert len(clock.tick(at(0, 3, 30))) == 1
    assert count_jobs(clock_db, "name = 'caches.Age'") == 1


def test_two_clocks_on_two_pools_enqueue_each_minute_once(clock_db, database_url):
    schedule = [Scheduled("q", f"q.Job{n}", every(1)) for n in range(4)]
    pools = [DB.connect(database_url, size=2) for _ in range(2)]
    clocks = [Clock(pool, schedule) for pool in pools]
    try:
        for minute in range(15):
            tick_at = at(0, 9, minute)
            racers = [gevent.spawn(clock.tick, tick_at) for clock in clocks]
            gevent.joinall(racers, raise_error=True, timeout=30)
            ids = [job_id for racer in racers for job_id in racer.value]
            assert len(ids) == len(set(ids)) == 4, minute
            finish_all(clock_db)  # done, so the next minute's copy is not held back
    finally:
        for pool in pools:
            pool.close()
    assert clock_db.query("SELECT name, count(*) FROM jobs GROUP BY name ORDER BY name") == [
        (f"q.Job{n}", 15) for n in range(4)
    ]
    assert clock_db.query_row("SELECT count(*) FROM clock_ticks")[0] == 60


def test_no_enqueue_while_a_copy_is_pending(clock_db):
    clock = Clock(clock_db, [Scheduled("caches", "caches.Age", every(15))])
    first = clock.tick(at(0, 10, 0))
    assert len(first) == 1
    assert clock.tick(at(0, 10, 15)) == []  # the 10:00 copy still waits
    assert count_jobs(clock_db) == 1
    assert ticks(clock_db, "caches.Age") == [at(0, 10, 0), at(0, 10, 15)]  # the minute was still decided
    clock_db.exec("UPDATE jobs SET status = 'started' WHERE id = %s", (first[0],))
    second = clock.tick(at(0, 10, 30))  # a running copy does not hold the next one back
    assert len(second) == 1
    finish_all(clock_db)
    insert(clock_db, "caches", "caches.Age")  # a pending copy with the entry's args counts, whoever wrote it
    assert clock.tick(at(0, 10, 45)) == []
    finish_all(clock_db)
    assert len(clock.tick(at(0, 11, 0))) == 1


def test_missed_minutes_are_not_replayed_without_catch_up(clock_db):
    schedule = [Scheduled("caches", "caches.Age", every(15)), Scheduled("m", "m.Daily", daily(3, 17))]
    Clock(clock_db, schedule).tick(at(0, 3, 0))
    finish_all(clock_db)
    # Down from 03:01 to 03:40: 03:15 and 03:17 pass unseen.
    restarted = Clock(clock_db, schedule)
    assert restarted.tick(at(0, 3, 41)) == []
    assert restarted.tick(at(0, 3, 44)) == []
    assert len(restarted.tick(at(0, 3, 45))) == 1
    assert count_jobs(clock_db, "name = 'm.Daily'") == 0


def test_catch_up_fires_once_for_the_latest_missed_minute(clock_db):
    quarter = Scheduled("caches", "caches.Age", every(15), catch_up=True)
    cleanup = Scheduled("m", "m.Daily", daily(3, 17), catch_up=True)
    # Monday's firings, then down from Monday 03:18 to Tuesday 03:50: many
    # quarters and one 03:17 missed.
    clock_db.exec("INSERT INTO clock_ticks VALUES ('caches.Age', %s), ('m.Daily', %s)", (at(0, 3, 15), at(0, 3, 17)))
    restarted = Clock(clock_db, [quarter, cleanup])
    ids = restarted.tick(at(1, 3, 50))
    assert len(ids) == 2
    assert ticks(clock_db, "caches.Age") == [at(0, 3, 15), at(1, 3, 45)]  # the latest missed minute only
    assert ticks(clock_db, "m.Daily") == [at(0, 3, 17), at(1, 3, 17)]
    assert [row[:2] for row in jobs(clock_db)] == [("caches", "caches.Age"), ("m", "m.Daily")]
    finish_all(clock_db)
    assert restarted.tick(at(1, 3, 51)) == []  # only on the first tick
    # Another process starting now finds the catch-up already done.
    assert Clock(clock_db, [quarter, cleanup]).tick(at(1, 3, 52)) == []
    assert count_jobs(clock_db) == 2


def test_catch_up_with_no_firing_on_record_fires_at_start(clock_db):
    # A new entry, or one whose last firing is older than a day: its most recent
    # minute was missed as far as anyone can tell.
    cleanup = Scheduled("m", "m.Daily", daily(3, 17), catch_up=True)
    assert len(Clock(clock_db, [cleanup]).tick(at(0, 9, 0))) == 1
    assert ticks(clock_db, "m.Daily") == [at(0, 3, 17)]


def test_catch_up_is_not_owed_when_nothing_was_missed(clock_db):
    cleanup = Scheduled("m", "m.Daily", daily(3, 17), catch_up=True)
    Clock(clock_db, [cleanup]).tick(at(0, 3, 17))
    finish_all(clock_db)
    assert Clock(clock_db, [cleanup]).tick(at(0, 9, 0)) == []  # 03:17 ran
    # A minute that matches now is fired once, not once more as a catch-up.
    assert len(Clock(clock_db, [cleanup]).tick(at(1, 3, 17))) == 1
    assert count_jobs(clock_db) == 2
    # The schedule moved the job from 04:00 to 03:17: today's 04:00 run is later
    # than the 03:17 just missed, so there is nothing to catch up.
    finish_all(clock_db)
    clock_db.exec("INSERT INTO clock_ticks VALUES ('m.Daily', %s)", (at(2, 4, 0),))
    assert Clock(clock_db, [cleanup]).tick(at(2, 9, 0)) == []
    assert count_jobs(clock_db) == 2
    never = Scheduled("n", "n.Never", lambda t: t.year == 1999, catch_up=True)
    assert Clock(clock_db, [never]).tick(at(1, 9, 0)) == []


def test_catch_up_after_a_failed_first_tick_is_still_owed(clock_db):
    clock = Clock(clock_db, [Scheduled("m", "m.Daily", daily(3, 17), catch_up=True)])
    clock_db.exec("ALTER TABLE clock_ticks RENAME TO clock_ticks_away")
    try:
        assert clock.tick(at(0, 9, 0)) == []  # the database refuses: nothing, and no crash
    finally:
        clock_db.exec("ALTER TABLE clock_ticks_away RENAME TO clock_ticks")
    assert len(clock.tick(at(0, 9, 1))) == 1
    assert ticks(clock_db, "m.Daily") == [at(0, 3, 17)]


@pytest.fixture
def refuse_broken_jobs(clock_db):
    """A trigger that makes the database refuse the job named 'broken.Job'."""
    clock_db.exec(
        "CREATE FUNCTION refuse_broken() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.name = 'broken.Job' THEN RAISE EXCEPTION 'refused by test'; END IF; RETURN NEW; END $$;"
        " CREATE TRIGGER refuse_broken BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_broken()"
    )
    yield
    clock_db.exec("DROP TRIGGER refuse_broken ON jobs; DROP FUNCTION refuse_broken()")


def test_a_failing_entry_does_not_stop_the_others(clock_db, sentry_events, refuse_broken_jobs, caplog):
    def explode(t: datetime) -> bool:
        raise RuntimeError("bad predicate")

    schedule = [
        Scheduled("a", "a.First", every(5)),
        Scheduled("broken", "broken.Job", every(5)),
        Scheduled("bad", "bad.Predicate", explode),
        Scheduled("z", "z.Last", every(5)),
    ]
    with caplog.at_level(logging.INFO, logger="jobs.clock"):
        ids = Clock(clock_db, schedule).tick(at(0, 12, 5))
    assert len(ids) == 2
    assert [row[1] for row in jobs(clock_db)] == ["a.First", "z.Last"]
    assert ticks(clock_db, "broken.Job") == []  # the tick row went with the refused job
    assert sorted(e["tags"]["job"] for e in sentry_events) == ["bad.Predicate", "broken.Job"]
    errors = [r.getMessage() for r in caplog.records if r.name == "jobs.clock" and r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all(line.startswith("clock job=") for line in errors)


def test_old_ticks_are_pruned(clock_db):
    clock_db.exec(
        "INSERT INTO clock_ticks VALUES ('x.Old', %s), ('x.Recent', %s)",
        (at(0, 0, 0) - timedelta(days=4), at(0, 0, 0) - timedelta(days=2)),
    )
    Clock(clock_db, [Scheduled("x", "x.Never", lambda t: False)]).tick(at(0, 0, 0))
    assert clock_db.query("SELECT name FROM clock_ticks") == [("x.Recent",)]


# run: the time is passed in, so nothing sleeps.


def test_run_ticks_each_minute_boundary_and_stops(clock_db):
    stop = Event()
    seen: list[datetime] = []
    entry = Scheduled("q", "q.Every", lambda t: seen.append(t) or False)
    now = FakeTime([at(0, 8, 59, 59), at(0, 9, 0, 0), at(0, 9, 0, 0), at(0, 9, 1, 0), at(0, 9, 1, 1)], stop)
    with gevent.Timeout(5):
        Clock(clock_db, [entry], now=now).run(stop)
    assert seen == [at(0, 9, 0), at(0, 9, 1)]


def test_run_that_wakes_late_skips_the_minutes_between(clock_db):
    stop = Event()
    seen: list[datetime] = []
    entry = Scheduled("q", "q.Every", lambda t: seen.append(t) or False)
    now = FakeTime([at(0, 8, 59, 30), at(0, 9, 3, 10), at(0, 9, 3, 10), at(0, 9, 3, 11)], stop)
    with gevent.Timeout(5):
        Clock(clock_db, [entry], now=now).run(stop)
    assert seen == [at(0, 9, 3)]


def test_run_returns_at_once_when_stopped(clock_db):
    """Stop set while the clock waits for its next minute (59 s away) ends the
    wait: shutdown does not hang on the clock. Stop set before it starts, it
    never ticks."""
    seen: list[datetime] = []
    entry = Scheduled("q", "q.Every", lambda t: seen.append(t) or True)
    waiting = Event()
    calls = 0

    def now() -> datetime:
        nonlocal calls
        calls += 1
        if calls == 2:
            # The second look at the time computes the wait; nothing yields
            # between here and the wait itself.
            waiting.set()
        return at(0, 9, 0, 1)

    stop = Event()
    clock = gevent.spawn(Clock(clock_db, [entry], now=now).run, stop)
    try:
        assert waiting.wait(5)
        stop.set()
        # Far less than the 59 s the clock was waiting: only the stop can end it.
        clock.get(timeout=20)
    finally:
        clock.kill()
    assert seen == []

    stop = Event()
    stop.set()
    with gevent.Timeout(20):
        Clock(clock_db, [entry], now=lambda: at(0, 9, 0, 1)).run(stop)
    assert seen == []


def test_an_entry_whose_tick_another_transaction_holds_fails_alone_in_time(clock_db, database_url, caplog):
    """Another clock's transaction holds entry A's tick for this minute and
    does not end (its link stalled): A's enqueue gives up at its lock
    timeout, and B's is written in the same tick."""
    a = Scheduled("caches", "caches.Age", every(15))
    b = Scheduled("reports", "reports.Send", every(15))
    minute = at(0, 3, 15)
    other = psycopg2.connect(database_url)
    try:
        with other.cursor() as cur:
            cur.execute("INSERT INTO clock_ticks (name, entry, minute) VALUES (%s, %s, %s)", (a.name, a.key, minute))
        began = time.monotonic()
        with gevent.Timeout(20), caplog.at_level(logging.ERROR, logger="jobs.clock"):
            ids = Clock(clock_db, [a, b]).tick(minute)
        took = time.monotonic() - began
    finally:
        other.rollback()
        other.close()
    assert jobs(clock_db) == [("reports", "reports.Send", {}, "clock:reports.Send", "pending")]
    assert len(ids) == 1
    assert FIRE_LOCK_TIMEOUT <= took < FIRE_LOCK_TIMEOUT + 5
    assert [r.getMessage().split(" err: ")[0] for r in caplog.records] == ["clock job=caches.Age queue=caches"]


def test_a_cron_entry_fires_once_a_minute_across_three_replicas_on_the_real_clock(clock_db, database_url):
    """Three clocks, each on a pool of its own as three worker processes have,
    run by the real clock through two minute boundaries: `* * * * *` fires
    once each minute. The clocks' time is the real time moved on to two
    seconds before a minute, so the test waits one minute, not up to two."""
    from lib.background.cron import cron

    real = datetime.now(UTC)
    shift = real.replace(second=58, microsecond=0) - real
    entry = Scheduled("q", "q.EveryMinute", cron("* * * * *"))
    pools = [DB.connect(database_url, size=1) for _ in range(3)]
    stop = Event()
    replicas = [gevent.spawn(Clock(pool, [entry], now=lambda: datetime.now(UTC) + shift).run, stop) for pool in pools]
    try:
        first = (real + shift).replace(second=0) + timedelta(minutes=1)
        wait_for(lambda: ticks(clock_db, entry.name) == [first], timeout=30)
        finish_all(clock_db)  # done, so the next minute's copy is not held back
        wait_for(lambda: ticks(clock_db, entry.name) == [first, first + timedelta(minutes=1)], timeout=75)
        time.sleep(2)  # every replica's tick of that minute is over
        assert not any(r.dead for r in replicas)
    finally:
        stop.set()
        gevent.joinall(replicas, timeout=10)
        for pool in pools:
            pool.close()
    assert clock_db.query("SELECT callsite, count(*) FROM jobs GROUP BY callsite") == [("clock:q.EveryMinute", 2)]
    assert ticks(clock_db, entry.name) == [first, first + timedelta(minutes=1)]
