"""Chaos: real worker processes on a private Postgres, killed, cut off and
restarted under them while they work, some of them on a link that stalls for
longer than the lease, with rows held by another session meanwhile; then the
guarantees are checked from the tables alone (FIFO, concurrency, no double claim, nothing lost, outliving a
restart, SIGTERM; each one's place is in
ARCHITECTURE.md).

Every run is recorded by the worker in chaos_runs (see apps/chaos_worker.py):
a `start` row when the handler begins and an `end` row when it is done, with
the worker's pid; a worker on the stalling link records them directly, so
they are stamped when they happen. Set CHAOS_SEED to replay a run's schedule.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import pytest
from chaos_server import ChaosServer, worker_env
from proxy import Proxy

from lib.insert import Job, insert_many
from lib.store.db import DB
from lib.store.migrate import migrate

pytestmark = pytest.mark.chaos

APP = Path(__file__).parent.parent / "apps" / "chaos_worker.py"
# Short, so a killed worker's jobs come back within seconds, not half a minute.
LEASE_SECONDS = 3.0
SHUTDOWN_WINDOW = 10.0
# Seconds a start record sent just before a SIGKILL may wait for the server.
IN_FLIGHT = 1.0
MAX_ATTEMPTS = 3

CHAOS_RUNS = """
CREATE TABLE chaos_runs (
  job_id bigint NOT NULL,
  queue text NOT NULL,
  attempt int NOT NULL,
  pid int NOT NULL,
  event text NOT NULL CHECK (event IN ('start', 'end')),
  at timestamptz NOT NULL
)"""


# --- the server, the database, the worker processes -------------------------


@pytest.fixture(scope="module")
def chaos_server() -> Iterator[ChaosServer]:
    with ChaosServer() as server:
        yield server


@pytest.fixture
def chaos_db(chaos_server: ChaosServer) -> Iterator[tuple[str, DB]]:
    """A migrated database of its own with an empty chaos_runs table, and a
    pool on it that checks every connection before use, since the test
    restarts the server under it."""
    url = chaos_server.database()
    db = DB.connect(url, size=4, ping_after=0.0, application_name="chaos-test")
    try:
        migrate(db)
        db.exec(CHAOS_RUNS)
        yield url, db
    finally:
        db.close()


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path
    killed_at: float | None = None  # wall clock just after SIGKILL
    termed_at: float | None = None  # wall clock just before SIGTERM
    dies: bool = False  # set to SIGKILL itself in a group commit (CHAOS_DIE_IN_BATCH)
    stalls: bool = False  # reaches the server through the stalling proxy

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def ready(self) -> bool:
        """Past migrations and running its pollers."""
        return " running " in self.log.read_text(errors="replace")


class Workers:
    """The worker processes of one test; every one is reaped on exit, whatever
    happened."""

    def __init__(self, url: str, log_dir: Path, **env: str) -> None:
        self.env = worker_env(
            url,
            JOBS_LEASE_SECONDS=str(LEASE_SECONDS),
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
            **env,
        )
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, proxy: Proxy | None = None, **env: str) -> Proc:
        """A new worker; with proxy, it reaches the server through it and
        records its runs directly."""
        if proxy is not None:
            env = {**env, "DATABASE_URL": proxy.url, "CHAOS_RECORD_URL": self.env["DATABASE_URL"]}
        log = self.log_dir / f"worker-{len(self.procs)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, str(APP), "--shutdown-window", str(SHUTDOWN_WINDOW)],
                env={**self.env, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(popen, log, dies="CHAOS_DIE_IN_BATCH" in env, stalls=proxy is not None)
        self.procs.append(proc)
        return proc

    def alive(self) -> list[Proc]:
        return [p for p in self.procs if p.popen.poll() is None]

    def all_ready(self) -> bool:
        return all(p.ready() for p in self.alive())

    def kill(self, proc: Proc) -> None:
        proc.popen.send_signal(signal.SIGKILL)
        proc.killed_at = time.time()
        proc.popen.wait(timeout=10)

    def terminate(self, proc: Proc) -> None:
        proc.termed_at = time.time()
        proc.popen.send_signal(signal.SIGTERM)

    def died_in_batch(self) -> list[Proc]:
        """Processes that killed themselves in a group commit, as they were
        set to, just now: noted as killed then."""
        died = [p for p in self.procs if p.dies and p.killed_at is None and p.popen.poll() == -signal.SIGKILL]
        for proc in died:
            proc.killed_at = time.time()
        return died

    def unexpected_exits(self) -> list[Proc]:
        """Processes that ended although nobody signalled them. The one set to
        die in a group commit, dead of its own SIGKILL, is not one: it may die
        after this loop's died_in_batch looked, and the next look notes it."""
        return [
            p
            for p in self.procs
            if p.popen.poll() is not None
            and p.killed_at is None
            and p.termed_at is None
            and not (p.dies and p.popen.returncode == -signal.SIGKILL)
        ]

    def stop_all(self, timeout: float) -> None:
        """SIGTERM every live process and wait for each, SIGKILL past timeout."""
        for proc in self.alive():
            self.terminate(proc)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(proc)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait(timeout=10)


