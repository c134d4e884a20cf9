"""LISTEN/NOTIFY wakeups: one listening connection per process, routed to the
pollers of the queue named in each notification.

Triggers on the jobs table notify on channel "jobs" whenever a queue may have
work, whoever wrote the row. The pollers' own poll interval stays as the
fallback; with this it can be long. An operator's cancel of a started job
(job_cancel_running, sql/operate.sql) notifies on "jobs_cancel", heard by
every worker: the one running the job stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg2
import psycopg2.extensions
from gevent.event import Event
from gevent.select import select

from lib.setup.error_reports import Outage
from lib.store.pool_connections import behind_pooler, connect_options
from lib.store.retry_backoff import Backoff

log = logging.getLogger("jobs.wakeups")

CHANNEL = "jobs"
# Pauses and resumes (lib/operate/queue_state.py): for the worker's log, not a wakeup.
STATE_CHANNEL = "jobs_state"
# Cancels of started jobs, each payload '<id> <who asked>'.
CANCEL_CHANNEL = "jobs_cancel"
# The end of a job others wait for (jobs_dep_ended, sql/rules/waits.sql).
WAITS_CHANNEL = "jobs_waits"
# How often the loop looks at stop while no notification comes.
_SELECT_TIMEOUT = 5.0
# The longest wait between tries to listen again: short, so that wakeups
# come back within seconds of the database, one connect a few seconds meanwhile.
_MAX_BACKOFF = 4.0


class Listener:
    def __init__(
        self,
        dsn: str,
        wake: Callable[[str], None],
        wake_all: Callable[[], None],
        *,
        outage: Outage | None = None,
        state: Callable[[str], None] | None = None,
        cancel: Callable[[int, str], None] | None = None,
        waits: Callable[[], None] | None = None,
    ) -> None:
        self.dsn = dsn
        self.wake = wake
        self.wake_all = wake_all
        # Given each STATE_CHANNEL payload; None: that channel is not listened to.
        self.state = state
        # Given each CANCEL_CHANNEL job id and who asked; None: that channel is not listened to.
        self.cancel = cancel
        # Called when a job others wait for has ended; None: that channel is not listened to.
        self.waits = waits
        self.outage = outage or Outage("listen for wakeups")
        self.listening = Event()  # set while a LISTEN connection is up (tests wait on it)
        self._warned_pooler = False  # said once per process, not at every reconnect

    def run(self, stop: Event) -> None:
        retry = Backoff(cap=_MAX_BACKOFF)
        while not stop.is_set():
            conn = None
            try:
                conn = self._connect()
                self.outage.recovered()
                retry.succeeded()
                # Rows written while nobody listened would otherwise wait
                # for the fallback poll.
                self.wake_all()
                self._listen(conn, stop)
            except (psycopg2.Error, OSError) as exc:
                self.outage.failed(exc)
            finally:
                self.listening.clear()
                if conn is not None:
                    conn.close()
            stop.wait(retry.failed())

    def _connect(self) -> psycopg2.extensions.connection:
        conn = psycopg2.connect(self.dsn, **connect_options("jobs-listener", self.dsn))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"LISTEN {CHANNEL}")
            if self.state is not None:
                cur.execute(f"LISTEN {STATE_CHANNEL}")
            if self.cancel is not None:
                cur.execute(f"LISTEN {CANCEL_CHANNEL}")
            if self.waits is not None:
                cur.execute(f"LISTEN {WAITS_CHANNEL}")
        if not self._warned_pooler and behind_pooler(conn):
            # Accepted, and in transaction mode never heard again: the pooler
            # hands the session that listens to other clients' transactions.
            self._warned_pooler = True
            log.warning(
                "the LISTEN connection goes through a connection pooler: unless it is in session mode,"
                " no wakeup arrives and queues wait for their fallback poll; point DATABASE_DIRECT_URL"
                " at the server itself"
            )
        self.listening.set()
        log.info("listening for wakeups")
        return conn

    def _listen(self, conn: psycopg2.extensions.connection, stop: Event) -> None:
        while not stop.is_set():
            readable, _, _ = select([conn], [], [], _SELECT_TIMEOUT)
            if not readable:
                continue
            # Raises when the server went away: the caller reconnects.
            conn.poll()
            queues = {n.payload for n in conn.notifies if n.channel == CHANNEL}
            states = [n.payload for n in conn.notifies if n.channel == STATE_CHANNEL]
            cancels = [n.payload for n in conn.notifies if n.channel == CANCEL_CHANNEL]
            ended = any(n.channel == WAITS_CHANNEL for n in conn.notifies)
            conn.notifies.clear()
            if ended and self.waits is not None:
                self.waits()
            if self.cancel is not None:
                for payload in cancels:
                    _cancelled(payload, self.cancel)
            if self.state is not None:
                for payload in states:
                    self.state(payload)
            for queue in queues:
                self.wake(queue)


def _cancelled(payload: str, cancel: Callable[[int, str], None]) -> None:
    """Hand a cancel's job id and asker to cancel."""
    job_id, _, by = payload.partition(" ")
    if not job_id.isdigit() or not by:
        # Sent by hand, not by job_cancel_running: nothing to stop.
        log.warning("a cancel that names no job and asker is ignored: %r", payload[:200])
        return
    cancel(int(job_id), by)
