"""The worker through a real PgBouncer in transaction mode (tests/pgbouncer.py),
where each transaction of a client may run on another server connection: no
prepared statement, session advisory lock or LISTEN outlives one.

Real processes: enqueuers and worker processes (tests/apps/chaos_worker.py,
which records each run's start and end in chaos_runs) get DATABASE_URL = the
pooled URL and JOBS_POOLER=transaction; DATABASE_DIRECT_URL = the server
itself, for the LISTEN connection, unless a test leaves it out to see the
worker poll instead. The guarantees are read back from the tables over the
direct URL, with the chaos suite's checks (FIFO, no overlap, no double claim,
nothing lost).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
import pytest
from pgbouncer import BINARY, PgBouncer, PgBouncerError
from programs import require
from test_chaos import CHAOS_RUNS, analyse, assert_clean
from tests_support import run_python, scratch_database, wait_for

from lib.insert import Job, insert, insert_many
from lib.store.db import DB
from lib.store.migrate import migrate, migrations

require(BINARY, "pgbouncer")

APP = Path(__file__).parent.parent / "apps" / "chaos_worker.py"
# Settings of the suite's own environment that must not reach a worker here.
OUTER = ("DATABASE_URL", "DATABASE_DIRECT_URL", "JOBS_POOLER", "JOBS_POLL_INTERVAL", "SENTRY_DSN")
# What a worker says at start when it has no way to LISTEN (lib/setup/settings).
NO_DIRECT = "no DATABASE_DIRECT_URL"
# Generous: two shared cores, and a worker process that starts under load.
MARGIN = 2.0


# --- PgBouncer, the database, the worker processes ---------------------------


@pytest.fixture(scope="module")
def bouncer(server_url: str) -> Iterator[PgBouncer]:
    try:
        started = PgBouncer(server_url)
    except PgBouncerError as exc:
        pytest.fail(str(exc))
    with started:
        yield started


@dataclass(frozen=True)
class Database:
    name: str
    direct_url: str  # the server itself
    pooled_url: str  # the same database through PgBouncer


@pytest.fixture(scope="module")
def database(server_url: str, bouncer: PgBouncer) -> Iterator[Database]:
    """A migrated scratch database with a chaos_runs table, for this file.
    Migrated over the direct URL: the tests are about the worker's traffic."""
    # Owned by the server's user: PgBouncer's entry logs every client in as that user.
    with scratch_database(server_url, "jobs_pgb", owner=False) as direct_url:
        db = DB.connect(direct_url, size=1)
        migrate(db)
        db.exec(CHAOS_RUNS)
        db.close()
        name = urlsplit(direct_url).path.lstrip("/")
        assert len(bouncer.warm(name)) == 4
        yield Database(name, direct_url, bouncer.url(name))
        bouncer.forget(name)


@pytest.fixture
def db(database: Database) -> Iterator[DB]:
    """A pool on the direct URL, to plant and read rows; empty tables."""
    pool = DB.connect(database.direct_url, size=4, application_name="pgb-test")
    pool.exec("TRUNCATE jobs, chaos_runs, job_queues, job_dedupe_names, clock_ticks, workers RESTART IDENTITY")
    yield pool
    pool.close()