def wait_until(what: str, predicate: Callable[[], bool], timeout: float, tick: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting until {what}")
        time.sleep(tick)


# --- reading the outcome back ------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    id: int
    queue: str
    status: str
    attempts: int
    max_attempts: int | None
    last_error: str | None


@dataclass
class Run:
    """One attempt of a job as its handler recorded it."""

    job_id: int
    queue: str
    attempt: int
    pid: int
    start: float
    end: float | None = None
    cut: bool = False  # no end was recorded: the end is when its process was killed

    @property
    def until(self) -> float:
        return max(self.start, self.end if self.end is not None else self.start)


@dataclass
class Report:
    jobs: dict[int, JobRow]
    runs: list[Run]
    # (job_id, attempt) -> how many start rows it has: more than one is a double claim.
    starts: dict[tuple[int, int], int]
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    max_overlap: int = 0

    def fail(self, check: str, detail: str) -> None:
        self.violations[check].append(detail)


def read_jobs(db: DB) -> dict[int, JobRow]:
    rows = db.query("SELECT id, queue, status, attempts, max_attempts, last_error FROM jobs")
    return {r[0]: JobRow(*r) for r in rows}


def read_runs(db: DB) -> tuple[list[Run], dict[tuple[int, int], int]]:
    """Runs from chaos_runs: one per start row, with the earliest end row of the
    same (job, attempt, pid) when there is one (a retried end write may leave two)."""
    rows = db.query(
        "SELECT job_id, queue, attempt, pid, event, extract(epoch FROM at)::float8 FROM chaos_runs ORDER BY at"
    )
    runs: list[Run] = []
    ends: dict[tuple[int, int, int], float] = {}
    starts: dict[tuple[int, int], int] = defaultdict(int)
    for job_id, queue, attempt, pid, event, at in rows:
        if event == "start":
            runs.append(Run(job_id, queue, attempt, pid, at))
            starts[(job_id, attempt)] += 1
        else:
            ends.setdefault((job_id, attempt, pid), at)
    for run in runs:
        run.end = ends.get((run.job_id, run.attempt, run.pid))
    return runs, starts


def close_open_runs(report: Report, killed_at: dict[int, float]) -> None:
    """A run with no end was cut short: only SIGKILL may do that, so it ended
    when its process was killed, or earlier, when the same process started
    the queue's next job (one poller runs one job at a time).

    The start time is the server's, stamped when it ran the start record, and
    the kill time is this process's, taken just after the signal: a record
    sent just before the kill may run a little after that (a process that
    inserts in a loop, killed 60 times, had its last row stamped after the
    kill 6 times, by up to 0.1 ms). Its handler never ran past the kill, so
    the run ended as it began. A start later than IN_FLIGHT after the kill is
    no such record."""
    later: dict[tuple[str, int], list[float]] = defaultdict(list)
    for run in report.runs:
        later[(run.queue, run.pid)].append(run.start)
    for run in report.runs:
        if run.end is not None:
            continue
        kill = killed_at.get(run.pid)
        if kill is None or run.start > kill + IN_FLIGHT:
            report.fail("open run", f"job {run.job_id} attempt {run.attempt} by pid {run.pid} never ended")
            run.end = float("inf")
            continue
        following = [s for s in later[(run.queue, run.pid)] if s > run.start]
        run.end = max(run.start, min([kill, *following]))
        run.cut = True


def check_statuses(report: Report, inserted: set[int]) -> None:
    """Nothing lost, nothing stuck: every committed job is in the table and
    reached a terminal status, or waits for a retry it is entitled to."""
    found = set(report.jobs)
    if found != inserted:
        report.fail(
            "lost or extra jobs", f"missing {sorted(inserted - found)[:10]}, extra {sorted(found - inserted)[:10]}"
        )
    for job in report.jobs.values():
        allowed = job.max_attempts or 1
        if job.attempts > allowed:
            report.fail("attempts", f"job {job.id}: {job.attempts} attempts of {allowed}")
        if job.status == "ok":
            continue
        if job.status == "pending":
            if job.attempts >= allowed:
                report.fail("stuck", f"job {job.id} pending after its last attempt")
            continue
        if not job.status.startswith("err: "):
            report.fail("status", f"job {job.id}: {job.status!r}")
        elif job.attempts < allowed:
            report.fail("gave up early", f"job {job.id}: {job.status!r} after {job.attempts} of {allowed}")


def check_runs_match_jobs(report: Report) -> None:
    """Each attempt started at most once (no row claimed twice for one
    attempt); an ok job's last attempt ran to its end; a job ran again only
    after a failure or an interruption, which leaves last_error behind."""
    for (job_id, attempt), n in report.starts.items():
        if n > 1:
            report.fail("double claim", f"job {job_id} attempt {attempt} started {n} times")
        job = report.jobs.get(job_id)
        if job is None or attempt > job.attempts:
            report.fail("phantom run", f"job {job_id} attempt {attempt} has no such claim")
    ended = {(r.job_id, r.attempt) for r in report.runs if r.end is not None and not r.cut}
    for job in report.jobs.values():
        if job.status == "ok" and (job.id, job.attempts) not in ended:
            report.fail("ok without run", f"job {job.id} is ok but attempt {job.attempts} has no start and end")
        if job.attempts > 1 and job.last_error is None:
            report.fail("silent rerun", f"job {job.id} ran {job.attempts} times with no error recorded")


def check_no_overlap(report: Report) -> None:
    """At most one run of a concurrency-1 queue at any instant, across all
    processes: a sweep over every run's [start, end]."""
    by_queue: dict[str, list[Run]] = defaultdict(list)
    for run in report.runs:
        by_queue[run.queue].append(run)
    for queue, runs in by_queue.items():
        # At one instant ends go before starts (back to back is no overlap),
        # except the end of a run that lasted no time at all.
        starts = [(r.start, 1, r) for r in runs]
        ends = [(r.until, 2 if r.until == r.start else 0, r) for r in runs]
        active: list[Run] = []
        for _, kind, run in sorted(starts + ends, key=lambda e: (e[0], e[1])):
            if kind != 1:
                active.remove(run)
                continue
            if active:
                other = active[0]
                report.fail(
                    "overlap",
                    f"{queue}: job {run.job_id}/{run.attempt} (pid {run.pid}) started at {run.start:.3f} "
                    f"while job {other.job_id}/{other.attempt} (pid {other.pid}) ran until {other.until:.3f}",
                )
            active.append(run)
            report.max_overlap = max(report.max_overlap, len(active))


def check_fifo(report: Report) -> None:
    """First attempts start in id order per queue: the head of a queue is never
    passed over. Retries and rescues come back later by design, so only first
    attempts are compared."""
    by_queue: dict[str, list[Run]] = defaultdict(list)
    for run in sorted(report.runs, key=lambda r: r.start):
        if run.attempt == 1:
            by_queue[run.queue].append(run)
    for queue, runs in by_queue.items():
        for before, after in itertools.pairwise(runs):
            if after.job_id < before.job_id:
                report.fail("fifo", f"{queue}: job {after.job_id} started after job {before.job_id}")


def analyse(db: DB, inserted: set[int], killed_at: dict[int, float]) -> Report:
    runs, starts = read_runs(db)
    report = Report(read_jobs(db), runs, starts)
    close_open_runs(report, killed_at)
    check_statuses(report, inserted)
    check_runs_match_jobs(report)
    check_no_overlap(report)
    check_fifo(report)
    return report


def dump(db: DB, folder: Path) -> None:
    """The tables as text beside the worker logs, to read a failure after the
    private server is gone."""
    for name, sql in (
        (
            "jobs.tsv",
            "SELECT id, queue, status, attempts, max_attempts, last_error, worker_id, run_at, started_at, finished_at FROM jobs ORDER BY id",
        ),
        ("chaos_runs.tsv", "SELECT job_id, queue, attempt, pid, event, at FROM chaos_runs ORDER BY at"),
    ):
        rows = db.query(sql)
        (folder / name).write_text("".join("\t".join(map(str, row)) + "\n" for row in rows))


def assert_clean(report: Report) -> None:
    if report.violations:
        lines = [f"{check} ({len(found)}): " + "; ".join(found[:5]) for check, found in report.violations.items()]
        raise AssertionError("guarantees broken:\n" + "\n".join(lines))


def quiescent(db: DB) -> bool:
    """Nothing running and nothing due: what remains waits for a retry."""
    started, due = db.query_row(
        "SELECT count(*) FILTER (WHERE status = 'started'),"
        " count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) FROM jobs"
    )
    return started == 0 and due == 0


def count(db: DB, where: str) -> int:
    return db.query_row(f"SELECT count(*) FROM jobs WHERE {where}")[0]


# --- test 1: kills, a restart and cut connections under three workers --------

QUEUES = ["c0", "c1", "c2", "c3"]
BATCHES = 10
BATCH_SIZE = 300  # 3000 jobs in all
BATCH_EVERY = 1.5  # seconds: inserts go on while the chaos does
KILLS = 4
TERMINATIONS = 3
WORKERS = 3
CHAOS_WINDOW = 20.0  # seconds in which the kills, the restart and the cuts fall
DEADLINE = 120.0  # the whole run, chaos and drain, or the test fails
STALLS = 2
# Longer than a lease and a rescue period: the stalled worker's job is taken over meanwhile.
STALL_SECONDS = (LEASE_SECONDS + 1.5, 2 * LEASE_SECONDS)
STALL_WINDOW = 0.4 * CHAOS_WINDOW  # stalls begin in it: their long runs end within the run
LONG_RUN = 2 * LEASE_SECONDS  # seconds: the stalled handler would outlive the takeover
ARM_SECONDS = 4.0  # how long a stall waits for a proxied worker to run a long job
ROW_LOCKS = 2
ROW_LOCK_SECONDS = (1.0, 2 * LEASE_SECONDS)


@dataclass
class Plan:
    """When each blow falls, in seconds from the start; drawn from a seed."""

    seed: int
    kills: list[float]
    restart: float
    terminations: list[float]
    stalls: list[tuple[float, float]]  # (when, for how long) the proxied workers' link stalls
    row_locks: list[tuple[float, float]]  # (when, for how long) another session holds a started row

    @classmethod
    def draw(cls, seed: int) -> Plan:
        rng = random.Random(seed)
        return cls(
            seed,
            kills=sorted(rng.uniform(2.0, CHAOS_WINDOW) for _ in range(KILLS)),
            restart=rng.uniform(0.3 * CHAOS_WINDOW, 0.7 * CHAOS_WINDOW),
            terminations=sorted(rng.uniform(1.0, CHAOS_WINDOW) for _ in range(TERMINATIONS)),
            stalls=sorted((rng.uniform(2.0, STALL_WINDOW), rng.uniform(*STALL_SECONDS)) for _ in range(STALLS)),
            row_locks=sorted(
                (rng.uniform(2.0, CHAOS_WINDOW), rng.uniform(*ROW_LOCK_SECONDS)) for _ in range(ROW_LOCKS)
            ),
        )


@dataclass
class Chaos:
    """The state of a chaos run as the loop advances it."""

    plan: Plan
    rng: random.Random
    inserted: set[int] = field(default_factory=set)
    batches: int = 0
    kills: int = 0
    terminated: int = 0
    terminations: int = 0
    restarted: bool = False
    died_in_batch: int = 0  # workers that killed themselves in a group commit
    replacements: list[float] = field(default_factory=list)  # when to start one
    started: int = 0  # workers the plan started: every other one goes through the stalling proxy


def insert_batch(db: DB, chaos: Chaos) -> None:
    """One batch spread over the queues, ids increasing within each queue."""
    jobs = [
        Job(QUEUES[i % len(QUEUES)], "chaos.Run", {"batch": chaos.batches, "n": i}, max_attempts=MAX_ATTEMPTS)
        for i in range(BATCH_SIZE)
    ]
    chaos.inserted.update(insert_many(db, jobs))
    chaos.batches += 1


class Stalls:
    """The planned stalls of the proxy some workers reach the server through,
    one at a time. Each first inserts a long job on every queue and stalls
    once a worker on the proxy runs one (or ARM_SECONDS later all the same):
    the handler that may not outlive its lease is then mid-run.

    A stall falls only while a worker past its start-up reaches the server
    through the proxy: kills may have taken every such worker, and the
    replacements of the plan's last kills may all have started while the
    link was stalled or a stall was armed (they are not sent through it
    then), so a stall due with none alive asks for one (needs_worker) and
    arms once it runs; a stall armed whose worker is killed meanwhile is
    armed again rather than falling on nobody."""

    def __init__(self, plan: list[tuple[float, float]], proxy: Proxy, db: DB, inserted: set[int]) -> None:
        self.plan = plan
        self.proxy = proxy
        self.db = db
        self.inserted = inserted
        self.done = 0
        self.armed: tuple[float, list[int]] | None = None  # since when, the long jobs
        self.until: float | None = None  # the end of the stall under way
        self.mid_run = 0  # stalls that fell on a proxied worker's long run
        self.long_jobs = 0
        self.fell_on: list[list[int]] = []  # per stall, the pids of the workers on the proxy when it fell
        self.rearmed = 0  # armed stalls whose every worker on the proxy was killed before they fell
        self.workers_asked = 0  # workers started through the proxy because a stall found none

    def step(self, elapsed: float, workers: Workers) -> None:
        if self.until is not None:
            if elapsed >= self.until:
                self.proxy.resume()
                self.until = None
                self.done += 1
            return
        if self.armed is not None:
            since, long_jobs = self.armed
            running = self._running_on_proxy(long_jobs, workers)
            if running or elapsed >= since + ARM_SECONDS:
                on_proxy = self._on_proxy(workers)
                if not on_proxy:
                    self.armed = None
                    self.rearmed += 1
                    print(
                        f"\nstall {self.done + 1} at {elapsed:.1f}s: every worker on the proxy was killed while it was armed; arming again"
                    )
                    return
                self.mid_run += running
                self.fell_on.append(on_proxy)
                self.proxy.stall()
                self.until = elapsed + self.plan[self.done][1]
                self.armed = None
            return
        # Only under workers past their start-up: one that cannot migrate exits.
        if self._due(elapsed) and workers.all_ready() and self._on_proxy(workers):
            jobs = [Job(q, "chaos.Run", {"ms": LONG_RUN * 1000}, max_attempts=MAX_ATTEMPTS) for q in QUEUES]
            long_jobs = insert_many(self.db, jobs)
            self.inserted.update(long_jobs)
            self.long_jobs += len(long_jobs)
            self.armed = (elapsed, long_jobs)

    def needs_worker(self, elapsed: float, workers: Workers) -> bool:
        """A stall is due and cannot fall: every worker has started up and none
        of them reaches the server through the proxy."""
        return (
            self._due(elapsed)
            and self.armed is None
            and self.until is None
            and workers.all_ready()
            and not self._on_proxy(workers)
        )

    def asked_worker(self, elapsed: float, proc: Proc) -> None:
        self.workers_asked += 1
        print(
            f"\nstall {self.done + 1} due at {self.plan[self.done][0]:.1f}s found no live worker on the proxy"
            f" at {elapsed:.1f}s: started {proc.log.stem} (pid {proc.pid}) through it"
        )

    def _due(self, elapsed: float) -> bool:
        return self.done < len(self.plan) and elapsed >= self.plan[self.done][0]

    @staticmethod
    def _on_proxy(workers: Workers) -> list[int]:
        return [p.pid for p in workers.alive() if p.stalls]

    def _running_on_proxy(self, long_jobs: list[int], workers: Workers) -> bool:
        pids = self._on_proxy(workers)
        rows = self.db.query(
            "SELECT 1 FROM chaos_runs s WHERE s.event = 'start' AND s.job_id = ANY(%s) AND s.pid = ANY(%s)"
            " AND NOT EXISTS (SELECT 1 FROM chaos_runs e WHERE e.event = 'end' AND e.job_id = s.job_id"
            " AND e.attempt = s.attempt AND e.pid = s.pid)",
            (long_jobs, pids),
        )
        return bool(rows)

    @property
    def stalled(self) -> bool:
        return self.until is not None

    @property
    def busy(self) -> bool:
        """Armed or stalled: a worker started now could be in its start-up when the link stalls."""
        return self.armed is not None or self.until is not None

    @property
    def finished(self) -> bool:
        return self.done == len(self.plan) and self.until is None and self.armed is None


class RowLocks:
    """The planned row locks: another session takes a started row, as a
    user's transaction might, and holds it for a while; one at a time.

    A lock due once every job has ended (the workers may drain the batches
    before the last lock falls) inserts a long job of its own to take, so
    there is always a started row to come."""

    def __init__(self, plan: list[tuple[float, float]], url: str, db: DB, inserted: set[int]) -> None:
        self.plan = plan
        self.url = url
        self.db = db
        self.inserted = inserted
        self.done = 0
        self.held: tuple[psycopg2.extensions.connection, float] | None = None
        self.rows: list[int] = []
        self.own_jobs = 0  # jobs inserted for a lock that found nothing left to run

    def step(self, elapsed: float) -> None:
        if self.held is not None:
            conn, until = self.held
            if elapsed >= until:
                self._end(conn, commit=True)
            return
        if self.done < len(self.plan) and elapsed >= self.plan[self.done][0]:
            self._take(elapsed + self.plan[self.done][1])

    def _take(self, until: float) -> None:
        """Lock a started row, if there is one now (else the next step tries again)."""
        try:
            conn = psycopg2.connect(self.url, application_name="chaos-lock", connect_timeout=10)
        except psycopg2.Error:
            return  # the server restarts: later
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT id FROM jobs WHERE status = 'started' ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED"
                )
                row = cur.fetchone()
        except psycopg2.Error:
            row = None  # the server restarts: later
        if row is None:
            self._end(conn, commit=False)
            if count(self.db, "status IN ('pending', 'started')") == 0:
                self._insert_own_job()
            return
        self.rows.append(row[0])
        self.held = (conn, until)

    def _insert_own_job(self) -> None:
        queue = QUEUES[self.done % len(QUEUES)]
        job = Job(queue, "chaos.Run", {"ms": LONG_RUN * 1000}, max_attempts=MAX_ATTEMPTS)
        self.inserted.update(insert_many(self.db, [job]))
        self.own_jobs += 1
        print(f"\nrow lock {self.done + 1} found no job left to run: inserted a long one on {queue} to take")

    def _end(self, conn: psycopg2.extensions.connection, commit: bool) -> None:
        try:
            if commit:
                conn.commit()
        except psycopg2.Error:
            pass  # a restart ended the session, and so the lock, already
        finally:
            conn.close()
        if self.held is not None:
            self.held = None
            self.done += 1

    @property
    def finished(self) -> bool:
        return self.done == len(self.plan) and self.held is None


