"""jobs_step_one answers a lone ask exactly as jobs_step answers a batch of
that one ask (sql/rules/step.sql; both call the rules of sql/rules/rules.sql): the same
rows written, the same job claimed, the same wait, in every case a claim or an
outcome can meet.

Each case is set up once; then each function runs it, as lib.run.steps sends it,
in a transaction of its own that is rolled back, from the same state. Another
connection holds what another process would hold (a row, the queue's turn)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import pytest
from factory import make_jobs

from lib.insert import insert
from lib.operate.queue_state import pause
from lib.run.steps import QUEUE_TURN_KEY, Ask, batch_step, lone_step
from lib.store.db import DB

Pair = tuple[dict[str, Any] | None, dict[str, Any] | None]  # (outcome, claim)
# jobs_step_one's floats come from now() of its own transaction: a wait or a
# latency may differ by the moment between the two runs.
SLACK = 0.2


def claim(queue: str = "q", slot: int = 0, job_id: int | None = None) -> dict[str, Any]:
    return {"queue": queue, "slot": slot, "worker_id": "w", "lease": 300.0, "max_attempts": 5, "id": job_id}


def outcome(job_id: int, status: str = "ok", *, attempts: int = 1, **fields: Any) -> dict[str, Any]:
    base = {
        "id": job_id,
        "worker_id": "w",
        "attempts": attempts,
        "status": status,
        "retry_in": None,
        "last_error": None,
        "last_traceback": None,
        "delay": 0.0,
        "uncounted": 0,
    }
    return {**base, **fields}


def started(db: DB, queue: str = "q", slot: int = 0) -> int:
    """A job of the queue claimed by worker w in the given slot."""
    job_id = insert(db, queue, "q.N", {"n": 1})
    db.query(*lone_step(Ask(None, claim(queue, slot, job_id))))
    return job_id


@contextmanager
def held(database_url: str, sql: str, params: tuple[Any, ...]) -> Iterator[None]:
    """Another process's open transaction, holding what sql took."""
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
        yield
    finally:
        conn.rollback()
        conn.close()


