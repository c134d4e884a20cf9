"""Job rows planted for a test, in any state, by one INSERT: a test states
only what it is about and the rest is what the worker would have written.

    make_job(db)                                     pending, due now
    make_job(db, run_at=later(hours=1), attempts=2)  a retry (or a snooze) waiting
    make_job(db, status="started", worker_id="w1")   running, its lease held
    make_job(db, status="err: boom", finished_at=ago(days=20))

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

from lib.store.db import DB


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


def make_job(
    db: DB, queue: str = "q", name: str | None = None, args: Any = None, *, status: str = "pending", **cols: Any
) -> Job:
    """Plant one row and read it back. name defaults to "<queue>.N"; any other
    column of Job may be given, and overrides what the status implies."""
    unknown = set(cols) - set(COLUMNS)
    if unknown:
        raise TypeError(f"jobs has no column {', '.join(sorted(unknown))}")
    values = {
        "queue": queue,
        "name": name or f"{queue}.N",
        "args": json.dumps(args or {}),
        "status": status,
        "callsite": _caller(),
        **_defaults(status),
        **cols,
    }
    placeholders = []
    for column, value in values.items():
        if column in _TIMES and isinstance(value, timedelta):
            placeholders.append("now() + %s")
        elif column == "args":
            placeholders.append("%s::jsonb")
        else:
            placeholders.append("%s")
    row = db.query_row(
        f"INSERT INTO jobs ({', '.join(values)}) VALUES ({', '.join(placeholders)}) RETURNING {_SELECT}",
        tuple(values.values()),
    )
    return Job(*row)


def read_job(db: DB, job_id: int) -> Job:
    """The row as it is now; a test reads a job back by id with it."""
    row = db.query_row(f"SELECT {_SELECT} FROM jobs WHERE id = %s", (job_id,))
    if row is None:
        raise AssertionError(f"no job {job_id}")
    return Job(*row)
