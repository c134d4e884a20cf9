"""A small psycopg2 connection pool, cooperative under gevent.

This is the one module that knows psycopg2's exception classes: callers ask
is_conn_failure() instead of inspecting driver errors themselves.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import select
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from lib.setup import counters
from lib.store.sql import STATEMENTS, Q

log = logging.getLogger("jobs.db")

Params = dict[str, Any] | Sequence[Any] | None
Row = tuple[Any, ...]

# Server errors after which the server has closed the session anyway:
# admin_shutdown (pg_terminate_backend), crash_shutdown, cannot_connect_now.
_SESSION_ENDING = {"57P01", "57P02", "57P03"}


class PoolTimeout(Exception):
    """Every connection stayed checked out for the whole checkout timeout."""


class Unsendable(ValueError):
    """A statement could not be built or bound from its values (a NUL
    character, a type the driver cannot adapt): nothing was sent."""


class NoReply(Exception):
    """A statement got no answer in time: what it did on the server is not
    known until settled (DB.settle, with the backend_pid noted on it)."""


def is_conn_failure(exc: BaseException) -> bool:
    """True when exc says the connection was lost, not that the server refused
    the statement. Such a statement may be run again on another connection;
    the caller's own timeout or cancellation is never a reason to."""
    if not isinstance(exc, psycopg2.Error):
        return False
    code = exc.pgcode
    if code is None:
        return isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError)
    return code.startswith("08") or code in _SESSION_ENDING


def is_unique_violation(exc: BaseException) -> bool:
    return isinstance(exc, psycopg2.errors.UniqueViolation)


def is_lock_timeout(exc: BaseException) -> bool:
    """The server gave up waiting for a lock (lock_timeout: lock_not_available)."""
    return isinstance(exc, psycopg2.errors.LockNotAvailable)


def is_database_error(exc: BaseException) -> bool:
    """exc came from the database or the way to it (the driver, the pool), not
    from a bug in the code that called it."""
    return isinstance(exc, psycopg2.Error | PoolTimeout | NoReply)


def is_server_error(exc: BaseException) -> bool:
    """The server answered that it refused the statement (bad SQL, a
    constraint, a bad value): nothing of its transaction committed, and the
    connection is fine. After anything else, a timeout or a greenlet kill in
    the middle of a query included, what the server did is not known."""
    return isinstance(exc, psycopg2.Error) and exc.pgcode is not None and not is_conn_failure(exc)


def is_data_error(exc: BaseException) -> bool:
    """The server refused a value: a data exception (an infinite timestamp
    subtracted, an integer out of range) or a program limit (a value too
    deep or too large)."""
    return is_server_error(exc) and str(getattr(exc, "pgcode", ""))[:2] in ("22", "54")


# A connection is returned to the pool only after a plain server error.
_reusable_after = is_server_error