def run_both(db: DB, ask: Pair) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows each function answers, and the job rows each left, rolled back."""
    answers = []
    for build in (batch_step, lone_step):
        sql, params = build([Ask(*ask)]) if build is batch_step else build(Ask(*ask))
        with db.transaction() as tx:
            rows = tx.query(sql, params)
            state = tx.query(
                "SELECT id, status, attempts, max_attempts, worker_id, slot, run_at > now(),"
                " last_error, finished_at IS NOT NULL, lease_until IS NOT NULL,"
                " (SELECT greatest(paused_until, next_claim_at) > now() FROM job_queues WHERE queue = 'q')"
                " FROM jobs ORDER BY id"
            )
            tx.conn.rollback()
        answers.append((rows, state))
    (general, general_state), (lone, lone_state) = answers
    return general, lone, [general_state, lone_state]


def same(general: list[tuple[Any, ...]], lone: list[tuple[Any, ...]]) -> bool:
    if len(general) != len(lone):
        return False
    for a, b in zip(general, lone, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                if abs(x - y) > SLACK:
                    return False
            elif x != y:
                return False
    return True


def soon(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


Case = Callable[[DB, str], Pair]


def due_job(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N", {"n": 1}, callsite="here")
    insert(db, "q", "q.N", {"n": 2})
    return None, claim()


def priority_first(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N", {"n": 1})
    insert(db, "q", "q.N", {"n": 2}, priority=5)
    return None, claim()


def asked_for(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N", {"n": 1})
    second = insert(db, "q", "q.N", {"n": 2})
    return None, claim(job_id=second)


def asked_for_not_due(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N", {"n": 1})
    later = insert(db, "q", "q.N", {"n": 2}, run_at=soon(30))
    return None, claim(job_id=later)


def empty_queue(db: DB, url: str) -> Pair:
    insert(db, "other", "q.N")
    return None, claim()


def only_later(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N", run_at=soon(40))
    insert(db, "q", "q.N", run_at=soon(20))
    return None, claim()


def paused(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N")
    pause(db, "q", "by hand", soon(60))
    return None, claim()


def paused_for_ever(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N")
    pause(db, "q", "by hand")
    return None, claim()


def throttled(db: DB, url: str) -> Pair:
    insert(db, "q", "q.N")
    db.exec("INSERT INTO job_queues (queue, next_claim_at) VALUES ('q', now() + interval '5 seconds')")
    return None, claim()


def slot_taken(db: DB, url: str) -> Pair:
    started(db)
    insert(db, "q", "q.N")
    return None, claim(slot=0)


def other_slot_free(db: DB, url: str) -> Pair:
    started(db)
    insert(db, "q", "q.N", {"n": 2})
    return None, claim(slot=1)


def outcome_and_next(db: DB, url: str) -> Pair:
    job_id = started(db)
    insert(db, "q", "q.N", {"n": 2})
    return outcome(job_id), claim()


def outcome_of_another_claim(db: DB, url: str) -> Pair:
    job_id = started(db)
    return outcome(job_id, attempts=2), None


def outcome_again(db: DB, url: str) -> Pair:
    job_id = started(db)
    db.query(*lone_step(Ask(outcome(job_id), None)))
    return outcome(job_id), None


def retry(db: DB, url: str) -> Pair:
    job_id = started(db)
    return outcome(job_id, "err: boom", retry_in=30.0, last_error="err: boom", last_traceback="tb"), None


def interrupted_keeps_its_place(db: DB, url: str) -> Pair:
    job_id = started(db)
    return outcome(job_id, "interrupted", retry_in=0.0, last_error="interrupted"), None


def snooze(db: DB, url: str) -> Pair:
    job_id = started(db)
    return outcome(job_id, "ok", retry_in=10.0, last_error="ok", uncounted=1), None


def throttling_outcome(db: DB, url: str) -> Pair:
    job_id = started(db)
    insert(db, "q", "q.N")
    return outcome(job_id, delay=2.0), None


def claimed(n: int) -> Callable[[list[tuple[Any, ...]]], bool]:
    """The answer claims the job whose args say n."""
    return lambda rows: [r[4] for r in rows if r[0] is not None] == [f'{{"n": {n}}}']


def waits(low: float | None, high: float | None = None) -> Callable[[list[tuple[Any, ...]]], bool]:
    """The answer claims nothing and waits between low and high seconds (None: no wait known)."""

    def check(rows: list[tuple[Any, ...]]) -> bool:
        [row] = [r for r in rows if r[0] is not None]
        if row[2] is not None:
            return False
        return row[9] is None if low is None else low <= row[9] <= (high or low)

    return check


def written(expected: bool) -> Callable[[list[tuple[Any, ...]]], bool]:
    return lambda rows: any(r[0] is None for r in rows) is expected


DAY = 86400.0
CASES: list[tuple[Case, Callable[[list[tuple[Any, ...]]], bool]]] = [
    (due_job, claimed(1)),
    (priority_first, claimed(2)),
    (asked_for, claimed(2)),
    (asked_for_not_due, waits(25, 30)),
    (empty_queue, waits(None)),
    (only_later, waits(15, 20)),
    (paused, waits(55, 60)),
    (paused_for_ever, waits(DAY - 5, DAY)),
    (throttled, waits(4, 5)),
    (slot_taken, waits(None)),
    (other_slot_free, claimed(2)),
    (outcome_and_next, lambda rows: written(True)(rows) and claimed(2)(rows)),
    (outcome_of_another_claim, written(False)),
    (outcome_again, written(True)),
    (retry, written(True)),
    (interrupted_keeps_its_place, written(True)),
    (snooze, written(True)),
    (throttling_outcome, written(True)),
]


@pytest.mark.parametrize(("case", "expect"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_a_lone_ask_gets_the_batch_answer(db: DB, database_url: str, case: Case, expect: Any) -> None:
    general, lone, states = run_both(db, case(db, database_url))
    assert same(general, lone), (general, lone)
    assert same(*states), states
    # Each case reaches the part of the rules it is named for.
    assert expect(lone), lone


def test_a_held_head_claims_nothing_not_the_row_behind(db: DB, database_url: str) -> None:
    head = insert(db, "q", "q.N", {"n": 1})
    insert(db, "q", "q.N", {"n": 2})
    with held(database_url, "SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (head,)):
        general, lone, states = run_both(db, (None, claim()))
    assert same(general, lone), (general, lone)
    assert [row[2] for row in lone] == [None] and lone[0][9] == 0.05
    assert same(*states)


def test_a_batch_claims_a_queues_order_only_up_to_its_first_held_row(db: DB, database_url: str) -> None:
    """Several free slots of one queue in a batch: the rows before the first
    one another transaction holds are claimed, none after it, so no job
    starts while one before it is due and not started."""
    jobs = [insert(db, "q", "q.N", {"n": n}) for n in range(4)]
    asks = [Ask(None, claim(slot=slot)) for slot in range(4)]
    for first_held, expected in ((0, []), (2, jobs[:2])):
        with (
            held(database_url, "SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (jobs[first_held],)),
            db.transaction() as tx,
        ):
            rows = tx.query(*batch_step(asks))
            tx.conn.rollback()
        assert sorted(row[2] for row in rows if row[2] is not None) == expected, (first_held, rows)
    with db.transaction() as tx:
        rows = tx.query(*batch_step(asks))
        tx.conn.rollback()
    assert sorted(row[2] for row in rows if row[2] is not None) == jobs


def test_a_batch_finds_each_queues_prefix_in_time_that_grows_with_the_batch_not_its_square(db: DB) -> None:
    """800 free slots (100 queues of 8) in one batch are claimed well inside a
    statement timeout a quadratic prefix could not meet: comparing every head
    with every other head and each locked row is some 10^8 comparisons here,
    tens of seconds, where finding each queue's first unlocked head takes
    milliseconds. A sanity bound, not a timing."""
    queues = [f"b{n:03d}" for n in range(100)]
    make_jobs(db, 800, [queue for queue in queues for _ in range(8)])
    asks = [Ask(None, claim(queue, slot)) for queue in queues for slot in range(8)]
    with db.transaction() as tx:
        tx.exec("SET LOCAL statement_timeout = '5s'")
        rows = tx.query(*batch_step(asks))
        tx.conn.rollback()
    assert sum(1 for row in rows if row[2] is not None) == 800


def test_a_queue_whose_turn_is_held_is_looked_at_again_shortly(db: DB, database_url: str) -> None:
    insert(db, "q", "q.N")
    with held(database_url, "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (QUEUE_TURN_KEY, "q")):
        general, lone, _ = run_both(db, (None, claim()))
    assert same(general, lone), (general, lone)
    assert [row[2] for row in lone] == [None] and lone[0][9] == 0.05


def test_a_throttling_outcome_holds_the_turn_until_it_commits(db: DB, database_url: str) -> None:
    """Both take the queue's turn before writing a throttling outcome, so a
    claim that comes meanwhile is told to look again, not let through."""
    job_id = started(db)
    insert(db, "q", "q.N")
    for build in (batch_step, lone_step):
        ask = Ask(outcome(job_id, delay=2.0), None)
        sql, params = build([ask]) if build is batch_step else build(ask)
        with db.transaction() as tx:
            assert [row[2] for row in tx.query(sql, params)] == [job_id]
            other = psycopg2.connect(database_url)
            try:
                with other.cursor() as cur:
                    cur.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext('q'))", (QUEUE_TURN_KEY,))
                    assert cur.fetchone() == (False,), build.__name__
            finally:
                other.close()
            tx.conn.rollback()


def test_the_shared_rules_are_inlined(db: DB, admin_db: DB) -> None:
    """The SQL functions both steps call are put in place of their calls by the
    planner, so neither step pays a call of its own for them: a call that is
    not inlined shows in the server's count of function calls."""
    job_id = started(db)
    insert(db, "q", "q.N")
    insert(db, "later", "q.N", run_at=soon(30))
    asks = [Ask(outcome(job_id), claim()), Ask(None, claim("later")), Ask(None, claim(slot=1))]
    with admin_db.transaction() as tx:  # track_functions is an administrator's setting
        tx.exec("SET LOCAL track_functions = 'all'")
        tx.query(*lone_step(asks[0]))
        tx.query(*lone_step(asks[1]))
        tx.query(*batch_step(asks[1:]))
        called = {row[0] for row in tx.query("SELECT funcname FROM pg_stat_xact_user_functions")}
        tx.conn.rollback()
    # The PL/pgSQL ones are called: the steps, and, for the queue with nothing
    # due, going to sleep (sql/rules/wakeups.sql: a lock, then a statement
    # that sees what committed before it, which no one SQL statement can be).
    assert called == {"jobs_step", "jobs_step_one", "jobs_asleep_wait", "jobs_sleep"}, called
