"""Leases on started rows: this process renews the rows it runs, fences a job
whose lease it could not renew in time, and takes back (rescues) rows whose
worker stopped renewing them, wherever that worker was.

The renewal runs in a native thread on a connection of its own, so a handler
that holds the hub (a CPU loop, an unpatched blocking call) cannot let its own
lease lapse and have the job run a second time elsewhere while it still runs.

A job an operator cancels while it runs (the listener hears it, or a renewal's
answer says so) has its handler told to stop, and its lease renewed
CANCEL_GRACE longer: a handler that goes on regardless is fenced when the
lease lapses, and the rescue ends its row cancelled, never runs it again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.monkey
import psycopg2
from gevent.event import Event

from lib.greenlets.thread_stop import ThreadStop
from lib.job import status as st
from lib.setup import counters
from lib.setup.error_reports import Outage, capture
from lib.store.db import DB
from lib.store.driver_errors import NoReply, is_database_error, is_outage, is_server_error
from lib.store.pool_connections import DeadlineConnection, connect_options, deadline_connection
from lib.store.sql import Q

log = logging.getLogger("jobs.leases")

# How long a claim holds without renewal. A worker that dies leaves its rows
# for at most this long (plus one rescue period: at most another lease)
# before another takes them.
LEASE_SECONDS = 30.0

# How long a cancelled job's lease is still renewed once the cancel reached
# this process: its handler's time to stop and have its outcome written.
CANCEL_GRACE = 2.0

# A native thread: the renewal must not touch the hub it stands in for.
_start_thread = gevent.monkey.get_original("_thread", "start_new_thread")


def new_worker_id() -> str:
    """One identity per worker start, written on each row it claims. Made when
    the worker starts, not at import, so processes forked from one parent
    never share one. The random part is os.urandom's, as uuid4's would be
    (the uuid module is memory the worker would keep for these 8 digits)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


class LeaseLost(BaseException):
    """Thrown into a handler whose lease this worker could not renew in time:
    another worker may be running the job now. A BaseException, so handler
    code that catches Exception does not swallow it."""


@dataclass
class Held:
    """A job this process runs. `good_until` is a monotonic time by which its
    lease is known to hold; it errs early, never late."""

    job_id: int
    good_until: float
    fence: Callable[[], None]
    fenced: bool = False
    # Stops the handler when an operator cancels the job, given who asked.
    stop: Callable[[str], None] | None = None
    # Who asked to cancel the job, and when this process learnt it (monotonic).
    cancel_by: str | None = None
    cancel_at: float = 0.0
    stopped: bool = False  # stop() was called

    def cancelled(self, by: str) -> None:
        """Note an operator's cancel; from either thread, as it touches no hub."""
        if self.cancel_by is None:
            self.cancel_at = time.monotonic()
            self.cancel_by = by

    def renewed(self, now: float) -> bool:
        """Whether to renew its lease: a job cancelled over CANCEL_GRACE ago
        is let go, so its lease lapses and the rescue ends it."""
        return self.cancel_by is None or now < self.cancel_at + CANCEL_GRACE


