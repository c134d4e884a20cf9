"""Budgets (sql/rules/rates.sql, lib/run/budget.py): a claim reserves the most a
job spends of each budget of its queue, across processes; what the job
reports it spent settles the reservation."""

import logging
import time
from dataclasses import replace

import psycopg2
import pytest
from tests_support import make_poller

from lib.insert import insert
from lib.job import Budget, Rate
from lib.operate import setup_check
from lib.run.queue import Queue
from lib.run.rates import declare_rate
from lib.run.steps import Ask, batch_step, lone_step
from lib.setup.parsers import SettingError
from lib.store.db import DB

TOKENS = Budget("tokens", 100, per=60, most=40)


def ok(job):
    return "ok"


def budgeted(queue, db, *budgets, rate=None, concurrency=5, worker_id=None):
    from lib.run.runtime import Runtime

    runtime = Runtime.alone(db, worker_id=worker_id) if worker_id else None
    return make_poller(
        queue, db, {f"{queue}.N": ok}, rate=rate, budgets=budgets, concurrency=concurrency, runtime=runtime
    )


def fill(db, queue, n):
    return [insert(db, queue, f"{queue}.N") for _ in range(n)]


def spend(poller, job, **units):
    """As the executor hands the job to its handler, and the handler reports."""
    replace(job, budgets=poller.executor.budgets).spent(**units)


def test_a_claim_reserves_the_most_a_job_spends_and_its_report_gives_back_the_rest(db):
    """100 tokens a minute, 40 reserved a job: two jobs at once, the third
    waits until a report gives back what the first did not use."""
    p = budgeted("b", db, TOKENS)
    ids = fill(db, "b", 4)
    first, second, third = (p.steps.claim(None, slot) for slot in range(3))
    assert [first.job.id, second.job.id] == ids[:2]
    # 80 of 100 reserved: 20 more would take 12 s of refill (0.6 s a token).
    assert third.job is None and 11 < third.wait <= 12
    spend(p, first.job, tokens=10)  # 30 given back: 50 reserved or spent
    again = p.steps.claim(None, 2)
    assert again.job is not None and again.job.id == ids[2]
    # 90 now; a job past its reservation is taken as spent: 30 more, 120 in
    # all, so the next 40 fit once 60 have refilled: 36 s.
    spend(p, second.job, tokens=70)
    later = p.steps.claim(None, 3)
    assert later.job is None and 35 < later.wait <= 36


def test_a_second_report_of_a_unit_adds_to_the_first(db, caplog):
    caplog.set_level(logging.WARNING, logger="jobs")
    p = budgeted("twice", db, TOKENS)
    fill(db, "twice", 1)
    job = replace(p.steps.claim(None, 0).job, budgets=p.executor.budgets)
    (before,) = db.query_row("SELECT extract(EPOCH FROM tat - now())::float8 FROM job_rates WHERE key = 'twice/tokens'")
    job.spent(tokens=30)  # settles 40 reserved: 10 back
    job.spent(tokens=20)  # 50 in all, 10 past the reservation
    (after,) = db.query_row("SELECT extract(EPOCH FROM tat - now())::float8 FROM job_rates WHERE key = 'twice/tokens'")
    assert after - before == pytest.approx(10 * 0.6, abs=0.2)
    warned = [r.getMessage() for r in caplog.records if "over the 40 its claim reserved" in r.getMessage()]
    assert len(warned) == 1 and "spent 50 tokens" in warned[0] and "overdrawn by 10" in warned[0]


def test_each_budget_and_the_rate_hold_together(db):
    """The claim takes from the group's every row: the tightest one holds."""
    p = budgeted(
        "both",
        db,
        Budget("tokens_in", 1000, per=60, most=100),
        Budget("tokens_out", 100, per=60, most=50),
        rate=Rate(100, per=1, burst=10),
    )
    fill(db, "both", 5)
    got = [p.steps.claim(None, slot) for slot in range(5)]
    assert sum(g.job is not None for g in got) == 2  # tokens_out: 2 x 50 of 100
    assert all(g.job is None and 29 < g.wait <= 30 for g in got[2:])


def test_a_batch_of_claims_takes_no_more_than_the_budget(db):
    p = budgeted("batch", db, TOKENS)
    fill(db, "batch", 5)
    rows = db.query(*batch_step([Ask(None, p.steps.params(None, slot)) for slot in range(5)]))
    assert sum(row[2] is not None for row in rows) == 2


