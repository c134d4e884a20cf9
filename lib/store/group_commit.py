"""Group commit: the outcome writes and claims of every poller of a process go
to the server together, one round trip and one transaction for all that is
ready at about the same moment.

A lone ask on an idle worker goes on the hub's next turn: there is no window
to wait for company, and the asks made in this turn go together (a queue's
slots, starting at once, claim in one statement). The sender (lib/greenlets/standby.py)
sends it, and stays a moment for the next batch. While one batch is on its
way, the asks that arrive meanwhile wait for it and then go together, so
under load a batch grows by itself; with none on its way, SEND_AT asks of
one queue go at once from the writer whose outcome makes them that many.
When batches carry one ask each (a serial queue, an idle worker), a job's
outcome goes at once from the greenlet that asked, without the hop to the
sender and back: outcomes come one at a time as jobs end, not in a burst of
one turn. A batch of one goes as jobs_step_one, each field a plain value:
the same rules for one ask, the functions both call (sql/rules/rules.sql).

One batch is on its way at a time (a second beside it would meet the first
on the same queue's turn and be told to come back later), on a connection
the pool keeps for it (DB.reserved), so handlers' own queries can never take
the connection an outcome needs.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gevent.event import AsyncResult

from lib.greenlets.deadline import Deadline, Expired
from lib.greenlets.standby import Standby
from lib.store.binding import Row, array_text
from lib.store.db import DB
from lib.store.driver_errors import NoReply, Unsendable, is_outage, is_server_error
from lib.store.sql import Q

log = logging.getLogger("jobs.commit")

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
        self._sender = Standby(self._drain, lambda: bool(self._asks))
        # One batch is on its way at a time, so one deadline serves them all.
        self._deadline = Deadline(timeout)
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
        self._deadline.seconds = self.timeout
        try:
            with self._deadline:
                return self.db.reserved.query(sql, params)
        except Expired as exc:
            # The connection was discarded with the server process noted on
            # the exception (lib.store.db): settling needs it.
            lost = NoReply(f"no answer within {self.timeout:g}s")
            lost.backend_pid = getattr(exc, "backend_pid", None)  # type: ignore[attr-defined]
            raise lost from None


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
                self.claimed[row[0], row[1], row[-1]] = row[2:]

    def reply(self, ask: Ask) -> Reply:
        written = ask.outcome is not None and ask.outcome["id"] in self.written
        held = ask.outcome is not None and ask.outcome["id"] in self.held
        if ask.claim is None:
            return Reply(written, None, held)
        queue, worker = ask.claim["queue"], ask.claim["worker_id"]
        row = self.claimed.get((queue, worker, ask.claim["slot"]))
        return Reply(written, row if row is not None else self.waits.get((queue, worker)), held)
