"""Helpers shared by the tests (not fixtures)."""

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import gevent
import psycopg2
from gevent.event import Event

from lib.job import Handler
from lib.run.poller import Poller
from lib.run.queue import Queue
from lib.run.rates import declare_rate
from lib.run.runtime import Runtime
from lib.store.db import DB
from lib.store.sql import Q

ROOT = Path(__file__).resolve().parent.parent


def make_poller(
    queue: str | Queue,
    db: DB,
    dispatch: Mapping[str, Handler] | None = None,
    *,
    runtime: Runtime | None = None,
    **options: Any,
) -> Poller:
    """A poller run without a worker: of the definition given, or of one
    built from queue, dispatch and options; on runtime, else on a runtime of
    its own (Runtime.alone). Pollers meant to share a lease keeper or a
    group commit, as a worker's do, are given one runtime."""
    if not isinstance(queue, Queue):
        assert dispatch is not None, "a queue's name needs its dispatch"
        queue = Queue(queue, dispatch, **options)
    else:
        assert dispatch is None and not options, "a definition comes whole"
    # As the worker does at start: the claim reads the rate and budgets from the database.
    if queue.rate is not None or queue.budgets:
        assert declare_rate(db, queue.name, queue.rate, queue.budgets)
    return Poller(queue, db, runtime or Runtime.alone(db))


def _with_database(url: str, name: str) -> str:
    """url pointing at another database of the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _with_user(url: str, user: str) -> str:
    """url connecting as another role (no password: the test servers trust their clients)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@contextmanager
def scratch_database(server_url: str, prefix: str, *, owner: bool = True) -> Iterator[str]:
    """The URL of a new, empty database on the server, dropped afterwards.
    With owner (the default), the URL connects as a role made for it that owns
    the database and is no superuser, as a managed Postgres (RDS, Cloud SQL)
    gives its user: what the worker does must work so. Here, not in conftest:
    a test module cannot import from conftest (another folder's conftest.py
    may hold that module name)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(server_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            if owner:
                # Ending the server processes of its own role is all a managed
                # role may do to others' sessions (pg_signal_backend lets it end
                # any non-superuser's); the tests' clients of this database
                # that stand in for other applications are this role too.
                cur.execute(f"CREATE ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
                cur.execute(f"CREATE DATABASE {name} OWNER {name}")
                cur.execute(f"REVOKE ALL ON DATABASE {name} FROM PUBLIC")
            else:
                cur.execute(f"CREATE DATABASE {name}")
        url = _with_database(server_url, name)
        yield _with_user(url, name) if owner else url
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            if owner:
                cur.execute(f"DROP ROLE IF EXISTS {name}")
    finally:
        admin.close()


def superuser_url(database_url: str, server_url: str) -> str:
    """database_url as the server's own superuser (server_url's user): for what
    a test does as the database's administrator, not as the worker."""
    return urlunsplit(urlsplit(database_url)._replace(netloc=urlsplit(server_url).netloc))


def asleep(db: DB, *queues: str) -> None:
    """Each queue as a poller of it leaves it when it goes to sleep
    (jobs_sleep, sql/rules/wakeups.sql): its enqueues notify, until a claim
    of it. Only a queue some poller sleeps on is notified."""
    for queue in queues:
        assert db.query_row("SELECT jobs_sleep(%s)", (queue,)) == ("asleep",)


def count_jobs(db: DB, where: str = "TRUE") -> int:
    return db.query_row(f"SELECT count(*) FROM jobs WHERE {where}")[0]


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run code in a plain interpreter (no gevent) from the project root."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


PROBE_WORKER = ROOT / "tests" / "apps" / "probe_worker.py"


