"""One queue's poller: the loop that takes each job through the stages in
order: claim (lib/run/steps.py), run and decide the outcome (execute.py),
write it (steps.py again), then pause for the queue's throttle. One job at a
time per slot; a queue has `concurrency` slots (default 1), and the database
holds every process to that."""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import gevent
from gevent.event import Event

from lib.job import PendingJob, Throttle, real_seconds
from lib.job import status as st
from lib.job.rate import limits_key
from lib.job.text import describe
from lib.run.budget import Budgets
from lib.run.execute import Abandon, Decision, Executor, GiveBack, Interrupted, Outcome, decide
from lib.run.queue import Queue
from lib.run.release import Releaser
from lib.run.runtime import Runtime
from lib.run.steps import ClaimResult, Steps
from lib.setup import counters
from lib.setup.error_reports import Outage, capture
from lib.store.db import DB
from lib.store.driver_errors import is_database_error, is_outage, is_server_error
from lib.store.retry_backoff import Backoff

log = logging.getLogger("jobs")

MAX_THROTTLE = 86400.0
# How long a slot holds back after giving a job back to a worker that handles
# its name: its next claim would take the same head row again at once.
LEFT_FOR_ANOTHER_PAUSE = 2.0
FENCED = "queue=%s job=%s id=%d stopped: its lease was lost; no outcome written, a rescue takes it over"


class Worked(NamedTuple):
    """The status a job reached, and what the write that ended it found when
    it also looked for the slot's next job (None: it did not look)."""

    status: str
    found: ClaimResult | None


class Poller:
    """One queue's poller, built once from its definition (lib/run/queue.py)
    on the runtime the worker's pollers share."""

    def __init__(self, queue: Queue, db: DB, runtime: Runtime) -> None:
        self.definition = queue
        self.runtime = runtime
        self.queue = name = queue.name
        self.db = db
        self.dispatch = queue.dispatch
        self.throttle = queue.throttle
        self.job_timeout = queue.job_timeout
        self.poll_interval = min(queue.poll_interval, runtime.poll_interval or queue.poll_interval)
        self.concurrency = concurrency = queue.concurrency
        self.max_attempts = queue.max_attempts
        self.retry_base = queue.retry_base
        self.outage = runtime.outage or Outage(f"queue={name} fetch")
        self.leases = runtime.leases
        # The process's group commit, which this queue's steps go through.
        self.completer = runtime.completer
        self.running: dict[int, PendingJob] = {}
        # A fault of the claim that is not a lost connection, once per run.
        self.claim_fault = Outage(f"queue={name} claim")
        self._wakeups = [Event() for _ in range(concurrency)]
        # The stages: the claim and the outcome's write (steps), and the run.
        budgets = (
            Budgets(name, db, limits_key(name, queue.rate, queue.budgets), queue.budgets) if queue.budgets else None
        )
        self.executor = Executor(queue, db, self.leases, budgets, runtime.known)
        self.releaser = Releaser(name, db, self.leases)
        self.steps = Steps(queue, db, runtime, release=self.releaser.release, outage=self.outage)

    @property
    def handles(self) -> frozenset[str]:
        return self.definition.handles

    def wake(self) -> None:
        """Something was enqueued (or the worker is stopping): look now."""
        for event in self._wakeups:
            event.set()

    def poll(self, stop: Event) -> None:
        """Work due jobs in order until stop is set (every slot; the worker
        runs each slot under its supervisor instead). Each slot runs in a
        greenlet of its own, so that a kill of this one waits out the
        slots' writes (lib/greenlets/kills.py)."""
        slots = [gevent.spawn(self.run_slot, stop, slot) for slot in range(self.concurrency)]
        try:
            gevent.joinall(slots, raise_error=True)
        finally:
            self.runtime.kills.kill(slots)

    def run_slot(self, stop: Event, slot: int) -> None:
        wakeup = self._wakeups[slot]
        retry = Backoff(cap=self.poll_interval)
        # What the last outcome's write found when it looked for the next job:
        # that job, or None and how long until the queue may have work.
        found: ClaimResult | None = None
        failing = False  # the last claim failed: the next one that succeeds says so
        # A job claimed with the last outcome runs even if stop came meanwhile:
        # it is claimed, as if stop had come a moment later.
        while (found is not None and found.job is not None) or not stop.is_set():
            if found is None:
                # Cleared before the claim: a wake that lands after it is not lost.
                wakeup.clear()
                try:
                    found = self.steps.claim(None, slot)
                except Exception as exc:
                    _claim_failed(exc, self.queue, self.outage, self.claim_fault)
                    failing = True
                    # A wakeup (a commit, the listener back, the database's
                    # return: lib/run/recovery.py) cuts the backoff short.
                    gevent.wait([stop, wakeup], timeout=retry.failed(), count=1)
                    continue
                if failing:
                    failing = False
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
            found = self.work(found.job, slot=slot, stop=stop, wakeup=wakeup).found

    def work_once(self, job: PendingJob | None = None, *, slot: int = 0, stop: Event | None = None) -> str | None:
        """Claim (the given job, or the queue's next due one) and work it, as
        the poll loop does; its status, or None when there was nothing to claim."""
        claimed = self.claim(job.id if job else None, slot=slot)
        if claimed is None:
            return None
        return self.work(claimed, slot=slot, stop=stop).status

    def claim(self, job_id: int | None = None, *, slot: int = 0) -> PendingJob | None:
        """The claimed job; None when another worker got there first, the
        queue's slots are all taken, or the queue is paused or throttled."""
        return self.steps.claim(job_id, slot).job

    def run(self, job: PendingJob, *, slot: int = 0, stop: Event | None = None) -> str:
        """Run a claimed job to its outcome; the status it reached."""
        return self.work(job, slot=slot, stop=stop).status

    def work(self, job: PendingJob, *, slot: int = 0, stop: Event | None = None, wakeup: Event | None = None) -> Worked:
        """Take a claimed job through its run and the write of its outcome.
        Given the slot's wakeup (the poll loop) and with no throttle pause
        due, the write also looks for the slot's next job, and says what it found."""
        self.running[slot] = job
        start = time.monotonic()
        try:
            try:
                decision = self.executor.run(job, slot)
            except BaseException:
                # Only the greenlet's own kill (shutdown) gets here: the job is
                # written off as interrupted, and the kill goes on up.
                interrupted = decide(Interrupted(), job.attempts, job.max_attempts)
                self._carry_out(job, slot, interrupted, start, stop, None, interrupted=True)
                raise
            return self._carry_out(job, slot, decision, start, stop, wakeup)
        finally:
            # Whatever failed on the way, a slot that goes no further keeps
            # no row renewed for ever: a rescue can take it back.
            self.running.pop(slot, None)
            if job.id in self.leases.held:
                self.leases.release(job.id)

    def _carry_out(
        self,
        job: PendingJob,
        slot: int,
        decision: Decision,
        start: float,
        stop: Event | None,
        wakeup: Event | None,
        *,
        interrupted: bool = False,
    ) -> Worked:
        match decision:
            case GiveBack():
                self.releaser.give_back(job)
                # In the poll loop this slot then holds back a while, so that it
                # does not take the same head row again at once (on a serial queue
                # nothing behind it runs meanwhile: FIFO holds).
                if wakeup is not None and stop is not None:
                    stop.wait(LEFT_FOR_ANOTHER_PAUSE)
                return Worked(st.PENDING, None)
            case Abandon():
                self.leases.release(job.id)
                self.steps.abandoned.add(job.id)
                log.error(FENCED, self.queue, job.name, job.id)
                return Worked(st.INTERRUPTED, None)
            case Outcome():
                return self._conclude(job, slot, decision, start, stop, wakeup, interrupted=interrupted)
        raise TypeError(f"not a decision: {decision!r}")

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
    ) -> Worked:
        elapsed = time.monotonic() - start
        # Known before the outcome is written, so the write also holds the
        # queue back for every process; a job cut off by shutdown has none.
        delay = 0.0 if interrupted else max(throttle_pause(self.throttle, self.queue, outcome, elapsed), outcome.hold)
        # Whether stop came is asked now, when the job is done, not when it began.
        look = wakeup is not None and delay == 0 and not (stop and stop.is_set())
        if look and wakeup is not None:
            # Cleared before that claim, as in the loop: a wake that lands after it is not lost.
            wakeup.clear()
        try:
            found = self.steps.write(job, outcome, delay, slot if look else None)
        finally:
            self.running.pop(slot, None)
        if interrupted or (stop is not None and stop.is_set()):
            # This poller gives the queue's slot up: a poller of another
            # worker may take it now, not at its next fallback poll.
            self.releaser.hand_over()
        try:
            if log.isEnabledFor(logging.INFO):
                _log_done(self.queue, self.leases.worker_id, job, outcome, elapsed)
            counters.job_done(self.queue, outcome, elapsed)
        except Exception as exc:
            # The outcome is written, and the write may have claimed this
            # slot's next job: that job must not be lost with the slot.
            log.error("queue=%s id=%d outcome written but not logged or counted: %s", self.queue, job.id, describe(exc))
        if delay > 0:
            (stop or Event()).wait(delay)
        return Worked(outcome.status, found)


