"""One queue's poller: claim a job, run it under a timeout, write its outcome,
then pause for the queue's throttle. One job at a time per slot; a queue has
`concurrency` slots (default 1), and the database holds every process to that.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.pool
from gevent.event import AsyncResult, Event
from greenlet import GreenletExit

from lib.background import worker_registry
from lib.background.leases import LeaseLost, Leases
from lib.greenlets.backoff import BASE_SECONDS as RETRY_BASE_SECONDS
from lib.greenlets.backoff import Backoff, backoff
from lib.greenlets.deadline import Deadline
from lib.greenlets.standby import Standby
from lib.insert import MAX_ARGS_BYTES, check_name
from lib.job import Handler, PendingJob, Snooze, Throttle, real_seconds
from lib.job import status as st
from lib.setup import counters
from lib.setup.errors import (
    Outage,
    capture,
    capture_message,
    configured_secrets,
    describe,
    reporting,
    safe_text,
    traceback_text,
)
from lib.setup.redact import scrub
from lib.store.db import DB, Unsendable, is_data_error, is_database_error, is_server_error, is_unique_violation
from lib.store.group_commit import committer
from lib.store.sql import Q

log = logging.getLogger("jobs")

FINALIZE_TIMEOUT = 30.0
# An outcome that could not be written is sent again after these waits
# (doubling, with jitter), for as long as the job's lease holds.
WRITE_RETRY_BASE = 0.05
WRITE_RETRY_CAP = 1.0
MAX_THROTTLE = 86400.0
# A handler that catches its JobTimeout and goes on is thrown another this
# often, until its block ends.
TIMEOUT_AGAIN_EVERY = 0.5
# How long a slot holds back after giving a job back to a worker that handles
# its name: its next claim would take the same head row again at once.
LEFT_FOR_ANOTHER_PAUSE = 2.0

# Outcome writes run in greenlets of their own, so that killing a poller at the
# end of the shutdown window cannot cut a write in half; the worker waits for
# this group before it exits.
FINALIZING = gevent.pool.Group()


class _Writes:
    """One slot's outcome writes, each run in the slot's writer greenlet (in
    FINALIZING), which stays for the slot's next job while it is busy."""

    def __init__(self) -> None:
        self._queue: list[tuple[Callable[..., Any], tuple[Any, ...], AsyncResult]] = []
        self.writer = Standby(self._run, lambda: bool(self._queue), FINALIZING)

    def submit(self, write: Callable[..., Any], *args: Any) -> AsyncResult:
        """write(*args) in the writer greenlet; its answer, or what it raised."""
        done = AsyncResult()
        self._queue.append((write, args, done))
        self.writer.ask()
        return done

    def _run(self) -> None:
        while self._queue:
            write, args, done = self._queue.pop(0)
            try:
                done.set(write(*args))
            except BaseException as exc:
                done.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise  # the writer itself was killed (the process is ending)


class JobTimeout(BaseException):
    """The handler ran past the queue's job timeout. A BaseException, as the
    lease fence's LeaseLost is, so a handler's `except Exception` retry loop
    does not take it for one more fault to retry."""


class UnknownJob(Exception):
    """No handler of this queue has the job's name."""


class BadStatus(Exception):
    """The handler returned something that is not an ok/fail/skip status."""


class BadArgs(Exception):
    """The job's stored args cannot be read; no handler could use them."""


# Never a job's fault: the worker's own kill at shutdown, the process ending.
_NOT_THE_JOBS = (GreenletExit, KeyboardInterrupt, SystemExit)


@dataclass(frozen=True)
class ClaimResult:
    """What a claim found: a job, or None and the seconds until the queue may
    have work (None: nothing known)."""

    job: PendingJob | None
    wait: float | None = None


@dataclass(frozen=True)
class Outcome:
    status: str  # what the job reached, as the log and the throttle see it
    error: BaseException | None = None
    retry_in: float | None = None  # seconds until the retry, when one is due
    counted: bool = True  # whether this attempt counts against max_attempts
    traceback: str | None = None  # the error's, bounded (lib.setup.errors.traceback_text)

    @property
    def stored(self) -> str:
        return st.PENDING if self.retry_in is not None else self.status


