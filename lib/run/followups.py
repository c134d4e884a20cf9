"""Follow-ups (PendingJob.then): the jobs a job's outcome writes, checked
when its handler returns, so that a bad one fails its job, saying which,
and never the write that stores the outcome."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lib.background import worker_registry
from lib.insert import InvalidJob, Job, checked, job_of
from lib.job import PendingJob
from lib.job import status as st


class BadFollowUp(Exception):
    """A follow-up the handler added cannot be enqueued: a field insert
    refuses, or a queue and job name no worker handles. Final: running the
    handler again adds the same one."""

    final = True


def to_write(
    job: PendingJob, status: str, retry_in: float | None, known: Mapping[str, frozenset[str]] | None, db: Any
) -> tuple[Job, ...]:
    """The follow-ups an outcome of this status writes, as insert's jobs;
    none when the job comes back (a retry, a snooze). known: the job names
    of every queue this worker defines (None: any name goes); a name outside
    it must be one a live worker handles. BadFollowUp for one that cannot be."""
    if retry_in is not None:
        return ()
    kind = st.kind(status)
    jobs = []
    for follow in job.followups:
        if kind not in follow.when:
            continue
        written = job_of(follow)
        try:
            checked(written)
        except InvalidJob as exc:
            raise BadFollowUp(f"follow-up {follow.queue}/{follow.name} refused: {exc}") from None
        if known is not None and not _handled(known, db, follow.queue, follow.name):
            raise BadFollowUp(f"follow-up {follow.queue}/{follow.name}: no worker handles that queue and job name")
        jobs.append(written)
    return tuple(jobs)


def _handled(known: Mapping[str, frozenset[str]], db: Any, queue: str, name: str) -> bool:
    return name in known.get(queue, ()) or worker_registry.handled_elsewhere(db, queue, name)
