"""This project's worker against procrastinate and PGQueuer, on the same
workloads, in one run, on one server.

Run from the project root, after `.venv/bin/pip install -r bench/requirements.txt`:

    .venv/bin/python bench/compare.py [--quick] [--jobs N] [--only ours|procrastinate|pgqueuer] [--workloads 1,2,...]

Each side runs as its own processes (bench/apps/compare_*.py): a worker
process working until SIGTERM, and separate enqueue processes. Ours is the
real worker.main with no-op queues; the peers run their own workers at their
best settings for the workload (see bench/README.md). Every measurement gets a
fresh database on the server (DATABASE_URL, else the embedded one); the
server's single-client commit rate (pgbench) is measured in the same run.

Workloads (no-op jobs, --jobs of them), each run by every side in turn:
  1. one queue, one job at a time, in --rounds rounds (each side once a
     round, going first in turn), the median run reported; for
     ours, also the serial step alone
     (bench/step_cost.py: jobs_step_one from a plain psycopg2 loop, no
     worker), which bounds what any worker around that statement can reach;
  2. one queue at each of --concurrencies, the best reported;
  3. --jobs over 40 queues, one job at a time each, in --rounds rounds as
     workload 1, the median run reported: jobs/s, database transactions per
     job, and the connections held at peak (workload 7);
  4. commit-to-start latency while idle: another process enqueues one job per
     commit, with a pause between;
  5. enqueue: one job per transaction, and batches of 1,000, in --rounds
     rounds as workload 1, each rate's median reported;
  6. an idle 40-queue worker: transactions a minute, connections, RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg2.extensions

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, step_cost
from bench.harness import (
    ROOT,
    CommitRate,
    ConnectionSampler,
    Server,
    ServerMeter,
    WorkerProcess,
    add_pgbench_seconds,
    backends,
    percentile,
    query_one,
    revision,
    rss_mb,
    scratch_database,
    vacuum_analyze,
    worker,
)

APPS = ROOT / "bench" / "apps"
SIDES = ("ours", "procrastinate", "pgqueuer")
PEERS = ("procrastinate", "pgqueuer")
MANY_QUEUES = 40
ENQUEUE_BATCH = 1000
# Settings that would change what our worker does; the comparison runs its defaults.
UNSET = ("JOBS_LEASE_SECONDS", "SENTRY_DSN", "JOBS_ADMIN_TOKEN")
READY_TIMEOUT = 60.0
READY_SETTLE = 2.0  # seconds after the worker's first connection before producing
RECORDED_TIMEOUT = 15.0  # from the last handler start to its outcome in the table
STEP_ALONE_STEPS, STEP_ALONE_ROUNDS = 2000, 3  # the serial step alone: about 3 s


# ---------------------------------------------------------------- the sides


def _queues(names: list[str]) -> str:
    return ",".join(names)


@dataclass(frozen=True)
class Side:
    """How the benchmark drives one library: its processes and the SQL that
    reads its own tables. Ours by default; the peers override."""

    name: str = "ours"
    migrated: bool = True  # the scratch database gets our migrations
    # The interpreter of the side's processes: ours runs in the project's
    # virtualenv; a peer's may be another (--peer-python).
    python: str = sys.executable
    worker_app: str = "compare_ours_worker.py"
    enqueue_app: str = "compare_ours_enqueue.py"
    # The first handler start and the last outcome as the database records them, and the jobs done.
    span_sql: str = (
        "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)),"
        " count(*) FILTER (WHERE status = 'ok') FROM jobs"
    )
    settings: str = (
        "worker.main (a real worker process), one Poller per queue at concurrency C (1 for 40 queues),"
        " every other option at its default (LISTEN/NOTIFY wakes, 120 s fallback poll);"
        " JOBS_HTTP_ADDR=off, LOG_LEVEL=WARNING; enqueue: lib.insert (psycopg2)"
    )

    def install(self, url: str) -> None:
        """Our schema comes with the scratch database (its migrations)."""

    def worker_command(self, url: str, queues: list[str], concurrency: int) -> list[str]:
        command = [self.python, str(APPS / self.worker_app), "--url", url, "--queues", _queues(queues)]
        return [*command, "--concurrency", str(concurrency)]

    def worker_env(self, url: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        # No HTTP endpoints (several workers may run on this machine), and no
        # per-job INFO line, which would cost more than a no-op job.
        env.update(DATABASE_URL=url, JOBS_HTTP_ADDR="off", LOG_LEVEL="WARNING")
        return env

    def enqueue_command(self, mode: str, url: str, queues: list[str], jobs: int, batch: int = 1) -> list[str]:
        command = [self.python, str(APPS / self.enqueue_app), mode, "--url", url, "--queues", _queues(queues)]
        return [*command, "--jobs", str(jobs), "--batch", str(batch)]


@dataclass(frozen=True)
class Procrastinate(Side):
    name: str = "procrastinate"
    migrated: bool = False
    worker_app: str = "compare_procrastinate.py"
    enqueue_app: str = "compare_procrastinate.py"
    span_sql: str = (
        "SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started')),"
        " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')),"
        " count(*) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
    )
    settings: str = (
        "async worker (PsycopgConnector, psycopg 3 pool of min 1, max jobs-at-once + 1), listen_notify=True,"
        " fetch/abort polling intervals 120 s (fallback only); one queue: one worker at concurrency C;"
        " 40 queues: one worker per queue at concurrency 1 in one process (no lock);"
        " jobs kept on success (default); logging WARNING; enqueue: defer_async / batch_defer_async"
    )

    def install(self, url: str) -> None:
        subprocess.run([self.python, str(APPS / self.worker_app), "install", "--url", url], check=True)

    def worker_command(self, url: str, queues: list[str], concurrency: int) -> list[str]:
        command = [self.python, str(APPS / self.worker_app), "work", "--url", url, "--queues", _queues(queues)]
        per_queue = ["--per-queue"] if len(queues) > 1 else []
        return [*command, "--concurrency", str(concurrency), *per_queue]


@dataclass(frozen=True)
class PGQueuer(Side):
    name: str = "pgqueuer"
    migrated: bool = False
    worker_app: str = "compare_pgqueuer.py"
    enqueue_app: str = "compare_pgqueuer.py"
    # Finished rows leave its queue table; its log keeps each job's picked and successful moments.
    span_sql: str = (
        "SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked')),"
        " extract(epoch FROM max(created) FILTER (WHERE status = 'successful')),"
        " count(*) FILTER (WHERE status = 'successful') FROM pgqueuer_log"
    )
    settings: str = (
        "QueueManager over one asyncpg connection; a queue is an entrypoint with concurrency_limit C"
        " (1 each for 40 queues); batch_size = jobs that may run at once (C, or 40), since its"
        " completion log flushes every batch_size jobs or 0.1 s; dequeue_timeout 120 s (fallback only);"
        " log aggregation off; logging WARNING; enqueue: Queries.enqueue, lists for batches"
    )

    def install(self, url: str) -> None:
        subprocess.run([self.python, str(APPS / self.worker_app), "install", "--url", url], check=True)

    def worker_command(self, url: str, queues: list[str], concurrency: int) -> list[str]:
        command = [self.python, str(APPS / self.worker_app), "work", "--url", url, "--queues", _queues(queues)]
        return [*command, "--concurrency", str(concurrency), "--batch-size", str(concurrency * len(queues))]


def make_side(name: str, peer_python: str) -> Side:
    if name == "ours":
        return Side()
    return {"procrastinate": Procrastinate, "pgqueuer": PGQueuer}[name](python=peer_python)


# ---------------------------------------------------------------- processes


def side_worker(
    side: Side, url: str, queues: list[str], concurrency: int, target: int, work: Path
) -> AbstractContextManager[WorkerProcess]:
    """The side's worker process, stopped at the end however the block ends."""
    return worker(side.worker_command(url, queues, concurrency), side.worker_env(url), work, target)


