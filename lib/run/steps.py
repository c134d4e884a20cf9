"""The step client: how a queue's claims and outcomes reach the server. A
slot's claim, a job's outcome, or both in one ask; the asks of every poller
of a process go together, one round trip and one transaction for all that
is ready at about the same moment (the group commit).

A lone ask on an idle worker goes on the hub's next turn: there is no window
to wait for company, and the asks made in this turn go together (a queue's
slots, starting at once, claim in one statement). The sender sends it, and
stays a moment for the next batch. While one batch is on its way, the asks
that arrive meanwhile wait for it and then go together, so under load a
batch grows by itself; with none on its way, SEND_AT asks of one queue go at
once from the writer whose outcome makes them that many. When batches carry
one ask each (a serial queue, an idle worker), a job's outcome goes at once
from the greenlet that asked, without the hop to the sender and back:
outcomes come one at a time as jobs end, not in a burst of one turn. A
batch of one goes as jobs_step_one, each field a plain value: the same rules
for one ask, the functions both call (sql/rules/rules.sql).

One batch is on its way at a time (a second beside it would meet the first
on the same queue's turn and be told to come back later), on a connection
the pool keeps for it (DB.reserved), so handlers' own queries can never take
the connection an outcome needs.

Over 400 lines: the claim, the outcome's write and the batch they travel in
are one concern, what a slot asks of the server and what the answer means.
Apart, a job's walk entered each of them once for the claim and again for
the outcome; here a claim is one call into this module and a write another.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import gevent
from gevent.event import AsyncResult, Event

from lib.insert import MAX_ARGS_BYTES, insert_many, oversize
from lib.job import PendingJob
from lib.job import status as st
from lib.run import traces
from lib.run.execute import Outcome
from lib.run.job_steps import StepStore
from lib.run.queue import Queue
from lib.setup.error_reports import Outage, capture, capture_message
from lib.store.binding import Row, array_text
from lib.store.db import DB
from lib.store.driver_errors import (
    NoReply,
    Unsendable,
    is_data_error,
    is_outage,
    is_server_error,
    is_unique_violation,
)
from lib.store.retry_backoff import Backoff
from lib.store.sql import Q

if TYPE_CHECKING:
    from lib.run.runtime import Runtime  # which holds this module's Committer

log = logging.getLogger("jobs.commit")
job_log = logging.getLogger("jobs")

# The first key of every queue's turn, pg_try_advisory_xact_lock(key,
# hashtext(queue)): the key jobs_queue_turn (sql/rules/rules.sql) takes.
QUEUE_TURN_KEY = 1785684595

# Asks of one queue that make a batch worth sending at once, not on the
# sender's turn: under load a queue's slots then settle into two batches that
# take turns, one at the server while the other's jobs run (at 64 slots, one
# batch of all of them leaves the worker idle while the server works, and the
# other way round). Its slots' claims share one read of the queue, so the
# server's part of a job is about the worker's, and overlapping them pays.
# Asks of many queues claim each its own way, the server's part is the
# larger, and they go together on the sender's turn: a second statement a
# turn costs them more than the overlap gives.
SEND_AT = 16

# Seconds a batch may take before it counts as unanswered (the server or the
# way to it hangs); its outcome is then settled like a lost connection's.
TIMEOUT = 30.0

# Seconds the sender waits for the next ask before it ends. Starting a
# greenlet costs more than the switch to one that waits (each new greenlet
# maps a fresh frame stack and unmaps it when it ends): a busy worker asks
# the sender every batch, an idle one lets it end.
LINGER = 1.0

# An outcome that could not be written is sent again after these waits
# (doubling, with jitter), for as long as the job's lease holds.
WRITE_RETRY_BASE = 0.05
WRITE_RETRY_CAP = 1.0

# jsonb prints a float Python wrote as 5e-324 in 326 characters, the most it
# widens any args: a printed text longer than this is over the limit by any
# measure, and is refused undecoded.
PRINTED_CEILING = 64 * MAX_ARGS_BYTES


@dataclass(frozen=True)
class Reply:
    written: bool  # whether the outcome sent was written (False also when none was sent)
    row: Row | None  # the claim's answer in job_claim's columns; None when no claim was sent
    # The outcome is still this claim's but was not written: another transaction
    # holds its row, or its queue's turn. The asker sends it again.
    held: bool = False


@dataclass
class Ask:
    outcome: dict[str, Any] | None  # the fields of _OUTCOME, by their short names
    claim: dict[str, Any] | None  # job_claim's parameters
    reply: AsyncResult = field(default_factory=AsyncResult)


class ClaimResult(NamedTuple):
    """What a claim found: a job, or None and the seconds until the queue may
    have work (None: nothing known)."""

    job: PendingJob | None
    wait: float | None = None


class _Undone(Exception):
    """Rolls back an outcome's transaction whose update did not land."""

    def __init__(self, reply: Reply) -> None:
        super().__init__("the outcome was not written")
        self.reply = reply


