import gevent
import psycopg2
import pytest

from lib.db import DB, PoolTimeout, is_conn_failure


def _backends(db, app):
    return [r[0] for r in db.query("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))]


def test_server_error_is_not_a_conn_failure_and_keeps_the_connection(database_url):
    db = DB.connect(database_url, size=1, application_name="t-server-error")
    pid = db.query_row("SELECT pg_backend_pid()")[0]
    with pytest.raises(psycopg2.Error) as info:
        db.exec("SELECT 1/0")
    assert not is_conn_failure(info.value)
    assert db.query_row("SELECT pg_backend_pid()")[0] == pid  # same connection, still good
    db.close()


def test_killed_connection_is_a_conn_failure_and_is_discarded(database_url, db):
    pool = DB.connect(database_url, size=1, application_name="t-killed")
    with pytest.raises(psycopg2.Error) as info, pool.transaction() as tx:
        pid = tx.query_row("SELECT pg_backend_pid()")[0]
        db.exec("SELECT pg_terminate_backend(%s)", (pid,))
        gevent.sleep(0.1)
        tx.query_row("SELECT 1")
    assert is_conn_failure(info.value)
    # The dead connection was not returned: the next call gets a new one.
    assert pool.query_row("SELECT pg_backend_pid()")[0] != pid
    pool.close()


def test_idle_connection_told_to_go_is_dropped_without_a_round_trip(database_url, db):
    pool = DB.connect(database_url, size=1, application_name="t-told")
    pid = pool.query_row("SELECT pg_backend_pid()")[0]
    db.exec("SELECT pg_terminate_backend(%s)", (pid,))
    gevent.sleep(0.1)
    assert pool.query_row("SELECT pg_backend_pid()")[0] != pid  # no error reached the caller
    pool.close()


def test_long_idle_connection_is_pinged_before_handout(database_url, db):
    pool = DB.connect(database_url, size=1, ping_after=0, application_name="t-ping")
    pid = pool.query_row("SELECT pg_backend_pid()")[0]
    db.exec("SELECT pg_terminate_backend(%s)", (pid,))
    gevent.sleep(0.1)
    assert pool.query_row("SELECT pg_backend_pid()")[0] != pid  # no error reached the caller
    pool.close()


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


def test_checkout_blocks_then_times_out(database_url):
    pool = DB.connect(database_url, size=1, checkout_timeout=0.3)
    holder = gevent.spawn(pool.exec, "SELECT pg_sleep(1)")
    gevent.sleep(0.1)
    with pytest.raises(PoolTimeout):
        pool.query_row("SELECT 1")
    holder.get()
    assert pool.query_row("SELECT 1") == (1,)  # freed again
    pool.close()


def test_checkout_waits_for_a_free_connection(database_url):
    pool = DB.connect(database_url, size=1, checkout_timeout=5)
    holder = gevent.spawn(pool.exec, "SELECT pg_sleep(0.3)")
    gevent.sleep(0.05)
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


def test_queries_run_concurrently_under_gevent(database_url):
    pool = DB.connect(database_url, size=4)
    sleepers = [gevent.spawn(pool.exec, "SELECT pg_sleep(0.5)") for _ in range(4)]
    # Four half-second sleeps on four connections end together, not one after another.
    assert gevent.joinall(sleepers, timeout=1.8) and all(g.successful() for g in sleepers)
    pool.close()


def test_bad_pool_size():
    with pytest.raises(ValueError):
        DB("postgresql://x", size=0)
