"""How the pool's connections are opened and wait on the server: under gevent
on the hub, in a native thread with a deadline of their own."""

from __future__ import annotations

import functools
import os
import select
import sys
import threading
import time
from typing import Any

import psycopg2
import psycopg2.extensions


def install_gevent_wait() -> None:
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


def pool_semaphore(value: int) -> Any:
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


def call_later(seconds: float, fn: Any) -> Any:
    """fn in a greenlet of its own in that many seconds, under gevent (its
    Greenlet, to kill); None, and nothing scheduled, in a plain program, where
    the next use of the pool is the only time there is."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return None
    import gevent

    return gevent.spawn_later(seconds, fn)


def readable_now(conn: psycopg2.extensions.connection) -> bool:
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
        # Kerberos libraries into every worker (resident memory of an idle
        # worker, docs/performance.md) and costs each new connection a round trip.
        options["gssencmode"] = "disable"
    if not pooled:
        # No JIT: Postgres compiles a statement whose estimated cost passes
        # jit_above_cost, and estimates grow with the finished rows kept, not
        # with the rows read, so on a large table compiling costs more than
        # the query saves (docs/scale.md). Ahead of the DSN's own options (or
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