class RollbackProbe(Exception):
    """Rolls back a claim made only to see whether it fails."""


class _Sender:
    """The greenlet that sends what waits, each time it is asked, and stays
    LINGER seconds for the next ask instead of ending."""

    def __init__(self, work: Callable[[], None], pending: Callable[[], bool]) -> None:
        self._work = work
        self._pending = pending
        self._greenlet: gevent.Greenlet | None = None
        self._asked = Event()
        # The linger: one libev timer, made at first use on the hub that runs
        # the sender and restarted for each wait, that ends the wait as an ask would.
        self._linger: Any = None
        self._linger_for = 0.0

    def ask(self) -> None:
        """Have work() run on the hub's next turn (asks made in this one share the run)."""
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)
        else:
            self._asked.set()

    def _run(self) -> None:
        while True:
            self._work()
            self._asked.clear()
            linger = self._linger
            if linger is None or self._linger_for != LINGER:
                # Repeating, as libev's again needs: stopped once the wait ends.
                linger = self._linger = gevent.get_hub().loop.timer(LINGER, LINGER)
                self._linger_for = LINGER
            linger.again(self._asked.set)
            self._asked.wait()
            linger.stop()
            # No switch between this last look and the greenlet's end, so an
            # ask is never left with no greenlet to do it.
            if not self._pending():
                return


class Committer:
    def __init__(self, db: DB, timeout: float = TIMEOUT) -> None:
        self.db = db
        self.timeout = timeout
        self._asks: list[Ask] = []
        self._of_queue: Counter[str | None] = Counter()  # the asks waiting, by the queue they claim for
        self._in_flight = False  # a batch is on its way
        self._alone = True  # the last batch carried one ask: the next outcome may go at once
        # The sender: it stays a moment for the next batch (a busy worker
        # sends one every job), and sends on the hub's next turn, so asks
        # made in this one go together.
        self._sender = _Sender(self._drain, lambda: bool(self._asks))
        self.batches = 0  # round trips sent, and the asks they carried (/metrics)
        self.asks = 0

    def send(self, outcome: dict[str, Any] | None, claim: dict[str, Any] | None) -> Reply:
        """Write an outcome (the fields of _OUTCOME) and/or claim (job_claim's parameters),
        in the next batch; raises what the batch raised."""
        ask = Ask(outcome, claim)
        if outcome is None or self._in_flight or self._asks or not self._alone:
            queue = None if claim is None else claim["queue"]
            self._asks.append(ask)
            self._of_queue[queue] += 1
            if self._in_flight:
                pass  # the batch on its way asks the sender once it is back
            elif outcome is not None and self._of_queue[queue] >= SEND_AT:
                # Enough for a batch: it goes now, while the slots still
                # running make the next one, so the server works on one
                # batch while the worker runs the jobs of the other. Only
                # an outcome's writer sends for others: the shutdown's kill
                # waits for a poller's outcome write (lib/greenlets/kills.py).
                self._batch(self._take())
            else:
                self._sender.ask()
        else:
            self._batch([ask])
        return ask.reply.get()

    def _drain(self) -> None:
        # A writer may have sent what waited (SEND_AT) since the sender was asked.
        while self._asks and not self._in_flight:
            self._batch(self._take())

    def _take(self) -> list[Ask]:
        asks, self._asks = self._asks, []
        self._of_queue.clear()
        return asks

    def _batch(self, asks: list[Ask]) -> None:
        self._in_flight = True
        try:
            self._commit(asks)
        except Exception as exc:
            # A bug here must not leave pollers waiting for ever: each
            # ask still unanswered hears of it, and the next batch goes on.
            for ask in asks:
                if not ask.reply.ready():
                    ask.reply.set_exception(exc)
            log.exception("group commit failed")
        finally:
            self._in_flight = False
            self._alone = len(asks) == 1
            if self._asks:
                self._sender.ask()

    def _commit(self, asks: list[Ask]) -> None:
        try:
            rows = self._round_trip(asks)
        except Exception as exc:
            if len(asks) > 1 and ((is_server_error(exc) and not is_outage(exc)) or isinstance(exc, Unsendable)):
                # The server refused the batch for one ask's sake (a value it
                # cannot store, a row it cannot claim), or the batch could not
                # be built or bound for one of its values (a NUL character, a
                # type no column takes): nothing committed, and each goes
                # again alone, so only that one fails. Not when the database
                # refuses everything for now (read-only): each would fail too.
                for ask in asks:
                    self._commit([ask])
                return
            for ask in asks:
                ask.reply.set_exception(exc)
            return
        except BaseException as exc:
            # Killed in the middle (the process is ending): no ask waits for ever.
            stopped = NoReply(f"the batch was cut off: {type(exc).__name__}")
            stopped.backend_pid = getattr(exc, "backend_pid", None)  # type: ignore[attr-defined]
            for ask in asks:
                ask.reply.set_exception(stopped)
            raise
        answers = _Answers(rows)
        for ask in asks:
            ask.reply.set(answers.reply(ask))

    def _round_trip(self, asks: list[Ask]) -> list[Row]:
        self.batches += 1
        self.asks += len(asks)
        try:
            sql, params = lone_step(asks[0]) if len(asks) == 1 else batch_step(asks)
        except Exception as exc:
            raise Unsendable(f"the batch cannot be built: {type(exc).__name__}: {exc}") from exc
        return self.db.reserved.query_within(self.timeout, sql, params)


