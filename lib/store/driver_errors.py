"""Driver errors, classified: the one module that knows psycopg2's exception
classes. Callers ask is_conn_failure() and the rest instead of inspecting
driver errors themselves."""

from __future__ import annotations

import psycopg2
import psycopg2.errors

# Server errors after which the server has closed the session anyway:
# admin_shutdown (pg_terminate_backend), crash_shutdown, cannot_connect_now.
_SESSION_ENDING = {"57P01", "57P02", "57P03"}
# read_only_sql_transaction: a write in a session that started read-only (a
# database turned read-only when its disk filled, a standby after a failover).
# The session stays read-only whatever the database becomes.
_READ_ONLY = "25006"


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


def is_read_only(exc: BaseException) -> bool:
    """The server refused a write because the session is read-only: the
    session is not used again (a new one reads the database's state anew)."""
    return isinstance(exc, psycopg2.Error) and exc.pgcode == _READ_ONLY


def is_outage(exc: BaseException) -> bool:
    """The database cannot serve the worker for now, whatever is asked of it:
    unreachable, no answer, read-only, or out of a resource (disk, memory,
    connections: class 53). Every part meets the same outage, which is
    reported once and waited out: a write it refused is tried again once it
    passes, as after a lost connection."""
    if is_conn_failure(exc) or isinstance(exc, NoReply):
        return True
    code = getattr(exc, "pgcode", None) if isinstance(exc, psycopg2.Error) else None
    return code is not None and (code == _READ_ONLY or code.startswith("53"))


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
