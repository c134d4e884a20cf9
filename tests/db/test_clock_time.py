"""The time the clock ticks by: the database's, read anew at each look, and
no tick while it cannot be read."""

import logging
from datetime import UTC, datetime, timedelta

import gevent
import psycopg2
import pytest
from gevent.event import Event
from proxy import Proxy
from tests_support import FakeTime, at

from lib.background import clock
from lib.background.clock import Clock, Scheduled
from lib.background.db_time import DatabaseTime
from lib.store.db import DB
from lib.store.driver_errors import is_conn_failure


def database_clock(db: DB) -> datetime:
    return db.query_row("SELECT clock_timestamp()")[0]


def test_the_time_is_the_databases_as_read_mid_round_trip(db):
    """The database reads its clock somewhere in the round trip; the middle
    is taken, and the time passed since is added by the monotonic clock. A
    round trip of 10 s by a fake monotonic clock, read again as it ends:
    the database's reading plus 5 s."""
    before = database_clock(db)
    got = DatabaseTime(db, monotonic=iter([100.0, 110.0, 110.0]).__next__)()
    after = database_clock(db)
    assert before + timedelta(seconds=5) <= got <= after + timedelta(seconds=5)
    assert got.utcoffset() == timedelta(0)
    assert abs(DatabaseTime(db)() - database_clock(db)) < timedelta(seconds=1)


def test_a_database_that_cannot_be_asked_gives_no_time(database_url):
    """Never the host's time in its place: a part that acts on it would fire
    on a guess."""
    proxy = Proxy(database_url)
    pool = DB(proxy.url, size=1)
    try:
        now = DatabaseTime(pool)
        assert abs(now() - datetime.now(UTC)) < timedelta(seconds=5)  # this host's clock is the database's
        proxy.down()
        with pytest.raises(Exception) as raised:
            now()
        assert is_conn_failure(raised.value), raised.value
    finally:
        pool.close()
        proxy.close()


def test_no_minute_is_ticked_while_the_time_cannot_be_read(db, monkeypatch, caplog):
    """The database goes away as the clock waits for 09:00 and is back at
    09:02:10: nothing is ticked on a guess meanwhile, the run of failures is
    one report, and the clock ticks the minute it can read, 09:02."""
    monkeypatch.setattr(clock, "TIME_RETRY", 0.01)
    seen: list[datetime] = []
    entry = Scheduled("q", "q.Every", lambda t: seen.append(t) or False)
    stop = Event()
    away = psycopg2.OperationalError("the database is away")
    now = FakeTime([at(0, 8, 59, 59), away, away, away, at(0, 9, 2, 10), at(0, 9, 2, 10)], stop)
    with gevent.Timeout(10), caplog.at_level(logging.WARNING, logger="jobs"):
        Clock(db, [entry], now=now).run(stop)
    assert seen == [at(0, 9, 2)]
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "failing" in line] == ["clock time failing: the database is away"]
    assert any(line.startswith("clock time recovered after 3 failures") for line in lines), lines