# The fields of an outcome and of a claim (job_claim's parameters),
# each with its parameter's name in job_step and job_step_one.
_OUTCOME = tuple(
    (f"o_{k}", k)
    for k in ("id", "worker_id", "attempts", "status", "retry_in", "last_error", "last_traceback", "delay", "uncounted")
)
_CLAIM = tuple((f"c_{k}", k) for k in ("queue", "slot", "worker_id", "lease", "max_attempts", "id"))


def lone_step(ask: Ask) -> tuple[str, dict[str, Any]]:
    """The statement for a lone ask, each field a plain value: jobs_step_one, which
    makes them the one-element arrays of jobs_step's batch."""
    params = {name: None if ask.outcome is None else ask.outcome[k] for name, k in _OUTCOME}
    params.update({name: None if ask.claim is None else ask.claim[k] for name, k in _CLAIM})
    return Q.job_step_one, params


def batch_step(asks: list[Ask]) -> tuple[str, dict[str, str]]:
    """The statement for several asks, each field a column of the batch: jobs_step."""
    outcomes = [a.outcome for a in asks if a.outcome is not None]
    claims = [a.claim for a in asks if a.claim is not None]
    params = {name: array_text([o[k] for o in outcomes]) for name, k in _OUTCOME}
    params.update({name: array_text([c[k] for c in claims]) for name, k in _CLAIM})
    return Q.job_step, params


class _Answers:
    """A batch's rows, by what each answers: outcomes written (queue NULL, the
    job's id), jobs claimed (queue, worker and slot) and, for a group that
    claimed nothing, its wait (queue and worker, no slot)."""

    def __init__(self, rows: list[Row]) -> None:
        # An outcome's row with a wait was held back, not written.
        self.written = {row[2] for row in rows if row[0] is None and row[9] is None}
        self.held = {row[2] for row in rows if row[0] is None and row[9] is not None}
        self.claimed: dict[tuple[Any, Any, Any], Row] = {}
        self.waits: dict[tuple[Any, Any], Row] = {}
        for row in rows:
            if row[0] is None:
                continue
            if row[2] is None:
                self.waits[row[0], row[1]] = row[2:]
            else:
                self.claimed[row[0], row[1], row[10]] = row[2:]  # by queue, worker and slot

    def reply(self, ask: Ask) -> Reply:
        written = ask.outcome is not None and ask.outcome["id"] in self.written
        held = ask.outcome is not None and ask.outcome["id"] in self.held
        if ask.claim is None:
            return Reply(written, None, held)
        queue, worker = ask.claim["queue"], ask.claim["worker_id"]
        row = self.claimed.get((queue, worker, ask.claim["slot"]))
        return Reply(written, row if row is not None else self.waits.get((queue, worker)), held)


