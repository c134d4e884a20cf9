import contextlib
import math
import socket
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import gevent
import psycopg2
import pytest
from gevent.server import StreamServer

from lib.store.db import DB
from lib.store.driver_errors import PoolTimeout, is_conn_failure, is_outage
from lib.store.pool_connections import connect_options


def _wait_for(predicate, timeout: float = 10.0) -> None:
    with gevent.Timeout(timeout):
        while not predicate():
            gevent.sleep(0.01)


def _gone(db: DB, pid: int) -> bool:
    """Whether the backend has left: it removes itself only after telling its client it is going."""
    return db.query_row("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == (0,)


def _sleeping(db: DB, app: str) -> bool:
    """Whether a backend of this run's database with this application name is in pg_sleep."""
    (n,) = db.query_row(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = %s AND wait_event = 'PgSleep'",
        (app,),
    )
    return n > 0


class VanishingRelay:
    """A loopback relay in front of the server whose connections can vanish
    without a word, as when a NAT or firewall between drops its state: the
    server's side is closed, the client's is left open with nothing to read,
    and whatever the client sends next is met by a close. Only a round trip
    finds out. New connections relay as usual."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        host = parse_qs(parts.query).get("host", [parts.hostname or "localhost"])[0]
        port = parts.port or 5432
        if host.startswith("/"):
            self.target: tuple = (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
        else:
            self.target = (socket.AF_INET, (host, port))
        self.server = StreamServer(("127.0.0.1", 0), self._handle)
        self.server.start()
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{self.server.server_port}"
        self.url = urlunsplit(("postgresql", netloc, parts.path, "", ""))
        self._links: list[dict] = []

    def _handle(self, client: socket.socket, _address: object) -> None:
        upstream = socket.socket(self.target[0], socket.SOCK_STREAM)
        upstream.connect(self.target[1])
        link = {
            "vanished": False,
            "pumps": [gevent.spawn(_pump, client, upstream), gevent.spawn(_pump, upstream, client)],
        }
        self._links.append(link)
        gevent.joinall(link["pumps"], count=1)
        gevent.killall(link["pumps"])
        upstream.close()
        if link["vanished"]:
            with contextlib.suppress(OSError):
                client.recv(65536)  # the client's next message finds the connection gone
        # The server closes the client's socket when this returns.

    def vanish(self) -> None:
        for link in self._links:
            link["vanished"] = True
            gevent.killall(link["pumps"])
        self._links = []

    def close(self) -> None:
        self.server.stop()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass


def test_server_error_is_not_a_conn_failure_and_keeps_the_connection(database_url):
    db = DB.connect(database_url, size=1, application_name="t-server-error")
    pid = db.query_row("SELECT pg_backend_pid()")[0]
    with pytest.raises(psycopg2.Error) as info:
        db.exec("SELECT 1/0")
    assert not is_conn_failure(info.value)
    assert db.query_row("SELECT pg_backend_pid()")[0] == pid  # same connection, still good
    db.close()


def test_a_session_refused_a_write_as_read_only_is_not_used_again(database_url):
    """A session that began read-only (the database turned read-only, a
    standby after a failover) stays so whatever the database becomes: the
    write refused, the session is discarded, and the next is read anew."""
    pool = DB.connect(database_url, size=1, application_name="t-read-only")
    pid = pool.query_row("SELECT pg_backend_pid()")[0]
    pool.exec("SET default_transaction_read_only = on")  # as a session begun in a read-only spell
    with pytest.raises(psycopg2.Error) as info:
        pool.exec("CREATE TEMPORARY TABLE written (n int)")
    assert is_outage(info.value) and not is_conn_failure(info.value)
    assert pool.query_row("SELECT pg_backend_pid(), current_setting('transaction_read_only')") != (pid, "on")
    pool.exec("CREATE TEMPORARY TABLE written (n int)")
    pool.close()


def test_killed_connection_is_a_conn_failure_and_is_discarded(database_url, db):
    pool = DB.connect(database_url, size=1, application_name="t-killed")
    with pytest.raises(psycopg2.Error) as info, pool.transaction() as tx:
        pid = tx.query_row("SELECT pg_backend_pid()")[0]
        db.exec("SELECT pg_terminate_backend(%s)", (pid,))
        _wait_for(lambda: _gone(db, pid))
        tx.query_row("SELECT 1")
    assert is_conn_failure(info.value)
    # The dead connection was not returned: the next call gets a new one.
    assert pool.query_row("SELECT pg_backend_pid()")[0] != pid
    pool.close()


def test_idle_connection_told_to_go_is_dropped_without_a_round_trip(database_url, db):
    pool = DB.connect(database_url, size=1, application_name="t-told")
    pid = pool.query_row("SELECT pg_backend_pid()")[0]
    db.exec("SELECT pg_terminate_backend(%s)", (pid,))
    _wait_for(lambda: _gone(db, pid))
    assert pool.query_row("SELECT pg_backend_pid()")[0] != pid  # no error reached the caller
    pool.close()


def test_long_idle_connection_is_pinged_before_handout(database_url):
    """A connection whose peer vanished silently has nothing to read, so it
    looks alive. One idle past ping_after is pinged before it is handed out,
    and the caller gets a fresh connection instead of the error."""
    relay = VanishingRelay(database_url)
    pool = DB.connect(relay.url, size=1, ping_after=0)
    unpinged = DB.connect(relay.url, size=1)  # idle far less than its ping_after
    try:
        pid = pool.query_row("SELECT pg_backend_pid()")[0]
        relay.vanish()
        assert pool.query_row("SELECT pg_backend_pid()")[0] != pid  # no error reached the caller
        # The case needs the ping: without one, the caller meets the dead connection.
        with pytest.raises(psycopg2.Error) as info:
            unpinged.query_row("SELECT 1")
        assert is_conn_failure(info.value)
    finally:
        pool.close()
        unpinged.close()
        relay.close()


def test_timeout_mid_query_is_not_a_conn_failure_but_discards(database_url):
    pool = DB.connect(database_url, size=1, application_name="t-timeout")
    pid = pool.query_row("SELECT pg_backend_pid()")[0]
    with pytest.raises(gevent.Timeout) as info, gevent.Timeout(0.2):
        pool.exec("SELECT pg_sleep(5)")
    assert not is_conn_failure(info.value)
    assert pool.query_row("SELECT pg_backend_pid()")[0] != pid
    pool.close()


def test_statement_timeout_from_server_is_not_a_conn_failure(db):
    with pytest.raises(psycopg2.Error) as info, db.transaction() as tx:
        tx.exec("SET LOCAL statement_timeout = 50")
        tx.exec("SELECT pg_sleep(1)")
    assert not is_conn_failure(info.value)


def test_checkout_blocks_then_times_out(database_url, db):
    pool = DB.connect(database_url, size=1, checkout_timeout=0.3, application_name="t-blocks")
    holder = gevent.spawn(pool.exec, "SELECT pg_sleep(1)")
    _wait_for(lambda: _sleeping(db, "t-blocks"))  # the holder has the one connection
    with pytest.raises(PoolTimeout):
        pool.query_row("SELECT 1")
    holder.get()
    assert pool.query_row("SELECT 1") == (1,)  # freed again
    pool.close()


def test_checkout_waits_for_a_free_connection(database_url, db):
    pool = DB.connect(database_url, size=1, checkout_timeout=5, application_name="t-waits")
    holder = gevent.spawn(pool.exec, "SELECT pg_sleep(0.3)")
    _wait_for(lambda: _sleeping(db, "t-waits"))  # the holder has the one connection
    assert pool.query_row("SELECT 2") == (2,)
    holder.get()
    pool.close()


def test_transaction_commits_or_rolls_back(db):
    with db.transaction() as tx:
        tx.exec("INSERT INTO cache_entries VALUES ('a', '1', now())")
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.exec("INSERT INTO cache_entries VALUES ('b', '1', now())")
        raise RuntimeError("abandon")
    assert db.query("SELECT key FROM cache_entries") == [("a",)]


def test_a_connection_left_in_a_transaction_the_driver_does_not_know_of_is_not_handed_out(database_url, caplog):
    """The server in a failed transaction while the driver takes it for
    ended (a COMMIT cancelled by its statement_timeout leaves the same): the
    check-in's rollback() sends nothing, so the connection is closed."""
    pool = DB.connect(database_url, size=1)
    try:
        with pool.connection() as conn:
            cur = conn.cursor()
            cur.execute("BEGIN")
            with pytest.raises(psycopg2.errors.DivisionByZero):
                cur.execute("SELECT 1/0")
        assert pool.query_row("SELECT 1") == (1,)
        assert pool.query_row("SELECT pg_current_xact_id_if_assigned() IS NULL") == (True,)
        assert any("inside a transaction the driver did not know of" in r.getMessage() for r in caplog.records)
    finally:
        pool.close()


def test_queries_run_concurrently_under_gevent(database_url):
    pool = DB.connect(database_url, size=4)
    sleepers = [gevent.spawn(pool.exec, "SELECT pg_sleep(0.5)") for _ in range(4)]
    # Four half-second sleeps on four connections end together, not one after another.
    assert gevent.joinall(sleepers, timeout=1.8) and all(g.successful() for g in sleepers)
    pool.close()


def test_bad_pool_size():
    with pytest.raises(ValueError):
        DB("postgresql://x", size=0)


def test_connections_skip_gss_encryption_unless_asked(database_url, monkeypatch):
    monkeypatch.delenv("PGGSSENCMODE", raising=False)
    pool = DB(database_url, size=1)
    asked = DB(database_url + ("&" if "?" in database_url else "?") + "gssencmode=prefer", size=1)
    try:
        with pool.connection() as conn:
            assert conn.info.dsn_parameters["gssencmode"] == "disable"
        with asked.connection() as conn:
            assert conn.info.dsn_parameters["gssencmode"] == "prefer"
    finally:
        pool.close()
        asked.close()


def test_connections_run_without_jit_keeping_the_options_given(database_url, monkeypatch):
    """Postgres compiles a statement whose estimated cost passes jit_above_cost,
    and the estimates grow with the finished rows kept: the worker's sessions
    run without JIT. Options of the URL (or PGOPTIONS) still hold, a jit
    they name included. Through a pooler nothing is sent: PgBouncer refuses
    an options parameter it is not told to ignore."""
    monkeypatch.delenv("PGOPTIONS", raising=False)
    sep = "&" if "?" in database_url else "?"
    urls = [database_url, *(f"{database_url}{sep}options={quote(o)}" for o in ("-c lock_timeout=4321", "-c jit=on"))]
    show = "SELECT current_setting('jit'), current_setting('lock_timeout')"
    pools = [DB(url, size=1) for url in urls]
    try:
        got = [pool.query_row(show) for pool in pools]
        monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=1234")
        pools.append(DB(database_url, size=1))
        got.append(pools[-1].query_row(show))
    finally:
        for pool in pools:
            pool.close()
    assert [row[0] for row in got] == ["off", "off", "on", "off"]
    assert (got[1][1], got[3][1]) == ("4321ms", "1234ms")
    assert "options" not in connect_options("jobs", database_url, pooled=True)


# Every value a job's statements carry, and some that look like them but are not the fast path's to write.
LITERAL_VALUES = [
    None,
    0,
    7,
    -5,
    10**30,
    -(10**30),
    True,
    False,
    0.0,
    -0.0,
    1.5,
    -1.5,
    1e300,
    5e-324,
    float("inf"),
    float("-inf"),
    float("nan"),
    "",
    "ok",
    "q00",
    "w-host-1234-ab12",
    "fail: no match for 50% of %s and %(name)s",
    "it's",
    "a\\b",
    "é",
    "tab\there",
    "line\nbreak",
]


def test_values_written_without_the_driver_are_what_the_driver_writes(db):
    """lib.store.db writes the common values of a prepared statement itself: byte for
    byte what psycopg2's mogrify writes, or None to leave the value (and the
    statement) to the driver."""
    from lib.store.binding import literal

    fast = 0
    with db.connection() as conn, conn.cursor() as cur:
        for value in LITERAL_VALUES:
            written = literal(value)
            if written is not None:
                fast += 1
                assert written == cur.mogrify("%s", (value,)), value
        for other in ({"a": 1}, [1], b"x", psycopg2.extensions.ISQLQuote):
            assert literal(other) is None
    # Infinities, NaN and strings that need escaping or are not plain ASCII stay the driver's.
    assert fast == len(LITERAL_VALUES) - 3 - 5


def test_a_prepared_statement_reads_back_every_value_it_was_given(db, monkeypatch):
    """Through a named query run prepared, the values lib.store.db writes and those
    it leaves to the driver, side by side in one statement, reach the server
    as they were sent."""
    from lib.store.sql import STATEMENTS, statement

    echo = "SELECT %(t)s::text, %(n)s::numeric, %(f)s::float8, %(b)s::bool"
    monkeypatch.setitem(STATEMENTS, echo, statement("test_echo", echo))
    strings = [v for v in LITERAL_VALUES if isinstance(v, str)]
    ints = [v for v in LITERAL_VALUES if type(v) is int]
    floats = [v for v in LITERAL_VALUES if type(v) is float]
    sent = [
        {"t": strings[i % len(strings)], "n": ints[i % len(ints)], "f": floats[i % len(floats)], "b": i % 2 == 0}
        for i in range(len(strings))
    ]
    sent.append(dict.fromkeys(("t", "n", "f", "b")))
    for params in sent:
        text, number, real, flag = db.query_row(echo, params)
        assert (text, number, flag) == (params["t"], params["n"], params["b"])
        if params["f"] is None or math.isnan(params["f"]):
            assert real is params["f"] or math.isnan(real)
        else:
            # -0.0 reads back as 0.0, as it does when the driver writes it: "-" is an operator in SQL.
            assert real == params["f"]
    # Run prepared (the pool hands out the connection used last).
    assert db.query_row("SELECT count(*) FROM pg_prepared_statements WHERE name = 'test_echo'") == (1,)
