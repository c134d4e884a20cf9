"""The claim stage: take the head of the queue for a slot, learn what a claim
whose reply was lost committed, and end a row no claim can read, so the rest
of its queue is worked."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, NamedTuple

from lib.background.leases import Leases
from lib.insert import MAX_ARGS_BYTES, oversize
from lib.job import PendingJob
from lib.job import status as st
from lib.setup.error_reports import capture
from lib.store.db import DB
from lib.store.driver_errors import is_data_error, is_server_error, is_unique_violation
from lib.store.group_commit import Committer
from lib.store.sql import Q

log = logging.getLogger("jobs")

# jsonb prints a float Python wrote as 5e-324 in 326 characters, the most it
# widens any args: a printed text longer than this is over the limit by any
# measure, and is refused undecoded.
PRINTED_CEILING = 64 * MAX_ARGS_BYTES


class ClaimResult(NamedTuple):
    """What a claim found: a job, or None and the seconds until the queue may
    have work (None: nothing known)."""

    job: PendingJob | None
    wait: float | None = None


class RollbackProbe(Exception):
    """Rolls back a claim made only to see whether it fails."""


class Claimer:
    def __init__(self, queue: str, db: DB, completer: Committer, leases: Leases, *, max_attempts: int) -> None:
        self.queue = queue
        self.db = db
        self.completer = completer
        self.leases = leases
        self.max_attempts = max_attempts
        # Per slot, a claim whose reply was lost: what it did is settled
        # before the slot claims again.
        self.unsettled: dict[int, BaseException] = {}
        # Rows this poller gave up on while they were still started by it
        # (outcome not written, or fenced): never mistaken for a new claim.
        self.abandoned: set[int] = set()

    def params(self, job_id: int | None, slot: int) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "id": job_id,
            "slot": slot,
            "worker_id": self.leases.worker_id,
            "lease": self.leases.lease,
            "max_attempts": self.max_attempts,
        }

    def claim(self, job_id: int | None, slot: int) -> ClaimResult:
        """The claimed job (the given one, or the queue's head), or None and
        the seconds until the queue may have work (None: nothing known). None
        is the ordinary answer when another worker got there first, the
        queue's slots are all taken, or the queue is paused or throttled."""
        if slot in self.unsettled:
            # A claim of this slot whose reply was lost may have committed:
            # that job is this slot's to run, before any other.
            mine = self._settle(slot, self.unsettled[slot])
            if mine is not None:
                return ClaimResult(mine)
        while True:
            try:
                row = self.completer.send(None, self.params(job_id, slot)).row
            except Exception as exc:
                if is_unique_violation(exc):
                    return ClaimResult(None)
                if is_data_error(exc) and self._end_unclaimable(slot, exc):
                    continue
                if not is_server_error(exc):
                    self.unsettled[slot] = exc
                    mine = self._settle(slot, exc)
                    if mine is not None:
                        return ClaimResult(mine)
                raise
            return claimed(row)

    def lost(self, slot: int, exc: BaseException) -> PendingJob | None:
        """A write that carried this slot's claim got no answer: the job it
        claimed, when that can be learnt now; else the slot settles before its
        next claim."""
        self.unsettled[slot] = exc
        try:
            return self._settle(slot, exc)
        except Exception as settle_exc:
            log.warning("queue=%s could not yet learn what a lost write committed: %s", self.queue, settle_exc)
            return None

    def _settle(self, slot: int, exc: BaseException) -> PendingJob | None:
        """Make the outcome of the write that failed final, then read the row.
        The job it claimed, or None when it claimed nothing. Raises (and stays
        unsettled) while the server cannot be asked."""
        self.db.settle(exc)
        # Not a job this worker runs or finalizes now (the write that failed
        # may have been that job's outcome), nor one it gave up on.
        known = sorted(self.abandoned | set(self.leases.held))
        params = {"queue": self.queue, "slot": slot, "worker_id": self.leases.worker_id, "known": known}
        row = self.db.query_row(Q.job_claimed_by, params)
        self.unsettled.pop(slot, None)
        job = claimed(row).job
        if job is not None:
            log.warning("queue=%s id=%d was claimed though the reply was lost; running it", self.queue, job.id)
        return job

    def _end_unclaimable(self, slot: int, exc: BaseException) -> bool:
        """The claim failed on a value in a row (one written by hand, say).
        When the queue's head row is the one (claiming it alone fails the same
        way), end it with the reason, so the rest of the queue is worked.
        Whether a row was ended."""
        head = self.db.query_row(Q.job_head, {"queue": self.queue})
        if head is None:
            return False
        try:
            with self.db.transaction() as tx:
                tx.query_row(Q.job_claim, self.params(head[0], slot))
                # Claimable: the fault lies elsewhere. Roll back.
                raise RollbackProbe
        except RollbackProbe:
            return False
        except Exception as probe:
            if not is_data_error(probe):
                return False
        status = st.err(f"cannot be claimed: {first_line(exc)}")
        if not self.db.exec(Q.job_end_unclaimable, {"id": head[0], "status": status}):
            return False
        log.error("queue=%s id=%d ended: %s", self.queue, head[0], status)
        capture(exc, message="job cannot be claimed", queue=self.queue, job_id=head[0])
        return True


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def claimed(row: tuple[Any, ...] | None) -> ClaimResult:
    """A job_claim row as what the claim found."""
    if row is None:
        return ClaimResult(None)
    job_id, name, args_text, attempts, max_attempts, callsite, latency, wait, _slot = row
    if job_id is None:
        return ClaimResult(None, wait)
    args, args_error = decode_args(args_text)
    return ClaimResult(
        PendingJob(job_id, name, args, attempts, max_attempts, callsite, latency, time.monotonic(), args_error)
    )


def decode_args(text: str | None) -> tuple[Any, str | None]:
    """The args as the handler gets them, or why they cannot be read. Decoded
    here, after the claim committed, so a row whose args cannot be read ends
    with the reason instead of failing every claim of its queue."""
    if text is None:
        return None, "args are NULL"
    if len(text) > PRINTED_CEILING:
        # Not decoded: the objects of a text this long can take gigabytes.
        return None, f"args are {len(text)} characters as jsonb prints them; the limit is {MAX_ARGS_BYTES} bytes"
    try:
        args = json.loads(text)
        # jsonb prints ", " and ": " where compact JSON has "," and ":", and
        # each number in full: its text is never smaller than what the limit
        # measures, so a text within the limit is not measured again.
        too_big = oversize(args) if _over(text) else None
    except (ValueError, RecursionError) as exc:
        return None, f"args cannot be decoded: {type(exc).__name__}: {first_line(exc)}"
    return (None, too_big) if too_big else (args, None)


def _over(text: str) -> bool:
    """Whether text is more than MAX_ARGS_BYTES of UTF-8; a character is at
    most 4 bytes, so a short text is not encoded to know."""
    return len(text) > MAX_ARGS_BYTES // 4 and len(text.encode()) > MAX_ARGS_BYTES