@dataclass
class Faults:
    """The faults beyond kills and the server's: stalls and row locks."""

    stalls: Stalls
    locks: RowLocks

    def start(self, workers: Workers, chaos: Chaos, **env: str) -> Proc:
        """Every other worker goes through the stalling proxy, unless a stall
        is armed or under way: a worker cannot start through a stalled link."""
        proxied = chaos.started % 2 == 1 and not self.stalls.busy
        chaos.started += 1
        return workers.start(self.stalls.proxy if proxied else None, **env)

    def start_for_stall(self, elapsed: float, workers: Workers, chaos: Chaos) -> None:
        """A worker through the proxy when a stall is due and none is alive,
        once the worker set to die in a group commit has (it runs alone) and
        the replacements due have started (one of them may go through it)."""
        if chaos.died_in_batch and not chaos.replacements and self.stalls.needs_worker(elapsed, workers):
            self.stalls.asked_worker(elapsed, workers.start(self.stalls.proxy))


def step(chaos: Chaos, elapsed: float, db: DB, server: ChaosServer, workers: Workers, faults: Faults) -> None:
    """Do whatever is due at this moment of the run."""
    if chaos.batches < BATCHES and elapsed >= chaos.batches * BATCH_EVERY:
        insert_batch(db, chaos)
    for _ in workers.died_in_batch():
        chaos.died_in_batch += 1
        # It ran alone: now its replacement and the others.
        chaos.replacements.extend(elapsed + chaos.rng.uniform(0.0, 1.5) for _ in range(WORKERS))
    for due in [t for t in chaos.replacements if t <= elapsed]:
        chaos.replacements.remove(due)
        faults.start(workers, chaos)
    # Not the worker set to die in a group commit, while it has not: a kill
    # first would leave that crash untried. A kill with no other worker to
    # fall on waits for one.
    victims = [p for p in workers.alive() if not (p.dies and chaos.died_in_batch == 0)]
    if chaos.kills < len(chaos.plan.kills) and elapsed >= chaos.plan.kills[chaos.kills] and victims:
        workers.kill(chaos.rng.choice(victims))
        chaos.kills += 1
        # Replaced after a while: between blows two or three workers run.
        chaos.replacements.append(elapsed + chaos.rng.uniform(0.0, 1.5))
    faults.start_for_stall(elapsed, workers, chaos)
    faults.stalls.step(elapsed, workers)
    faults.locks.step(elapsed)
    # The server is cut only under workers past their start-up: a worker that
    # cannot migrate exits, as it should, and would be a false alarm here.
    if not workers.all_ready():
        return
    if not chaos.restarted and elapsed >= chaos.plan.restart:
        server.restart(down_seconds=1.0)
        chaos.restarted = True
    if chaos.terminations < len(chaos.plan.terminations) and elapsed >= chaos.plan.terminations[chaos.terminations]:
        chaos.terminated += server.terminate_backends("jobs%", limit=chaos.rng.randint(2, 8))
        chaos.terminations += 1


