import psycopg2
import pytest

from lib.db import DB
from lib.sql import STATEMENTS, Q, parse, statement


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
        "job_insert", "job_insert_many", "job_claim", "job_finalize", "job_release", "job_heartbeat",
        "job_rescue", "job_delete_finished", "queue_pause", "queue_pause_once", "queue_resume",
        "queue_paused", "dedupe_declare", "clock_fire", "clock_last_fired", "clock_prune", "job_redrive",
        "migration_applied", "migration_record",
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


def test_unprepared_pool_gives_the_same_answers(database_url):
    db = DB.connect(database_url, size=2, prepare=False)
    db.exec(Q.queue_pause, {"queue": "unprepared", "reason": "test", "until": None})
    with db.transaction() as tx:
        assert tx.query(Q.queue_paused) == db.query(Q.queue_paused)
    (prepared,) = db.query_row("SELECT count(*) FROM pg_prepared_statements")
    assert prepared == 0
    db.exec("DELETE FROM job_queues WHERE queue = 'unprepared'")
    db.close()
