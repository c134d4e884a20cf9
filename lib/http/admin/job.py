"""One job's page: the row as it is shown (its args and its steps' results
masked), and the actions that fit its state: cancel a pending or running
one, run a scheduled one now, retry a failed one, with its steps kept or
forgotten. Each action rechecks the state on the rows it changes, so a job
that ended or was claimed meanwhile is left alone and the operator is told why."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lib.http.admin.jobs import state_of
from lib.job import status as st
from lib.operate import overview
from lib.operate.cancel import cancel as cancel_jobs
from lib.operate.overview import JobSteps, JobWaits
from lib.operate.redrive import redrive
from lib.operate.tables import PREVIEW_CHARS, compact_json, cut
from lib.setup.error_reports import configured_secrets
from lib.setup.redact import REDACTED, scrub
from lib.store.sql import Q

# The settings name their secret values (JOBS_ADMIN_TOKEN, the API tokens:
# lib.setup.error_reports masks those everywhere), but no args keys; so the value of
# any key whose name holds one of these words is masked as well, at any depth.
SECRET_WORDS = ("token", "secret", "password", "key")


@dataclass(frozen=True)
class Actions:
    cancel: bool  # pending, due or scheduled; or running, and not cancelled yet
    run_now: bool  # pending with run_at in the future
    retry: bool  # failed (err:)
    retry_fresh: bool  # failed, with steps to forget


def shown(job: dict[str, Any], steps: JobSteps, now: datetime, waits: JobWaits | None = None) -> dict[str, Any]:
    """The job as the page shows it: args as masked, indented JSON text, its
    steps each with a masked preview of its result, what it waits for and
    what waits for it, and the timings worked out."""
    args = json.dumps(masked(job["args"]), indent=2, ensure_ascii=False, sort_keys=True)
    pending = job["status"] == st.PENDING
    failed = job["status"].startswith("err: ")
    secrets = configured_secrets()
    return {
        **job,
        "args": scrub(args, secrets),
        "steps": [
            # Masked whole, then cut: a secret the cut would split is masked all the same.
            {"name": name, "stored_at": at, "preview": cut(scrub(compact_json(masked(result)), secrets), PREVIEW_CHARS)}
            for name, at, result in steps.listed
        ],
        "steps_total": steps.total,
        "waits": waits,
        "state": state(job, now),
        "latency": _between(job["run_at"], job["started_at"]),
        "ran_for": _between(job["started_at"], job["finished_at"]),
        "actions": Actions(
            cancel=pending or (job["status"] == st.STARTED and not job["cancel_requested"]),
            # A job that waits for others is not due until they end.
            run_now=pending and job["run_at"] > now and not (waits and waits.waits_for),
            retry=failed,
            retry_fresh=failed and steps.total > 0,
        ),
    }


def masked(value: Any) -> Any:
    """value with the value of every secret-sounding key replaced by REDACTED."""
    if isinstance(value, dict):
        return {k: REDACTED if _secret(k) else masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def _secret(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in SECRET_WORDS)


def state(job: dict[str, Any], now: datetime) -> str:
    """The state the jobs list shows for the row."""
    return state_of(job["status"], job["attempts"], job["last_error"] is not None, job["run_at"], now)


def _between(start: datetime | None, end: datetime | None) -> str | None:
    if start is None or end is None:
        return None
    seconds = (end - start) / timedelta(seconds=1)
    return f"{seconds * 1000:.0f} ms" if abs(seconds) < 10 else overview.age(seconds)


# -- actions: each returns the line the operator reads


def act(db: Any, job_id: int, action: str, operator: str) -> str:
    """The action a job page's button names: cancel, run-now, retry (its
    steps kept) or retry-fresh (its steps forgotten)."""
    if action == "cancel":
        return cancel(db, job_id, operator)
    if action == "run-now":
        return run_now(db, job_id)
    if action in ("retry", "retry-fresh"):
        return retry(db, job_id, fresh=action == "retry-fresh")
    raise ValueError(f"no action {action!r}")


def cancel(db: Any, job_id: int, operator: str) -> str:
    by = f"an operator on the admin page ({operator})"
    done = cancel_jobs(db, [job_id], by)
    if done.ended:
        return f"cancelled job {job_id}: {st.cancelled(by)}"
    if done.stopping:
        return f"stopping job {job_id}: its worker ends it {st.cancelled(by)}"
    if done.unknown:
        return f"job {job_id} was not cancelled: there is no such job"
    return f"job {job_id} was not cancelled: it has already ended: {done.left.get(job_id, '')[:200]}"


def run_now(db: Any, job_id: int) -> str:
    if db.query(Q.admin_job_run_now, {"id": job_id}):
        return f"job {job_id} is due now"
    found = _status(db, job_id)
    if found == st.PENDING:
        return f"job {job_id} was already due: it runs in its turn"
    return f"job {job_id} was not made due: {_not_pending(db, job_id, found)}"


def retry(db: Any, job_id: int, *, fresh: bool = False) -> str:
    done = redrive(db, ids=[job_id], fresh=fresh)
    if done.redriven:
        afresh = ", its steps forgotten" if fresh else ""
        return f"retried job {job_id}: pending again, with one more attempt{afresh}"
    if job_id in done.skipped:
        return f"job {job_id} was not retried: {done.skipped[job_id]}"
    found = _status(db, job_id)
    if found is None:
        return f"job {job_id} was not retried: there is no such job"
    return f"job {job_id} was not retried: only a failed (err:) job is; it is {found[:200]}"


def _status(db: Any, job_id: int) -> str | None:
    rows = db.query(Q.job_statuses, {"ids": [job_id]})
    return rows[0][1] if rows else None


def _not_pending(db: Any, job_id: int, found: str | None = None) -> str:
    found = found or _status(db, job_id)
    if found is None:
        return "there is no such job"
    if found == st.STARTED:
        return "it is running"
    return f"it is no longer pending: {found[:200]}"