def finished(chaos: Chaos, db: DB, workers: Workers, faults: Faults) -> bool:
    blows_done = (
        chaos.batches == BATCHES
        and chaos.kills == len(chaos.plan.kills)
        and chaos.restarted
        and chaos.terminations == len(chaos.plan.terminations)
        and chaos.died_in_batch == 1
        and not chaos.replacements
        and faults.stalls.finished
        and faults.locks.finished
    )
    # A worker still starting up would die of SIGTERM before it handles it.
    return blows_done and workers.all_ready() and quiescent(db)


def drive(chaos: Chaos, db: DB, server: ChaosServer, workers: Workers, faults: Faults) -> None:
    """Run the plan until every blow has fallen and the jobs have settled."""
    began = time.monotonic()
    # One of them crashes in a group commit: after the server has answered an
    # outcome and claims, before its pollers hear of it. It starts alone, and
    # the others once it has died: a queue's slot stays with the worker that
    # claimed it, so beside the others it could hold no slot and wait for ever
    # for its Nth commit (one ran two jobs in two minutes); alone, it holds
    # every queue's and reaches it within its first jobs.
    faults.start(workers, chaos, CHAOS_DIE_IN_BATCH=str(chaos.rng.randint(5, 40)))
    while not finished(chaos, db, workers, faults):
        elapsed = time.monotonic() - began
        assert elapsed < DEADLINE, (
            f"not done after {DEADLINE:g}s: {status_counts(db)}; died in a group commit {chaos.died_in_batch},"
            f" kills {chaos.kills}, restarted {chaos.restarted}, terminations {chaos.terminations},"
            f" stalls {faults.stalls.done}, row locks {faults.locks.done}"
        )
        step(chaos, elapsed, db, server, workers, faults)
        crashed = workers.unexpected_exits()
        assert not crashed, f"a worker exited by itself:\n{crashed[0].output()}"
        time.sleep(0.05)


