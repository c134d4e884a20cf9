"""What a second and a third worker replica add: 1, 2 and 3 worker processes,
each the real worker.main running all 40 no-op queues at concurrency 1,
sharing one database, in one run, next to the server's own commit rate.

Run from the project root:  .venv/bin/python bench/replicas.py [--jobs N] [--processes 1,2,3]

For each row, in a fresh database of the server (DATABASE_URL, else the
embedded one): the same backlog of --jobs no-op jobs, round robin over
q00..q39, enqueued with the queues paused; the processes start (compare.py's
worker app, as its "ours" side runs it) and go idle; all 40 queues are resumed
in one commit, which wakes every process at once. Each process count runs
shared (every process runs all 40 queues, as replicas of one deployment do)
and, unless --no-split, split (each process its own 40/n of the queues: what
more processes could add were the queues spread over them). Measured:

  - jobs/s, from the first job's start to the last job's outcome as the rows
    record them, and that over the commit rate (pgbench);
  - server transactions per job (pg_stat_database, less this benchmark's own);
  - jobs and CPU of each worker process, CPU of the server (the bench
    database's backends, and every process of the server), and the machine's
    busy and stolen CPU over the same window: where the limit is.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.apps.compare_support import OURS_JOB_NAME
from bench.compare import Side, concurrency, side_worker
from bench.harness import (
    CommitRate,
    MachineCpu,
    Scratch,
    Server,
    ServerMeter,
    WorkerProcess,
    add_pgbench_seconds,
    load_average,
    machine_cpu,
    postgres_cpu_seconds,
    process_cpu_seconds,
    processes_cpu,
    scratch_database,
    server_cpu_seconds,
    stop_all,
    vacuum_analyze,
)
from lib.insert import Job, insert_many
from lib.store.sql import Q

QUEUES = [f"q{i:02d}" for i in range(40)]
INSERT_CHUNK = 10_000
# The pause that holds the backlog until every process is up; the resume ends
# only a pause with this reason.
HOLD_REASON = "bench/replicas.py: held until every replica is up"
READY_TIMEOUT = 60.0
# An idle backend reports its transaction counts up to 10 s after it went idle
# (PGSTAT_IDLE_INTERVAL, PostgreSQL 15+): the workers' start-up is in the
# counter once they have been idle this long, and the count starts clean.
STATS_IDLE = 11.0
# How often the benchmark looks whether the backlog is done: a cheap look
# (two partial indexes, LIMIT 1 each), a few dozen times a run.
POLL_SECONDS = 0.25
# No outcome for this long: the run is reported incomplete, not waited on.
STALL_SECONDS = 30.0
# Jobs a row: 5-10 s for one process on two cores. Not sized from the commit
# rate: a transaction here carries tens of jobs, so the rate does not follow
# it, and every run then compares the same backlog.
DEFAULT_JOBS = 40_000

# The bench's look at progress, on its own connection: whether any job is
# still pending or started, and the last outcome so far (for the stall check).
PROGRESS_SQL = (
    "SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'pending')"
    " OR EXISTS (SELECT 1 FROM jobs WHERE status = 'started'),"
    " (SELECT max(finished_at) FROM jobs WHERE status NOT IN ('pending', 'started'))"
)
SPAN_SQL = (
    "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)),"
    " count(*) FILTER (WHERE status = 'ok') FROM jobs"
)


# Processes named in the record as the machine's other work, at most.
TOP_OTHER = 8

# ---------------------------------------------------------------- one process count


@dataclass
class Process:
    pid: int
    queues: int  # queues it runs
    worker_id: str = ""
    jobs: int = 0  # ok rows this process finished (the rows' worker_id)
    cpu_seconds: float | None = None  # over the window
    cpu_share: float | None = None  # of one core over the window


@dataclass
class Phase:
    processes: int
    mode: str  # "shared": every process runs all 40 queues; "split": each runs its own share of them
    jobs: int
    load_average_1m: float = 0.0  # at the phase's start: other work on the machine
    done: int = 0
    seconds: float = 0.0  # first start to last outcome, from the rows
    jobs_per_s: float = 0.0
    ratio: float = 0.0  # jobs/s over the commit rate
    speedup: float = 0.0  # jobs/s over the one-process row's
    xacts_per_job: float | None = None
    workers: list[Process] = field(default_factory=list)
    # CPU over the window (the resume's commit to the last outcome seen by the
    # benchmark), as a share of one core; None when not readable here.
    window_seconds: float = 0.0
    workers_cpu_share: float | None = None  # all worker processes together
    server_db_cpu_share: float | None = None  # the bench database's backends
    server_cpu_share: float | None = None  # every process of the server, other databases' included
    machine_busy_cores: float | None = None  # everything the machine ran, this benchmark's and others'
    machine_steal_cores: float | None = None
    machine_irq_cores: float | None = None  # in busy, charged to no process (loopback TCP among it)
    other_cpu_share: float | None = None  # busy less workers, server and this benchmark: other work
    # The processes that took the most CPU over the window, other than the
    # workers, this benchmark and the bench database's backends: who "other"
    # and the server's other databases were. [command, share of a core]
    top_other: list[tuple[str, float]] = field(default_factory=list)
    client_cpu_ms_per_job: float | None = None
    server_cpu_ms_per_job: float | None = None  # the bench database's backends
    statuses: dict[str, int] = field(default_factory=dict)
    complete: bool = False
    error: str | None = None


def fill(url: str, total: int) -> None:
    """total pending no-op jobs, round robin over the queues, all queues paused
    so that no process takes any before every process is up; then planner
    statistics and the visibility map as autovacuum would leave them."""
    conn = psycopg2.connect(url, application_name="jobs-bench-setup")
    try:
        with conn.cursor() as cur:
            for queue in QUEUES:
                cur.execute(Q.queue_pause, {"queue": queue, "until": None, "reason": HOLD_REASON})
        jobs = [Job(QUEUES[i % len(QUEUES)], OURS_JOB_NAME, {"seq": i}) for i in range(total)]
        for start in range(0, total, INSERT_CHUNK):
            insert_many(conn, jobs[start : start + INSERT_CHUNK])
        conn.commit()
    finally:
        conn.close()
    vacuum_analyze(url)


def listeners(scratch: Scratch) -> int:
    """Worker processes whose listener is connected: each process has one."""
    with scratch.admin.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = 'jobs-listener'",
            (scratch.name,),
        )
        return int(cur.fetchone()[0])


def wait_ready(scratch: Scratch, runs: list[WorkerProcess]) -> None:
    """Every process has connected its listener (after registering); its
    pollers find their queues paused and sleep until the resume wakes them."""
    deadline = time.monotonic() + READY_TIMEOUT
    while listeners(scratch) < len(runs):
        for run in runs:
            if run.proc.poll() is not None:
                raise RuntimeError(f"a worker exited with {run.proc.returncode}:\n{run.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every worker connected within {READY_TIMEOUT:g} s")
        time.sleep(0.1)


def settled_xacts(meter: ServerMeter) -> int:
    """The counter once the workers' start-up is all in it: they have been idle
    STATS_IDLE seconds, and two reads a second apart agree (or, should an idle
    worker's lease keeper keep moving it, the last read after 10 s more)."""
    time.sleep(STATS_IDLE)
    deadline = time.monotonic() + 10
    count, previous = meter.xacts_reported(), -1
    while count != previous and time.monotonic() < deadline:
        time.sleep(1.0)
        count, previous = meter.xacts_reported(), count
    return count


@dataclass
class CpuSnapshot:
    at: float  # perf_counter
    workers: list[float | None]
    backends: dict[int, float]  # the bench database's backends
    server: float | None  # the whole server
    machine: MachineCpu
    bench: float  # this process
    everyone: dict[int, tuple[str, float]]  # every process visible here


def snapshot(runs: list[WorkerProcess], meter: ServerMeter, postmaster: int | None) -> CpuSnapshot:
    backends: dict[int, float] = {}
    for pid in meter.backends():
        seconds = postgres_cpu_seconds(pid)
        if seconds is not None:
            backends[pid] = seconds
    return CpuSnapshot(
        time.perf_counter(),
        [process_cpu_seconds(run.proc.pid) for run in runs],
        backends,
        None if postmaster is None else server_cpu_seconds(postmaster),
        machine_cpu(),
        time.process_time(),
        processes_cpu(),
    )


def wait_done(conn: psycopg2.extensions.connection, runs: list[WorkerProcess]) -> tuple[int, str | None]:
    """Poll until no job is pending or started; (the polls sent, why it ended
    early or None)."""
    polls, last, since = 0, None, time.monotonic()
    while True:
        time.sleep(POLL_SECONDS)
        with conn.cursor() as cur:
            cur.execute(PROGRESS_SQL)
            busy, finished = cur.fetchone()
        polls += 1
        if not busy:
            return polls, None
        if any(run.proc.poll() is not None for run in runs):
            return polls, "a worker exited"
        if finished != last:
            last, since = finished, time.monotonic()
        elif time.monotonic() - since > STALL_SECONDS:
            return polls, f"no outcome for {STALL_SECONDS:g} s"


def share(after: float | None, before: float | None, seconds: float) -> float | None:
    if after is None or before is None or seconds <= 0:
        return None
    return (after - before) / seconds


def apply_cpu(phase: Phase, start: CpuSnapshot, end: CpuSnapshot) -> None:
    seconds = phase.window_seconds = end.at - start.at
    worker_seconds = []
    for process, before, after in zip(phase.workers, start.workers, end.workers, strict=True):
        if before is not None and after is not None:
            process.cpu_seconds = after - before
            process.cpu_share = process.cpu_seconds / seconds
            worker_seconds.append(process.cpu_seconds)
    if len(worker_seconds) == len(phase.workers):
        phase.workers_cpu_share = sum(worker_seconds) / seconds
        if phase.done:
            phase.client_cpu_ms_per_job = 1000 * sum(worker_seconds) / phase.done
    # A backend that closed during the window is lost here (the whole server's count keeps it).
    if end.backends:
        db_seconds = sum(cpu - start.backends.get(pid, 0.0) for pid, cpu in end.backends.items())
        phase.server_db_cpu_share = db_seconds / seconds
        if phase.done:
            phase.server_cpu_ms_per_job = 1000 * db_seconds / phase.done
    phase.server_cpu_share = share(end.server, start.server, seconds)
    phase.machine_busy_cores = (end.machine.busy - start.machine.busy) / seconds
    phase.machine_steal_cores = (end.machine.steal - start.machine.steal) / seconds
    phase.machine_irq_cores = (end.machine.irq - start.machine.irq) / seconds
    ours = {p.pid for p in phase.workers} | set(end.backends) | {os.getpid()}
    others = []
    for pid, (command, cpu) in end.everyone.items():
        if pid not in ours:
            # A process that started within the window counts from zero.
            before = start.everyone.get(pid, (command, 0.0))[1]
            others.append((command, (cpu - before) / seconds))
    others.sort(key=lambda other: -other[1])
    phase.top_other = [(command, round(cores, 3)) for command, cores in others[:TOP_OTHER] if cores >= 0.01]
    if phase.workers_cpu_share is not None and phase.server_cpu_share is not None:
        bench = (end.bench - start.bench) / seconds
        phase.other_cpu_share = phase.machine_busy_cores - phase.workers_cpu_share - phase.server_cpu_share - bench


def process_queues(count: int, mode: str) -> list[list[str]]:
    """The queues each process runs: all of them (shared), or dealt out so that
    each queue runs in one process only (split)."""
    if mode == "shared":
        return [QUEUES] * count
    return [QUEUES[i::count] for i in range(count)]


def run_phase(server: Server, count: int, mode: str, total: int) -> Phase:
    phase = Phase(count, mode, total, load_average())
    queues = process_queues(count, mode)
    side = Side()  # compare.py's "ours": worker.main, JOBS_HTTP_ADDR=off, LOG_LEVEL=WARNING
    with scratch_database(server) as scratch, tempfile.TemporaryDirectory(prefix="jobs-replicas-") as work:
        fill(scratch.url, total)
        meter = ServerMeter(scratch.admin, scratch.name)
        with ExitStack() as stack:
            runs = []
            for i in range(count):
                folder = Path(work) / f"p{i}"
                folder.mkdir()
                # target 0: no done file; the benchmark watches the table instead.
                runs.append(stack.enter_context(side_worker(side, scratch.url, queues[i], concurrency(1), 0, folder)))
            wait_ready(scratch, runs)
            # The benchmark's own connection, opened before the counter's first
            # read; its resume and polls are taken off the count.
            conn = psycopg2.connect(scratch.url, application_name="jobs-bench-replicas")
            stack.callback(conn.close)
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT id, pid FROM workers")
                worker_ids = {pid: worker_id for worker_id, pid in cur.fetchall()}
            phase.workers = [
                Process(run.proc.pid, len(q), worker_ids.get(run.proc.pid, ""))
                for run, q in zip(runs, queues, strict=True)
            ]
            postmaster = meter.postmaster()
            before = settled_xacts(meter)

            start = snapshot(runs, meter, postmaster)
            # Every queue at once, one commit: each process's listener hears all 40.
            conn.autocommit = False
            with conn.cursor() as cur:
                for queue in QUEUES:
                    cur.execute(Q.queue_resume, {"queue": queue, "prefix": HOLD_REASON})
            conn.commit()
            conn.autocommit = True
            polls, phase.error = wait_done(conn, runs)
            end = snapshot(runs, meter, postmaster)

            stop_all(runs)
            conn.close()
            if phase.error:
                print(runs[0].log_tail(), file=sys.stderr)
        # Less the resume's transaction and the polls; the processes' stop (a
        # few transactions each: their registry row, the last flushes) stays in.
        xacts = meter.xacts() - before - 1 - polls

        conn = psycopg2.connect(scratch.url, application_name="jobs-bench-replicas")
        try:
            with conn.cursor() as cur:
                cur.execute(SPAN_SQL)
                first, last, done = cur.fetchone()
                cur.execute("SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status")
                phase.statuses = dict(cur.fetchall())
                cur.execute("SELECT worker_id, count(*) FROM jobs WHERE status = 'ok' GROUP BY worker_id")
                by_worker = dict(cur.fetchall())
        finally:
            conn.close()
    for process in phase.workers:
        process.jobs = int(by_worker.get(process.worker_id, 0))
    phase.done = int(done)
    if phase.done and first is not None and last is not None:
        phase.seconds = float(last) - float(first)
        phase.jobs_per_s = phase.done / phase.seconds if phase.seconds > 0 else 0.0
        phase.xacts_per_job = xacts / phase.done
    apply_cpu(phase, start, end)
    phase.complete = phase.statuses == {"ok": total} and phase.error is None
    return phase


# ---------------------------------------------------------------- report


def _cell(value: float | None, scale: float = 100, digits: int = 0) -> str:
    return "n/a" if value is None else f"{scale * value:.{digits}f}"


def row_label(phase: dict[str, Any]) -> str:
    return str(phase["processes"]) if phase["processes"] == 1 else f"{phase['processes']} {phase['mode']}"


def print_table(result: dict[str, Any]) -> None:
    print(f"jobs         {result['options']['jobs']:,} no-op jobs a row, round robin over 40 queues, concurrency 1")
    print()
    header = (
        f"{'processes':<10}{'jobs/s':>7}{'x1':>6}{'ratio':>6}{'xacts/job':>10}  {'jobs %':<10}{'worker cpu %':<14}"
        f"{'db cpu %':>8}{'pg cpu %':>9}{'us/job':>8}{'busy':>6}{'steal':>6}{'other %':>8}{'load':>6}"
    )
    print(header)
    print("-" * len(header))
    for p in result["phases"]:
        jobs_by = "/".join(f"{100 * w['jobs'] / p['done']:.0f}" if p["done"] else "0" for w in p["workers"])
        cpu_by = "/".join(_cell(w["cpu_share"]) for w in p["workers"])
        client, server = p["client_cpu_ms_per_job"], p["server_cpu_ms_per_job"]
        per_job = "n/a" if client is None or server is None else f"{1000 * client:.0f}+{1000 * server:.0f}"
        label = row_label(p)
        print(
            f"{label:<10}{p['jobs_per_s']:>7,.0f}{p['speedup']:>6.2f}{p['ratio']:>6.2f}"
            f"{_cell(p['xacts_per_job'], 1, 3):>10}  {jobs_by:<10}{cpu_by:<14}"
            f"{_cell(p['server_db_cpu_share']):>8}{_cell(p['server_cpu_share']):>9}{per_job:>8}"
            f"{_cell(p['machine_busy_cores'], 1, 2):>6}{_cell(p['machine_steal_cores'], 1, 2):>6}"
            f"{_cell(p['other_cpu_share']):>8}{p['load_average_1m']:>6.2f}"
        )
        if not p["complete"]:
            print(f"  INCOMPLETE: {p['done']}/{p['jobs']} jobs ok, statuses {p['statuses']}, error {p['error']}")
    cpus = result["machine"]["cpus"]
    print(
        "(shared: every process runs all 40 queues; split: each runs its own 40/n of them."
        "\n x1: jobs/s over one process's; ratio: jobs/s over the commit rate; xacts/job: server transactions a job."
        "\n jobs %: each process's share of the jobs; cpu %: of one core over the run: each worker process,"
        "\n the bench database's backends (db), every process of the server (pg, other databases' included);"
        "\n us/job: CPU microseconds a job, worker processes + the bench database's backends;"
        f"\n busy, steal: of the machine's {cpus} cores, busy and taken by the hypervisor;"
        "\n other: busy less workers, server and this benchmark; load: 1-minute load average at the row's start)"
    )
    print("\nthe most CPU besides the workers and their backends, % of a core (other databases' backends among it):")
    for p in result["phases"]:
        label = row_label(p)
        named = ", ".join(f"{command[:48]} {100 * cores:.0f}" for command, cores in p["top_other"][:3])
        print(f"  {label:<10}{named or 'nothing above 1%'}")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="jobs a row (default %(default)s)")
    parser.add_argument("--processes", default="1,2,3", help="process counts to run (default %(default)s)")
    add_pgbench_seconds(parser)
    parser.add_argument(
        "--no-split", action="store_true", help="leave out the rows where each process runs its own share of the queues"
    )
    args = parser.parse_args(argv)
    try:
        args.counts = [int(c) for c in args.processes.split(",")]
    except ValueError:
        parser.error("--processes takes comma-separated numbers, such as 1,2,3")
    if args.jobs < len(QUEUES) or args.pgbench_seconds < 1 or not args.counts or min(args.counts) < 1:
        parser.error(f"--jobs must be >= {len(QUEUES)}, --pgbench-seconds and every process count >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measure(server: Server, rate: CommitRate) -> dict[str, Any]:
        plan = [(count, "shared") for count in args.counts]
        # One process runs every queue either way: its row serves both.
        plan += [] if args.no_split else [(count, "split") for count in args.counts if count > 1]
        phases: list[Phase] = []
        for count, mode in plan:
            print(f"{args.jobs:,} no-op jobs, 40 queues, {count} worker process(es), {mode} ...", flush=True)
            phase = run_phase(server, count, mode, args.jobs)
            phase.ratio = phase.jobs_per_s / rate.tps
            phases.append(phase)
        base = next((p for p in phases if p.processes == 1), phases[0])
        for phase in phases:
            phase.speedup = phase.jobs_per_s / base.jobs_per_s if base.jobs_per_s else 0.0
        return {"phases": [asdict(p) for p in phases]}

    return harness.run("replicas", args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
