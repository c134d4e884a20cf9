"""The horizon watch (lib/background/horizon_watch.py): one WARNING line and
one Sentry report when something holds the database's horizon past the
threshold, none again until the hold ends, and one again for the next."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import psycopg2
from tests_support import running_worker, wait_for

import worker
from lib.background.horizon_watch import HorizonWatch
from lib.greenlets.supervise import Supervisor
from lib.run.queue import Queue


@contextmanager
def held(url: str, application: str = "doctor-psql") -> Iterator[int]:
    conn = psycopg2.connect(url, application_name=application)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT 1")
        yield conn.info.backend_pid
    finally:
        conn.rollback()
        conn.close()


def told(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "jobs.horizon" and r.levelno == logging.WARNING]


def test_a_hold_past_the_threshold_is_told_once_until_it_ends(db, database_url, caplog, sentry_events):
    caplog.set_level(logging.INFO, "jobs.horizon")
    watch = HorizonWatch(db, threshold=0.0)
    assert watch.look() is None and not told(caplog)
    with held(database_url) as pid:
        assert watch.look().pid == pid
        assert watch.look().pid == pid
        lines = told(caplog)
        assert len(lines) == 1, lines
        assert f"by transaction pid {pid} (doctor-psql, role " in lines[0]
        assert f"end it with SELECT pg_terminate_backend({pid})" in lines[0]
        assert "worker.py doctor shows it" in lines[0]
    assert watch.look() is None
    assert "database horizon released" in caplog.text
    with held(database_url, "another-psql") as pid:
        watch.look()
    lines = told(caplog)
    assert len(lines) == 2 and f"transaction pid {pid} (another-psql" in lines[1]
    assert [e["message"] for e in sentry_events] == ["database horizon held for over 0.0s"] * 2
    assert sentry_events[0]["level"] == "warning" and sentry_events[0]["tags"]["holder_kind"] == "transaction"


def test_a_hold_under_the_threshold_is_not_told(db, database_url, caplog):
    watch = HorizonWatch(db)
    with held(database_url):
        assert watch.look() is None
    assert not told(caplog)


def test_a_hold_whose_start_is_hidden_counts_from_when_the_watch_first_saw_it(db, admin_db, caplog):
    """Another role's session shows no start to the owner: the watch times it itself."""
    now = [1000.0]
    watch = HorizonWatch(db, threshold=60.0, clock=lambda: now[0])
    with held(admin_db.dsn, "nightly-report") as pid:
        assert watch.look() is None
        now[0] += 61
        assert watch.look().pid == pid
    (line,) = told(caplog)
    assert f"held for at least 1 min by transaction pid {pid} (nightly-report" in line


def test_the_worker_runs_the_watch_as_a_supervised_part(db, database_url, caplog, monkeypatch):
    monkeypatch.setattr(worker, "HorizonWatch", partial(HorizonWatch, threshold=0.0))
    made: list[Supervisor] = []

    class Seen(Supervisor):
        def __init__(self, *args, **options) -> None:
            super().__init__(*args, **options)
            made.append(self)

    monkeypatch.setattr(worker, "Supervisor", Seen)
    registry = [lambda db: Queue("a", {"a.N": lambda job: "ok"})]
    with held(database_url) as pid, running_worker(db, registry):
        wait_for(lambda: told(caplog), 10)
        assert not made[0].greenlets["horizon"].dead
    assert len(told(caplog)) == 1 and f"pid {pid}" in told(caplog)[0]
