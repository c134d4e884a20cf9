"""Enqueue jobs: how a program writes job rows. (The clock writes its
scheduled rows in a statement of its own, sql/clock.sql.)

Synchronous programs (a Flask or Django process, a cron script) import this as
is: it never imports gevent and never monkey-patches. Given a connection, it
writes inside the caller's open transaction and never commits, so a job is
accepted exactly when the caller's own work commits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lib.store.sql import ROOT, Q

# The payload is a handler's arguments, not a place for documents; a large
# blob belongs in a table the handler reads. Postgres would take far more, but
# every claim would then drag it through the worker.
MAX_ARGS_BYTES = 256 * 1024
# Queue and job names are indexed together (jobs_failed_queue); a btree entry
# holds at most 2,704 bytes, and two names of 200 characters are at most 1,600 bytes of UTF-8.
MAX_NAME_CHARS = 200
# The jobs one job may wait for: a fan-in past this is a job per group.
MAX_AFTER = 1000


class InvalidJob(ValueError):
    """The job was refused before anything was written."""


@dataclass(frozen=True)
class Job:
    """One job for insert_many."""

    queue: str
    name: str
    args: Any = None
    run_at: datetime | None = None
    priority: int = 0
    max_attempts: int | None = None
    key: str | None = None
    after: Sequence[int] = ()
    after_any_outcome: bool = False


def job_of(fields: Any) -> Job:
    """A Job of anything with its fields by name (a follow-up, PendingJob.then)."""
    return Job(
        fields.queue,
        fields.name,
        fields.args,
        fields.run_at,
        fields.priority,
        fields.max_attempts,
        fields.key,
        fields.after,
        fields.after_any_outcome,
    )


def insert(
    db: Any,
    queue: str,
    name: str,
    args: Any = None,
    *,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    callsite: str | None = None,
    key: str | None = None,
    after: Sequence[int] = (),
    after_any_outcome: bool = False,
) -> int | None:
    """Write one job; its id, or None when a unique (dedupe) index suppressed it.

    db is the project's DB (or a transaction of it), a psycopg2 or psycopg 3
    connection or cursor, or a SQLAlchemy Session or Connection (written in
    its transaction). Inside an OpenTelemetry span, the row keeps the span's
    context for the run's span to link to (trace_context). args is a mapping or a
    dataclass instance; enqueue only the keys you set, since args is part of
    the dedupe key. max_attempts None means the queue's own setting. callsite
    names the writer in the row; None: the caller's file:line (a command that
    enqueues for a person names itself instead, "cli"). key puts the job in
    an order of its own within the queue ("repo:octo/hello"): the jobs of one
    key start one at a time, in the queue's order, across every worker.

    after names jobs this one waits for: it runs once every one has ended ok
    (in any queue, run by any process); when one ends otherwise it ends as a
    skip naming it, unless after_any_outcome. Each must exist, else the
    database refuses the insert, and the caller's transaction with it; each
    is locked until that transaction ends, and its own outcome waits for that.
    """
    params = {
        "queue": queue,
        "name": name,
        "args": _checked(queue, name, args, run_at, priority, max_attempts),
        "run_at": run_at,
        "priority": priority,
        "max_attempts": max_attempts,
        "callsite": callsite or _callsite(),
        "key": _key(key),
        "trace": trace_context(),
    }
    waits_for = _after(after)
    if waits_for:
        params.update(after=waits_for, any_outcome=bool(after_any_outcome))
    found = _fetch(db, Q.job_insert_after if waits_for else Q.job_insert, params, one=True)
    return found[0][0] if found else None


def insert_many(db: Any, jobs: Iterable[Job], *, callsite: str | None = None) -> list[int]:
    """Write many jobs in one statement; the ids of the rows written, in the
    order given (a suppressed duplicate has no id, so the list may be shorter).
    callsite as for insert."""
    jobs = list(jobs)
    if not jobs:
        return []
    if any(j.after for j in jobs):
        # Each made to wait as insert makes it, in the statement after its own.
        site = callsite or _callsite()
        return [i for j in jobs if (i := _insert_job(db, j, site)) is not None]
    # Each column goes as one JSON array: psycopg2 would write a list as an
    # ARRAY[...] of one literal per job, which costs more to build and to parse.
    texts = [checked(j) for j in jobs]
    params = {
        "callsite": callsite or _callsite(),
        "queues": encode_json([j.queue for j in jobs]),
        "names": encode_json([j.name for j in jobs]),
        "args": f"[{','.join(texts)}]",
        "run_ats": encode_json([None if j.run_at is None else j.run_at.isoformat() for j in jobs]),
        "priorities": encode_json([j.priority for j in jobs]),
        "max_attempts": encode_json([j.max_attempts for j in jobs]),
        "keys": encode_json([_key(j.key) for j in jobs]),
        "trace": trace_context(),
    }
    return [r[0] for r in _fetch(db, Q.job_insert_many, params, one=False)]


# One encoder for every call: json.dumps with options builds a new one each time.
# Compact, NaN and infinity refused (jsonb takes neither); also what a step's
# result is stored as (lib/run/job_steps.py).
encode_json = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode


def encode_args(args: Any) -> str:
    """args as the JSON text stored in the row, or InvalidJob saying why not."""
    if args is None:
        return "{}"
    if type(args) is not dict:
        if dataclasses.is_dataclass(args) and not isinstance(args, type):
            args = dataclasses.asdict(args)
        if not isinstance(args, Mapping):
            raise InvalidJob(f"args must be a mapping or a dataclass instance, not {type(args).__name__}")
        args = dict(args)
    try:
        text = encode_json(args)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"args are not JSON-serialisable: {exc}") from None
    if "\\u0000" in text:
        raise InvalidJob("args contain a NUL character, which Postgres cannot store in jsonb")
    if too_big := oversize(args, text):
        raise InvalidJob(too_big)
    return text


def oversize(args: Any, compact: str | None = None, *, what: str = "args are") -> str | None:
    """Why args are over MAX_ARGS_BYTES, or None. The one measure of the
    limit, taken at insert and again at claim on the args read back from
    the row, so a job the insert takes is never refused when it is claimed:
    the size of args as compact UTF-8 JSON, each number written as the
    database keeps it. compact: encode_json(args), when the caller has it;
    what: the words the reason starts with (a step's result is measured so too)."""
    text = encode_json(args) if compact is None else compact
    # Only Python's exponents ("1e+300") are shorter than the database's
    # digits; a character is at most 4 bytes: a short text without one is
    # within the limit unmeasured.
    exponents = "e+" in text
    if len(text) <= MAX_ARGS_BYTES // 4 and not exponents:
        return None
    size = len(text.encode()) + (_digits_beyond_exponents(args) if exponents else 0)
    if size <= MAX_ARGS_BYTES:
        return None
    return f"{what} {size} bytes as compact JSON; the limit is {MAX_ARGS_BYTES}"


def _digits_beyond_exponents(args: Any) -> int:
    """The bytes a float Python writes with a positive exponent takes beyond
    its text as the database keeps it: jsonb keeps 1e+300 as its 301 digits,
    and a claim reads it back as that int."""
    extra = 0
    values = [args]
    while values:  # a loop: args json could nest deeper than Python recurses
        value = values.pop()
        if isinstance(value, dict):
            values.extend(value.values())
        elif isinstance(value, list | tuple):
            values.extend(value)
        elif isinstance(value, float):
            text = float.__repr__(value)  # as json writes it, a float subclass too
            if "e+" in text:
                # One digit before the point, then as many as the exponent says.
                extra += (value < 0) + int(text.partition("e+")[2]) + 1 - len(text)
    return extra


def check_name(field: str, value: Any) -> str:
    """The one rule for a queue's or a job's name, wherever one is given (an
    insert, a schedule entry, a poller's queue and handlers): a non-empty
    string without surrounding spaces, since rows are matched by exact name,
    of at most MAX_NAME_CHARS characters, so every index over names can hold
    the row whatever status it ends in."""
    if not isinstance(value, str) or not value or value != value.strip():
        raise InvalidJob(f"{field} must be a non-empty string without surrounding spaces, got {value!r:.200}")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidJob(f"{field} is {len(value)} characters; the limit is {MAX_NAME_CHARS}, got {value[:60]!r}...")
    return value


def checked(job: Job) -> str:
    """The job's args as JSON text, once every field is known good; else InvalidJob."""
    if job.after != ():  # the default, no waits, is known good: a batch's jobs mostly wait for none
        _after(job.after)
    return _checked(job.queue, job.name, job.args, job.run_at, job.priority, job.max_attempts, job.key)


def _checked(queue: Any, name: Any, args: Any, run_at: Any, priority: Any, max_attempts: Any, key: Any = None) -> str:
    """A job's args as JSON text, once every field is known good; else InvalidJob."""
    check_name("queue", queue)
    check_name("name", name)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidJob(f"priority must be an int, got {priority!r}")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        raise InvalidJob(f"max_attempts must be a positive int or None, got {max_attempts!r}")
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        raise InvalidJob("run_at must be a timezone-aware datetime (a naive one is ambiguous)")
    _key(key)
    return encode_args(args)


def _insert_job(db: Any, job: Job, callsite: str) -> int | None:
    return insert(
        db,
        job.queue,
        job.name,
        job.args,
        run_at=job.run_at,
        priority=job.priority,
        max_attempts=job.max_attempts,
        callsite=callsite,
        key=job.key,
        after=job.after,
        after_any_outcome=job.after_any_outcome,
    )


def _after(after: Any) -> list[int]:
    """The ids a job waits for, each a positive int; else InvalidJob."""
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise InvalidJob(f"after must be a list of job ids, got {after!r:.200}")
    ids = list(after)
    for job_id in ids:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise InvalidJob(f"after must hold job ids (positive ints), got {job_id!r:.200}")
    if len(ids) > MAX_AFTER:
        raise InvalidJob(f"after names {len(ids)} jobs; the limit is {MAX_AFTER}")
    return sorted(set(ids))


def _key(key: Any) -> str | None:
    return None if key is None else check_name("key", key)


# SQLAlchemy's drivers that take our "%(name)s" SQL as it is written.
_SQLALCHEMY_DRIVERS = ("psycopg2", "psycopg")
# What running our SQL in a database without the jobs schema fails with:
# undefined_function (jobs_insert), undefined_table.
_NO_JOBS_TABLE = ("42883", "42P01")


def _fetch(db: Any, sql: str, params: dict[str, Any], *, one: bool) -> list[Any]:
    """Run sql on whichever kind of handle the caller gave, in its transaction
    (a SQLAlchemy Session's is joined, or begun as its next flush would);
    never commits. A handle insert cannot write through is a TypeError and
    nothing is run. In a database without the jobs table (a Session bound to
    the application's own database) the statement fails, and so does the
    caller's transaction, as after any failed statement: a RuntimeError
    saying so, raised from the driver's error."""
    try:
        if hasattr(db, "query_row"):  # the project's DB or Tx
            if one:
                row = db.query_row(sql, params)
                return [row] if row else []
            return db.query(sql, params)
        if (connection := _sqlalchemy_connection(db)) is not None:
            # exec_driver_sql hands sql and params to the driver as they are,
            # through SQLAlchemy's events and logging.
            return connection.exec_driver_sql(sql, params).fetchall()
        if hasattr(db, "cursor"):  # a psycopg2 or psycopg 3 connection
            with db.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall()
        if hasattr(db, "execute") and hasattr(db, "fetchall"):  # a cursor
            db.execute(sql, params)
            return db.fetchall()
    except Exception as exc:
        cause = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
        if (getattr(cause, "pgcode", None) or getattr(cause, "sqlstate", None)) in _NO_JOBS_TABLE:
            reason = str(cause).splitlines()[0]
            raise RuntimeError(
                f"this database has no jobs table ({reason}): is the {type(db).__name__} bound to the worker's"
                " database, migrated by the worker? Its transaction is failed: roll it back"
            ) from exc
        raise
    raise TypeError(
        f"cannot enqueue through a {type(db).__name__}: pass a DB, a connection or a cursor,"
        " or a SQLAlchemy Session or Connection"
    )


def _sqlalchemy_connection(db: Any) -> Any:
    """The SQLAlchemy Connection to run on: db itself, or a Session's (as
    session.connection() gives it); None when db is not SQLAlchemy's. Known
    by its classes' module, since this module never imports SQLAlchemy; a
    subclass (Flask-SQLAlchemy's Session) counts."""
    modules = [t.__module__ for t in type(db).__mro__ if t.__module__.startswith("sqlalchemy.")]
    if not modules:
        return None
    supported = "a Session or Connection of an engine on postgresql+psycopg2:// or postgresql+psycopg://"
    if any(m.startswith("sqlalchemy.ext.asyncio") for m in modules):
        raise TypeError(f"cannot enqueue through an async {type(db).__name__}: insert is synchronous; pass {supported}")
    if hasattr(db, "exec_driver_sql"):  # a Connection
        bind = db
    elif hasattr(db, "get_bind"):  # a Session or scoped_session
        try:
            bind = db.get_bind()
        except Exception as exc:
            if type(exc).__name__ != "UnboundExecutionError":
                raise
            raise TypeError(f"cannot enqueue through a {type(db).__name__} with no bind: pass {supported}") from exc
    else:  # an Engine: no transaction of the caller's to write in
        raise TypeError(
            f"cannot enqueue through a SQLAlchemy {type(db).__name__}, outside any transaction: pass {supported}"
        )
    dialect = bind.dialect
    if dialect.name != "postgresql" or dialect.driver not in _SQLALCHEMY_DRIVERS or dialect.is_async:
        on = f"{dialect.name}+{dialect.driver}{' (async)' if dialect.is_async else ''}"
        raise TypeError(
            f"cannot enqueue through a {type(db).__name__} on {on}: the jobs table is PostgreSQL's; pass {supported}"
        )
    return db if bind is db else db.connection()


def trace_context() -> str | None:
    """The caller's trace context as JSON text ({"traceparent": ...}, what
    OpenTelemetry's propagator writes), for the row; None when the caller
    runs in no span. Read only where the program has loaded OpenTelemetry's
    API (configuring a tracer provider loads it): anywhere else this imports
    nothing and costs one dictionary lookup."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        from opentelemetry import propagate

        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    except Exception:
        # A fault of the tracing setup never refuses an enqueue: the job is
        # written untraced.
        return None
    return encode_json(carrier) if carrier else None


def _callsite() -> str:
    """file:line of the code that called insert."""
    return callsite_of(sys._getframe(2))


def callsite_of(frame: Any) -> str:
    """A frame's file:line, relative to the repo root when it lies inside it,
    so it reads the same whatever checkout ran it."""
    path = os.path.abspath(frame.f_code.co_filename)
    root = str(ROOT) + os.sep
    if path.startswith(root):
        path = path[len(root) :]
    return f"{path}:{frame.f_lineno}"