def throttle_pause(throttle: Throttle | None, queue: str, outcome: Outcome, elapsed: float) -> float:
    """The throttle's pause after this outcome; a throttle that raises or
    answers nonsense is reported and means no pause, never a stuck queue."""
    if throttle is None:
        return 0.0
    try:
        delay = real_seconds(throttle(outcome.status, outcome.error, elapsed), "the throttle's pause")
    except Exception as exc:
        log.error("queue=%s throttle raised, no pause: %s", queue, describe(exc))
        capture(exc, message="throttle", queue=queue)
        return 0.0
    # NaN fails both comparisons: no pause. A day bounds a runaway answer.
    return min(delay, MAX_THROTTLE) if delay > 0 else 0.0


def _log_done(queue: str, worker_id: str, job: PendingJob, outcome: Outcome, elapsed: float) -> None:
    shown = outcome.status if outcome.retry_in is None else f"{outcome.status} (retry in {outcome.retry_in:.0f}s)"
    log.info(
        "queue=%s job=%s id=%d status=%r latency=%.2fs duration=%.2fs",
        queue,
        job.name,
        job.id,
        shown,
        job.latency,
        elapsed,
        # The same fields as keys of their own, for LOG_FORMAT=json (lib/setup/logs.py).
        extra={
            "queue": queue,
            "job": job.name,
            "id": job.id,
            "status": shown,
            "latency": round(job.latency, 3),
            "duration": round(elapsed, 3),
            "worker": worker_id,
        },
    )


def _claim_failed(exc: BaseException, queue: str, outage: Outage, claim_fault: Outage) -> None:
    """The database's outage (a lost connection, a read-only spell) is shared
    by every part of the worker; any other statement the server refused is
    this queue's own fault, reported apart; anything else is a bug, for the
    supervisor to report."""
    if not is_database_error(exc):
        raise exc
    if is_server_error(exc) and not is_outage(exc):
        claim_fault.failed(exc, queue=queue)
    else:
        outage.failed(exc, queue=queue)