class Leases:
    def __init__(
        self,
        db: DB,
        *,
        worker_id: str | None = None,
        lease: float = LEASE_SECONDS,
        legacy_age: float = 660.0,
        outage: Outage | None = None,
        seen: Callable[[Any], None] | None = None,
    ) -> None:
        if not lease > 0:
            raise ValueError(f"the lease must be a positive number of seconds, got {lease!r}")
        self.db = db
        self.worker_id = worker_id or new_worker_id()
        self.lease = lease
        # Rows claimed before leases existed carry none; they are taken once
        # older than the longest job timeout plus a margin.
        self.legacy_age = legacy_age
        # A job is fenced this long before its lease would lapse: the reply
        # that confirmed it may have taken this long to come back, and the
        # handler must be stopped before another worker can rescue the row.
        self.margin = min(1.0, lease / 10)
        self.held: dict[int, Held] = {}
        # Shared with the rest of the worker (the renewal thread included):
        # an outage of the database is one report, whoever meets it.
        self.outage = outage or Outage("leases")
        # Run inside each rescue's transaction, given it: the worker
        # registry's refresh (lib/background/worker_registry.py), passed in so this module does
        # not depend on it. One commit for both.
        self.seen: Callable[[Any], None] = seen or (lambda runner: None)
        # How long a rescue or a renewal may wait for the server: well inside
        # the margin a fence leaves, so a renewal that cannot get through is
        # given up on and tried again while the lease still holds.
        self.round_trip = max(lease / 6, 0.5)
        # A rescue is off the fence's path: it may take longer, but never for ever.
        self.rescue_deadline = max(lease / 3, 2.0)
        # Rows no rescue statement can write, left out of every later one.
        self._unrescuable: set[int] = set()

    def hold(
        self, job_id: int, claimed_at: float, fence: Callable[[], None], stop: Callable[[str], None] | None = None
    ) -> None:
        """Note a job claimed at claimed_at (monotonic, when the claim's reply
        came back); fence() stops its handler if the lease cannot be kept,
        stop(by) when an operator cancels the job."""
        self.held[job_id] = Held(job_id, claimed_at + self.lease - self.margin, fence, stop=stop)

    def release(self, job_id: int) -> None:
        """The job's outcome is written (or it was fenced): stop renewing it."""
        self.held.pop(job_id, None)

    def held_ids(self) -> list[int]:
        # list() of a dict's keys runs without releasing the GIL, so the
        # renewal thread reads a consistent snapshot.
        return sorted(list(self.held))

    def cancel(self, job_id: int, by: str) -> bool:
        """An operator cancelled the job (the listener heard it): its handler
        is told to stop now. In the hub's thread. False: not held here."""
        held = self.held.get(job_id)
        if held is None:
            return False
        held.cancelled(by)
        self.stop_cancelled()
        return True

    def stop_cancelled(self) -> list[int]:
        """Tell the handler of each cancelled job held here to stop, once; the
        ids told. In the hub's thread (a renewal's answer only notes a cancel)."""
        told = []
        for held in list(self.held.values()):
            if held.cancel_by is not None and not held.stopped and held.stop is not None:
                held.stopped = True
                told.append(held.job_id)
                held.stop(held.cancel_by)
        return told

    def heartbeat(self, runner: Any = None) -> int:
        """Renew the rows held now, through runner (the pool by default), and
        note the cancels they carry (the fallback for a lost NOTIFY); the
        number renewed. Only a row this worker still holds is renewed: one
        rescued meanwhile stays with its rescuer."""
        sent = time.monotonic()
        ids = sorted(h.job_id for h in list(self.held.values()) if h.renewed(sent))
        if not ids:
            return 0
        rows = (runner or self.db).query(
            Q.job_heartbeat, {"lease": self.lease, "worker_id": self.worker_id, "ids": ids}
        )
        for job_id, cancel_by in rows:
            held = self.held.get(job_id)
            if held is not None:
                held.good_until = sent + self.lease - self.margin
                if cancel_by is not None:  # the fence's greenlet tells its handler
                    held.cancelled(cancel_by)
        return len(rows)

    def fence_lapsed(self, now: float | None = None) -> list[int]:
        """Stop every held job whose lease may lapse before it is renewed: its
        handler is stopped and no outcome written, so the worker that rescues
        it runs the only copy. The ids fenced."""
        now = time.monotonic() if now is None else now
        fenced = []
        for held in list(self.held.values()):
            if held.fenced or now < held.good_until:
                continue
            held.fenced = True
            fenced.append(held.job_id)
            if held.cancel_by is not None:
                # Let go on purpose: its handler went on past its cancel, and a rescue ends the row.
                log.warning("id=%d cancelled and still running: its handler is stopped by the fence", held.job_id)
                held.fence()
                continue
            log.error(
                "id=%d lease could not be renewed in time; its handler is stopped, no outcome written", held.job_id
            )
            if not self.outage.failing:  # else the database's outage is what cost the lease, and is reported
                capture(LeaseLost(f"job {held.job_id}: lease not renewed"), message="lease lost", job_id=held.job_id)
            held.fence()
        return fenced

    def rescue_period(self) -> float:
        """How long from one rescue to the next. A third of a lease while this
        worker holds jobs; a whole lease while it holds none, so an idle
        worker sends one transaction a lease. Either way, a dead worker's rows
        are taken back within two leases of their last renewal, and the
        registry's last_seen (read as alive for three leases, lib/operate/overview.py)
        moves on at least once a lease."""
        return self.lease / 3 if self.held else self.lease

    def rescue(self, legacy_age: float | None = None) -> list[tuple[int, str, str, str]]:
        """Take back started rows whose lease ran out, never one this worker
        still holds (it is running or finalizing it) nor one another
        transaction holds. In the same transaction: seen(), and a wakeup for
        each queue a row came back to. When the statement for all of them
        fails on one row, each is taken alone, so one bad row never stops the
        rescue of the others. Bounded by rescue_deadline: a rescue that gets
        no answer gives up and is tried again at the next period."""
        age = self.legacy_age if legacy_age is None else legacy_age
        params = {
            "legacy_age": age,
            "worker_id": self.worker_id,
            # A cancelled job fenced here is let go: its rescue ends it, whatever its handler does.
            "held": sorted(h.job_id for h in list(self.held.values()) if not (h.fenced and h.cancel_by)),
            "skip": sorted(self._unrescuable),
            "only": None,
        }
        with gevent.Timeout(self.rescue_deadline):
            try:
                rows = self._rescue(params, seen=True)
            except Exception as exc:
                # One row's fault is met row by row; the database's (read-only) by none of them.
                if not is_server_error(exc) or is_outage(exc):
                    raise
                rows = self._rescue_each(params, exc)
        for job_id, queue, name, status in rows:
            log.warning("queue=%s job=%s id=%d rescued from a lost worker: %s", queue, name, job_id, status)
            counters.rescued(queue)
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def _rescue(self, params: dict[str, Any], *, seen: bool) -> list[Any]:
        with self.db.transaction() as tx:
            # A table lock queued ahead (a schema change waiting on an open
            # transaction) is given up on in time, not waited out.
            tx.exec(f"SET LOCAL lock_timeout = {int(self.rescue_deadline * 500)}")
            if seen:
                self.seen(tx)
            rows = tx.query(Q.job_rescue, params)
            for queue in sorted({r[1] for r in rows}):
                # The lost worker held the queue's slot; whoever runs the queue may go on.
                tx.exec(Q.queue_notify, {"queue": queue})
        return rows

    def _rescue_each(self, params: dict[str, Any], failed: BaseException) -> list[Any]:
        """Each row alone, after the statement for all failed on one; a row
        that cannot be rescued ends with a status that fits, saying why."""
        log.warning("the rescue of all lost rows failed on one, rescuing each alone: %s", failed)
        rows = []
        with self.db.transaction() as tx:
            self.seen(tx)  # the registry's refresh, which the failure rolled back
        for (job_id,) in self.db.query(Q.job_rescue_candidates, params):
            try:
                rows += self._rescue({**params, "only": job_id}, seen=False)
            except Exception as exc:
                if not is_server_error(exc):
                    raise
                rows += self._end_refused(job_id, exc)
        return rows

    def _end_refused(self, job_id: int, exc: BaseException) -> list[Any]:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        status = st.fail(f"interrupted; no err: status can be stored for this row: {reason}")
        try:
            ended = self.db.query(Q.job_rescue_refused, {"id": job_id, "status": status})
        except Exception as end_exc:
            if not is_server_error(end_exc):
                raise
            # Left out of every later rescue of this process, and reported once.
            self._unrescuable.add(job_id)
            log.error("id=%d cannot be rescued, left started: %s", job_id, end_exc)
            capture(end_exc, message="job cannot be rescued", job_id=job_id)
            return []
        log.error("id=%d could not be rescued as err: %s", job_id, reason)
        capture(exc, message="job rescue refused", job_id=job_id)
        return ended

    def run(self, stop: Event) -> None:
        """Keep the leases of the jobs this process runs: the renewal thread
        renews them, and this greenlet fences a job whose lease it could not
        renew in time. The fence waits on nothing: no database call, no lock,
        no link stands between it and a handler that must stop."""
        thread_stop = ThreadStop()
        _start_thread(_Renewal(self).run, (thread_stop,))
        try:
            while not stop.is_set():
                # The cancels a renewal's answer brought, handed to their handlers from here.
                self.stop_cancelled()
                self.fence_lapsed()
                # Often enough that a fence comes before the lease lapses.
                stop.wait(min(self.margin / 2, self.lease / 3))
        finally:
            thread_stop.set()

    def run_rescue(self, stop: Event) -> None:
        """Rescue until stop is set, every rescue_period. The first rescue, at
        start, also takes every lease-less row: those predate leases."""
        first = True
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.rescue(0.0 if first else None)
                first = False
                self.outage.recovered()
            except gevent.Timeout as exc:
                self.outage.failed(NoReply(f"the rescue got no answer within {self.rescue_deadline:g}s: {exc}"))
            except Exception as exc:
                if not is_database_error(exc):
                    raise  # a bug: the supervisor reports it and restarts this part
                self.outage.failed(exc)
            # The period is read each time round: a job claimed during an
            # idle worker's long wait brings the next rescue closer.
            while not stop.is_set() and time.monotonic() < began + self.rescue_period():
                stop.wait(min(self.margin, began + self.rescue_period() - time.monotonic()))


