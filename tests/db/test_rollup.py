"""The per-minute rollup (lib/background/rollup.py, job_minutes): counts by
kind, start latency and backlog per queue and for every queue, rolled up
from rows planted at known minutes, with the minute passed in."""

import logging
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from factory import make_job

from lib.background.rollup import KEEP, ROLLUP_KEY, Rollup
from lib.store.sql import Q

MINUTE = timedelta(minutes=1)
# A minute well in the past, so that nothing the test does now falls in it.
M = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)


def minutes(db, queue: str) -> list[tuple]:
    return db.query(Q.job_minutes_since, {"queue": queue, "since": M - timedelta(days=30)})


def ended(db, queue: str, status: str, at: datetime, latency: float | None = 1.0) -> None:
    started = None if latency is None else at - timedelta(seconds=5)
    run_at = (started or at) - timedelta(seconds=latency or 0)
    make_job(db, queue, status=status, finished_at=at, started_at=started, run_at=run_at)


def test_a_minute_is_counted_by_kind_per_queue_and_for_every_queue(db):
    for n in range(4):
        ended(db, "mail", "ok", M + timedelta(seconds=n), latency=float(n))
    ended(db, "mail", "fail: no such user", M + timedelta(seconds=30), latency=10.0)
    ended(db, "sms", "skip: nothing to do", M + timedelta(seconds=59))
    ended(db, "sms", "err: boom", M + timedelta(seconds=1))
    ended(db, "sms", "weird, by hand", M + timedelta(seconds=2), latency=None)  # never started
    ended(db, "sms", "ok", M + MINUTE)  # the next minute
    ended(db, "sms", "ok", M - 4 * MINUTE)  # before the minutes rolled up
    make_job(db, "mail")  # pending and due: the backlog
    make_job(db, "mail", run_at=timedelta(hours=1))  # pending, not due

    assert Rollup(db).roll_up(M + MINUTE + timedelta(seconds=1))

    (mail,) = minutes(db, "mail")
    assert mail[:5] == (M, 4, 1, 0, 0)
    # Latencies 0, 1, 2, 3 and 10 s: the median and the 95th percentile, interpolated.
    assert mail[5] == pytest.approx(2.0) and mail[6] == pytest.approx(8.6)
    assert mail[7] == 1
    (sms,) = minutes(db, "sms")
    assert sms[:5] == (M, 0, 0, 1, 2)  # a status outside the vocabulary counts as err
    assert sms[5] == pytest.approx(1.0) and sms[7] is None  # sms has no backlog
    (every,) = minutes(db, "")
    assert every[:5] == (M, 4, 1, 1, 2) and every[7] == 1


def test_a_row_that_commits_after_its_minute_is_counted_by_the_next_roll_up(db):
    rollup = Rollup(db)
    ended(db, "mail", "ok", M + timedelta(seconds=10))
    rollup.roll_up(M + MINUTE)
    ended(db, "mail", "ok", M + timedelta(seconds=50))  # its transaction began in M, committed after
    rollup.roll_up(M + 2 * MINUTE)
    assert [row[:2] for row in minutes(db, "mail")] == [(M, 2)]
    rollup.roll_up(M + 2 * MINUTE)  # again: the same numbers, not twice them
    assert [row[:2] for row in minutes(db, "mail")] == [(M, 2)]


def test_only_the_worker_that_takes_the_turn_rolls_up(db, database_url):
    ended(db, "mail", "ok", M + timedelta(seconds=10))
    other = psycopg2.connect(database_url)
    try:
        with other.cursor() as cur:
            cur.execute("BEGIN; SELECT pg_advisory_xact_lock(%s)", (ROLLUP_KEY,))
            assert Rollup(db).roll_up(M + MINUTE) is False
        other.rollback()
    finally:
        other.close()
    assert minutes(db, "mail") == []
    assert Rollup(db).roll_up(M + MINUTE) is True
    assert len(minutes(db, "mail")) == 1


def test_minutes_older_than_a_week_are_forgotten_on_the_hour(db):
    rollup = Rollup(db)
    ended(db, "mail", "ok", M + timedelta(seconds=10))
    rollup.roll_up(M + MINUTE)
    rollup.roll_up(M + KEEP + 30 * MINUTE)  # not on the hour: kept
    assert len(minutes(db, "mail")) == 1
    rollup.roll_up(M + KEEP + 60 * MINUTE)
    assert minutes(db, "mail") == []


def test_a_row_another_transaction_holds_fails_the_roll_up_in_time_reported_once(
    db, database_url, sentry_events, caplog
):
    """A person's open transaction on a job_minutes row makes the roll-up give
    up after its lock_timeout, not wait for it; a run of such minutes is one
    report, and the first minute after it is rolled up."""
    rollup = Rollup(db)
    ended(db, "mail", "ok", M + timedelta(seconds=10))
    rollup.roll_up(M + MINUTE)
    person = psycopg2.connect(database_url)
    try:
        with person.cursor() as cur:
            cur.execute("BEGIN; SELECT * FROM job_minutes WHERE queue = 'mail' FOR UPDATE")
            with caplog.at_level(logging.WARNING, logger="jobs.errors"):
                for n in (2, 3):
                    started = datetime.now(UTC)
                    rollup.tick(M + n * MINUTE)
                    assert datetime.now(UTC) - started < timedelta(seconds=10)
        person.rollback()
    finally:
        person.close()
    assert len([e for e in sentry_events if "rollup failing" in str(e)]) == 1
    ended(db, "mail", "ok", M + MINUTE + timedelta(seconds=10))
    rollup.tick(M + 3 * MINUTE)
    assert [row[:2] for row in minutes(db, "mail")] == [(M, 1), (M + MINUTE, 1)]
