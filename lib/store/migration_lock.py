"""The migrations' lock: processes that start together take turns, and the
second finds nothing left to do.

The lock is a transaction-level advisory lock held by a transaction left
open on a connection of its own for the whole run. A migration in steps runs
many transactions and statements outside any, so no one transaction of the
work can hold it; a session's lock would not do behind a pooler in
transaction mode (PgBouncer), which runs each transaction on whichever server
session is free and keeps its sessions open after a client leaves, while an
open transaction keeps its server session for as long as it lasts, and ends
with its client.

The open transaction holds nothing else: no snapshot (READ COMMITTED drops
its snapshot between statements), no transaction id, no table lock, so a
CREATE INDEX CONCURRENTLY, which waits for every older snapshot, never
waits for it. A process waiting for the lock asks again and again in short
transactions instead of waiting inside a statement: a statement that waits
holds its snapshot, and a CONCURRENTLY build of the process holding the
lock would wait for that process, which waits for the lock.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg2.extensions

from lib.store.db import DB
from lib.store.driver_errors import is_database_error
from lib.store.retry_backoff import Backoff

log = logging.getLogger("jobs.migrate")

# Any fixed number will do; every process that migrates this database takes
# it, an older release's worker started during a rolling upgrade included
# (it takes it in each of its migrations' transactions).
LOCK_KEY = 0x6A6F6273  # "jobs"
# A server's idle_in_transaction_session_timeout would end the lock's
# transaction in the middle of a run: not for this one.
_TAKE = "SELECT set_config('idle_in_transaction_session_timeout', '0', true), pg_try_advisory_xact_lock(%s)"


class LockLost(RuntimeError):
    """The connection that held the migrations' lock went away mid-run."""


class MigrationsLock:
    """with MigrationsLock(db) as lock: the lock held until the block ends;
    lock.check() before each piece of work."""

    def __init__(self, db: DB) -> None:
        self.db = db
        self.conn: psycopg2.extensions.connection | None = None

    def __enter__(self) -> MigrationsLock:
        conn = self.db.open_connection("jobs-migrate")
        try:
            conn.autocommit = False
            _take(conn)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        return self

    def __exit__(self, *exc: Any) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.rollback()
            except Exception as exc:
                if not is_database_error(exc):
                    raise
                # Gone already: the server ended its transaction, and the lock with it.
            finally:
                conn.close()

    def check(self) -> None:
        """Raise LockLost when the lock's connection has gone: another
        process may be migrating now, so this one stops (a later run resumes
        where it stopped)."""
        assert self.conn is not None, "check() inside the with-block"
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT 1")
        except Exception as exc:
            if not is_database_error(exc):
                raise
            raise LockLost(f"the connection holding the migrations' lock was lost: {exc}".strip()) from exc


def _take(conn: psycopg2.extensions.connection) -> None:
    """Wait until this connection's transaction holds the lock."""
    retry = Backoff(base=0.2, cap=2.0)
    began = time.monotonic()
    while True:
        with conn.cursor() as cur:
            cur.execute(_TAKE, (LOCK_KEY,))
            (_, taken) = cur.fetchone()
        if taken:
            break
        conn.rollback()
        if not retry.failures:
            log.info("another process is migrating the database; waiting for it to finish")
        time.sleep(retry.failed())
    if retry.failures:
        log.info("the other process's migrations ended after %.1fs", time.monotonic() - began)
