"""Throughput of no-op jobs against the server's own single-client commit rate.

Run from the project root:  .venv/bin/python bench/throughput.py [--jobs N] [--queues 40]

Three measurements on a fresh database of one server (DATABASE_URL, else the
embedded one in .pgdata/bench):
  1. the commit rate: pgbench, one client, one single-row autocommit UPDATE per
     transaction, connecting the way our pool does;
  2. no-op jobs per second through one queue (one Poller);
  3. the same number of jobs spread over --queues queues, all polling at once
     over one shared pool.
The target: one queue sustains at least a third of the commit rate. A job is a
claim and a finalize, each a commit when sent alone, plus the worker's own work;
xacts/job in the table shows how many commits a job took.
"""

# ruff: noqa: E402  (monkey-patching must come before every other import)
from gevent import monkey

monkey.patch_all()

import argparse
import cProfile
import io
import logging
import os
import pstats
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(ROOT))

from bench.common import (
    CommitRate,
    Server,
    ServerMeter,
    begin,
    context_lines,
    finish,
    machine_line,
    measure_commit_rate,
    run_record,
    scratch_database,
)
from lib.insert import Job, insert_many
from lib.job import PendingJob
from lib.run.poller import Poller
from lib.store.db import DB

TARGET_RATIO = 1 / 3
JOB_NAME = "q.Noop"
# Connections beyond one per poller, as worker.py sizes its pool.
POOL_BUFFER = 4
# Every job is enqueued before timing starts, so a poller only waits once its
# queue has drained, and setting stop wakes it from that wait.
POLL_INTERVAL = 5.0
# A phase that stops making progress (a bug, a lock, a claim that keeps failing
# and retrying) is reported as incomplete, not waited on forever.
STALL_SECONDS = 30.0
# Auto-sized runs aim at this many seconds per phase at the target rate.
AUTO_SECONDS = 10.0
INSERT_CHUNK = 10_000

# ---------------------------------------------------------------- jobs


@dataclass
class Phase:
    queues: int
    jobs: int
    done: int = 0
    seconds: float = 0.0
    jobs_per_s: float = 0.0
    ratio: float = 0.0  # jobs/s over the commit rate
    statuses: dict[str, int] = field(default_factory=dict)
    # Where a job's time goes. Server transactions are every transaction the
    # pool ran (autocommit: one per round trip), pings and PREPAREs included.
    server_xacts_per_job: float | None = None
    # None when no job ran, or (server cpu) for a server not on this machine.
    client_cpu_ms_per_job: float | None = None
    server_cpu_ms_per_job: float | None = None  # the pool's backends only
    wall_ms_per_job: float | None = None
    complete: bool = False
    error: str | None = None