def enqueue(side: Side, mode: str, url: str, queues: list[str], jobs: int, batch: int = 1, **extra: float) -> Any:
    """Run one enqueue process to the end; its JSON output."""
    command = side.enqueue_command(mode, url, queues, jobs, batch)
    for key, value in extra.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{side.name} {mode} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


# ---------------------------------------------------------------- reading the server


def wait_ready(admin: psycopg2.extensions.connection, dbname: str, run: WorkerProcess) -> None:
    """The worker has connected, and had READY_SETTLE seconds to LISTEN and
    make its first (empty) claims."""
    deadline = time.monotonic() + READY_TIMEOUT
    while backends(admin, dbname) == 0:
        if run.proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {run.proc.returncode}:\n{run.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not connect within {READY_TIMEOUT:g} s:\n{run.log_tail()}")
        time.sleep(0.1)
    time.sleep(READY_SETTLE)


def wait_done(run: WorkerProcess, timeout: float) -> str | None:
    """None once the handlers have started every job; else why the wait ended."""
    deadline = time.monotonic() + timeout
    while not run.done_file.exists():
        if run.proc.poll() is not None:
            return f"the worker exited with {run.proc.returncode}"
        if time.monotonic() > deadline:
            return f"not every job started within {timeout:g} s"
        time.sleep(0.05)
    return None


def wait_recorded(url: str, side: Side, total: int) -> tuple[int, int]:
    """Wait for the last outcomes to reach the table (a handler's start comes
    before its job's outcome is committed); (jobs done, queries sent)."""
    deadline = time.monotonic() + RECORDED_TIMEOUT
    queries = 0
    while True:
        done = int(query_one(url, side.span_sql)[2])
        queries += 1
        if done >= total or time.monotonic() > deadline:
            return done, queries
        time.sleep(0.1)


# ---------------------------------------------------------------- workloads


@dataclass
class Throughput:
    queues: int
    concurrency: int
    jobs: int
    done: int = 0
    seconds: float = 0.0
    jobs_per_s: float = 0.0
    xacts_per_job: float | None = None  # the worker's start and stop included
    peak_connections: int = 0
    complete: bool = False
    error: str | None = None


def measure_throughput(side: Side, server: Server, queues: list[str], jobs: int, concurrency: int) -> Throughput:
    """jobs enqueued first (untimed, batches of 1,000), then the worker started:
    from the first job's start to the last job's outcome, as the database
    records them."""
    result = Throughput(len(queues), concurrency, jobs)
    with scratch_database(server, side.migrated) as scratch, tempfile.TemporaryDirectory(prefix="jobs-cmp-") as work:
        side.install(scratch.url)
        enqueue(side, "bulk", scratch.url, queues, jobs, ENQUEUE_BATCH)
        vacuum_analyze(scratch.url)
        meter = ServerMeter(scratch.admin, scratch.name)
        before = meter.xacts()
        # A budget that no sane run reaches: 60 s, plus 50 ms a job.
        timeout = 60 + 0.05 * jobs
        sampler = ConnectionSampler(scratch.server.url, scratch.name, 0.1)
        with sampler, side_worker(side, scratch.url, queues, concurrency, jobs, Path(work)) as run:
            result.error = wait_done(run, timeout)
            done, queries = wait_recorded(scratch.url, side, jobs)
            if result.error:
                print(run.log_tail(), file=sys.stderr)
        # Less this benchmark's own completion checks (one connection each).
        xacts = meter.xacts() - before - 2 * queries
        first, last, done = query_one(scratch.url, side.span_sql)
        result.peak_connections = sampler.peak
    result.done = int(done)
    if result.done and first is not None and last is not None:
        result.seconds = float(last) - float(first)
        result.jobs_per_s = result.done / result.seconds if result.seconds > 0 else 0.0
        result.xacts_per_job = xacts / result.done
    result.complete = result.done == jobs and result.error is None
    return result


@dataclass
class Latency:
    samples: int
    started: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None


def measure_step_alone(server: Server) -> float:
    """Serial steps a second of jobs_step_one run by a plain psycopg2 loop, as
    the group commit sends them (bench/step_cost.py), on a fresh database."""
    with scratch_database(server) as scratch:
        found = step_cost.measure(scratch.url, STEP_ALONE_STEPS, STEP_ALONE_ROUNDS, ["jobs_step_one"])
    return float(found["jobs_step_one"]["steps_per_s"])


def measure_latency(side: Side, server: Server, samples: int) -> Latency:
    """Another process commits one job at a time, 50-100 ms apart (random);
    each latency is the handler's time.time() at start less the producer's
    right after its commit returned (one machine, one clock)."""
    result = Latency(samples)
    with scratch_database(server, side.migrated) as scratch, tempfile.TemporaryDirectory(prefix="jobs-cmp-") as work:
        side.install(scratch.url)
        with side_worker(side, scratch.url, ["q00"], 1, samples, Path(work)) as run:
            wait_ready(scratch.admin, scratch.name, run)
            commits = enqueue(side, "produce", scratch.url, ["q00"], samples, gap_min=0.05, gap_max=0.1)
            # A job not started 5 s after the last commit counts as missed, not waited for.
            wait_done(run, 5.0)
            run.stop()
            starts = run.starts()
    latencies = [1000 * (starts[seq] - t) for seq, t in commits if seq in starts]
    result.started = len(latencies)
    if latencies:
        result.p50_ms = percentile(latencies, 50)
        result.p99_ms = percentile(latencies, 99)
        result.max_ms = max(latencies)
    return result


@dataclass
class Enqueue:
    jobs: int
    single_per_s: float = 0.0  # one job per transaction
    batch_per_s: float = 0.0  # ENQUEUE_BATCH jobs per transaction


def measure_enqueue(side: Side, server: Server, jobs: int) -> Enqueue:
    """One process enqueues `jobs` one per transaction, then as many again in
    batches of 1,000, into one queue, with no worker running."""
    result = Enqueue(jobs)
    with scratch_database(server, side.migrated) as scratch:
        side.install(scratch.url)
        single = enqueue(side, "bulk", scratch.url, ["q00"], jobs, 1)
        batch = enqueue(side, "bulk", scratch.url, ["q00"], jobs, ENQUEUE_BATCH)
    result.single_per_s = jobs / single["seconds"]
    result.batch_per_s = jobs / batch["seconds"]
    return result


@dataclass
class Idle:
    queues: int
    seconds: float = 0.0
    xacts: int = 0
    xacts_per_minute: float = 0.0
    connections: int = 0  # held at the end of the window
    peak_connections: int = 0  # over the window
    rss_mb: float = 0.0


def measure_idle(side: Side, server: Server, seconds: float, settle: float) -> Idle:
    """A 40-queue worker with nothing to do, from `settle` seconds after its
    first connection: the database's transactions over `seconds` (both reads
    of pg_stat_database lag alike), its connections, the process's RSS."""
    queues = [f"q{i:02d}" for i in range(MANY_QUEUES)]
    result = Idle(len(queues))
    with scratch_database(server, side.migrated) as scratch, tempfile.TemporaryDirectory(prefix="jobs-cmp-") as work:
        side.install(scratch.url)
        with side_worker(side, scratch.url, queues, 1, 0, Path(work)) as run:
            wait_ready(scratch.admin, scratch.name, run)
            time.sleep(settle)
            with ConnectionSampler(scratch.server.url, scratch.name, 1.0) as sampler:
                meter = ServerMeter(scratch.admin, scratch.name)
                start, before = time.monotonic(), meter.xacts_reported()
                time.sleep(seconds)
                end, after = time.monotonic(), meter.xacts_reported()
            if run.proc.poll() is not None:
                raise RuntimeError(f"the {side.name} worker exited during the window:\n{run.log_tail()}")
            result.rss_mb = rss_mb(run.proc.pid)
            result.connections = backends(scratch.admin, scratch.name)
            result.peak_connections = sampler.peak
    result.seconds = end - start
    result.xacts = after - before
    result.xacts_per_minute = 60 * result.xacts / result.seconds
    return result


# ---------------------------------------------------------------- one side's run


@dataclass
class SideResult:
    name: str
    version: str
    settings: str
    one_queue: Throughput | None = None  # workload 1
    concurrency: list[Throughput] = field(default_factory=list)  # workload 2
    many_queues: Throughput | None = None  # workloads 3 and 7
    latency: Latency | None = None  # workload 4
    enqueue: Enqueue | None = None  # workload 5
    idle: Idle | None = None  # workload 6
    step_alone: float | None = None  # workload 1, ours only: serial steps a second with no worker
    serial_rounds: list[Throughput] = field(default_factory=list)  # workload 1, each round; one_queue is the median
    many_queues_rounds: list[Throughput] = field(default_factory=list)  # workload 3, each round; many_queues the median
    enqueue_rounds: list[Enqueue] = field(default_factory=list)  # workload 5, each round; enqueue the medians
    step_alone_rounds: list[float] = field(default_factory=list)

    def best(self) -> Throughput | None:
        return max(self.concurrency, key=lambda t: t.jobs_per_s, default=None)


def version(side: Side) -> str:
    if side.name == "ours":
        rev = revision()
        return rev["commit"] if rev else "?"
    return peer_versions(side.python)[side.name]


def peer_versions(python: str) -> dict[str, str]:
    """The peers' versions as python has them installed; SystemExit when one is missing."""
    script = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps({n: m.version(n) for n in ('procrastinate', 'pgqueuer', 'asyncpg')}))"
    )
    done = subprocess.run([python, "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"{python} lacks the peers: run  {python} -m pip install -r bench/requirements.txt"
            f"  (or --peer-python another interpreter, or --only ours)\n{done.stderr[-500:]}"
        )
    return json.loads(done.stdout)


# The workloads run in rounds, and what a round of each is.
ROUNDS = {
    "1": "one queue, one at a time",
    "3": f"over {MANY_QUEUES} queues, one at a time each",
    "5": f"enqueued one per transaction, then in batches of {ENQUEUE_BATCH}",
}


def run_rounds(
    workload: str, sides: dict[str, Side], results: dict[str, SideResult], server: Server, args: argparse.Namespace
) -> None:
    """Workload 1, 3 or 5 in --rounds rounds, the sides taking turns within
    each round and going first in turn, so a drift of the machine's commit
    cost over the run (a shared disk's) falls on every side alike; each
    side's reported run is its median. A run of 5,000 jobs lasts a few
    seconds, or about one on 40 queues, so one run alone moves with whatever
    else the machine is doing in those seconds."""
    names = list(sides)
    for turn in range(args.rounds):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            say(name, f"workload {workload}, round {turn + 1} of {args.rounds}: {args.jobs} jobs {ROUNDS[workload]}")
            result, side = results[name], sides[name]
            if workload == "1":
                result.serial_rounds.append(measure_throughput(side, server, ["q00"], args.jobs, 1))
                if name == "ours":
                    say(name, "workload 1: the serial step alone, no worker")
                    result.step_alone_rounds.append(measure_step_alone(server))
            elif workload == "3":
                queues = [f"q{i:02d}" for i in range(MANY_QUEUES)]
                result.many_queues_rounds.append(measure_throughput(side, server, queues, args.jobs, 1))
            else:
                result.enqueue_rounds.append(measure_enqueue(side, server, args.jobs))
    for result in results.values():
        if workload == "1":
            result.one_queue = median_run(result.serial_rounds)
            if result.step_alone_rounds:
                result.step_alone = statistics.median(result.step_alone_rounds)
        elif workload == "3":
            result.many_queues = median_run(result.many_queues_rounds)
        else:
            # The two rates are measured apart, one after the other: each its own median.
            runs = result.enqueue_rounds
            single = statistics.median_low([run.single_per_s for run in runs])
            batch = statistics.median_low([run.batch_per_s for run in runs])
            result.enqueue = Enqueue(runs[0].jobs, single, batch)


def median_run(runs: list[Throughput]) -> Throughput:
    """The run of median rate (the lower middle of an even count): a whole run,
    so its completeness and counts go with the rate shown."""
    return sorted(runs, key=lambda t: t.jobs_per_s)[(len(runs) - 1) // 2]


def say(name: str, what: str) -> None:
    print(f"[{name}] {what} ...", flush=True)


def run_workload(
    name: str, side: Side, workload: str, result: SideResult, server: Server, args: argparse.Namespace
) -> None:
    """Workload 2, 4 or 6 for one side (1, 3 and 5 run in rounds)."""
    if workload == "2":
        for concurrency in args.concurrencies:
            if concurrency == 1:
                result.concurrency.append(result.one_queue)  # type: ignore[arg-type]
                continue
            say(name, f"workload 2: {args.jobs} jobs, one queue, concurrency {concurrency}")
            result.concurrency.append(measure_throughput(side, server, ["q00"], args.jobs, concurrency))
    elif workload == "4":
        say(name, f"workload 4: commit-to-start latency, {args.samples} jobs one per commit")
        result.latency = measure_latency(side, server, args.samples)
    elif workload == "6":
        say(name, f"workload 6: idle {MANY_QUEUES}-queue worker, {args.idle_seconds:g} s window")
        result.idle = measure_idle(side, server, args.idle_seconds, args.settle)


def run_all(server: Server, args: argparse.Namespace) -> dict[str, SideResult]:
    """Workload by workload, every side in turn: the runs a ratio compares are
    minutes apart at most, not a whole side's run apart."""
    sides = {name: make_side(name, args.peer_python) for name in args.sides}
    results = {name: SideResult(name, version(side), side.settings) for name, side in sides.items()}
    if "1" in args.workloads or "2" in args.workloads:
        run_rounds("1", sides, results, server, args)
    for workload in sorted(set(args.workloads) - {"1"}):
        if workload in ROUNDS:
            run_rounds(workload, sides, results, server, args)
            continue
        for name, side in sides.items():
            run_workload(name, side, workload, results[name], server, args)
    return results


# ---------------------------------------------------------------- the table


@dataclass
class Row:
    label: str
    higher_is_better: bool
    values: dict[str, float | None]
    notes: dict[str, str] = field(default_factory=dict)  # e.g. the best concurrency


def _get(result: SideResult, path: str) -> float | None:
    """A number from a side's result by dotted path ('idle.rss_mb'), None when not measured."""
    value: Any = result
    for part in path.split("."):
        value = None if value is None else getattr(value, part)
    return None if value is None else float(value)


ROWS: list[tuple[str, str, bool]] = [
    ("1 queue, 1 at a time (jobs/s)", "one_queue.jobs_per_s", True),
    ("1 queue, best concurrency (jobs/s)", "best.jobs_per_s", True),
    ("40 queues, 1 at a time each (jobs/s)", "many_queues.jobs_per_s", True),
    ("40 queues: db transactions/job", "many_queues.xacts_per_job", False),
    ("40 queues busy: peak connections", "many_queues.peak_connections", False),
    ("commit->start p50 (ms)", "latency.p50_ms", False),
    ("commit->start p99 (ms)", "latency.p99_ms", False),
    ("enqueue, 1 per commit (jobs/s)", "enqueue.single_per_s", True),
    (f"enqueue, {ENQUEUE_BATCH} per commit (jobs/s)", "enqueue.batch_per_s", True),
    ("idle 40 queues: xacts/min", "idle.xacts_per_minute", False),
    ("idle 40 queues: connections", "idle.connections", False),
    ("idle 40 queues: worker RSS (MB)", "idle.rss_mb", False),
]


def build_rows(results: dict[str, SideResult]) -> list[Row]:
    rows = []
    for label, path, higher in ROWS:
        values = {}
        for name, result in results.items():
            if path.startswith("best."):
                best = result.best()
                values[name] = None if best is None else best.jobs_per_s
            else:
                values[name] = _get(result, path)
        row = Row(label, higher, values)
        if path.startswith("best."):
            row.notes = {n: f"c={r.best().concurrency}" for n, r in results.items() if r.best() is not None}  # type: ignore[union-attr]
        if any(v is not None for v in values.values()):
            rows.append(row)
    return rows


RATIO_KEYS = ("ours/better_peer", "ours/pgqueuer")


def ratios(row: Row) -> tuple[float | None, float | None]:
    """(ours / the better peer, ours / PGQueuer): the better peer is the higher
    rate, or the lower cost or latency."""
    ours = row.values.get("ours")
    peers = [row.values[p] for p in PEERS if row.values.get(p) is not None]
    if ours is None or not peers:
        return None, None
    better = max(peers) if row.higher_is_better else min(peers)
    pgq = row.values.get("pgqueuer")
    return (ours / better if better else None), (ours / pgq if pgq else None)


def _cell(value: float | None, note: str = "") -> str:
    if value is None:
        return "-"
    if value == int(value) and abs(value) < 1000:  # a count (connections)
        return f"{int(value)} {note}".strip()
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    return f"{text} {note}".strip()


def print_table(result: dict[str, Any]) -> None:
    rows = [Row(r["label"], r["higher_is_better"], r["values"], r["notes"]) for r in result["table"]]
    rate = result["commit_rate"]
    names = [n for n in SIDES if n in result["sides"]]
    versions = ", ".join(f"{n} {result['sides'][n]['version']}" for n in names)
    print(f"versions     {versions}; {result['options']['jobs']} jobs per throughput run")
    print()
    header = f"{'workload':<40}" + "".join(f"{n:>16}" for n in names) + f"{'ours/better':>13}{'ours/pgq':>10}"
    print(header)
    print("-" * len(header))
    for row in rows:
        best, pgq = ratios(row)
        cells = "".join(f"{_cell(row.values.get(n), row.notes.get(n, '')):>16}" for n in names)
        print(f"{row.label:<40}{cells}{_cell(best):>13}{_cell(pgq):>10}")
    for row in rows:
        ours = row.values.get("ours")
        if ours is not None and "jobs/s" in row.label and "enqueue" not in row.label:
            print(f"  ours, {row.label.split(' (')[0]}: {ours / rate['tps']:.2f} of the commit rate")
    print_step_alone(result, rows)
    print_rounds(result)
    print("(ratios: ours over the better peer / over PGQueuer; above 1 is more: better for jobs/s,")
    print(" worse for transactions, connections, latency and memory)")
    for name in names:
        side = result["sides"][name]
        # Every serial round, not only the median one shown: a round cut short
        # moves the median too.
        runs = [(f"one_queue round {n}", run) for n, run in enumerate(side.get("serial_rounds") or [], 1)]
        runs += [(f"many_queues round {n}", run) for n, run in enumerate(side.get("many_queues_rounds") or [], 1)]
        for key, run in runs:
            if run and not run["complete"]:
                print(f"  INCOMPLETE {name} {key}: {run['done']}/{run['jobs']} done, {run['error']}")
        latency = side.get("latency")
        if latency and latency["started"] < latency["samples"]:
            print(f"  {name} latency: {latency['samples'] - latency['started']} jobs not started within 5 s")


def print_step_alone(result: dict[str, Any], rows: list[Row]) -> None:
    """The serial step with no worker around it, against the same peers: the
    most the serial row's ratio could be with that statement."""
    alone = result["sides"].get("ours", {}).get("step_alone")
    serial = next((row for row in rows if row.label == ROWS[0][0]), None)
    if not alone or serial is None:
        return
    best, _ = ratios(Row(serial.label, True, {**serial.values, "ours": alone}))
    line = f"  the serial step alone (jobs_step_one, no worker): {alone:,.0f} steps/s"
    if best is not None:
        line += f", {best:.2f} x the better peer"
    ours = serial.values.get("ours")
    if ours:
        line += f"; the worker runs at {ours / alone:.2f} of it"
    print(line)


def print_rounds(result: dict[str, Any]) -> None:
    """The rounds of workloads 1, 3 and 5, each ours over the peer of that
    round its row compares with (the better peer; PGQueuer for 40 queues and
    for enqueuing, as the targets are set): how far the median's ratio could
    move between runs."""
    for key, rate, label, against in (
        ("serial_rounds", "jobs_per_s", "1 queue, 1 at a time", PEERS),
        ("many_queues_rounds", "jobs_per_s", f"{MANY_QUEUES} queues, 1 at a time each", ("pgqueuer",)),
        ("enqueue_rounds", "single_per_s", "enqueue, 1 per commit", ("pgqueuer",)),
        ("enqueue_rounds", "batch_per_s", f"enqueue, {ENQUEUE_BATCH} per commit", ("pgqueuer",)),
    ):
        rates = {name: [run[rate] for run in side.get(key) or []] for name, side in result["sides"].items()}
        ours, peers = rates.get("ours"), [rates[p] for p in against if rates.get(p)]
        if not ours or len(ours) < 2 or not peers:
            continue
        better = [max(peer[turn] for peer in peers) for turn in range(len(ours))]
        each = ", ".join(f"{mine / peer:.2f}" if peer else "-" for mine, peer in zip(ours, better, strict=True))
        peer = "the better peer" if len(against) > 1 else "PGQueuer"
        print(f"  {label}, round by round, ours over {peer}: {each}")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, help="jobs per throughput and enqueue run (default 5000; quick 1000)")
    parser.add_argument("--only", choices=SIDES, action="append", help="run only this side (repeatable)")
    parser.add_argument("--workloads", default="1,2,3,4,5,6", help="comma-separated, of 1-6 (7 comes with 3)")
    parser.add_argument("--concurrencies", default="1,2,4,8,16", help="workload 2 (default %(default)s)")
    parser.add_argument("--samples", type=int, help="workload 4's jobs (default 200; quick 50)")
    parser.add_argument("--idle-seconds", type=float, help="workload 6's window (default 60; quick 20)")
    parser.add_argument("--settle", type=float, help="workload 6: seconds before the window (default 30; quick 15)")
    add_pgbench_seconds(parser, default=0)
    parser.add_argument(
        "--rounds", type=int, help="workloads 1, 3 and 5: rounds, each side once a round (default 3; quick 1)"
    )
    parser.add_argument(
        "--peer-python",
        default=sys.executable,
        help="the interpreter with bench/requirements.txt installed, for the peers (default: this one)",
    )
    parser.add_argument("--quick", action="store_true", help="a sanity run: smaller numbers, shorter windows")
    args = parser.parse_args(argv)
    quick = args.quick
    args.jobs = args.jobs or (1000 if quick else 5000)
    args.samples = args.samples or (50 if quick else 200)
    args.idle_seconds = args.idle_seconds or (20.0 if quick else 60.0)
    args.settle = args.settle if args.settle is not None else (15.0 if quick else 30.0)
    # 0: not given on the command line.
    args.pgbench_seconds = args.pgbench_seconds or (5 if quick else 10)
    args.rounds = args.rounds or (1 if quick else 3)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.concurrencies = sorted({int(c) for c in args.concurrencies.split(",")})
    args.sides = [s for s in SIDES if not args.only or s in args.only]
    if set(args.workloads) - set("1234567") or args.jobs < MANY_QUEUES or min(args.concurrencies) < 1:
        parser.error("--workloads of 1-7, --jobs >= 40, --concurrencies >= 1")
    if args.rounds < 1:
        parser.error("--rounds >= 1")
    return args


def check_peers(args: argparse.Namespace) -> None:
    if set(args.sides) & set(PEERS):
        peer_versions(args.peer_python)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_peers(args)

    def measure(server: Server, rate: CommitRate) -> dict[str, Any]:
        results = run_all(server, args)
        rows = build_rows(results)
        return {
            "sides": {name: asdict(r) for name, r in results.items()},
            "table": [{**asdict(row), "ratios": dict(zip(RATIO_KEYS, ratios(row), strict=True))} for row in rows],
        }

    return harness.run("compare", args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