class Steps:
    """A queue's claims and outcomes, through the process's Committer."""

    def __init__(
        self, queue: Queue, db: DB, runtime: Runtime, *, release: Callable[[PendingJob], None], outage: Outage
    ) -> None:
        self.queue = queue.name
        self.db = db
        self.completer = runtime.completer
        self.leases = runtime.leases
        self.max_attempts = queue.max_attempts
        self._kills = runtime.kills
        # Gives back a job the write claimed for a slot that was killed meanwhile.
        self._release = release
        # The database's outage, shared by the worker's parts: while it is
        # reported, an outcome it keeps from being written is not reported again.
        self.outage = outage
        # Per slot, a claim whose reply was lost, settled before the slot claims again.
        self.unsettled: dict[int, BaseException] = {}
        # Rows this poller gave up on while they were still started by it
        # (outcome not written, or fenced): never mistaken for a new claim.
        self.abandoned: set[int] = set()
        self.step_store = StepStore(db)

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
                if is_data_error(exc) and end_unclaimable(
                    self.db, self.queue, exc, lambda head: self.params(head, slot)
                ):
                    continue
                if not is_server_error(exc):
                    self.unsettled[slot] = exc
                    mine = self._settle(slot, exc)
                    if mine is not None:
                        return ClaimResult(mine)
                raise
            return claimed(row, self.step_store)

    def write(self, job: PendingJob, outcome: Outcome, delay: float, next_slot: int | None) -> ClaimResult | None:
        """Write the outcome; with next_slot, together with the claim of that
        slot's next job (one round trip, one commit), and what it found. A
        kill that comes meanwhile (the shutdown window closed) waits for the
        write to end. The job's lease is let go once the write is done."""
        found: ClaimResult | None = None
        try:
            with self._kills:
                found = self._write(job, outcome, delay, next_slot)
        except BaseException:
            # The kill held back: a job the write claimed will now never run here.
            if found is not None and found.job is not None:
                self._release(found.job)
            raise
        finally:
            # Held (renewed, and never rescued by this worker) until the
            # outcome is written or given up on.
            self.leases.release(job.id)
        return found

    def _write(self, job: PendingJob, outcome: Outcome, delay: float, next_slot: int | None) -> ClaimResult | None:
        """One update by primary key; with next_slot, sent together with the
        claim of that slot's next job. When that fails, what committed is
        settled first (the claim may have), and the outcome goes alone unless
        it went with the claim. What the claim sent with it found, if it went."""
        params = self.outcome_params(job, outcome, delay)
        if next_slot is not None and not outcome.followups:
            try:
                reply = self.completer.send(params, self.params(None, next_slot))
            except Exception as exc:
                job_log.debug("queue=%s id=%d outcome and next claim together failed: %s", self.queue, job.id, exc)
                # Unsendable: nothing was sent.
                if not is_server_error(exc) and not isinstance(exc, Unsendable):
                    # No answer: the server may have committed both, or may
                    # still, unless its process is ended first.
                    mine = self.lost(next_slot, exc)
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
                return claimed(reply.row, self.step_store)
        self._write_alone(job, outcome, params)
        return None

    def outcome_params(self, job: PendingJob, outcome: Outcome, delay: float) -> dict[str, Any]:
        return {
            "id": job.id,
            "worker_id": self.leases.worker_id,
            "attempts": job.attempts,
            "status": outcome.stored,
            "retry_in": outcome.retry_in,
            "last_error": outcome.last_error,
            "delay": delay,
            "uncounted": 0 if outcome.counted else 1,
            "last_traceback": outcome.traceback,
        }

    def lost(self, slot: int, exc: BaseException) -> PendingJob | None:
        """A write that carried this slot's claim got no answer: the job it
        claimed, when that can be learnt now; else the slot settles before its
        next claim."""
        self.unsettled[slot] = exc
        try:
            return self._settle(slot, exc)
        except Exception as settle_exc:
            job_log.warning("queue=%s could not yet learn what a lost write committed: %s", self.queue, settle_exc)
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
        job = claimed(row, self.step_store).job
        if job is not None:
            job_log.warning("queue=%s id=%d was claimed though the reply was lost; running it", self.queue, job.id)
        return job

    def _write_alone(self, job: PendingJob, outcome: Outcome, params: dict[str, Any]) -> None:
        """The outcome by itself, sent again with backoff while the row may
        still be this claim's: a lost connection, a server that does not
        answer or is read-only for a spell, a row another transaction holds
        each only delay the write.
        Safe to repeat, and safe after the lease lapsed: the update matches
        only while the row is this claim's (not rescued) or already holds this
        very outcome. The tries go on until a lease after the job's own lapses
        (a rescue has had time to take the row by then), the last one at that
        moment. An outcome the server refuses (a value it cannot store) is
        replaced by one saying so, so the row still ends."""
        tags = {"queue": self.queue, "job": job.name, "job_id": job.id, "callsite": job.callsite}
        replacements = _replacements(outcome)
        retry = Backoff(base=WRITE_RETRY_BASE, cap=WRITE_RETRY_CAP)
        until = time.monotonic() + 2 * self.leases.lease  # a job the lease keeper does not hold
        said = False
        while True:
            try:
                # The follow-ups go with the outcome they were added for, not
                # with one that replaced it.
                if outcome.followups and params["status"] == outcome.stored:
                    reply = self._send_with_followups(job, params, outcome)
                else:
                    reply = self.completer.send(params, None)
            except Exception as exc:
                if _refused_value(exc):
                    status = next(replacements, None)
                    if status is not None:
                        job_log.error("queue=%s id=%d %s (it was %r)", self.queue, job.id, status, outcome.status[:200])
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
                job_log.warning("queue=%s id=%d outcome not written yet, trying again: %s", self.queue, job.id, first)
            # The last try goes at the end of the tries, not a whole backoff before it.
            gevent.sleep(min(retry.failed(), left))

    def _send_with_followups(self, job: PendingJob, params: dict[str, Any], outcome: Outcome) -> Reply:
        """The outcome and the jobs it enqueues, in a transaction of their own
        (the group commit's batches carry outcomes alone). The row is locked
        first: when no longer started by this claim, an earlier try committed
        both (its reply lost) or a rescue took it, and nothing is written now."""
        ask = Ask(params, None)
        try:
            with self.db.transaction() as tx:
                found = tx.query_row(Q.job_ending, params)
                if found is None or found[0] != st.STARTED:
                    return Reply(found is not None and found[0] == params["status"], None)
                if not found[1]:
                    return Reply(False, None, held=True)
                reply = _Answers(tx.query(*lone_step(ask))).reply(ask)
                if not reply.written:
                    raise _Undone(reply)
                with traces.resumed(outcome.followups_trace):
                    insert_many(tx, outcome.followups, callsite=f"then of job {job.id}")
                return reply
        except _Undone as undone:
            return undone.reply

    def _give_up(self, job: PendingJob, why: str, exc: BaseException | None, tags: dict[str, Any]) -> None:
        """The outcome cannot be written: the row stays started, and the rescue
        takes it once its lease lapses."""
        job_log.error("queue=%s id=%d %s", self.queue, job.id, why)
        if self.outage.failing and (exc is None or is_outage(exc)):
            pass  # the database's outage is why, and its report stands for this one
        elif exc is not None:
            capture(exc, message="finalize job", **tags)
        else:
            capture_message(f"queue={self.queue} id={job.id} {why}", **tags)
        self.abandoned.add(job.id)

    def _check_written(self, job: PendingJob, outcome: Outcome, written: bool) -> None:
        if not written:
            # The lease ran out (no heartbeat got through) and another worker
            # rescued the row; its outcome stands.
            job_log.warning(
                "queue=%s id=%d was rescued before it finished; outcome %r dropped", self.queue, job.id, outcome.status
            )