def _install_gevent_wait() -> None:
    """Under gevent's monkey-patching, psycopg2 must yield to the hub while it
    waits on the server; without that a query would block every greenlet of
    the process. Installs psycogreen's wait callback for the hub's thread."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("socket"):
        return
    if psycopg2.extensions.get_wait_callback() is None:
        from psycogreen.gevent import gevent_wait_callback

        hub_thread = monkey.get_original("_thread", "get_ident")()
        psycopg2.extensions.set_wait_callback(_thread_aware(gevent_wait_callback, hub_thread, monkey))


def _thread_aware(green: Any, hub_thread: int, monkey: Any) -> Any:
    """psycogreen's callback in the hub's thread; a plain blocking wait in any
    other native thread (the lease renewal), which has no hub to yield to."""
    get_ident = monkey.get_original("_thread", "get_ident")
    native_select = monkey.get_original("select", "select")

    def wait(conn: psycopg2.extensions.connection, timeout: float | None = None) -> None:
        if get_ident() == hub_thread:
            green(conn, timeout)
            return
        # A native thread has no gevent.Timeout: a DeadlineConnection carries its own.
        deadline = getattr(conn, "deadline", None)
        while (state := conn.poll()) != psycopg2.extensions.POLL_OK:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise psycopg2.OperationalError("no answer from the server in time")
            if state == psycopg2.extensions.POLL_READ:
                native_select([conn.fileno()], [], [], left)
            elif state == psycopg2.extensions.POLL_WRITE:
                native_select([], [conn.fileno()], [], left)
            else:
                raise psycopg2.OperationalError(f"bad result from poll: {state!r}")

    return wait


class DeadlineConnection(psycopg2.extensions.connection):
    """A connection for a native thread, whose every wait on the server ends by
    `deadline` (a monotonic time, moved on by its user before each round
    trip): a link that stalls without closing raises OperationalError then,
    where a socket with no timeout would wait for ever."""

    deadline: float | None = None


def deadline_connection(first: float) -> type[DeadlineConnection]:
    """A DeadlineConnection class whose connect must be done by `first`. The
    deadline is kept by the wait callback a DB installs from the hub's thread."""

    class Connecting(DeadlineConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.deadline = first
            super().__init__(*args, **kwargs)

    return Connecting


def _semaphore(value: int) -> Any:
    """A counting semaphore for the pool, whose users are the greenlets of the
    hub's thread. Under gevent, gevent's own: the patched threading.Semaphore
    yields to the hub on every release (its Condition checks that it holds
    its lock with a non-blocking acquire, which gevent follows with a
    sleep(0)), a switch on every statement the pool runs."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        from gevent.lock import Semaphore

        return Semaphore(value)
    return threading.Semaphore(value)


def _readable_now(conn: psycopg2.extensions.connection) -> bool:
    """Whether the server has sent something on conn, asked without waiting.
    The stdlib's select: gevent's, even with no timeout, also yields to the
    hub, a switch on every checkout of the pool."""
    return bool(_native_select()([conn], [], [], 0)[0])


@functools.cache
def _native_select() -> Any:
    """The stdlib's select.select, patched or not; looked up once (the pool
    is made after the worker's monkey-patching)."""
    monkey = sys.modules.get("gevent.monkey")
    return select.select if monkey is None else monkey.get_original("select", "select")


def _libpq_env(name: str) -> str | None:
    """A variable of libpq's own (PGGSSENCMODE, PGOPTIONS), which libpq reads
    whatever the worker's settings say."""
    # The one read of the environment outside lib/setup/settings.py: libpq's own variables, not ours.
    return os.environ.get(name)


def connect_options(application_name: str, dsn: str, pooled: bool = False) -> dict[str, Any]:
    """What every connection of the worker is opened with; pooled: dsn is a
    pooler in transaction mode (DB's pooled)."""
    options: dict[str, Any] = {
        "connect_timeout": 5,
        "application_name": application_name,
        # A peer that vanished without a FIN is noticed in seconds, not hours.
        "keepalives": 1,
        "keepalives_idle": 15,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    if "gssencmode" not in psycopg2.extensions.parse_dsn(dsn) and _libpq_env("PGGSSENCMODE") is None:
        # Unless asked for: trying GSS encryption first makes libpq load the
        # Kerberos libraries into every worker (0.8 MB resident, seen on an
        # idle worker) and costs each new connection a round trip.
        options["gssencmode"] = "disable"
    if not pooled:
        # No JIT: Postgres compiles a statement whose estimated cost passes
        # jit_above_cost, and estimates grow with the finished rows kept, not
        # with the rows read: at 10M rows the status query took 84 ms, 27 ms
        # without JIT (docs/scale.md). Ahead of the DSN's own options (or
        # PGOPTIONS, which an options parameter replaces), so a -c jit there
        # still wins. Not through a pooler: it does not pass options on, and
        # PgBouncer refuses a connection that sends one it is not told to
        # ignore; the README says to ALTER ROLE ... SET jit = off there.
        given = psycopg2.extensions.parse_dsn(dsn).get("options", _libpq_env("PGOPTIONS") or "")
        options["options"] = f"-c jit=off {given}".strip()
    return options


def behind_pooler(conn: psycopg2.extensions.connection) -> bool:
    """Whether the connection goes through a connection pooler (PgBouncer,
    say): the process id the connection was given at start is then the
    pooler's own, not that of the server process running its statements."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        (server_pid,) = cur.fetchone()
    return bool(conn.info.backend_pid != server_pid)


@dataclass
class _Pooled:
    conn: psycopg2.extensions.connection
    idle_since: float = field(default_factory=time.monotonic)
    # The server process behind the connection, read once while it is whole:
    # settle() needs it after the connection is lost. 0: not known.
    backend_pid: int = 0


# The named queries each connection has prepared; a connection that is closed
# and collected takes its entry with it, as the server does its statements.
_prepared: weakref.WeakKeyDictionary[psycopg2.extensions.connection, set[str]] = weakref.WeakKeyDictionary()


def _bind(cur: psycopg2.extensions.cursor, sql: str, params: Params, prepare: bool) -> bytes:
    """The statement to send, its parameters bound. A named query of sql/
    with named parameters is run prepared (PREPAREd on this connection the
    first time, then an EXECUTE): planning the claim's CTEs cost more than
    running them."""
    stmt = STATEMENTS.get(sql) if prepare and (params is None or isinstance(params, dict)) else None
    if stmt is None:
        return _mogrify(cur, sql, params)
    done = _prepared.setdefault(cur.connection, set())
    if stmt.name not in done:
        cur.execute(stmt.prepare)
        done.add(stmt.name)
    if not params:
        return _mogrify(cur, stmt.execute, None)
    values = [params[name] for name in stmt.params]
    literals = [_literal(value) for value in values]
    if None in literals:
        return _mogrify(cur, stmt.execute, values)
    return stmt.template % tuple(literals)


def _mogrify(cur: psycopg2.extensions.cursor, sql: str, params: Params) -> bytes:
    """cur.mogrify, its refusal of a value raised as Unsendable: it sends nothing."""
    try:
        return cur.mogrify(sql, params)
    except (ValueError, TypeError, psycopg2.ProgrammingError) as exc:
        if isinstance(exc, psycopg2.Error) and exc.pgcode is not None:
            raise
        raise Unsendable(f"{type(exc).__name__}: {exc}") from exc


def _literal(value: Any) -> bytes | None:
    """value as the driver's mogrify writes it, byte for byte, for the values
    the worker's own statements carry on every job (ids, counts, seconds, a
    queue, a worker id, a plain status); None for any other value, and the
    driver then binds them all. The driver finds an adapter for each value
    through its registry: about 19 us for a serial step's 15 values on a
    2 GHz core, several times what writing them here takes. A string that
    needs quoting or escaping, or a value of any other type, is still the
    driver's to write."""
    kind = type(value)
    if value is None:
        return b"NULL"
    if kind is int:
        # A space before a minus, as the driver writes it: "-" after "-" would start a comment.
        return b"%d" % value if value >= 0 else b" %d" % value
    if kind is str:
        plain = value.isascii() and value.isprintable() and "'" not in value and "\\" not in value
        return b"'" + value.encode() + b"'" if plain else None
    if kind is float:
        # repr reads back as the same float8; the driver writes infinities and NaN its own way.
        if not math.isfinite(value):
            return None
        text = repr(value).encode()
        return b" " + text if text.startswith(b"-") else text
    if kind is bool:
        return b"true" if value else b"false"
    return None


class _Runner:
    """exec/query_row/query over whatever connection _cursor() provides."""

    prepare = True

    def _cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        raise NotImplementedError

    def exec(self, sql: str, params: Params = None) -> int:
        """Run a statement; the number of rows it touched."""
        with self._cursor() as cur:
            cur.execute(_bind(cur, sql, params, self.prepare))
            return cur.rowcount

    def query_row(self, sql: str, params: Params = None) -> Row | None:
        with self._cursor() as cur:
            cur.execute(_bind(cur, sql, params, self.prepare))
            return cur.fetchone()

    def query(self, sql: str, params: Params = None) -> list[Row]:
        with self._cursor() as cur:
            cur.execute(_bind(cur, sql, params, self.prepare))
            return cur.fetchall()


class Tx(_Runner):
    """One connection inside an open transaction."""

    def __init__(self, conn: psycopg2.extensions.connection, prepare: bool = True) -> None:
        self.conn = conn
        self.prepare = prepare

    def _cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        return self.conn.cursor()


class _Reserved(_Runner):
    """The pool's reserved connection: one user at a time (lib.store.group_commit)."""

    def __init__(self, db: DB) -> None:
        self.db = db

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
        _install_gevent_wait()
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
        self._slots = _semaphore(size)
        # One more connection, only for DB.reserved: the group commit's writes
        # never wait behind handlers that hold every other connection.
        self._reserve = _semaphore(1)
        self._closed = False
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

    @property
    def open_idle(self) -> int:
        """Connections open and not checked out now."""
        return len(self._idle)

    def close(self) -> None:
        self._closed = True
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
        if _readable_now(pooled.conn):
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
            pooled.conn.autocommit = True
            pooled.idle_since = time.monotonic()
            self._idle.append(pooled)
            self._prune()
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

    @contextmanager
    def connection(self) -> Iterator[psycopg2.extensions.connection]:
        """A raw autocommit connection, for code that needs the driver itself
        (for example lib.insert called with a connection)."""
        with self._checked_out() as conn:
            yield conn
