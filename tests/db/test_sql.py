import psycopg2
import pytest

from lib.run.steps import Ask, lone_step
from lib.store.db import DB
from lib.store.sql import STATEMENTS, Named, Q, parse, statement


def test_every_named_query_prepares(database_url):
    """The pool runs named queries prepared, which needs the server to infer
    every parameter's type; a query that cannot be would fail at run time."""
    conn = psycopg2.connect(database_url)
    with conn.cursor() as cur:
        for stmt in STATEMENTS.values():
            cur.execute(stmt.prepare)
    conn.rollback()
    conn.close()


def test_the_named_queries_the_code_relies_on_exist():
    expected = {
        "job_insert", "job_insert_many", "job_claim", "job_release", "job_heartbeat",
        "job_rescue", "job_delete_finished", "queue_pause", "queue_pause_once", "queue_resume",
        "queue_paused", "dedupe_declare", "clock_fire", "clock_last_fired", "clock_prune", "job_redrive",
        "migration_applied", "migration_record", "queue_stats", "worker_seen", "worker_remove", "worker_forget",
        "worker_list", "job_failed", "job_get", "job_cancel", "job_cancel_running", "job_statuses", "job_status_of",
    }  # fmt: skip
    assert expected <= Q.names()


def test_statement_positional_form():
    stmt = statement("x", "SELECT %(a)s, %(b)s::int, %(a)s LIKE 'x%%'")
    assert stmt.params == ("a", "b")
    assert stmt.prepare == "PREPARE x AS SELECT $1, $2::int, $1 LIKE 'x%'"
    assert stmt.execute == "EXECUTE x(%s, %s)"
    assert statement("y", "SELECT 1").execute == "EXECUTE y"


def test_a_name_defined_twice_is_an_error():
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


def test_a_plan_line_marks_a_query_planned_for_its_values():
    got = parse("-- name: a\n-- What a is.\n-- plan: custom\nSELECT 1\n-- name: b\n-- What b is.\nSELECT 2\n")
    assert got == {"a": Named("SELECT 1", custom_plan=True), "b": Named("SELECT 2", custom_plan=False)}
    with pytest.raises(ValueError, match="plan"):
        parse("-- name: a\n-- plan: generic\nSELECT 1\n")


def test_queries_filtered_by_optional_values_are_never_prepared(database_url):
    """Their "%(x)s IS NULL OR col = %(x)s" filters become index ranges only
    in a plan made for the values: the pool sends them as text, however often
    one connection runs them (a prepared statement may go generic from its
    sixth run)."""
    pool = DB.connect(database_url, size=1)
    failed = {"ids": None, "queue": "q", "name": "q.N", "since": None, "limit": 10}
    try:
        for _ in range(7):
            pool.query(Q.job_failed, failed)
            pool.query(Q.job_failed_list, {"queue": "q", "name": "q.N", "limit": 10})
            pool.query(Q.job_redrive, {"ids": None, "queue": "q", "name": "q.N", "fresh": False})
            pool.query(Q.job_get, {"id": 0})
        prepared = {name for (name,) in pool.query("SELECT name FROM pg_prepared_statements")}
    finally:
        pool.close()
    assert "job_get" in prepared
    assert not prepared & {"job_failed", "job_failed_list", "job_redrive"}, prepared


class _Rollback(Exception):
    pass


def _answers(db: DB) -> tuple[list, list[str]]:
    """What a run of named queries answers on this pool, the way the code runs
    them, in a transaction rolled back so the next pool starts from the same
    table; and the statements the connection had prepared by then."""
    answers: list = []
    with pytest.raises(_Rollback), db.transaction() as tx:
        tx.exec(Q.queue_pause, {"queue": "cmp", "reason": "test", "until": None})
        answers.append(tx.query(Q.queue_paused))
        answers.append(tx.exec(Q.queue_resume, {"queue": "cmp", "prefix": "auth: "}))
        answers.append(tx.exec(Q.queue_resume, {"queue": "cmp", "prefix": None}))
        insert = {"queue": "cmp", "name": "cmp.N", "args": '{"a": [1, "x"]}', "callsite": "here:1"}
        fields = {"run_at": None, "priority": 3, "max_attempts": None, "key": "cmp:1", "trace": None}
        (job_id,) = tx.query_row(Q.job_insert, {**insert, **fields})
        claim = {"queue": "cmp", "id": None, "slot": 0, "worker_id": "w", "lease": 30.0, "max_attempts": 2}
        claimed = tx.query_row(Q.job_claim, claim)
        # Ids differ between the runs (a sequence is not rolled back), and so does the latency.
        answers.append((claimed[0] == job_id, *claimed[1:6], claimed[7:]))
        # The outcome's row: the job's id (ids differ between the runs), written (no wait).
        outcome = {"id": job_id, "worker_id": "w", "attempts": 1, "status": "pending", "retry_in": 3600.0}
        outcome |= {"last_error": "err: x", "delay": 0.0, "uncounted": 0, "last_traceback": None}
        answers.append([(row[2] == job_id, row[9]) for row in tx.query(*lone_step(Ask(outcome, None)))])
        answers.append(
            tx.query_row("SELECT status, attempts, max_attempts, last_error FROM jobs WHERE id = %s", (job_id,))
        )
        answers.append(tx.query_row(Q.job_claim, claim)[7] > 3500)  # the wait until the retry is due
        prepared = [name for (name,) in tx.query("SELECT name FROM pg_prepared_statements ORDER BY name")]
        raise _Rollback
    answers.append(db.query(Q.queue_paused))
    return answers, prepared


def test_unprepared_pool_gives_the_same_answers(database_url):
    """A pool with prepare off (for a pooler in transaction mode) sends the
    named queries as plain text: it must answer as the prepared pool does, and
    leave nothing prepared on the server."""
    prepared_db = DB.connect(database_url, size=1)
    unprepared_db = DB.connect(database_url, size=1, pooled=True)
    try:
        prepared_answers, prepared = _answers(prepared_db)
        unprepared_answers, unprepared = _answers(unprepared_db)
    finally:
        prepared_db.close()
        unprepared_db.close()
    assert unprepared_answers == prepared_answers
    assert prepared_answers[3][0] is True  # the claim took the row just inserted
    assert {"job_claim", "job_step_one", "job_insert", "queue_pause"} <= set(prepared)
    assert unprepared == []