@dataclass
class Worker:
    popen: subprocess.Popen[bytes]
    log: Path
    termed_at: float | None = None  # wall clock just before SIGTERM

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self) -> bool:
        """Past migrations and running its pollers."""
        return " running " in self.text()

    def lines(self, holding: str) -> list[str]:
        return [line for line in self.text().splitlines() if holding in line]

    def problems(self, *expected: str) -> list[str]:
        """Lines at WARNING or above, and tracebacks, but those holding one of
        expected: a statement the pooler breaks shows up here even when the
        worker retries its way past it."""
        found = []
        for line in self.text().splitlines():
            bad = any(f" {level} " in line for level in ("WARNING", "ERROR", "CRITICAL")) or "Traceback" in line
            if bad and not any(e in line for e in expected):
                found.append(line)
        return found

    def terminate(self) -> None:
        self.termed_at = time.time()
        self.popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; its exit code."""
        if self.popen.poll() is None:
            self.terminate()
        return self.popen.wait(timeout=timeout)


@contextmanager
def workers(tmp_path: Path, database: Database, *, direct: bool = True, **env: str) -> Iterator[Callable[..., Worker]]:
    """start(**env) for chaos worker processes through PgBouncer (with the
    direct URL for LISTEN unless direct=False); each is killed on exit if
    still running. Every run succeeds: CHAOS_FAIL_RATE=0."""
    base = {k: v for k, v in os.environ.items() if k not in OUTER}
    base.update(
        DATABASE_URL=database.pooled_url,
        JOBS_POOLER="transaction",
        LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
        CHAOS_FAIL_RATE="0",
        **env,
    )
    if direct:
        base["DATABASE_DIRECT_URL"] = database.direct_url
    started: list[Worker] = []

    def start(**more: str) -> Worker:
        log = tmp_path / f"worker-{len(started)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, str(APP)], env={**base, **more}, stdout=out, stderr=subprocess.STDOUT
            )
        started.append(Worker(popen, log))
        return started[-1]

    try:
        yield start
    finally:
        for worker in started:
            if worker.popen.poll() is None:
                worker.popen.kill()
            worker.popen.wait(timeout=10)


def wait_ready(worker: Worker, timeout: float = 30.0) -> None:
    try:
        wait_for(lambda: worker.ready() or worker.popen.poll() is not None, timeout=timeout)
    except AssertionError:
        raise AssertionError(f"worker not running after {timeout:g}s:\n{worker.text()[-3000:]}") from None
    assert worker.popen.poll() is None, f"worker exited with {worker.popen.returncode}:\n{worker.text()[-3000:]}"


def enqueue(pooled_url: str, queue: str) -> int:
    """One job in a transaction of its own through PgBouncer, committed: an
    application's enqueue."""
    conn = psycopg2.connect(pooled_url)
    try:
        with conn:
            job_id = insert(conn, queue, "chaos.Run")
    finally:
        conn.close()
    assert job_id is not None
    return job_id


