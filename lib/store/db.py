"""A small psycopg2 connection pool, cooperative under gevent.

Driver errors are classified in lib.store.driver_errors (is_conn_failure() and the
rest), connections are made and waited on in lib.store.pool_connections, and
statements are bound to their values in lib.store.binding.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.extensions

from lib.greenlets.deadline import Deadline, Expired
from lib.setup import counters
from lib.store.binding import Params, Row, bind
from lib.store.driver_errors import NoReply, PoolTimeout, is_read_only, is_server_error
from lib.store.pool_connections import call_later, connect_options, install_gevent_wait, pool_semaphore, readable_now
from lib.store.sql import Q

log = logging.getLogger("jobs.db")


def _reusable_after(exc: BaseException) -> bool:  # a plain server error; a read-only session stays so
    return is_server_error(exc) and not is_read_only(exc)


@dataclass
class _Pooled:
    conn: psycopg2.extensions.connection
    idle_since: float = field(default_factory=time.monotonic)
    # The server process behind the connection, read once while it is whole:
    # settle() needs it after the connection is lost. 0: not known.
    backend_pid: int = 0


class _Runner:
    """exec/query_row/query over whatever connection _cursor() provides."""

    prepare = True

    def _cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        raise NotImplementedError

    def exec(self, sql: str, params: Params = None) -> int:
        """Run a statement; the number of rows it touched."""
        with self._cursor() as cur:
            cur.execute(bind(cur, sql, params, self.prepare))
            return cur.rowcount

    def query_row(self, sql: str, params: Params = None) -> Row | None:
        with self._cursor() as cur:
            cur.execute(bind(cur, sql, params, self.prepare))
            return cur.fetchone()

    def query(self, sql: str, params: Params = None) -> list[Row]:
        with self._cursor() as cur:
            cur.execute(bind(cur, sql, params, self.prepare))
            return cur.fetchall()


class Tx(_Runner):
    """One connection inside an open transaction."""

    def __init__(self, conn: psycopg2.extensions.connection, prepare: bool = True) -> None:
        self.conn = conn
        self.prepare = prepare

    def _cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        return self.conn.cursor()


class _LockBounded(_Runner):
    """Each statement in a transaction of its own that waits at most
    lock_timeout_ms for a lock, then fails (is_lock_timeout)."""

    def __init__(self, db: DB, lock_timeout_ms: int) -> None:
        self.db = db
        self.lock_timeout_ms = int(lock_timeout_ms)

    @property
    def prepare(self) -> bool:  # type: ignore[override]
        return self.db.prepare

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        with self.db.transaction() as tx:
            tx.exec(f"SET LOCAL lock_timeout = {self.lock_timeout_ms}")
            yield tx

    @contextmanager
    def _cursor(self) -> Iterator[psycopg2.extensions.cursor]:  # type: ignore[override]
        with self.transaction() as tx, tx.conn.cursor() as cur:
            yield cur


class _Reserved(_Runner):
    """The pool's reserved connection: one user at a time (lib.run.steps)."""

    def __init__(self, db: DB) -> None:
        self.db = db
        self._deadline = Deadline(0)  # one statement at a time on the connection

    def query_within(self, seconds: float, sql: str, params: Params = None) -> list[Row]:
        """query(), or NoReply when no answer comes within seconds of the
        statement's start (the server or the way to it hangs); the connection
        is discarded, its server process noted for settle(). The deadline
        starts once the connection is the caller's: one block at a time."""
        with self._cursor() as cur:
            self._deadline.seconds = seconds
            try:
                with self._deadline:
                    cur.execute(bind(cur, sql, params, self.prepare))
                    return cur.fetchall()
            except Expired:
                raise NoReply(f"no answer within {seconds:g}s") from None

    @property
    def prepare(self) -> bool:  # type: ignore[override]
        return self.db.prepare

    def _cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        return _CheckedOutCursor(self.db, reserved=True)


class _CheckedOut:
    """A connection of the pool for one with-block, checked back in (or
    discarded, after a fault that leaves it unusable) when the block ends.
    A class, not a generator: every statement the worker sends goes through
    one, and a generator's context manager costs several times as much."""

    __slots__ = ("db", "pooled", "reserved")

    def __init__(self, db: DB, reserved: bool = False) -> None:
        self.db = db
        self.reserved = reserved

    def __enter__(self) -> psycopg2.extensions.connection:
        self.pooled = self.db._checkout(self.reserved)
        self.db.in_use += 1
        return self.pooled.conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        pooled = self.pooled
        if exc is not None and not _reusable_after(exc) and pooled.backend_pid:
            # What the statement did on the server is not known; settle() finds out.
            with contextlib.suppress(AttributeError, TypeError):
                exc.backend_pid = pooled.backend_pid  # type: ignore[attr-defined]
        self.db._checkin(pooled, exc, self.reserved)