class Poller:
    def __init__(
        self,
        queue: str,
        db: DB,
        dispatch: Mapping[str, Handler],
        *,
        throttle: Throttle | None = None,
        job_timeout: float = 600.0,
        # Only a fallback: LISTEN/NOTIFY wakes a poller, and an idle one sleeps
        # to its queue's next delayed row or to the end of a pause or throttle.
        poll_interval: float = 120.0,
        concurrency: int = 1,
        max_attempts: int = 1,
        outage: Outage | None = None,
        disabled_reason: str | None = None,
        dedupe: frozenset[str] | set[str] = frozenset(),
        retry_base: float = RETRY_BASE_SECONDS,
    ) -> None:
        # A bad configuration fails when the worker starts, not at the first job.
        check_name("queue", queue)
        if not dispatch or not all(callable(h) for h in dispatch.values()):
            raise ValueError(f"queue {queue}: dispatch must map job names to handlers")
        for name in dispatch:
            check_name(f"queue {queue}: job name", name)
        if job_timeout <= 0 or poll_interval <= 0:
            raise ValueError(f"queue {queue}: job_timeout and poll_interval must be positive")
        if retry_base <= 0:
            raise ValueError(f"queue {queue}: retry_base must be positive")
        if concurrency < 1 or max_attempts < 1:
            raise ValueError(f"queue {queue}: concurrency and max_attempts must be at least 1")
        if throttle is not None and not callable(throttle):
            raise ValueError(f"queue {queue}: throttle must be callable")
        if not set(dedupe) <= set(dispatch):
            raise ValueError(f"queue {queue}: dedupe names jobs it does not handle: {set(dedupe) - set(dispatch)}")
        self.queue = queue
        self.db = db
        self.dispatch = dict(dispatch)
        self.throttle = throttle
        self.job_timeout = job_timeout
        self.poll_interval = poll_interval
        self.concurrency = concurrency
        self.max_attempts = max_attempts
        self.retry_base = retry_base
        self.outage = outage or Outage(f"queue={queue} fetch")
        # Why this queue must not run in this process (say, its API token is
        # not configured); the worker says so once and leaves it alone.
        self.disabled_reason = disabled_reason
        # Job names that refuse a second pending or started copy with the same args.
        self.dedupe = frozenset(dedupe)
        # The worker shares one Leases (its worker id, lease length, renewal
        # and fence) between all its pollers; this default serves tests.
        self.leases = Leases(db)
        # Outcomes and claims go to the server in the process's group commit.
        self.commit = committer(db)
        self.running: dict[int, PendingJob] = {}
        # The job each slot's handler is running now, and the greenlet it runs
        # in: only that handler may be fenced.
        self._dispatching: dict[int, tuple[PendingJob, Any]] = {}
        # Per slot, a claim whose reply was lost: what it did is settled
        # before the slot claims again.
        self._unsettled: dict[int, BaseException] = {}
        self._writes = [_Writes() for _ in range(concurrency)]
        # Rows this poller gave up on while they were still started by it
        # (outcome not written, or fenced): never mistaken for a new claim.
        self._abandoned: set[int] = set()
        # A fault of the claim that is not a lost connection, once per run.
        self.claim_fault = Outage(f"queue={queue} claim")
        self._wakeups = [Event() for _ in range(concurrency)]
        # Each slot's limit on its handler, restarted for every job.
        self._deadlines: dict[int, Deadline] = {}
        # Job names given back to the workers that handle them, said once each.
        self._left_names: set[str] = set()

    @property
    def worker_id(self) -> str:
        return self.leases.worker_id

    @worker_id.setter
    def worker_id(self, value: str) -> None:
        self.leases.worker_id = value

    @property
    def lease(self) -> float:
        return self.leases.lease

    @lease.setter
    def lease(self, value: float) -> None:
        self.leases.lease = value

    @property
    def handles(self) -> frozenset[str]:
        return frozenset(self.dispatch)

    def wake(self) -> None:
        """Something was enqueued (or the worker is stopping): look now."""
        for event in self._wakeups:
            event.set()

    def poll(self, stop: Event) -> None:
        """Work due jobs in order until stop is set (every slot; the worker
        runs each slot under its supervisor instead)."""
        if self.concurrency == 1:
            self.run_slot(stop, 0)
            return
        slots = [gevent.spawn(self.run_slot, stop, slot) for slot in range(self.concurrency)]
        try:
            gevent.joinall(slots, raise_error=True)
        finally:
            gevent.killall(slots)

    def run_slot(self, stop: Event, slot: int) -> None:
        try:
            self._run_slot(stop, slot)
        finally:
            # Its last write goes on; the writer ends after it, not a moment later.
            self._writes[slot].writer.close()

    def _run_slot(self, stop: Event, slot: int) -> None:
        wakeup = self._wakeups[slot]
        retry = Backoff(cap=self.poll_interval)
        # What the last outcome's write found when it looked for the next job:
        # that job, or None and how long until the queue may have work.
        found: ClaimResult | None = None
        # A job claimed with the last outcome runs even if stop came meanwhile:
        # it is claimed, as if stop had come a moment later.
        while (found is not None and found.job is not None) or not stop.is_set():
            if found is None:
                # Cleared before the claim: a wake that lands after it is not lost.
                wakeup.clear()
                try:
                    found = ClaimResult(*self._claim(None, slot))
                except Exception as exc:
                    self._claim_failed(exc)
                    stop.wait(retry.failed())
                    continue
                self.outage.recovered()
                self.claim_fault.recovered()
                retry.succeeded()
            if found.job is None:
                # The queue's next delayed row, or the end of its pause or
                # throttle, when that comes before the fallback poll. The
                # fallback polls of all queues fall on the same instants, so
                # an idle worker's go to the server as one batch.
                wait = found.wait
                fallback = self.poll_interval - time.monotonic() % self.poll_interval
                timeout = fallback if wait is None or wait <= 0 else min(wait, fallback)
                gevent.wait([stop, wakeup], timeout=timeout, count=1)
                found = None
                continue
            _, found = self._work(found.job, slot, stop, wakeup)

    def _claim_failed(self, exc: BaseException) -> None:
        """A lost connection is the database's outage, shared by every part of
        the worker; a statement the server refused is this queue's own fault,
        reported apart; anything else is a bug, for the supervisor to report."""
        if not is_database_error(exc):
            raise exc
        if is_server_error(exc):
            self.claim_fault.failed(exc, queue=self.queue)
        else:
            self.outage.failed(exc, queue=self.queue)

    def work_once(self, job: PendingJob | None = None, *, slot: int = 0, stop: Event | None = None) -> str | None:
        """Claim (the given job, or the queue's next due one), run and finalize it;
        its status, or None when there was nothing to claim."""
        claimed = self.claim(job.id if job else None, slot=slot)
        if claimed is None:
            return None
        return self.run(claimed, slot=slot, stop=stop)

    def claim(self, job_id: int | None = None, *, slot: int = 0) -> PendingJob | None:
        """One conditional statement; None is the ordinary answer when another
        worker got there first, the queue's slots are all taken, or the queue
        is paused or throttled."""
        return self._claim(job_id, slot)[0]

    def _claim_params(self, job_id: int | None, slot: int) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "id": job_id,
            "slot": slot,
            "worker_id": self.worker_id,
            "lease": self.lease,
            "max_attempts": self.max_attempts,
        }

    def _claim(self, job_id: int | None, slot: int) -> tuple[PendingJob | None, float | None]:
        """The claimed job, or None and the seconds until the queue may have
        work (None: nothing known)."""
        if slot in self._unsettled:
            # A claim of this slot whose reply was lost may have committed:
            # that job is this slot's to run, before any other.
            mine = self._settle(slot, self._unsettled[slot])
            if mine is not None:
                return mine, None
        while True:
            try:
                row = self.commit.send(None, self._claim_params(job_id, slot)).row
            except Exception as exc:
                if is_unique_violation(exc):
                    return None, None
                if is_data_error(exc) and self._end_unclaimable(slot, exc):
                    continue
                if not is_server_error(exc):
                    self._unsettled[slot] = exc
                    mine = self._settle(slot, exc)
                    if mine is not None:
                        return mine, None
                raise
            return _claimed(row)

    def _settle(self, slot: int, exc: BaseException) -> PendingJob | None:
        """After a write that may have claimed a job for this slot failed
        without an answer: make its outcome final, then read the row. The job
        it claimed, or None when it claimed nothing. Raises (and stays
        unsettled) while the server cannot be asked."""
        self.db.settle(exc)
        # Not a job this worker runs or finalizes now (the write that failed
        # may have been that job's outcome), nor one it gave up on.
        known = sorted(self._abandoned | set(self.leases.held))
        params = {"queue": self.queue, "slot": slot, "worker_id": self.worker_id, "known": known}
        row = self.db.query_row(Q.job_claimed_by, params)
        self._unsettled.pop(slot, None)
        job, _ = _claimed(row)
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
                tx.query_row(Q.job_claim, self._claim_params(head[0], slot))
                # Claimable: the fault lies elsewhere. Roll back.
                raise _Probe
        except _Probe:
            return False
        except Exception as probe:
            if not is_data_error(probe):
                return False
        status = st.err(f"cannot be claimed: {_first_line(exc)}")
        if not self.db.exec(Q.job_end_unclaimable, {"id": head[0], "status": status}):
            return False
        log.error("queue=%s id=%d ended: %s", self.queue, head[0], status)
        capture(exc, message="job cannot be claimed", queue=self.queue, job_id=head[0])
        return True

    def run(self, job: PendingJob, *, slot: int = 0, stop: Event | None = None) -> str:
        """Run a claimed job to its outcome; the status it reached."""
        return self._work(job, slot, stop, None)[0]

    def _work(
        self, job: PendingJob, slot: int, stop: Event | None, wakeup: Event | None
    ) -> tuple[str, ClaimResult | None]:
        """Run a claimed job and write its outcome. Given the slot's wakeup (the
        poll loop) and with no throttle pause due, the write also looks for the
        slot's next job, and says what it found."""
        if self._left_for_another(job, stop, wakeup):
            return st.PENDING, None
        self.running[slot] = job
        self.leases.hold(job.id, job.claimed_at or time.monotonic(), lambda: self._fence(slot, job))
        start = time.monotonic()
        try:
            try:
                result = self._dispatch(job, slot)
            except BaseException:
                # Only the greenlet's own kill (shutdown) gets here: the job is
                # written off as interrupted, and the kill goes on up.
                self._conclude(job, slot, self._interrupted(job), start, stop, None, interrupted=True)
                raise
            if isinstance(result, LeaseLost):
                return self._fenced(job, slot)
            return self._conclude(job, slot, self._recorded(job, result), start, stop, wakeup)
        finally:
            # Whatever failed on the way, a slot that goes no further keeps
            # no row renewed for ever: a rescue can take it back.
            self.running.pop(slot, None)
            self.leases.release(job.id)

    def _left_for_another(self, job: PendingJob, stop: Event | None, wakeup: Event | None) -> bool:
        """A job of a name this worker does not handle and a live worker does
        (one of a newer release, during a rolling upgrade): given back, the
        attempt not counted, for that worker to claim; in the poll loop this
        slot then holds back a while, so that it does not take the same head
        row again at once (on a serial queue nothing behind it runs meanwhile:
        FIFO holds). False when no live worker handles the name, or that
        cannot be learnt: the job ends as an unknown job, and a typo never
        stalls its queue."""
        if job.name in self.dispatch or not self._handled_elsewhere(job):
            return False
        self._give_back(job)
        if wakeup is not None and stop is not None:
            stop.wait(LEFT_FOR_ANOTHER_PAUSE)
        return True

    def _handled_elsewhere(self, job: PendingJob) -> bool:
        try:
            return worker_registry.handled_elsewhere(self.db, self.queue, job.name)
        except Exception as exc:
            if not is_database_error(exc):
                raise
            log.warning("queue=%s id=%d cannot learn whether a worker handles it: %s", self.queue, job.id, exc)
            return False

    def _give_back(self, job: PendingJob) -> None:
        if job.name not in self._left_names:
            self._left_names.add(job.name)
            log.info("queue=%s job=%s is left to the workers that handle it (this one does not)", self.queue, job.name)
        try:
            self.db.exec(Q.job_release, {"id": job.id, "worker_id": self.worker_id, "attempts": job.attempts})
        except Exception as exc:
            if not is_database_error(exc):
                raise
            # The lease runs out and the rescue takes the row back instead.
            log.warning("queue=%s id=%d not given back: %s", self.queue, job.id, exc)
            return
        # A worker that handles it may be idle until its fallback poll.
        self._hand_over()

    def _conclude(
        self,
        job: PendingJob,
        slot: int,
        outcome: Outcome,
        start: float,
        stop: Event | None,
        wakeup: Event | None,
        *,
        interrupted: bool = False,
    ) -> tuple[str, ClaimResult | None]:
        elapsed = time.monotonic() - start
        # Known before the outcome is written, so the write also holds the
        # queue back for every process; a job cut off by shutdown has none.
        delay = 0.0 if interrupted else self._delay(outcome, elapsed)
        # Whether stop came is asked now, when the job is done, not when it began.
        look = wakeup is not None and delay == 0 and not (stop and stop.is_set())
        if look and wakeup is not None:
            # Cleared before that claim, as in the loop: a wake that lands after it is not lost.
            wakeup.clear()
        try:
            found = self._finalize(job, slot, outcome, delay, slot if look else None)
        finally:
            # Held (renewed, and never rescued by this worker) until the
            # outcome is written or given up on.
            self.running.pop(slot, None)
            self.leases.release(job.id)
        if interrupted or (stop is not None and stop.is_set()):
            # This poller gives the queue's slot up: a poller of another
            # worker may take it now, not at its next fallback poll.
            self._hand_over()
        try:
            if log.isEnabledFor(logging.INFO):
                self._log_done(job, outcome, elapsed)
            counters.job_done(self.queue, outcome, elapsed)
        except Exception as exc:
            # The outcome is written, and the write may have claimed this
            # slot's next job: that job must not be lost with the slot.
            log.error("queue=%s id=%d outcome written but not logged or counted: %s", self.queue, job.id, describe(exc))
        if delay > 0:
            (stop or Event()).wait(delay)
        return outcome.status, found

    def _log_done(self, job: PendingJob, outcome: Outcome, elapsed: float) -> None:
        shown = outcome.status if outcome.retry_in is None else f"{outcome.status} (retry in {outcome.retry_in:.0f}s)"
        log.info(
            "queue=%s job=%s id=%d status=%r latency=%.2fs duration=%.2fs",
            self.queue,
            job.name,
            job.id,
            shown,
            job.latency,
            elapsed,
            # The same fields as keys of their own, for LOG_FORMAT=json (lib/setup/logs.py).
            extra={
                "queue": self.queue,
                "job": job.name,
                "id": job.id,
                "status": shown,
                "latency": round(job.latency, 3),
                "duration": round(elapsed, 3),
                "worker": self.leases.worker_id,
            },
        )

    def _fence(self, slot: int, job: PendingJob) -> None:
        """Stop this job's handler: its lease could not be renewed in time.
        Thrown from the hub, where the check and the throw cannot be split by
        a switch: a handler that has just returned is left alone (its outcome
        write only lands if the row is still this worker's)."""

        def throw() -> None:
            running = self._dispatching.get(slot)
            if running is not None and running[0] is job:
                running[1].throw(LeaseLost(f"lease of job {job.id} not renewed in time"))

        gevent.get_hub().loop.run_callback(throw)

    def _fenced(self, job: PendingJob, slot: int) -> tuple[str, ClaimResult | None]:
        self.running.pop(slot, None)
        self.leases.release(job.id)
        self._abandoned.add(job.id)
        log.error(
            "queue=%s job=%s id=%d stopped: its lease was lost; no outcome written, a rescue takes it over",
            self.queue,
            job.name,
            job.id,
        )
        return st.INTERRUPTED, None

    def _dispatch(self, job: PendingJob, slot: int = 0) -> str | BaseException:
        """The handler's status, or the exception that stands for its fault."""
        if job.args_error is not None:
            return BadArgs(job.args_error)
        handler = self.dispatch.get(job.name)
        if handler is None:
            return UnknownJob(f"unknown job {job.name!r} for queue {self.queue}")
        self._dispatching[slot] = (job, gevent.getcurrent())
        deadline = self._deadlines.get(slot)
        if deadline is None:
            deadline = self._deadlines[slot] = Deadline(
                self.job_timeout, self._timed_out, again_every=TIMEOUT_AGAIN_EVERY
            )
        try:
            with deadline:
                result = handler(job)
        except _NOT_THE_JOBS:
            raise
        except BaseException as exc:  # a gevent.Timeout of its own and any other BaseException are the job's fault
            if deadline.expired is None or isinstance(exc, JobTimeout | LeaseLost):
                return exc
            # Whatever it raised once its time was up, the timeout ended it.
            return deadline.expired
        finally:
            self._dispatching.pop(slot, None)
        if deadline.expired is not None:
            # It caught its timeout and returned: the job still ran out of time.
            return deadline.expired
        if not isinstance(result, str):
            return BadStatus(f"handler returned {type(result).__name__}, not a status string")
        # A plain str from here (a subclass's own methods are not called), one
        # that Postgres can store: no NUL, no lone surrogate.
        result = safe_text(result)
        try:
            kind = st.kind(result)
        except ValueError:
            return BadStatus(f"handler returned {result!r:.100}, not a status")
        if kind not in (st.Kind.OK, st.Kind.FAIL, st.Kind.SKIP):
            # A fault recorded without an exception would reach nobody.
            return BadStatus(f"handler returned {result!r:.100}; a fault must be raised")
        return st.clean(result)

    def _timed_out(self) -> JobTimeout:
        return JobTimeout(f"timed out after {self.job_timeout:g}s")

    def _recorded(self, job: PendingJob, result: str | BaseException) -> Outcome:
        """The outcome of the handler's result; when making it fails (a bug),
        one saying so, so the job still ends."""
        try:
            return self._outcome(job, result)
        except Exception as exc:
            status = st.err(
                f"the worker could not record this job's outcome: {scrub(describe(exc), configured_secrets())}"
            )
            log.error("queue=%s job=%s id=%d %s", self.queue, job.name, job.id, status, exc_info=True)
            capture(exc, message="outcome not recorded", queue=self.queue, job=job.name, job_id=job.id)
            return Outcome(status, exc, traceback=traceback_text(exc))

    def _outcome(self, job: PendingJob, result: str | BaseException) -> Outcome:
        if isinstance(result, str):
            return Outcome(result)
        if isinstance(result, Snooze):
            return Outcome(st.clean(result.status), retry_in=result.seconds, counted=False)
        capture(result, queue=self.queue, job=job.name, job_id=job.id, callsite=job.callsite)
        # Stored in the row, which must hold no secret, whatever the message quotes.
        text = st.err(scrub(describe(result), configured_secrets()))
        # An error marked final (OutcomeUnknown: a second try could do the
        # work twice) ends the job though attempts remain.
        retry = job.attempts < job.max_attempts and not getattr(result, "final", False)
        retry_in = backoff(job.attempts, base=self.retry_base) if retry else None
        if not reporting():
            # Without Sentry the log is the one place an operator finds where it failed.
            exc_info = (type(result), result, result.__traceback__)
            log.error("queue=%s job=%s id=%d raised %s", self.queue, job.name, job.id, text, exc_info=exc_info)
        return Outcome(text, result, retry_in, traceback=traceback_text(result))

    def _interrupted(self, job: PendingJob) -> Outcome:
        # Like a rescue: another worker takes the job over when attempts
        # remain, in its place in the queue (retry_in 0 keeps run_at).
        return Outcome(st.INTERRUPTED, retry_in=0.0 if job.attempts < job.max_attempts else None)

    def _finalize(
        self, job: PendingJob, slot: int, outcome: Outcome, delay: float, next_slot: int | None
    ) -> ClaimResult | None:
        written = self._writes[slot].submit(self._write_outcome, job, outcome, delay, next_slot)
        try:
            return written.get()
        except BaseException:
            # Killed while the write was under way (the shutdown window
            # closed): let it land, and give back a job it claimed, which
            # will now never run here.
            written.wait(FINALIZE_TIMEOUT)
            if written.successful() and written.value is not None and written.value.job is not None:
                self._release(written.value.job)
            raise

    def _write_outcome(
        self, job: PendingJob, outcome: Outcome, delay: float, next_slot: int | None
    ) -> ClaimResult | None:
        """One update by primary key; with next_slot, sent together with the
        claim of that slot's next job (one round trip, one commit). When that
        fails, what committed is settled first (the claim may have), and the
        outcome goes alone unless it went with the claim. What the claim sent
        with it found, if it went."""
        params = self._outcome_params(job, outcome, delay)
        if next_slot is not None:
            try:
                reply = self.commit.send(params, self._claim_params(None, next_slot))
            except Exception as exc:
                log.debug("queue=%s id=%d outcome and next claim together failed: %s", self.queue, job.id, exc)
                # Unsendable: nothing was sent.
                if not is_server_error(exc) and not isinstance(exc, Unsendable):
                    # No answer: the server may have committed both, or may
                    # still, unless its process is ended first.
                    self._unsettled[next_slot] = exc
                    mine = self._try_settle(next_slot, exc)
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
                return ClaimResult(*_claimed(reply.row))
        self._write_alone(job, outcome, params)
        return None

    def _try_settle(self, slot: int, exc: BaseException) -> PendingJob | None:
        try:
            return self._settle(slot, exc)
        except Exception as settle_exc:
            # Left unsettled: the slot settles before its next claim.
            log.warning("queue=%s could not yet learn what a lost write committed: %s", self.queue, settle_exc)
            return None

    def _outcome_params(self, job: PendingJob, outcome: Outcome, delay: float) -> dict[str, Any]:
        return {
            "id": job.id,
            "worker_id": self.worker_id,
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
        answer, a row another transaction holds each only delay the write.
        Safe to repeat, and safe after the lease lapsed: the update matches
        only while the row is this claim's (not rescued) or already holds this
        very outcome. The tries end a lease after the job's own would lapse,
        when a rescue has had time to take the row. An outcome the server
        refuses (a value it cannot store) is replaced by one saying so, so the
        row still ends."""
        tags = {"queue": self.queue, "job": job.name, "job_id": job.id, "callsite": job.callsite}
        replacements = _replacements(outcome)
        retry = Backoff(base=WRITE_RETRY_BASE, cap=WRITE_RETRY_CAP)
        until = time.monotonic() + 2 * self.lease  # a job the lease keeper does not hold
        said = False
        while True:
            try:
                reply = self.commit.send(params, None)
            except Exception as exc:
                if _refused_value(exc):
                    status = next(replacements, None)
                    if status is not None:
                        log.error("queue=%s id=%d %s (it was %r)", self.queue, job.id, status, outcome.status[:200])
                        capture(exc, message="outcome refused", **tags)
                        params = {**params, "status": status, "last_error": status, "retry_in": None}
                        params["last_traceback"] = None
                        continue
                if is_server_error(exc) or _refused_value(exc):
                    self._give_up(job, f"finalize failed, the row stays started: {exc}", exc, tags)
                    return
                why: BaseException | str = exc
            else:
                if not reply.held:
                    self._check_written(job, outcome, reply.written)
                    return
                why = "its row is held by another transaction"
            wait = retry.failed()
            held = self.leases.held.get(job.id)
            if time.monotonic() + wait >= (held.good_until + self.lease if held is not None else until):
                self._give_up(job, f"outcome not written within a lease after its own ({why})", None, tags)
                return
            if not said:
                said = True
                log.warning("queue=%s id=%d outcome not written yet, trying again: %s", self.queue, job.id, why)
            gevent.sleep(wait)

    def _give_up(self, job: PendingJob, why: str, exc: BaseException | None, tags: dict[str, Any]) -> None:
        """The outcome cannot be written: the row stays started, and the rescue
        takes it once its lease lapses."""
        log.error("queue=%s id=%d %s", self.queue, job.id, why)
        if exc is not None:
            capture(exc, message="finalize job", **tags)
        else:
            capture_message(f"queue={self.queue} id={job.id} {why}", **tags)
        self._abandoned.add(job.id)

    def _check_written(self, job: PendingJob, outcome: Outcome, written: bool) -> None:
        if not written:
            # The lease ran out (no heartbeat got through) and another worker
            # rescued the row; its outcome stands.
            log.warning(
                "queue=%s id=%d was rescued before it finished; outcome %r dropped", self.queue, job.id, outcome.status
            )

    def _hand_over(self) -> None:
        try:
            self.db.exec(Q.queue_notify, {"queue": self.queue})
        except Exception as exc:
            log.info("queue=%s could not tell other workers it is free: %s", self.queue, exc)

    def _release(self, job: PendingJob) -> None:
        try:
            self.db.exec(Q.job_release, {"id": job.id, "worker_id": self.worker_id, "attempts": job.attempts})
        except Exception as exc:
            # The lease runs out and the rescue takes the row back instead.
            log.warning("queue=%s id=%d claimed at shutdown, not given back: %s", self.queue, job.id, exc)

    def _delay(self, outcome: Outcome, elapsed: float) -> float:
        """The throttle's pause after this outcome; a throttle that raises or
        answers nonsense is reported and means no pause, never a stuck queue."""
        if self.throttle is None:
            return 0.0
        try:
            delay = real_seconds(self.throttle(outcome.status, outcome.error, elapsed), "the throttle's pause")
        except Exception as exc:
            log.error("queue=%s throttle raised, no pause: %s", self.queue, describe(exc))
            capture(exc, message="throttle", queue=self.queue)
            return 0.0
        # NaN fails both comparisons: no pause. A day bounds a runaway answer.
        return min(delay, MAX_THROTTLE) if delay > 0 else 0.0


class _Probe(Exception):
    """Rolls back a claim made only to see whether it fails."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


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


def _claimed(row: tuple[Any, ...] | None) -> tuple[PendingJob | None, float | None]:
    """A job_claim row as (job, None), or (None, seconds until the queue may have work)."""
    if row is None:
        return None, None
    job_id, name, args_text, attempts, max_attempts, callsite, latency, wait, _slot = row
    if job_id is None:
        return None, wait
    args, args_error = _decode_args(args_text)
    return (
        PendingJob(job_id, name, args, attempts, max_attempts, callsite, latency, time.monotonic(), args_error),
        None,
    )


def _decode_args(text: str | None) -> tuple[Any, str | None]:
    """The args as the handler gets them, or why they cannot be read. Decoded
    here, after the claim committed, so a row whose args cannot be read ends
    with the reason instead of failing every claim of its queue."""
    if text is None:
        return None, "args are NULL"
    size = len(text.encode())
    if size > MAX_ARGS_BYTES:
        return None, f"args are {size} bytes as JSON; the limit is {MAX_ARGS_BYTES}"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, f"args cannot be decoded: {type(exc).__name__}: {_first_line(exc)}"
