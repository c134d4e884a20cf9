"""Where a job's steps are kept (PendingJob.step): the result of each named
step, stored in a statement of its own as soon as the step returns, so a
later run of the same job (a retry, a run after a rescue) gets it back
instead of doing, and paying for, the work again.

A job that calls no step costs nothing here: the store comes with the
claim, and the job's steps are read at its first step alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lib.insert import InvalidJob, check_name, encode_json, oversize
from lib.store.driver_errors import Unsendable, is_data_error
from lib.store.sql import Q


class BadStep(Exception):
    """A step's name or result cannot be stored. Final: running the handler
    again names the same step, or has it return the same kind of result."""

    final = True


class StepStore:
    """The job_steps table (sql/job_steps.sql), as the jobs of one poller
    read and write it, through the pool (cooperative under gevent)."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def read(self, job_id: int) -> dict[str, Any]:
        """Every result the job has stored, by step name."""
        return dict(self.db.query(Q.job_steps_read, {"id": job_id}))

    def step(self, job_id: int, stored: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
        """The result of the job's step name: the one in stored (what this
        run has read and kept), else fn's, stored and added to stored. fn's
        own fault goes on up with nothing stored; BadStep for a name or a
        result that cannot be stored (fn has then run)."""
        try:
            check_name("step name", name)
        except InvalidJob as exc:
            raise BadStep(str(exc)) from None
        if name in stored:
            return stored[name]
        stored[name] = self._keep(job_id, name, fn())
        return stored[name]

    def _keep(self, job_id: int, name: str, value: Any) -> Any:
        """Store the result; what the row holds then (another run's, when one
        stored it first), as a later read gives it back."""
        params = {"id": job_id, "name": name, "result": _encoded(name, value)}
        try:
            row = self.db.query_row(Q.job_step_keep, params)
            if row is None:
                # Stored by another run since this one read (one that went on after its lease was lost).
                row = self.db.query_row(Q.job_step_get, params)
        except Exception as exc:
            if not (is_data_error(exc) or isinstance(exc, Unsendable)):
                raise
            # A text the driver cannot send (a lone surrogate) or jsonb refuses
            # (a number of over 131,072 digits): the same result would be again.
            raise BadStep(f"step {name!r}: its result cannot be stored: {exc}") from None
        # None: deleted between the two statements; this run's own result stands.
        return value if row is None else row[0]


def _encoded(name: str, value: Any) -> str:
    """value as the JSON text stored, or BadStep saying why it cannot be."""
    try:
        text = encode_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadStep(f"step {name!r}: its result cannot be stored as JSON: {exc}") from None
    if "\\u0000" in text:
        raise BadStep(f"step {name!r}: its result holds a NUL character, which jsonb cannot store")
    too_big = oversize(value, text, what="its result is")
    if too_big:
        raise BadStep(f"step {name!r}: {too_big}")
    return text