def latencies(db: DB, ids: list[int]) -> list[float]:
    """Seconds from each job's insert (created_at: its transaction, which
    commits at once) to its claim (started_at), both from the server's clock."""
    rows = db.query(
        "SELECT extract(epoch FROM started_at - created_at)::float8 FROM jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    )
    assert len(rows) == len(ids) and all(r[0] is not None for r in rows), rows
    return [r[0] for r in rows]


def started(db: DB, job_id: int) -> bool:
    return db.query_row("SELECT status <> 'pending' FROM jobs WHERE id = %s", (job_id,))[0]


def all_done(db: DB) -> bool:
    return db.query_row("SELECT count(*) FROM jobs WHERE status <> 'ok'")[0] == 0


def all_done_but(db: DB, job_id: int) -> bool:
    return db.query_row("SELECT count(*) FROM jobs WHERE status <> 'ok' AND id <> %s", (job_id,))[0] == 0


def in_flight(db: DB, pid: int) -> bool:
    """That worker process is in the middle of a run."""
    return bool(
        db.query(
            "SELECT 1 FROM chaos_runs s WHERE s.event = 'start' AND s.pid = %s AND NOT EXISTS ("
            " SELECT 1 FROM chaos_runs e WHERE e.event = 'end' AND e.job_id = s.job_id AND e.attempt = s.attempt)",
            (pid,),
        )
    )


def listeners(db: DB) -> int:
    """Server sessions of this database named as the worker's LISTEN
    connection (PgBouncer passes a client's name on to its server session, so
    one through the pooler counts too)."""
    return db.query_row(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'jobs-listener'"
    )[0]


def pooled_names(bouncer: PgBouncer, database: Database) -> set[str]:
    """The application names of PgBouncer's clients of this database."""
    return {str(r["application_name"]) for r in bouncer.show("CLIENTS") if r["database"] == database.name}


# --- enqueue from a plain process ---------------------------------------------


def test_a_plain_process_enqueues_through_the_pooler(db: DB, database: Database) -> None:
    """lib.insert inside the caller's own transactions: what commits is there,
    in order; what rolls back is not. Each transaction may run on another
    server connection, and nothing of the insert leans on the session."""
    done = run_python(
        "import json, psycopg2\n"
        "from lib.insert import insert\n"
        f"conn = psycopg2.connect({database.pooled_url!r})\n"
        "ids = [insert(conn, 'plain', 'plain.N', {'n': n}) for n in range(5)]\n"
        "conn.commit()\n"
        "more = [insert(conn, 'plain', 'plain.N', {'n': n}) for n in range(5, 8)]\n"
        "conn.commit()\n"
        "gone = insert(conn, 'plain', 'plain.Gone')\n"
        "conn.rollback()\n"
        "conn.close()\n"
        "print(json.dumps({'ids': ids + more, 'gone': gone}))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = json.loads(done.stdout)
    rows = db.query("SELECT id, name, (args->>'n')::int, status FROM jobs ORDER BY id")
    assert rows == [(job_id, "plain.N", n, "pending") for n, job_id in enumerate(out["ids"])]
    assert out["gone"] not in {r[0] for r in rows}


# --- migrations through the pooler ---------------------------------------------


def test_two_workers_migrate_an_empty_database_together(server_url: str, bouncer: PgBouncer, tmp_path: Path) -> None:
    """Two workers started at once on a database with no tables, both through
    PgBouncer: the migrations' lock holds across their transactions (a
    session's lock would stay behind on whichever server session took it),
    each migration is applied once, and both go on to run."""
    with scratch_database(server_url, "jobs_pgb_empty", owner=False) as direct_url:
        name = urlsplit(direct_url).path.lstrip("/")
        empty = Database(name, direct_url, bouncer.url(name))
        assert len(bouncer.warm(name)) == 4
        with workers(tmp_path, empty, CHAOS_QUEUES="m") as start:
            pair = [start(), start()]
            for worker in pair:
                wait_ready(worker)
            codes = [w.stop() for w in pair]
        conn = psycopg2.connect(direct_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT version FROM schema_migrations ORDER BY version")
                versions = [r[0] for r in cur.fetchall()]
                # PgBouncer keeps its server sessions open: a session's lock
                # taken on one and released on another would still be held.
                cur.execute(
                    "SELECT l.pid, a.state FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                    " WHERE l.locktype = 'advisory' AND a.datname = current_database()"
                )
                left = cur.fetchall()
        finally:
            conn.close()
        bouncer.forget(name)
    assert codes == [0, 0], [w.text()[-2000:] for w in pair]
    assert versions == [version for version, _, _ in migrations()]
    assert left == [], "an advisory lock outlived the migrations"
    applied = [line for w in pair for line in w.lines("applied migration")]
    assert len(applied) == len(versions), applied
    assert pair[0].problems() == [] and pair[1].problems() == []


# --- two workers: FIFO, no overlap, every job once ----------------------------

FIFO_QUEUES = ["c0", "c1", "c2", "c3"]


def test_two_workers_keep_fifo_and_never_overlap(db: DB, database: Database, tmp_path: Path) -> None:
    """Two worker processes on four concurrency-1 queues, 200 jobs enqueued in
    batches while they run: each queue's runs start in id order, never two at
    once across the processes, and every job finishes exactly once."""
    inserted: set[int] = set()
    env = {"CHAOS_QUEUES": ",".join(FIFO_QUEUES), "CHAOS_SLEEP_MS": "0,10"}
    with workers(tmp_path, database, **env) as start:
        pair = [start(), start()]
        for worker in pair:
            wait_ready(worker)
        conn = psycopg2.connect(database.pooled_url)
        try:
            # Many small batches apart in time: each finds the queues idle, so
            # the two processes race for them again. A race is won whole (the
            # woken worker claims all its queues in one group commit, and a busy
            # queue stays with the worker whose outcome write claims its next
            # job), so a few large batches could all go to one worker.
            for batch in range(25):
                jobs = [Job(FIFO_QUEUES[i % 4], "chaos.Run", {"batch": batch, "n": i}) for i in range(8)]
                with conn:
                    inserted.update(insert_many(conn, jobs))
                time.sleep(0.1)
        finally:
            conn.close()
        wait_for(lambda: all_done(db), timeout=60, every=0.1)
        codes = [w.stop() for w in pair]
    assert codes == [0, 0], [w.text()[-2000:] for w in pair]
    assert len(inserted) == 200
    report = analyse(db, inserted, killed_at={})
    assert_clean(report)
    assert report.max_overlap == 1
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'ok' AND attempts = 1 AND last_error IS NULL") == (
        200,
    )
    assert sorted(r.job_id for r in report.runs) == sorted(inserted)  # one start each
    share = [sum(r.pid == w.pid for r in report.runs) for w in pair]
    assert all(share), f"one of the workers ran nothing: {share}"
    for worker in pair:
        assert worker.problems() == []


# --- wakeups over the direct URL -----------------------------------------------


def test_listen_on_the_direct_url_wakes_the_worker(
    db: DB, database: Database, bouncer: PgBouncer, tmp_path: Path
) -> None:
    """Polls a minute apart, so only a wakeup starts a job soon: a job another
    process commits through PgBouncer starts within seconds. (A LISTEN through
    the pooler would be accepted and never hear a thing: a transaction pooler
    hands the session on once the statement is done.)"""
    with workers(tmp_path, database, JOBS_POLL_INTERVAL="60", CHAOS_POLL_INTERVAL="60", CHAOS_QUEUES="w") as start:
        worker = start()
        wait_ready(worker)
        wait_for(lambda: "listening for wakeups" in worker.text(), timeout=10)
        # On the server itself, not through the pooler.
        assert listeners(db) == 1 and "jobs-listener" not in pooled_names(bouncer, database)
        ids = []
        for _ in range(2):
            time.sleep(0.5)  # idle again, in its minute-long wait
            done = run_python(
                "import psycopg2\n"
                "from lib.insert import insert\n"
                f"conn = psycopg2.connect({database.pooled_url!r})\n"
                "with conn:\n"
                "    print(insert(conn, 'w', 'chaos.Run'))\n"
            )
            assert done.returncode == 0, done.stderr
            ids.append(int(done.stdout))
            try:
                wait_for(lambda: started(db, ids[-1]), timeout=10)
            except AssertionError:
                raise AssertionError(f"job {ids[-1]} not started in 10 s:\n{worker.text()[-3000:]}") from None
        assert worker.stop() == 0
    assert all(lat <= MARGIN for lat in latencies(db, ids)), latencies(db, ids)
    assert worker.problems() == []


# --- SIGTERM hands over ----------------------------------------------------------


def test_sigterm_lets_the_job_finish_and_the_next_worker_takes_over(db: DB, database: Database, tmp_path: Path) -> None:
    """SIGTERM mid-job: the job ends within the shutdown window, the worker
    exits 0 without claiming more; a worker started after it runs the rest.
    Nothing lost, nothing run twice, no overlap."""
    queues = ["h0", "h1"]
    jobs = [Job(q, "chaos.Run", {"n": n}, max_attempts=3) for n in range(3) for q in queues]
    inserted = set(insert_many(db, jobs))
    window = 5.0
    env = {"CHAOS_QUEUES": ",".join(queues), "CHAOS_SLEEP_MS": "600,900", "JOBS_SHUTDOWN_WINDOW": str(window)}
    with workers(tmp_path, database, **env) as start:
        first = start()
        wait_ready(first)
        wait_for(lambda: in_flight(db, first.pid), timeout=10, every=0.02)
        first.terminate()
        assert first.popen.wait(timeout=window + 10) == 0, first.text()[-3000:]
        exited = time.time()
        second = start()
        wait_for(lambda: all_done(db), timeout=30, every=0.1)
        assert second.stop() == 0, second.text()[-3000:]
    assert first.termed_at is not None
    assert exited - first.termed_at <= window + MARGIN
    assert "stopping: no new claims; " in first.text()
    report = analyse(db, inserted, killed_at={})
    assert_clean(report)
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'ok' AND attempts = 1 AND last_error IS NULL") == (
        len(inserted),
    )
    firsts = [r for r in report.runs if r.pid == first.pid]
    seconds = [r for r in report.runs if r.pid == second.pid]
    assert any(r.start < first.termed_at < (r.end or 0) for r in firsts), "no job was running at SIGTERM"
    # A claim already on its way when the signal came may still land.
    assert all(r.start < first.termed_at + 0.5 for r in firsts), "the first worker claimed after SIGTERM"
    assert seconds and len(firsts) + len(seconds) == len(inserted)
    assert first.problems() == [] and second.problems() == []


def test_sigterm_past_the_window_writes_the_job_off(db: DB, database: Database, tmp_path: Path) -> None:
    """A job longer than the shutdown window is interrupted and written off
    through PgBouncer (its last attempt: it is not run again), the worker
    exits 0, and the next worker runs what was waiting behind it."""
    slow = insert(db, "h0", "chaos.Run", max_attempts=1)
    behind = insert(db, "h0", "chaos.Run", max_attempts=1)
    with workers(tmp_path, database, CHAOS_QUEUES="h0", JOBS_SHUTDOWN_WINDOW="0.5") as start:
        first = start(CHAOS_SLEEP_MS="60000,60000")
        wait_ready(first)
        wait_for(lambda: in_flight(db, first.pid), timeout=10, every=0.02)
        first.terminate()
        assert first.popen.wait(timeout=0.5 + 10) == 0, first.text()[-3000:]
        assert first.termed_at is not None and time.time() - first.termed_at <= 0.5 + MARGIN + 1
        second = start(CHAOS_SLEEP_MS="0,0")
        wait_for(lambda: started(db, behind) and all_done_but(db, slow), timeout=30, every=0.1)
        assert second.stop() == 0, second.text()[-3000:]
    row = db.query_row("SELECT status, attempts, finished_at IS NOT NULL, lease_until FROM jobs WHERE id = %s", (slow,))
    assert row == ("err: interrupted", 1, True, None)
    assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (behind,)) == ("ok", 1)
    runs = db.query("SELECT job_id, pid FROM chaos_runs WHERE event = 'start' ORDER BY at")
    assert runs == [(slow, first.pid), (behind, second.pid)]
    assert first.problems("interrupting 1 running jobs") == []
    assert second.problems() == []