def test_chaos_keeps_every_guarantee(chaos_server: ChaosServer, chaos_db: tuple[str, DB], tmp_path: Path) -> None:
    url, db = chaos_db
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1 << 30))
    chaos = Chaos(Plan.draw(seed), random.Random(seed + 1))
    began = time.monotonic()
    proxy = Proxy(url)
    stalls = Stalls(chaos.plan.stalls, proxy, db, chaos.inserted)
    faults = Faults(stalls, RowLocks(chaos.plan.row_locks, url, db, chaos.inserted))
    with Workers(url, tmp_path) as workers:
        try:
            drive(chaos, db, chaos_server, workers, faults)
            workers.stop_all(timeout=SHUTDOWN_WINDOW + 10)
        finally:
            print(f"\nchaos seed {seed}; worker logs in {tmp_path}")
            proxy.close()
            if faults.locks.held is not None:
                faults.locks.held[0].close()
    for proc in workers.procs:
        if proc.termed_at is not None:
            assert proc.popen.returncode == 0, f"exit {proc.popen.returncode} after SIGTERM:\n{proc.output()}"
    killed_at = {p.pid: p.killed_at for p in workers.procs if p.killed_at is not None and p.termed_at is None}
    report = analyse(db, chaos.inserted, killed_at)
    print(summary(db, report, chaos, chaos_server.restarts, len(workers.procs), time.monotonic() - began))
    print(
        f"stalls={faults.stalls.done} mid_run={faults.stalls.mid_run} long_jobs={faults.stalls.long_jobs}"
        f" {chaos.plan.stalls}"
        f" stalled_workers={sum(p.stalls for p in workers.procs)} workers_asked={faults.stalls.workers_asked}"
        f" rearmed={faults.stalls.rearmed} fell_on={faults.stalls.fell_on}"
        f" row_locks={faults.locks.done} {chaos.plan.row_locks} rows={faults.locks.rows}"
        f" own_jobs={faults.locks.own_jobs}"
    )
    if report.violations:
        dump(db, tmp_path)
    assert_clean(report)
    # The chaos really happened, and the run really ran.
    assert chaos.kills == KILLS and chaos_server.restarts >= 1 and chaos.terminated > 0
    assert faults.stalls.done == STALLS and faults.locks.done == ROW_LOCKS
    # Each stall held the link of at least one live worker.
    assert len(faults.stalls.fell_on) == STALLS and all(faults.stalls.fell_on)
    assert report.max_overlap == 1
    assert len(report.jobs) == BATCHES * BATCH_SIZE + faults.stalls.long_jobs + faults.locks.own_jobs