class _Renewal:
    """The renewal thread: every third of a lease, renew what is held, on a
    connection of its own (the pool belongs to the hub's thread). Each round
    trip, the connect included, has round_trip to answer: a link that stalls
    without closing is given up on and opened anew."""

    def __init__(self, leases: Leases) -> None:
        self.leases = leases

    def run(self, stop: ThreadStop) -> None:
        leases = self.leases
        conn = None
        period = leases.lease / 3
        while not stop.is_set():
            began = time.monotonic()
            try:
                # Connected the first time a job is held: an idle worker holds no connection for it.
                if leases.held and (conn is None or conn.closed):
                    conn = self._connect()
                # Only a renewal that ran says the database is back: with
                # nothing held no statement goes, and nothing is learnt.
                if conn is not None and leases.held:
                    conn.deadline = time.monotonic() + leases.round_trip
                    leases.heartbeat(_Conn(conn))
                    leases.outage.recovered()
            except Exception as exc:  # any failure is retried next period; the fence guards the jobs
                leases.outage.failed(exc)
                if conn is not None:
                    conn.close()
                conn = None
            stop.wait(period - (time.monotonic() - began))
        if conn is not None:
            conn.close()

    def _connect(self) -> DeadlineConnection:
        db, round_trip = self.leases.db, self.leases.round_trip
        options = connect_options("jobs-leases", db.dsn, db.pooled)
        if "options" in options:
            # The server gives up on a lock wait itself, before the thread gives up on the server.
            options["options"] = f"-c lock_timeout={int(round_trip * 500)} {options['options']}"
        conn = psycopg2.connect(
            db.dsn,
            connection_factory=deadline_connection(time.monotonic() + round_trip),
            **options,
        )
        conn.autocommit = True
        return conn


class _Conn:
    """query() on one plain connection, for the renewal thread."""

    def __init__(self, conn: psycopg2.extensions.connection) -> None:
        self.conn = conn

    def query(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()