def start_worker(database_url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(PROBE_WORKER), *args],
        env={**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "INFO"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, timeout: float = 30.0, every: float = 0.05, what: str | None = None):
    """The first true answer of predicate, polled: for a condition nothing
    signals. On timeout the failure names the condition (what, else where
    the predicate is written) and its last answer."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {what or _written_at(predicate)}; its last answer: {found!r}"
            )
        time.sleep(every)
    return found


def _written_at(predicate) -> str:
    code = getattr(predicate, "__code__", None)
    if code is None:
        return repr(predicate)
    return f"{predicate.__qualname__} at {os.path.relpath(code.co_filename, ROOT)}:{code.co_firstlineno}"


class Gate:
    """A lock (an advisory lock, key) the test holds on a connection of its
    own. A trigger that takes it waits until the test opens the gate, so a
    statement stays in flight for exactly as long as the test needs, with no
    sleep to guess how long. Advisory locks belong to one database, and each
    run of the suite has its own."""

    def __init__(self, database_url: str, key: int) -> None:
        self.database_url = database_url
        self.key = key
        self.closed = True

    def __enter__(self) -> "Gate":
        self.conn = psycopg2.connect(self.database_url)
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (self.key,))
        self.closed = False
        return self

    def open(self) -> None:
        if not self.closed:
            with self.conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            self.closed = True

    def __exit__(self, *exc) -> None:
        self.conn.close()  # opens the gate, too


def waiting_on(db: DB, wait_event: str, app: str | None = None) -> list[int]:
    """Backends of this run's database (others may share the server) waiting on a lock of this kind."""
    rows = db.query(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND wait_event = %s AND (%s::text IS NULL OR application_name = %s)",
        (wait_event, app, app),
    )
    return [pid for (pid,) in rows]


def read_until(proc, text: str, timeout: float = 30.0) -> str:
    """What the process printed up to the first line holding text."""
    lines = []
    with gevent.Timeout(timeout):
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                return "".join(lines)
    raise AssertionError(f"the process ended before printing {text!r}: {''.join(lines)}")


@contextmanager
def running_worker(db: DB, registry: list, settings: Any = None, **options: Any) -> Iterator[gevent.Greenlet]:
    """worker.run on db with this registry (its settings: no HTTP server
    unless given) in a greenlet, for the block; then stop, and it must exit 0
    within its shutdown window. options go to worker.run (schedule=, supervisor=)."""
    import worker
    from lib.setup.settings import Settings

    stop = Event()
    run = gevent.spawn(worker.run, db, registry, settings or Settings(http_addr=None), stop=stop, **options)
    try:
        yield run
    finally:
        stop.set()
        code = run.get(timeout=30)
    assert code == 0, code


def poll_until(pollers, done, timeout: float = 30) -> None:
    """Run the pollers' poll in greenlets until done() holds, then stop them."""
    stop = Event()
    greenlets = [gevent.spawn(p.poll, stop) for p in pollers]
    try:
        with gevent.Timeout(timeout):
            while not done():
                gevent.sleep(0.02)
    finally:
        stop.set()
        for p in pollers:
            p.wake()
        gevent.joinall(greenlets, timeout=10, raise_error=True)


def paused(db: DB) -> list[tuple[str, str, Any]]:
    """The queues paused now: (queue, reason, until)."""
    return [(q, r, u) for q, r, u in db.query(Q.queue_paused)]


@contextmanager
def updates_held(db: DB, database_url: str, key: int, when: str) -> Iterator[Gate]:
    """While the block runs, an UPDATE of a jobs row for which `when` (SQL over
    NEW) holds waits on Gate(key) in a trigger, in flight for as long as the
    test keeps the gate closed. A row lock would not do: the worker's own
    statements pass over a row another transaction holds."""
    db.exec(
        "CREATE OR REPLACE FUNCTION held_update() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN IF {when} THEN PERFORM pg_advisory_xact_lock_shared({key}); END IF; RETURN NEW; END $$"
    )
    db.exec("CREATE TRIGGER held_update BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION held_update()")
    try:
        with Gate(database_url, key) as gate:
            yield gate
    finally:
        db.exec("DROP TRIGGER IF EXISTS held_update ON jobs")


# A Monday: the clock's tests read their times in its week.
MON = datetime(2026, 3, 2, tzinfo=UTC)


def at(day: int, hour: int, minute: int, second: int = 0) -> datetime:
    """A UTC time in the week of MON (day 0 is Monday)."""
    return MON + timedelta(days=day, hours=hour, minutes=minute, seconds=second)


class FakeTime:
    """now() for Clock.run: the given times in turn, an exception among them
    raised in its turn (a time that cannot be read); the last one also sets stop."""

    def __init__(self, times: list[datetime | Exception], stop: Event) -> None:
        self.times = times
        self.stop = stop

    def __call__(self) -> datetime:
        if len(self.times) == 1:
            self.stop.set()
        now = self.times[0] if len(self.times) == 1 else self.times.pop(0)
        if isinstance(now, Exception):
            raise now
        return now
