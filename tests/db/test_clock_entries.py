"""Schedule entries are told apart by what they enqueue: (queue, name, args)."""

import shutil

import gevent
import pytest
from tests_support import at

from lib.background.clock import Clock, Scheduled, check_schedule, daily, every
from lib.insert import insert
from lib.store.db import DB
from lib.store.migrate import migrate, migrations

OPS = Scheduled("reports", "reports.Send", every(15), args={"to": "ops"})
DEV = Scheduled("reports", "reports.Send", every(15), args={"to": "dev"})


@pytest.fixture
def clock_db(db: DB):
    db.exec("TRUNCATE clock_ticks")
    return db


def enqueued(db: DB, ids: list[int]) -> list[tuple]:
    return db.query("SELECT queue, name, args FROM jobs WHERE id = ANY(%s) ORDER BY id", (ids,))


def test_two_entries_of_one_name_with_different_args_fire_at_the_same_minute(clock_db):
    ids = Clock(clock_db, [OPS, DEV]).tick(at(0, 9, 0))
    assert enqueued(clock_db, ids) == [
        ("reports", "reports.Send", {"to": "ops"}),
        ("reports", "reports.Send", {"to": "dev"}),
    ]
    assert clock_db.query_row("SELECT count(*) FROM clock_ticks WHERE minute = %s", (at(0, 9, 0),))[0] == 2


def test_one_entrys_pending_copy_holds_back_that_entry_only(clock_db):
    clock = Clock(clock_db, [OPS, DEV])
    ops, _dev = clock.tick(at(0, 9, 0))
    clock_db.exec("UPDATE jobs SET status = 'ok', finished_at = now() WHERE id = %s", (ops,))
    # dev's 09:00 copy still waits; ops's is done.
    [again] = clock.tick(at(0, 9, 15))
    assert enqueued(clock_db, [again]) == [("reports", "reports.Send", {"to": "ops"})]
    # A pending copy with other args, or in another queue, holds back neither.
    clock_db.exec("UPDATE jobs SET status = 'ok', finished_at = now()")
    insert(clock_db, "reports", "reports.Send", {"to": "everyone"})
    insert(clock_db, "other", "reports.Send", {"to": "ops"})
    assert len(clock.tick(at(0, 9, 30))) == 2


def test_identical_entries_are_refused_and_others_of_one_name_are_not():
    with pytest.raises(ValueError, match=r"more than once: reports\.Send"):
        Clock(None, [OPS, Scheduled("reports", "reports.Send", daily(3, 0), args={"to": "ops"})])  # type: ignore[arg-type]
    # The same args in another key order are the same args.
    both = {"to": "ops", "cc": "dev"}
    with pytest.raises(ValueError, match="more than once"):
        Clock(
            None,
            [
                Scheduled("r", "r.X", every(5), args=both),
                Scheduled("r", "r.X", every(5), args=dict(reversed(both.items()))),
            ],
        )  # type: ignore[arg-type]
    Clock(None, [OPS, DEV, Scheduled("other", "reports.Send", every(15), args={"to": "ops"})])  # type: ignore[arg-type]


def test_the_schedule_check_refuses_what_no_clock_can_run():
    """check_schedule is what the clock and lib.operate.setup_check both ask: an
    entry listed twice, or one that is not an entry at all, is one line."""
    with pytest.raises(ValueError, match=r"^the schedule lists these jobs more than once: reports\.Send"):
        check_schedule([OPS, DEV, OPS])
    with pytest.raises(ValueError, match=r"^schedule entry 1 is a tuple, not a Scheduled: \('reports'"):
        check_schedule([OPS, ("reports", "reports.Send")])
    check_schedule([OPS, DEV])


def test_catch_up_reads_the_entrys_own_ticks(clock_db):
    ops = Scheduled("reports", "reports.Send", daily(3, 17), args={"to": "ops"}, catch_up=True)
    dev = Scheduled("reports", "reports.Send", daily(3, 17), args={"to": "dev"}, catch_up=True)
    # Only ops was in the schedule at 03:17.
    Clock(clock_db, [ops]).tick(at(0, 3, 17))
    clock_db.exec("UPDATE jobs SET status = 'ok', finished_at = now()")
    # dev, added since, missed 03:17; ops did not.
    ids = Clock(clock_db, [ops, dev]).tick(at(0, 9, 0))
    assert enqueued(clock_db, ids) == [("reports", "reports.Send", {"to": "dev"})]


def test_two_clocks_fire_each_entry_of_one_name_once_a_minute(clock_db, database_url):
    schedule = [Scheduled("q", "q.Job", every(1), args={"n": n}) for n in range(4)]
    pools = [DB.connect(database_url, size=2) for _ in range(2)]
    try:
        clocks = [Clock(pool, schedule) for pool in pools]
        for minute in range(5):
            racers = [gevent.spawn(clock.tick, at(0, 9, minute)) for clock in clocks]
            gevent.joinall(racers, raise_error=True, timeout=30)
            ids = [job_id for racer in racers for job_id in racer.value]
            assert len(ids) == len(set(ids)) == 4, minute
            clock_db.exec("UPDATE jobs SET status = 'ok', finished_at = now()")
    finally:
        for pool in pools:
            pool.close()
    assert clock_db.query("SELECT args->>'n', count(*) FROM jobs GROUP BY 1 ORDER BY 1") == [
        (str(n), 5) for n in range(4)
    ]


def test_ticks_kept_from_before_the_upgrade_still_count(empty_database, tmp_path):
    for number, _, path in migrations():
        if number <= 8:
            shutil.copy(path, tmp_path / path.name)
    db = DB.connect(empty_database, size=2)
    try:
        migrate(db, tmp_path, rules=None)
        # The older clock ticked daily at 03:17, and ran the job.
        db.exec("INSERT INTO clock_ticks (name, minute) VALUES ('m.Daily', %s)", (at(0, 3, 17),))
        assert "009_dedupe_clock_entries" in migrate(db)
        cleanup = Scheduled("m", "m.Daily", daily(3, 17), catch_up=True)
        # The restart after the upgrade owes no catch-up: 03:17 was acted on.
        assert Clock(db, [cleanup]).tick(at(0, 9, 0)) == []
        assert len(Clock(db, [cleanup]).tick(at(1, 3, 17))) == 1
        assert db.query_row("SELECT count(*) FROM clock_ticks WHERE name = 'm.Daily'")[0] == 2
    finally:
        db.close()
