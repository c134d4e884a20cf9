"""Rates (lib/job/rate.py, sql/rules/rates.sql): decided at claim, from the row of
job_rates the claim locks until it commits, for every process alike."""

import time

import psycopg2
import pytest
from tests_support import make_poller

from lib.insert import insert
from lib.job import Rate
from lib.operate import setup_check
from lib.run.queue import Queue
from lib.run.rates import declare_rate
from lib.run.steps import Ask, batch_step, lone_step
from lib.setup.parsers import SettingError
from lib.store.db import DB


def ok(job):
    return "ok"


def rated(queue: str, db: DB, rate: Rate | None, *, concurrency: int = 1, worker_id: str | None = None):
    from lib.run.runtime import Runtime

    runtime = Runtime.alone(db, worker_id=worker_id) if worker_id else None
    return make_poller(queue, db, {f"{queue}.N": ok}, rate=rate, concurrency=concurrency, runtime=runtime)


def fill(db: DB, queue: str, n: int) -> list[int]:
    return [insert(db, queue, f"{queue}.N") for _ in range(n)]


def test_a_rate_starts_a_burst_then_one_job_a_spacing(db):
    """Rate(1, per=30, burst=3): three claims at once, then the fourth waits
    the spacing, as the claim reports it."""
    p = rated("r", db, Rate(1, per=30, burst=3), concurrency=5)
    ids = fill(db, "r", 5)
    got = [p.steps.claim(None, slot) for slot in range(5)]
    assert [g.job.id for g in got if g.job is not None] == ids[:3]
    assert got[3].job is None and 29 < got[3].wait <= 30
    assert got[4].job is None and 29 < got[4].wait <= 30


def test_a_batch_of_claims_takes_no_more_than_the_rate(db):
    """Five slots of a rated queue and one of a queue without a rate, in one
    jobs_step: the rated queue gets its burst, the other its job."""
    p = rated("rb", db, Rate(1, per=30, burst=2), concurrency=5)
    free = rated("free", db, None)
    rb, fr = fill(db, "rb", 5), fill(db, "free", 1)
    asks = [Ask(None, p.steps.params(None, slot)) for slot in range(5)] + [Ask(None, free.steps.params(None, 0))]
    rows = db.query(*batch_step(asks))
    claimed = sorted(row[2] for row in rows if row[2] is not None)
    assert claimed == sorted(rb[:2] + fr)
    waits = [row[9] for row in rows if row[0] == "rb" and row[2] is None]
    assert waits and all(29 < w <= 30 for w in waits)


def test_queues_that_share_a_key_share_one_rate(db):
    shared = Rate(1, per=30, burst=2, key="one-api")
    a, b = rated("ka", db, shared), rated("kb", db, shared, concurrency=2)
    fill(db, "ka", 2), fill(db, "kb", 2)
    assert a.steps.claim(None, 0).job is not None
    assert b.steps.claim(None, 0).job is not None
    third = b.steps.claim(None, 1)
    assert third.job is None and 29 < third.wait <= 30


def test_a_claim_in_flight_holds_back_another_process_claim_of_the_same_rate(db, database_url):
    """The two-connection interleaving: A's claim has taken from the rate and
    not committed. B's claim (another queue of the same key) neither waits
    for it nor spends the same room: it comes back at once to ask again, and
    once A commits it sees the rate spent."""
    shared = Rate(1, per=30, burst=1, key="held")
    a = rated("ha", db, shared, worker_id="a")
    other = DB(database_url, size=2, application_name="jobs-other")
    try:
        b = rated("hb", other, shared, worker_id="b")
        fill(db, "ha", 1), fill(db, "hb", 1)
        conn = psycopg2.connect(database_url)
        try:
            with conn.cursor() as cur:
                cur.execute(*lone_step(Ask(None, a.steps.params(None, 0))))
                assert cur.fetchone()[2] is not None  # A claimed, in its open transaction
                started = time.monotonic()
                assert b.steps.claim(None, 0) == (None, 0.05)
                assert time.monotonic() - started < 1  # not waited for
            conn.commit()
        finally:
            conn.close()
        after = b.steps.claim(None, 0)
        assert after.job is None and 29 < after.wait <= 30
    finally:
        other.close()


def test_a_rate_dropped_from_the_definition_is_cleared_at_the_next_declaration(db):
    rated("gone", db, Rate(1, per=30))
    fill(db, "gone", 3)
    assert db.query_row("SELECT rate_key FROM job_queues WHERE queue = 'gone'") == ("gone",)
    assert declare_rate(db, "gone", None)
    p = rated("gone", db, None, concurrency=3)
    assert all(p.steps.claim(None, slot).job is not None for slot in range(3))


def test_a_declaration_gives_up_on_a_row_another_transaction_holds(db, database_url):
    """A person's open transaction on the queue's row holds the declaration
    back for the lock timeout only: the worker declares it again later."""
    rated("locked", db, Rate(5, per=1))
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT * FROM job_queues WHERE queue = 'locked' FOR UPDATE")
            started = time.monotonic()
            assert declare_rate(db, "locked", Rate(6, per=1)) is False
            assert time.monotonic() - started < 10
    finally:
        conn.rollback()
        conn.close()
    assert declare_rate(db, "locked", Rate(6, per=1))
    assert db.query_row("SELECT spacing FROM job_rates WHERE key = 'locked'")[0] == pytest.approx(1 / 6)


def test_a_rate_refuses_values_that_are_not_a_rate():
    for bad in (
        dict(limit=0),
        dict(limit=1.5),
        dict(limit=1, per=0),
        dict(limit=1, per=float("inf")),
        dict(limit=1, burst=0),
        dict(limit=1, key=5),
    ):
        with pytest.raises(ValueError):
            Rate(**bad)
    with pytest.raises(ValueError, match="rate key"):
        Queue("q", {"q.N": ok}, rate=Rate(1, key=" spaced "))
    with pytest.raises(ValueError, match="must be a Rate"):
        Queue("q", {"q.N": ok}, rate=10)
    assert str(Rate(100, per=60, burst=20)) == "100 per 60s, bursts of 20"


def test_the_registry_check_refuses_one_key_with_two_rates(db):
    registry = [
        lambda db: Queue("one", {"one.N": ok}, rate=Rate(10, per=1, key="api")),
        lambda db: Queue("two", {"two.N": ok}, rate=Rate(20, per=1, key="api")),
    ]
    with pytest.raises(SettingError, match="share the key 'api' with different rates or budgets"):
        setup_check.defined(registry, db)
