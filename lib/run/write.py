"""The write stage: the outcome goes to the completer, with the slot's next
claim when there is one to make (one round trip, one commit); alone, and
again with backoff while the row may still be this claim's, when that
cannot be; and the check that it landed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import gevent

from lib.background.leases import Leases
from lib.greenlets.kills import Kills
from lib.job import PendingJob
from lib.job import status as st
from lib.run.claim import Claimer, ClaimResult, claimed
from lib.run.outcome import Outcome
from lib.setup.error_reports import Outage, capture, capture_message
from lib.store.driver_errors import Unsendable, is_data_error, is_outage, is_server_error
from lib.store.group_commit import Committer
from lib.store.retry_backoff import Backoff

log = logging.getLogger("jobs")

# An outcome that could not be written is sent again after these waits
# (doubling, with jitter), for as long as the job's lease holds.
WRITE_RETRY_BASE = 0.05
WRITE_RETRY_CAP = 1.0


class Writer:
    def __init__(
        self,
        queue: str,
        completer: Committer,
        claimer: Claimer,
        leases: Leases,
        *,
        kills: Kills,
        release: Callable[[PendingJob], None],
        outage: Outage,
    ) -> None:
        self.queue = queue
        self.completer = completer
        self.claimer = claimer
        self.leases = leases
        self._kills = kills
        # Gives back a job the write claimed for a slot that was killed meanwhile.
        self._release = release
        # The database's outage, shared by the worker's parts: while it is
        # reported, an outcome it keeps from being written is not reported again.
        self.outage = outage

    def write(self, job: PendingJob, outcome: Outcome, delay: float, next_slot: int | None) -> ClaimResult | None:
        """Write the outcome; with next_slot, together with the claim of that
        slot's next job, and what it found. A kill that comes meanwhile (the
        shutdown window closed) waits for the write to end."""
        found: ClaimResult | None = None
        try:
            with self._kills:
                found = self._write(job, outcome, delay, next_slot)
        except BaseException:
            # The kill held back: a job the write claimed will now never run here.
            if found is not None and found.job is not None:
                self._release(found.job)
            raise
        return found

    def _write(self, job: PendingJob, outcome: Outcome, delay: float, next_slot: int | None) -> ClaimResult | None:
        """One update by primary key; with next_slot, sent together with the
        claim of that slot's next job (one round trip, one commit). When that
        fails, what committed is settled first (the claim may have), and the
        outcome goes alone unless it went with the claim. What the claim sent
        with it found, if it went."""
        params = self.outcome_params(job, outcome, delay)
        if next_slot is not None:
            try:
                reply = self.completer.send(params, self.claimer.params(None, next_slot))
            except Exception as exc:
                log.debug("queue=%s id=%d outcome and next claim together failed: %s", self.queue, job.id, exc)
                # Unsendable: nothing was sent.
                if not is_server_error(exc) and not isinstance(exc, Unsendable):
                    # No answer: the server may have committed both, or may
                    # still, unless its process is ended first.
                    mine = self.claimer.lost(next_slot, exc)
                    if mine is not None:
                        # The claim committed, so did the outcome beside it.
                        return ClaimResult(mine)
                # Else a server error rolled both back (another row holding
                # the slot refuses the claim, say): the outcome goes alone.
            else:
                if reply.held:
                    # The job's row (or its queue's turn) was held: the claim
                    # found the slot still the job's. The outcome goes again, alone.
                    self._write_alone(job, outcome, params)
                else:
                    self._check_written(job, outcome, reply.written)
                return claimed(reply.row)
        self._write_alone(job, outcome, params)
        return None

    def outcome_params(self, job: PendingJob, outcome: Outcome, delay: float) -> dict[str, Any]:
        return {
            "id": job.id,
            "worker_id": self.leases.worker_id,
            "attempts": job.attempts,
            "status": outcome.stored,
            "retry_in": outcome.retry_in,
            # Kept for anything that did not end well or is coming back.
            "last_error": outcome.status
            if outcome.retry_in is not None or st.kind(outcome.status) is st.Kind.ERR
            else None,
            "delay": delay,
            "uncounted": 0 if outcome.counted else 1,
            "last_traceback": outcome.traceback,
        }

    def _write_alone(self, job: PendingJob, outcome: Outcome, params: dict[str, Any]) -> None:
        """The outcome by itself, sent again with backoff while the row may
        still be this claim's: a lost connection, a server that does not
        answer or is read-only for a spell, a row another transaction holds
        each only delay the write.
        Safe to repeat, and safe after the lease lapsed: the update matches
        only while the row is this claim's (not rescued) or already holds this
        very outcome. The tries go on until a lease after the job's own lapses
        (a rescue has had time to take the row by then), the last one at that
        moment. An outcome the server
        refuses (a value it cannot store) is replaced by one saying so, so the
        row still ends."""
        tags = {"queue": self.queue, "job": job.name, "job_id": job.id, "callsite": job.callsite}
        replacements = _replacements(outcome)
        retry = Backoff(base=WRITE_RETRY_BASE, cap=WRITE_RETRY_CAP)
        until = time.monotonic() + 2 * self.leases.lease  # a job the lease keeper does not hold
        said = False
        while True:
            try:
                reply = self.completer.send(params, None)
            except Exception as exc:
                if _refused_value(exc):
                    status = next(replacements, None)
                    if status is not None:
                        log.error("queue=%s id=%d %s (it was %r)", self.queue, job.id, status, outcome.status[:200])
                        capture(exc, message="outcome refused", **tags)
                        params = {**params, "status": status, "last_error": status, "retry_in": None}
                        params["last_traceback"] = None
                        continue
                if (is_server_error(exc) and not is_outage(exc)) or _refused_value(exc):
                    self._give_up(job, f"finalize failed, the row stays started: {exc}", exc, tags)
                    return
                why: BaseException | str = exc
            else:
                if not reply.held:
                    self._check_written(job, outcome, reply.written)
                    return
                why = "its row is held by another transaction"
            held = self.leases.held.get(job.id)
            left = (held.good_until + self.leases.lease if held is not None else until) - time.monotonic()
            if left <= 0:
                self._give_up(job, f"outcome not written within a lease after its own ({why})", None, tags)
                return
            if not said:
                said = True
                first = (str(why).strip().splitlines() or [type(why).__name__])[0]
                log.warning("queue=%s id=%d outcome not written yet, trying again: %s", self.queue, job.id, first)
            # The last try goes at the end of the tries, not a whole backoff before it.
            gevent.sleep(min(retry.failed(), left))

    def _give_up(self, job: PendingJob, why: str, exc: BaseException | None, tags: dict[str, Any]) -> None:
        """The outcome cannot be written: the row stays started, and the rescue
        takes it once its lease lapses."""
        log.error("queue=%s id=%d %s", self.queue, job.id, why)
        if self.outage.failing and (exc is None or is_outage(exc)):
            pass  # the database's outage is why, and its report stands for this one
        elif exc is not None:
            capture(exc, message="finalize job", **tags)
        else:
            capture_message(f"queue={self.queue} id={job.id} {why}", **tags)
        self.claimer.abandoned.add(job.id)

    def _check_written(self, job: PendingJob, outcome: Outcome, written: bool) -> None:
        if not written:
            # The lease ran out (no heartbeat got through) and another worker
            # rescued the row; its outcome stands.
            log.warning(
                "queue=%s id=%d was rescued before it finished; outcome %r dropped", self.queue, job.id, outcome.status
            )


def _replacements(outcome: Outcome) -> Iterator[str]:
    """Statuses to store, in turn, when the server refuses an outcome: one
    that says so, and one no index of the row can refuse (an err: status is
    indexed with the job's name, which may be too long to index)."""
    yield st.err(f"the outcome could not be stored (it was {outcome.status[:100]!r})")
    yield st.fail("the outcome could not be stored, nor an err: status for this row")


def _refused_value(exc: BaseException) -> bool:
    """The outcome itself was refused: a value the driver cannot send (a NUL
    character) or the server cannot store. Not a lost connection."""
    return isinstance(exc, ValueError) or is_data_error(exc)