def test_a_claim_in_flight_holds_back_another_process_claim_of_the_same_budget(db, database_url):
    shared = Budget("tokens", 100, per=60, most=60, key="held-api")
    a = budgeted("ha", db, shared, worker_id="a")
    other = DB(database_url, size=2, application_name="jobs-other")
    try:
        b = budgeted("hb", other, shared, worker_id="b")
        fill(db, "ha", 1), fill(db, "hb", 1)
        conn = psycopg2.connect(database_url)
        try:
            with conn.cursor() as cur:
                cur.execute(*lone_step(Ask(None, a.steps.params(None, 0))))
                assert cur.fetchone()[2] is not None  # A reserved 60, uncommitted
                started = time.monotonic()
                assert b.steps.claim(None, 0) == (None, 0.05)
                assert time.monotonic() - started < 1
            conn.commit()
        finally:
            conn.close()
        after = b.steps.claim(None, 0)
        assert after.job is None and 11 < after.wait <= 12  # 60 + 60 > 100: 20 tokens short
    finally:
        other.close()


def test_declaring_budgets_names_the_group_and_drops_what_the_definition_lost(db):
    budgeted("decl", db, TOKENS, Budget("calls", 10, per=1, most=1), rate=Rate(5, per=1))
    rows = db.query("SELECT key, grp, cost FROM job_rates ORDER BY key")
    assert rows == [("decl", "decl", 1.0), ("decl/calls", "decl", 1.0), ("decl/tokens", "decl", 40.0)]
    assert db.query_row("SELECT rate_key FROM job_queues WHERE queue = 'decl'") == ("decl",)
    assert declare_rate(db, "decl", None, [TOKENS])
    assert db.query("SELECT key FROM job_rates ORDER BY key") == [("decl/tokens",)]
    p = budgeted("decl", db, TOKENS)
    fill(db, "decl", 3)
    assert sum(p.steps.claim(None, slot).job is not None for slot in range(3)) == 2
    assert declare_rate(db, "decl", None, [])
    assert db.query_row("SELECT rate_key FROM job_queues WHERE queue = 'decl'") == (None,)


def test_spent_refuses_a_unit_the_queue_has_no_budget_of_and_is_nothing_without_budgets(db):
    p = budgeted("units", db, TOKENS)
    fill(db, "units", 1)
    job = replace(p.steps.claim(None, 0).job, budgets=p.executor.budgets)
    with pytest.raises(ValueError, match="queue units has no budget of 'tokenz'; its budgets are tokens"):
        job.spent(tokenz=5)
    with pytest.raises(ValueError, match="tokens: a number of units"):
        job.spent(tokens=float("nan"))
    plain = make_poller("plain", db, {"plain.N": ok})
    fill(db, "plain", 1)
    plain.steps.claim(None, 0).job.spent(tokens=5)  # a queue without budgets: nothing to settle


def test_budgets_refuse_what_is_not_a_budget():
    for bad, said in (
        (lambda: Budget("tokens in", 10, per=1, most=1), "a name such as tokens_in"),
        (lambda: Budget("t", 0, per=1, most=1), "at least 1"),
        (lambda: Budget("t", 10, per=0, most=1), "positive"),
        (lambda: Budget("t", 10, per=1, most=11), "from 1 to its limit"),
        (lambda: Queue("q", {"q.N": ok}, budgets=(TOKENS, TOKENS)), "two budgets of one unit"),
        (lambda: Queue("q", {"q.N": ok}, rate=Rate(1, key="a"), budgets=(Budget("t", 9, 1, 1, key="b"),)), "keys"),
    ):
        with pytest.raises(ValueError, match=said):
            bad()


def test_the_registry_check_refuses_one_key_with_two_budgets(db):
    def one(db):
        return Queue("one", {"one.N": ok}, budgets=(Budget("t", 10, per=1, most=1, key="api"),))

    def two(db):
        return Queue("two", {"two.N": ok}, budgets=(Budget("t", 20, per=1, most=1, key="api"),))

    with pytest.raises(SettingError, match="share the key 'api' with different rates or budgets"):
        setup_check.defined([one, two], db)


def test_what_the_api_says_is_left_is_taken_as_spent_by_every_process(db):
    """Another client of the same key spent the API's tokens: the answer says
    10 are left, so the budget holds 90 as spent, whatever it reserved."""
    p = budgeted("left", db, TOKENS)
    fill(db, "left", 3)
    job = replace(p.steps.claim(None, 0).job, budgets=p.executor.budgets)
    job.spent(tokens=5)
    job.limits_left(tokens=10, calls=None)
    # 90 held: the next 40 fit once 30 have refilled, 18 s.
    after = p.steps.claim(None, 1)
    assert after.job is None and 17 < after.wait <= 18
    # Saying more is left than the budget holds gives back nothing.
    job.limits_left(tokens=100)
    assert 17 < p.steps.claim(None, 1).wait <= 18