# --- no direct URL: the worker polls -------------------------------------------


def test_without_a_direct_url_the_worker_polls(db: DB, database: Database, tmp_path: Path) -> None:
    """No DATABASE_DIRECT_URL: no LISTEN anywhere, one warning at start, and
    jobs start at the next poll (JOBS_POLL_INTERVAL), not at once: with
    inserts 1 s apart and polls 3 s apart, two of four inserts fall between the
    same two polls, and their waits differ by about a second."""
    # The queue's own fallback poll is two minutes: the setting is what polls.
    with workers(tmp_path, database, direct=False, CHAOS_QUEUES="p", CHAOS_POLL_INTERVAL="120") as start:
        worker = start(JOBS_POLL_INTERVAL="1")
        wait_ready(worker)
        said = worker.lines(NO_DIRECT)
        assert len(said) == 1 and "poll" in said[0] and " WARNING " in said[0], worker.text()[-3000:]
        assert listeners(db) == 0
        quick = []
        for pause in (0.2, 0.5, 0.8):
            time.sleep(pause)  # idle, somewhere between two polls
            quick.append(enqueue(database.pooled_url, "p"))
            wait_for(lambda: started(db, quick[-1]), timeout=1 + MARGIN + 5)
        assert worker.stop() == 0, worker.text()[-3000:]
        assert all(lat <= 1 + MARGIN for lat in latencies(db, quick)), latencies(db, quick)
        assert worker.problems(NO_DIRECT) == []
        assert len(worker.lines(NO_DIRECT)) == 1  # once, not once per queue or per poll

        slow = start(JOBS_POLL_INTERVAL="3")
        wait_ready(slow)
        spread = []
        for _ in range(4):
            spread.append(enqueue(database.pooled_url, "p"))
            time.sleep(1.0)
        wait_for(lambda: all_done(db), timeout=3 + MARGIN + 5, every=0.1)
        assert slow.stop() == 0, slow.text()[-3000:]
    waits = latencies(db, spread)
    assert all(lat <= 3 + MARGIN for lat in waits), waits
    # A wakeup would start each within milliseconds: all alike.
    assert max(waits) - min(waits) >= 0.5, waits
    assert slow.problems(NO_DIRECT) == []