def end_unclaimable(db: DB, queue: str, exc: BaseException, params: Callable[[int], dict[str, Any]]) -> bool:
    """A claim failed on a value in a row (one written by hand, say). When
    the queue's head row is the one (claiming it alone, with params(its id),
    fails the same way), end it with the reason, so the rest of the queue is
    worked. Whether a row was ended."""
    head = db.query_row(Q.job_head, {"queue": queue})
    if head is None:
        return False
    try:
        with db.transaction() as tx:
            tx.query_row(Q.job_claim, params(head[0]))
            # Claimable: the fault lies elsewhere. Roll back.
            raise RollbackProbe
    except RollbackProbe:
        return False
    except Exception as probe:
        if not is_data_error(probe):
            return False
    status = st.err(f"cannot be claimed: {first_line(exc)}")
    if not db.exec(Q.job_end_unclaimable, {"id": head[0], "status": status}):
        return False
    job_log.error("queue=%s id=%d ended: %s", queue, head[0], status)
    capture(exc, message="job cannot be claimed", queue=queue, job_id=head[0])
    return True


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def claimed(row: tuple[Any, ...] | None, step_store: StepStore | None = None) -> ClaimResult:
    """A job_claim row as what the claim found. Its job keeps its steps'
    results (PendingJob.step) in step_store, given here and not by the
    executor: a copy of every job would cost the jobs that keep none."""
    if row is None:
        return ClaimResult(None)
    job_id, name, args_text, attempts, max_attempts, callsite, latency, wait, _slot, trace = row
    if job_id is None:
        return ClaimResult(None, wait)
    args, args_error = decode_args(args_text)
    claimed_at = time.monotonic()
    job = PendingJob(
        job_id,
        name,
        args,
        attempts,
        max_attempts,
        callsite,
        latency,
        claimed_at,
        args_error,
        step_store=step_store,
        trace=trace,
    )
    return ClaimResult(job)


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