class _CheckedOutCursor(_CheckedOut):
    """The same, with a cursor on the connection for the block."""

    __slots__ = ("cur",)

    def __enter__(self) -> psycopg2.extensions.cursor:  # type: ignore[override]
        conn = super().__enter__()
        try:
            self.cur = conn.cursor()
        except BaseException as exc:
            super().__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self.cur

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self.cur.close()
        finally:
            super().__exit__(kind, exc, tb)


class DB(_Runner):
    """A pool of autocommit connections; each call checks one out and back in.

    Connections open when needed and close once idle for idle_timeout, so an
    idle worker holds next to none, and a busy one as many as it uses at once
    (at most size, plus the one reserved for the outcome writes)."""

    def __init__(
        self,
        dsn: str,
        size: int = 10,
        *,
        checkout_timeout: float = 30.0,
        ping_after: float = 300.0,
        idle_timeout: float = 60.0,
        connect_timeout: int = 5,
        application_name: str = "jobs",
        pooled: bool = False,
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        install_gevent_wait()
        self.dsn = dsn
        self.size = size
        self.checkout_timeout = checkout_timeout
        self.ping_after = ping_after
        self.idle_timeout = idle_timeout
        # Behind a pooler in transaction mode, each transaction may get another
        # server session: no statement is prepared (the next transaction's
        # session would not know it), and the process id the pooler reports
        # names no server process, so settle() cannot end one.
        self.pooled = pooled
        self.prepare = not pooled
        self._connect_kwargs = {**connect_options(application_name, dsn, pooled), "connect_timeout": connect_timeout}
        # Most recently used on the right: it is handed out next, and the
        # connections on the left are the ones that have been idle longest.
        self._idle: deque[_Pooled] = deque()
        self._slots = pool_semaphore(size)
        # One more connection, only for DB.reserved: the group commit's writes
        # never wait behind handlers that hold every other connection.
        self._reserve = pool_semaphore(1)
        self._closed = False
        self._pruner: Any = None  # the greenlet that closes idle connections once the pool goes quiet
        self.in_use = 0  # connections checked out now (for /metrics)
        self.reserved = _Reserved(self)

    @classmethod
    def connect(cls, dsn: str, size: int = 10, **options: Any) -> DB:
        """A pool that has shown it can reach the server."""
        db = cls(dsn, size, **options)
        db.query_row("SELECT 1")
        return db

    def exec_in_batches(self, sql: str, params: dict[str, Any]) -> int:
        """Run a statement that touches at most params["batch"] rows (a
        DELETE of a LIMITed set) until it touches fewer; the rows touched in
        all. Each batch is a short transaction of its own, and other
        greenlets run between batches (time.sleep is gevent's when patched)."""
        total = 0
        while True:
            n = self.exec(sql, params)
            total += n
            if n < params["batch"]:
                return total
            time.sleep(0)

    def grow(self, n: int) -> None:
        """Allow n more connections, for a worker that learns its needs late."""
        self.size += n
        for _ in range(n):
            self._slots.release()

    def close(self) -> None:
        self._closed = True
        if self._pruner is not None:
            self._pruner.kill(block=False)
        while self._idle:
            self._idle.pop().conn.close()

    def _open(self) -> _Pooled:
        conn = psycopg2.connect(self.dsn, **self._connect_kwargs)
        conn.autocommit = True
        return _Pooled(conn, backend_pid=0 if self.pooled else conn.info.backend_pid)

    def _alive(self, pooled: _Pooled) -> bool:
        """Whether an idle connection may be handed out, without a round trip in
        the common case: an idle connection that has become readable was told
        by the server it is going away (terminated, shut down) or hit EOF. One
        idle past ping_after is also pinged, for a peer that vanished silently.
        A ping on every checkout would double an idle worker's transactions."""
        if pooled.conn.closed:
            return False
        if readable_now(pooled.conn):
            pooled.conn.close()
            return False
        if time.monotonic() - pooled.idle_since < self.ping_after:
            return True
        try:
            with pooled.conn.cursor() as cur:
                cur.execute("SELECT 1")
            return True
        except psycopg2.Error:
            pooled.conn.close()
            return False

    def _prune(self) -> None:
        """Close the connections idle for longer than idle_timeout."""
        ended = time.monotonic() - self.idle_timeout
        while self._idle and self._idle[0].idle_since < ended:
            self._idle.popleft().conn.close()

    def _prune_later(self) -> None:
        # A pool that goes quiet closes its idle connections all the same:
        # no checkout or check-in would come to prune them.
        if self._pruner is None and self._idle and not self._closed:
            self._pruner = call_later(self.idle_timeout, self._pruned)

    def _pruned(self) -> None:
        self._pruner = None
        self._prune()
        self._prune_later()

    def _checkout(self, reserved: bool = False) -> _Pooled:
        if self._closed:
            raise RuntimeError("the pool is closed")
        began = time.monotonic()
        slots = self._reserve if reserved else self._slots
        if not slots.acquire(timeout=self.checkout_timeout):
            raise PoolTimeout(f"no connection free within {self.checkout_timeout}s (pool size {self.size})")
        counters.checkout_waited(time.monotonic() - began)
        try:
            self._prune()
            while self._idle:
                pooled = self._idle.pop()
                if self._alive(pooled):
                    return pooled
                log.info("discarded a dead idle connection")
            return self._open()
        except BaseException:
            slots.release()
            raise

    def _checkin(self, pooled: _Pooled, exc: BaseException | None, reserved: bool = False) -> None:
        try:
            if (exc is not None and not _reusable_after(exc)) or self._closed or pooled.conn.closed:
                pooled.conn.close()
                return
            if pooled.conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
                pooled.conn.rollback()
            if pooled.conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
                # Still in a transaction the driver took for ended (a COMMIT its
                # statement_timeout cancelled): rollback() sent nothing.
                log.warning("closed a connection checked in inside a transaction the driver did not know of")
                pooled.conn.close()
                return
            pooled.conn.autocommit = True
            pooled.idle_since = time.monotonic()
            self._idle.append(pooled)
            self._prune()
            self._prune_later()
        except psycopg2.Error:
            pooled.conn.close()
        finally:
            self.in_use -= 1
            (self._reserve if reserved else self._slots).release()

    def _checked_out(self, reserved: bool = False) -> _CheckedOut:
        return _CheckedOut(self, reserved)

    def _cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        return _CheckedOutCursor(self)

    def settle(self, exc: BaseException, timeout: float = 10.0) -> None:
        """After a statement failed with its outcome unknown (the connection
        was lost, or the caller stopped waiting for it), make the outcome
        final: end the server process that ran it, if it still runs. Its
        transaction has then committed or never will, and the rows say which.
        Raises when the server cannot be asked, or the process did not end.

        Behind a transaction pooler the process is not known, and nothing is
        ended: the pooler drops a server session whose client went away
        mid-transaction, which rolls it back. Should that transaction commit
        a claim after the rows were read, the row waits out its lease and
        the rescue runs it then."""
        pid = getattr(exc, "backend_pid", None)
        if not pid:
            return
        row = self.query_row(Q.backend_end, {"pid": pid, "timeout_ms": int(timeout * 1000)})
        if row is not None and not row[0]:
            raise PoolTimeout(f"server process {pid} did not end within {timeout:g}s")

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """One connection in one transaction: committed when the block ends,
        rolled back when it raises."""
        with self._checked_out() as conn:
            # On an exception the check-in rolls back (or discards) the connection.
            conn.autocommit = False
            yield Tx(conn, self.prepare)
            conn.commit()

    def lock_bounded(self, lock_timeout_ms: int) -> _LockBounded:
        """This pool, each statement waiting at most lock_timeout_ms for a lock."""
        return _LockBounded(self, lock_timeout_ms)

    def open_connection(self, application_name: str) -> psycopg2.extensions.connection:
        """A new autocommit connection of the caller's own, opened as the
        pool's are but outside the pool and its size; the caller closes it.
        For a transaction held open while the pool's connections work (the
        migrations' lock)."""
        conn = psycopg2.connect(self.dsn, **{**self._connect_kwargs, "application_name": application_name})
        conn.autocommit = True
        return conn

    @contextmanager
    def connection(self) -> Iterator[psycopg2.extensions.connection]:
        """A raw autocommit connection, for code that needs the driver itself
        (for example lib.insert called with a connection)."""
        with self._checked_out() as conn:
            yield conn