# --- the pooler is really in the path --------------------------------------------


def test_the_worker_is_a_client_of_pgbouncer(db: DB, database: Database, bouncer: PgBouncer, tmp_path: Path) -> None:
    """PgBouncer's own console lists the worker's connections to this
    database, and counts its transactions there; its LISTEN connection is
    not among them but on the server itself."""

    def xacts() -> int:
        rows = [r for r in bouncer.show("STATS") if r["database"] == database.name]
        return int(rows[0]["total_xact_count"]) if rows else 0

    before = xacts()
    with workers(tmp_path, database, CHAOS_QUEUES="s") as start:
        worker = start()
        wait_ready(worker)
        ids = [enqueue(database.pooled_url, "s") for _ in range(5)]
        wait_for(lambda: all_done(db), timeout=30, every=0.1)
        names = pooled_names(bouncer, database)
        assert listeners(db) == 1
        assert worker.stop() == 0, worker.text()[-3000:]
    assert "jobs" in names, names
    assert "jobs-listener" not in names
    # Claims, outcomes and the runs' records: more than one transaction a job.
    assert xacts() - before > len(ids)
    assert worker.problems() == []


# --- a pooler the settings do not name ---------------------------------------------


def test_a_listen_through_the_pooler_is_named_once(database: Database, tmp_path: Path) -> None:
    """DATABASE_DIRECT_URL pointed at the pooler by mistake: the LISTEN is
    accepted and would never hear a thing, so the worker says so, once."""
    with workers(tmp_path, database, direct=False, DATABASE_DIRECT_URL=database.pooled_url) as start:
        worker = start()
        wait_ready(worker)
        wait_for(lambda: "listening for wakeups" in worker.text(), timeout=10)
        assert worker.stop() == 0
    assert len(worker.lines("the LISTEN connection goes through a connection pooler")) == 1, worker.text()


def _migrate_through(url: str) -> subprocess.CompletedProcess[str]:
    """`python worker.py migrate` with DATABASE_URL=url and nothing of the suite's pooler settings."""
    env = {k: v for k, v in os.environ.items() if k not in OUTER}
    return subprocess.run(
        [sys.executable, "worker.py", "migrate"],
        cwd=APP.parents[2],
        env={**env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_database_url_through_a_pooler_without_jobs_pooler_is_named(database: Database) -> None:
    """JOBS_POOLER unset with DATABASE_URL at PgBouncer: said before the first
    statement that needs a session (here a migration's), whatever comes of it."""
    done = _migrate_through(database.pooled_url)
    said = [line for line in done.stderr.splitlines() if "DATABASE_URL goes through a connection pooler" in line]
    assert len(said) == 1, done.stderr
    # And never for the server itself.
    direct = _migrate_through(database.direct_url)
    assert direct.returncode == 0, direct.stderr
    assert "connection pooler" not in direct.stderr