def summary(db: DB, report: Report, chaos: Chaos, restarts: int, workers: int, seconds: float) -> str:
    retries = db.query_row("SELECT coalesce(sum(attempts - 1), 0) FROM jobs")[0]
    rescues = count(db, "last_error = 'err: interrupted'")
    pending = count(db, "status = 'pending'")
    errors = count(db, "status LIKE 'err:%'")
    return (
        f"chaos seed={chaos.plan.seed} jobs={len(report.jobs)} workers={workers} kills={chaos.kills} "
        f"died_in_group_commit={chaos.died_in_batch} restarts={restarts} terminated_connections={chaos.terminated} rescues={rescues} "
        f"retried_jobs={count(db, 'attempts > 1')} retries={retries} pending_retry={pending} errors={errors} "
        f"runs={len(report.runs)} max_overlap={report.max_overlap} seconds={seconds:.1f}"
    )


def status_counts(db: DB) -> list[tuple[str, int]]:
    return db.query("SELECT status, count(*) FROM jobs GROUP BY status ORDER BY 2 DESC LIMIT 8")


# --- test 2: SIGTERM hands a worker's queues over -------------------------------


def in_flight(db: DB, pid: int) -> set[str]:
    """The queues on which that worker is in the middle of a job."""
    rows = db.query(
        "SELECT s.queue FROM chaos_runs s WHERE s.event = 'start' AND s.pid = %s AND NOT EXISTS ("
        " SELECT 1 FROM chaos_runs e WHERE e.event = 'end' AND e.job_id = s.job_id AND e.attempt = s.attempt)",
        (pid,),
    )
    return {r[0] for r in rows}