class Countdown:
    """Counts handler calls and fires at the last job, so the clock stops
    without a monitor polling the table (and adding statements of its own)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.done = Event()

    def noop(self, job: PendingJob) -> str:
        self.count += 1
        if self.count >= self.target:
            self.done.set()
        return "ok"


def queue_names(count: int) -> list[str]:
    return ["q00"] if count == 1 else [f"q{i:02d}" for i in range(count)]


def enqueue(url: str, queues: list[str], total: int) -> None:
    """A fresh jobs table holding total pending no-op jobs, round robin over
    queues, with planner statistics as autovacuum would leave them."""
    setup = DB.connect(url, size=1, application_name="jobs-bench-setup")
    try:
        setup.exec("TRUNCATE jobs RESTART IDENTITY")
        jobs = [Job(queues[i % len(queues)], JOB_NAME, {"i": i}) for i in range(total)]
        for start in range(0, total, INSERT_CHUNK):
            insert_many(setup, jobs[start : start + INSERT_CHUNK])
        # VACUUM also sets the visibility map; a live table would be in that state.
        setup.exec("VACUUM ANALYZE jobs")
    finally:
        setup.close()


def warm(db: DB) -> None:
    """Open every connection of the pool before the clock starts: the statements
    overlap, so each checkout finds the others busy and opens its own."""
    gevent.joinall([gevent.spawn(db.exec, "SELECT pg_sleep(0.05)") for _ in range(db.size)], raise_error=True)


def wait_for_jobs(countdown: Countdown, crashed: Event) -> str | None:
    """None once every job ran; else why the wait ended early."""
    progress, since = -1, time.monotonic()
    while not countdown.done.is_set():
        if crashed.is_set():
            return "a poller crashed"
        if countdown.count != progress:
            progress, since = countdown.count, time.monotonic()
        elif time.monotonic() - since > STALL_SECONDS:
            return f"no job finished for {STALL_SECONDS:g} s (see the log above)"
        gevent.wait([countdown.done, crashed], timeout=1.0, count=1)
    return None


def run_phase(url: str, meter: ServerMeter, queues: list[str], total: int, profile: bool) -> Phase:
    phase = Phase(len(queues), total)
    enqueue(url, queues, total)
    xacts_before = meter.xacts()
    db = DB.connect(url, size=len(queues) + POOL_BUFFER, application_name="jobs-bench")
    try:
        warm(db)
        pids = meter.backends()
        countdown = Countdown(total)
        pollers = [Poller(q, db, {JOB_NAME: countdown.noop}, poll_interval=POLL_INTERVAL) for q in queues]
        server_cpu_before = meter.cpu_seconds(pids)
        profiler = cProfile.Profile() if profile else None
        stop = Event()

        cpu_before, started = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        greenlets = [gevent.spawn(p.poll, stop) for p in pollers]
        # A poller that dies stops the wait too, instead of leaving it to the timeout.
        crashed = Event()
        for g in greenlets:
            g.link_exception(lambda _g: crashed.set())
        stalled = wait_for_jobs(countdown, crashed)
        stop.set()
        # Joined before the clock stops: the last job's finalize is part of the run.
        gevent.joinall(greenlets, timeout=60)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_before
        if profiler:
            profiler.disable()
        server_cpu_after = meter.cpu_seconds(pids)

        phase.done = done = countdown.count
        phase.seconds = elapsed
        phase.jobs_per_s = done / elapsed
        if done:
            phase.wall_ms_per_job = 1000 * elapsed / done
            phase.client_cpu_ms_per_job = 1000 * cpu / done
            if server_cpu_before is not None and server_cpu_after is not None:
                phase.server_cpu_ms_per_job = 1000 * (server_cpu_after - server_cpu_before) / done
        failures = [g.exception for g in greenlets if g.exception is not None]
        if failures:
            phase.error = f"{type(failures[0]).__name__}: {failures[0]}"
        elif stalled:
            phase.error = stalled
        phase.statuses = dict(db.query("SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status"))
        phase.complete = phase.statuses == {"ok": total} and phase.error is None
        if profiler:
            print_profile(profiler, len(queues))
    finally:
        db.close()
    # Less the pool's own setup: DB.connect's SELECT 1, warm()'s statements, the
    # status count, and the transaction each new session runs as it starts.
    setup_xacts = 1 + db.size + 1 + len(pids)
    if phase.done:
        phase.server_xacts_per_job = (meter.xacts() - xacts_before - setup_xacts) / phase.done
    return phase


def print_profile(profiler: cProfile.Profile, queues: int) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    print(f"\n--- cProfile, {queues} queue(s), by own time (greenlet switches blur cumulative times)")
    print(out.getvalue())


# ---------------------------------------------------------------- report


def auto_jobs(commit_tps: float, queues: int) -> int:
    """About AUTO_SECONDS of work at the target rate, a multiple of the queue count."""
    jobs = int(commit_tps * TARGET_RATIO * AUTO_SECONDS)
    jobs = min(max(jobs, 1000), 50_000)
    return -(-jobs // queues) * queues


def report(
    server: Server, rate: CommitRate, phases: list[Phase], options: dict[str, Any], load_at_start: float
) -> dict[str, Any]:
    one = phases[0]
    return {
        **run_record(server, load_at_start),
        "options": options,
        "commit_rate": asdict(rate),
        "phases": [asdict(p) for p in phases],
        "target": {
            "ratio": TARGET_RATIO,
            "jobs_per_s": rate.tps * TARGET_RATIO,
            "met": one.complete and one.ratio >= TARGET_RATIO,
        },
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def print_table(result: dict[str, Any]) -> None:
    rate = result["commit_rate"]
    print()
    print("\n".join(context_lines(result)))
    print(f"pgbench      {rate['version']}, -c 1 -j 1 -T {rate['seconds']}, one single-row UPDATE per commit")
    print(machine_line(result))
    print()
    columns = ("rate/s", "ratio", "ms each", "client cpu", "server cpu", "xacts/job")
    print(f"{'measure':<20}" + "".join(f"{c:>11}" for c in columns))
    print(f"{'commit rate (tx)':<20}{rate['tps']:>11.0f}{1:>11.2f}{1000 / rate['tps']:>11.3f}")
    for p in result["phases"]:
        label = "1 queue (jobs)" if p["queues"] == 1 else f"{p['queues']} queues (jobs)"
        xacts = "n/a" if p["server_xacts_per_job"] is None else f"{p['server_xacts_per_job']:.2f}"
        print(
            f"{label:<20}{p['jobs_per_s']:>11.0f}{p['ratio']:>11.2f}{_ms(p['wall_ms_per_job']):>11}"
            f"{_ms(p['client_cpu_ms_per_job']):>11}{_ms(p['server_cpu_ms_per_job']):>11}{xacts:>11}"
        )
        if not p["complete"]:
            print(f"  INCOMPLETE: {p['done']}/{p['jobs']} jobs ran, statuses {p['statuses']}, error {p['error']}")
    if result["options"]["profile"]:
        print("PROFILED: cProfile slows the worker; these rates are not comparable with a plain run")
    print("(ratio: to the commit rate; ms each: wall time per commit or job;")
    print(" cpu: ms per job of this process and of the pool's server backends; xacts: server transactions per job)")
    target = result["target"]
    verdict = "MET" if target["met"] else "NOT MET"
    print(
        f"\ntarget: one queue >= 1/3 of the commit rate ({target['jobs_per_s']:.0f} jobs/s): {verdict}"
        f" (measured {result['phases'][0]['jobs_per_s']:.0f} jobs/s, ratio {result['phases'][0]['ratio']:.2f})"
    )


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=0, help="jobs per phase (default: about 10 s at the target rate)")
    parser.add_argument("--pgbench-seconds", type=int, default=10, help="pgbench duration (default %(default)s)")
    parser.add_argument("--queues", type=int, default=40, help="queues of the many-queue phase (default %(default)s)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each phase")
    parser.add_argument(
        "--log-jobs",
        action="store_true",
        help="log one INFO line per job (to /dev/null), as the worker does at its default LOG_LEVEL",
    )
    args = parser.parse_args(argv)
    if args.jobs < 0 or args.pgbench_seconds < 1 or args.queues < 1:
        parser.error("--jobs must be >= 0, --pgbench-seconds and --queues >= 1")
    return args


def setup_logging(log_jobs: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    if log_jobs:
        # The worker's per-job line costs formatting and a write; measure it without flooding the terminal.
        jobs_log = logging.getLogger("jobs")
        jobs_log.setLevel(logging.INFO)
        jobs_log.addHandler(logging.FileHandler(os.devnull))
        jobs_log.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_jobs)
    server, load_at_start = begin(quiet=False)
    with scratch_database(server) as scratch:
        print(f"PostgreSQL {server.version} ({server.source}), bench database {scratch.name}", flush=True)
        print(f"pgbench: {args.pgbench_seconds} s of single-row commits ...", flush=True)
        rate = measure_commit_rate(scratch.url, args.pgbench_seconds)
        jobs = args.jobs or auto_jobs(rate.tps, args.queues)
        meter = ServerMeter(scratch.admin, scratch.name)
        phases = []
        for count in [1] + ([args.queues] if args.queues > 1 else []):
            print(f"{jobs} no-op jobs through {count} queue(s) ...", flush=True)
            phase = run_phase(scratch.url, meter, queue_names(count), jobs, args.profile)
            phase.ratio = phase.jobs_per_s / rate.tps
            phases.append(phase)
    options = {"jobs": jobs, "queues": args.queues, "log_jobs": args.log_jobs, "profile": args.profile}
    result = report(server, rate, phases, options, load_at_start)
    return finish(result, "throughput", print_table)


if __name__ == "__main__":
    sys.exit(main())
