"""Job rows planted for a test, in any state, by one INSERT: a test states
only what it is about and the rest is what the worker would have written.

    make_job(db)                                     pending, due now
    make_job(db, run_at=later(hours=1), attempts=2)  a retry (or a snooze) waiting
    make_job(db, status="started", worker_id="w1")   running, its lease held
    make_job(db, status="err: boom", finished_at=ago(days=20))
    make_jobs(db, 500, "mail", status="ok")          500 alike, in one statement

A timestamp column takes a datetime, or a timedelta counted from the
database's now() (ago and later read better than a sign)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from tests_support import ROOT

from lib.store.db import DB, Tx


@dataclass(frozen=True)
class Job:
    """A jobs row, every column, as the table holds it now."""

    id: int
    queue: str
    name: str
    args: Any
    status: str
    callsite: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int | None
    worker_id: str | None
    lease_until: datetime | None
    slot: int | None
    last_error: str | None
    dedupe: bool
    last_traceback: str | None
    attempt_errors: Any
    key: str | None


COLUMNS = tuple(f.name for f in fields(Job))
_SELECT = ", ".join(COLUMNS)
_TIMES = {"created_at", "started_at", "finished_at", "run_at", "lease_until"}

LEASE = timedelta(seconds=30)  # a started row's lease: long enough that no rescue takes it mid-test


def ago(**delta: float) -> timedelta:
    """That long before the database's now()."""
    return -timedelta(**delta)


def later(**delta: float) -> timedelta:
    """That long after the database's now()."""
    return timedelta(**delta)


def _defaults(status: str) -> dict[str, Any]:
    """What the worker writes beside a status: a claim counts an attempt and
    takes a slot and a lease; an end stamps finished_at, and an err: keeps
    its text as last_error."""
    if status == "pending":
        return {}
    if status == "started":
        return {"attempts": 1, "worker_id": "test-worker", "slot": 0, "started_at": later(), "lease_until": LEASE}
    ended: dict[str, Any] = {"attempts": 1, "finished_at": later()}
    if status.startswith("err: "):
        ended["last_error"] = status
    return ended


def _caller() -> str:
    """file:line of the test that planted the row, as insert's callsite reads."""
    frame = sys._getframe(2)
    path = os.path.relpath(os.path.abspath(frame.f_code.co_filename), ROOT)
    return f"{path}:{frame.f_lineno}"


def _row(
    queue: Any, name: Any, args: Any, status: str, callsite: str, cols: dict[str, Any], per_row: bool = False
) -> dict[str, Any]:
    """The columns a planted row is written with, as make_job's docstring
    says; per_row, a list of args is one a row (make_jobs)."""
    unknown = set(cols) - set(COLUMNS)
    if unknown:
        raise TypeError(f"jobs has no column {', '.join(sorted(unknown))}")
    if name is None:
        name = [f"{q}.N" for q in queue] if isinstance(queue, list) else f"{queue}.N"
    return {
        "queue": queue,
        "name": name,
        "args": [json.dumps(a or {}) for a in args] if per_row and isinstance(args, list) else json.dumps(args or {}),
        "status": status,
        "callsite": callsite,
        **_defaults(status),
        **cols,
    }


def _value_sql(column: str, value: Any, ref: str) -> str:
    """The SQL for one column's value, read from ref: a timedelta is counted
    from now(), args is JSON text."""
    first = value[0] if isinstance(value, list) and value else value
    if column in _TIMES and isinstance(first, timedelta):
        return f"now() + {ref}"
    if column == "args":
        return f"{ref}::jsonb"
    return ref


def make_job(
    db: DB | Tx, queue: str = "q", name: str | None = None, args: Any = None, *, status: str = "pending", **cols: Any
) -> Job:
    """Plant one row and read it back. name defaults to "<queue>.N"; any other
    column of Job may be given, and overrides what the status implies."""
    values = _row(queue, name, args, status, _caller(), cols)
    placeholders = [_value_sql(column, value, "%s") for column, value in values.items()]
    row = db.query_row(
        f"INSERT INTO jobs ({', '.join(values)}) VALUES ({', '.join(placeholders)}) RETURNING {_SELECT}",
        tuple(values.values()),
    )
    return Job(*row)


def make_jobs(
    db: DB | Tx,
    n: int,
    queue: str | list[str] = "q",
    name: str | list[str] | None = None,
    args: Any = None,
    *,
    status: str = "pending",
    **cols: Any,
) -> list[int]:
    """Plant n rows as make_job would, in one INSERT ... SELECT (so the
    statement trigger runs once, as for any set-based writer), and return
    their ids in order. A value given as a list of n is one a row, in order:
    queue=["a", "b"] * 50, args=[{"n": i} for i in range(n)]; the status is
    one for all."""
    values = _row(queue, name, args, status, _caller(), cols, per_row=True)
    per_row = {column: value for column, value in values.items() if isinstance(value, list)}
    for column, value in per_row.items():
        if len(value) != n:
            raise ValueError(f"{column}: {len(value)} values for {n} rows")
    if n == 0:
        return []
    exprs = [
        _value_sql(column, value, f"r.{column}" if column in per_row else "%s") for column, value in values.items()
    ]
    scalars = [value for column, value in values.items() if column not in per_row]
    if per_row:
        source, params = (
            f"unnest({', '.join(['%s'] * len(per_row))}) AS r({', '.join(per_row)})",
            list(per_row.values()),
        )
    else:
        source, params = "generate_series(1, %s)", [n]
    rows = db.query(
        f"INSERT INTO jobs ({', '.join(values)}) SELECT {', '.join(exprs)} FROM {source} RETURNING id",
        (*scalars, *params),
    )
    return sorted(row[0] for row in rows)


def read_job(db: DB, job_id: int) -> Job:
    """The row as it is now; a test reads a job back by id with it."""
    row = db.query_row(f"SELECT {_SELECT} FROM jobs WHERE id = %s", (job_id,))
    if row is None:
        raise AssertionError(f"no job {job_id}")
    return Job(*row)