def test_sigterm_hands_queues_over_without_overlap(chaos_db: tuple[str, DB], tmp_path: Path) -> None:
    """The first worker holds both queues; a second one starts; SIGTERM to the
    first while it runs a job: that job finishes, and the second worker takes
    both queues over, never running a queue's job beside the first's."""
    url, db = chaos_db
    queues = ["c0", "c1"]
    per_queue = 12
    jobs = [Job(q, "chaos.Run", {"n": n}, max_attempts=MAX_ATTEMPTS) for n in range(per_queue) for q in queues]
    inserted = set(insert_many(db, jobs))
    env = {"CHAOS_QUEUES": ",".join(queues), "CHAOS_SLEEP_MS": "200,500", "CHAOS_FAIL_RATE": "0"}
    with Workers(url, tmp_path, **env) as workers:
        victim = workers.start()
        wait_until("the first worker holds both queues", lambda: in_flight(db, victim.pid) == set(queues), timeout=30)
        survivor = workers.start()
        wait_until("the second worker runs", survivor.ready, timeout=30)
        wait_until("the first worker is in a job", lambda: bool(in_flight(db, victim.pid)), timeout=10, tick=0.02)
        workers.terminate(victim)
        victim.popen.wait(timeout=SHUTDOWN_WINDOW + 10)
        left_at = time.time()
        wait_until("every job is done", lambda: count(db, "status <> 'ok'") == 0, timeout=60)
        workers.stop_all(timeout=SHUTDOWN_WINDOW + 10)
    assert victim.popen.returncode == 0, victim.output()
    assert survivor.popen.returncode == 0, survivor.output()
    assert victim.termed_at is not None
    report = analyse(db, inserted, killed_at={})
    if report.violations:
        dump(db, tmp_path)
    assert_clean(report)
    # Nothing was interrupted or run twice: the first worker finished what it held.
    assert count(db, "attempts <> 1 OR last_error IS NOT NULL") == 0
    victim_runs = [r for r in report.runs if r.pid == victim.pid]
    assert any(r.start < victim.termed_at < (r.end or 0) for r in victim_runs), "no job was running at SIGTERM"
    assert all(r.start < victim.termed_at + 0.5 for r in victim_runs), "the first worker claimed after SIGTERM"
    for queue in queues:
        taken = [r for r in report.runs if r.queue == queue and r.pid == survivor.pid and r.start > left_at]
        assert taken, f"{queue} was not handed over to the second worker"
    print(
        f"\nsigterm handover: the first worker ran {len(victim_runs)} jobs, the second {len(report.runs) - len(victim_runs)}"
    )
