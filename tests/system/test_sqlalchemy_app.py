"""insert and insert_many through SQLAlchemy 2.x, on both of its psycopg
drivers: a Flask app's scoped_session (tests/apps/flask_shop.py, driven by
Flask's test client in this process), a Session and a Connection from
engine.begin(); and the handles refused, with nothing written."""

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg2
import pytest
from apps.flask_shop import Base, make_app
from flask.testing import FlaskClient
from sqlalchemy import Connection, Engine, create_engine, event, exc, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from tests_support import count_jobs, make_poller

from lib.insert import Job, insert, insert_many
from lib.store.db import DB

DRIVERS = ["psycopg2", "psycopg"]
SUPPORTED = "pass a Session or Connection of an engine on postgresql+psycopg2:// or postgresql+psycopg://"


def engine_url(url: str, driver: str) -> str:
    return urlunsplit(urlsplit(url)._replace(scheme=f"postgresql+{driver}"))


@pytest.fixture(params=DRIVERS)
def engine(request: pytest.FixtureRequest, database_url: str) -> Iterator[Engine]:
    engine = create_engine(engine_url(database_url, request.param))
    yield engine
    engine.dispose()


@pytest.fixture
def shop(db: DB, engine: Engine) -> Iterator[FlaskClient]:
    yield make_app(engine).test_client()
    Base.metadata.drop_all(engine)  # the run's database holds the jobs schema and nothing else


def orders(db: DB) -> list[tuple[int, str]]:
    return db.query("SELECT id, item FROM shop_orders ORDER BY id")


def test_an_order_and_its_job_commit_in_one_transaction(db, shop):
    reply = shop.post("/orders", json={"item": "teapot"})
    assert reply.status_code == 201
    ids = reply.get_json()
    # Written by one transaction: each row is visible exactly when the other is.
    rows = db.query(
        "SELECT o.id, j.id, o.xmin::text = j.xmin::text, j.queue, j.name, j.args, j.callsite FROM shop_orders o, jobs j"
    )
    assert [row[:6] for row in rows] == [(ids["order"], ids["job"], True, "shop", "shop.Ship", {"order": ids["order"]})]
    assert rows[0][6].startswith("tests/apps/flask_shop.py:")
    assert make_poller("shop", db, {"shop.Ship": lambda job: "ok"}).work_once() == "ok"


def test_a_request_that_fails_after_the_insert_leaves_neither(db, shop):
    assert shop.post("/orders", json={"item": "teapot", "fail": True}).status_code == 500
    assert orders(db) == [] and count_jobs(db) == 0
    # The failed request did write its order and job (ids 1), then rolled them back.
    assert shop.post("/orders", json={"item": "kettle"}).get_json() == {"order": 2, "job": 2}
    assert orders(db) == [(2, "kettle")]
    assert db.query("SELECT id, args FROM jobs") == [(2, {"order": 2})]


def test_insert_many_through_a_session(db, engine):
    with Session(engine) as session:
        ids = insert_many(session, [Job("shop", "shop.Ship", {"order": n}) for n in (1, 2)])
        assert count_jobs(db) == 0  # in the session's transaction, not yet committed
        session.commit()
    assert db.query("SELECT id, args FROM jobs ORDER BY id") == [(ids[0], {"order": 1}), (ids[1], {"order": 2})]


class Undo(Exception):
    pass


def test_insert_through_a_connection_from_engine_begin(db, engine):
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cur, sql, *rest: statements.append(sql))
    with pytest.raises(Undo), engine.begin() as conn:
        insert(conn, "shop", "shop.Ship", {"order": 1})
        raise Undo
    assert count_jobs(db) == 0
    with engine.begin() as conn:
        job_id = insert(conn, "shop", "shop.Ship", {"order": 2})
    assert db.query("SELECT id, args FROM jobs") == [(job_id, {"order": 2})]
    assert sum("jobs_insert(" in sql for sql in statements) == 2  # through SQLAlchemy's events


def _async_session(stack: ExitStack) -> AsyncSession:
    return AsyncSession(create_async_engine("postgresql+psycopg://nobody@127.0.0.1:9/none"))


def _sqlite_connection(stack: ExitStack) -> Connection:
    engine = create_engine("sqlite://")
    stack.callback(engine.dispose)  # the pool keeps the sqlite3 connection open till then
    return stack.enter_context(engine.connect())


@pytest.mark.parametrize(
    ("handle", "says"),
    [
        (lambda _: Session(create_engine("sqlite://")), "a Session on sqlite+pysqlite: the jobs table is PostgreSQL's"),
        (_sqlite_connection, "a Connection on sqlite+pysqlite: the jobs table is PostgreSQL's"),
        (lambda _: Session(), "a Session with no bind"),
        (_async_session, "an async AsyncSession: insert is synchronous"),
        (lambda stack: _async_session(stack).sync_session, "a Session on postgresql+psycopg (async)"),
        (
            lambda _: create_engine("postgresql+psycopg2://nobody@127.0.0.1:9/none"),
            "a SQLAlchemy Engine, outside any transaction",
        ),
    ],
    ids=["sqlite-session", "sqlite-connection", "no-bind", "async", "async-sync-session", "engine"],
)
def test_a_handle_insert_cannot_write_through_is_refused(db, handle: Callable[[ExitStack], object], says: str):
    with ExitStack() as stack:
        refused = handle(stack)
        for write in (lambda: insert(refused, "shop", "shop.Ship"), lambda: insert_many(refused, [Job("shop", "a.B")])):
            with pytest.raises(TypeError) as raised:
                write()
            assert f"cannot enqueue through {says}" in str(raised.value)
            assert str(raised.value).endswith(SUPPORTED)
    assert count_jobs(db) == 0


NO_JOBS_TABLE = "this database has no jobs table (function jobs_insert("


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_session_on_a_database_without_the_jobs_table(db, empty_database, driver):
    engine = create_engine(engine_url(empty_database, driver))
    with Session(engine) as session:
        with pytest.raises(RuntimeError) as raised:
            insert(session, "shop", "shop.Ship")
        assert str(raised.value).startswith(NO_JOBS_TABLE)
        assert "is the Session bound to the worker's database" in str(raised.value)
        # The statement failed in the session's transaction, as the error says.
        with pytest.raises(exc.InternalError, match="current transaction is aborted"):
            session.execute(text("SELECT 1"))
    engine.dispose()
    assert count_jobs(db) == 0


@pytest.mark.parametrize("connect", [psycopg2.connect, psycopg.connect], ids=DRIVERS)
def test_a_driver_connection_to_a_database_without_the_jobs_table(db, empty_database, connect):
    conn = connect(empty_database)
    try:
        with pytest.raises(RuntimeError, match=r"^this database has no jobs table \(function jobs_insert_many\("):
            insert_many(conn, [Job("shop", "shop.Ship")])
    finally:
        conn.close()
    assert count_jobs(db) == 0
