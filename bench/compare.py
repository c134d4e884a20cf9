"""This project's worker against oban, chancy, PGQueuer, procrastinate and
DBOS, on the same workloads, in one run, on one server, each side at its own
best.

Run from the project root (the peers' virtualenv, .venv-peers, is built from
bench/requirements.txt when missing: oban needs Python >= 3.12):

    .venv/bin/python bench/compare.py [--quick] [--jobs N] [--only SIDE ...] [--workloads 1,2,...,horizon] [--sweep]

Each side runs as its own processes (bench/apps/compare_*.py): a worker
process working until SIGTERM, and separate enqueue processes. Ours is the
real worker.main with no-op queues; the peers run their own workers, each at
its best settings for the workload (bench/compare_sides.py; bench/README.md).
Every measurement gets a fresh database on the server (DATABASE_URL, else the
embedded one); the server's single-client commit rate (pgbench) and the
disk's fdatasync rate (pg_test_fsync) are measured in the same run.

Workloads (no-op jobs, --jobs of them), each in --rounds rounds, each side
once a round and going first in turn, the median reported:
  1. one queue, one job at a time; for ours, also the serial step alone
     (bench/step_cost.py: jobs_step_one from a plain psycopg2 loop, no
     worker), which bounds what any worker around that statement can reach;
  2. one queue, as fast as the side goes: its own sweep of settings (all in
     the first round, the best in the others); for ours, also one queue's
     batch statement alone (jobs_step, 256 slots a batch, from the same
     loop), which bounds any worker that sends one batch at a time;
  3. --jobs over 40 queues, one job at a time each: jobs/s, database
     transactions per job, and the connections held at peak;
  4. commit-to-start latency while idle: another process enqueues one job per
     commit, with a pause between;
  5. enqueue: one job per transaction, and batches of 1,000;
  6. an idle 40-queue worker: transactions a minute, connections, RSS;
  7. 16 enqueue processes at once for --seconds, beside the same 16 clients'
     one-row INSERT into a plain table (bench/compare_sharing.py);
  horizon. workload 3 clean and with a transaction id held open on another
     connection, each round; held over clean (bench/compare_sharing.py).
Workloads 1 and 3 run each peer at concurrency 1 a queue (the workload) and
its other knobs as a recorded sweep found (RECORDED); --sweep runs them all.

Over 400 lines: a workload's measurement, its rounds and the one table that
sets every side's results side by side are one concern, read together; the
sides themselves are in bench/compare_sides.py and the workloads of a shared
database in bench/compare_sharing.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import psycopg2.extensions

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Run as a script, this module is also bench.compare, so that the modules
# that import it (bench/enqueue_concurrency.py, bench/held_horizon.py) share it.
sys.modules.setdefault("bench.compare", sys.modules[__name__])

from bench import compare_sharing, harness, step_cost  # noqa: E402
from bench.compare_sides import (  # noqa: E402
    PEERS,
    RECORDED,
    SIDES,
    SWEEP_COMMAND,
    Setting,
    Side,
    concurrency,
    make_side,
)
from bench.harness import (  # noqa: E402
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

# The peers' own virtualenv (oban needs Python >= 3.12; the project's may be older).
PEER_VENV = ROOT / ".venv-peers"
MANY_QUEUES = 40
ENQUEUE_BATCH = 1000
READY_TIMEOUT = 60.0
READY_SETTLE = 2.0  # seconds after the worker's first connection before producing
RECORDED_TIMEOUT = 15.0  # from the last handler start to its outcome in the table
# Ours alone, by workload: bench/step_cost.py's path, and its jobs a round
# (each about 1 s); three rounds.
STEP_ALONE = {"1": ("jobs_step_one", 2000), "2": ("jobs_step (256 slots a batch), a job", 25_600)}
STEP_ALONE_ROUNDS = 3


# ---------------------------------------------------------------- processes


def side_worker(
    side: Side, url: str, queues: list[str], setting: Setting, target: int, work: Path
) -> AbstractContextManager[WorkerProcess]:
    """The side's worker process, stopped at the end however the block ends."""
    return worker(side.worker_command(url, queues, setting), side.worker_env(url), work, target)


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
    setting: str
    jobs: int
    done: int = 0
    seconds: float = 0.0
    jobs_per_s: float = 0.0
    xacts_per_job: float | None = None  # the worker's start and stop included
    peak_connections: int = 0
    complete: bool = False
    error: str | None = None


def measure_throughput(side: Side, server: Server, queues: list[str], jobs: int, setting: Setting) -> Throughput:
    """jobs enqueued first (untimed, batches of 1,000 where the side has
    them), then the worker started: from the first job's start to the last
    job's outcome, as the database records them. A held setting
    (setting.hold): a transaction id held open on another connection from
    before the worker starts until it has stopped."""
    result = Throughput(len(queues), setting.label, jobs)
    with scratch_database(server, side.migrated) as scratch, tempfile.TemporaryDirectory(prefix="jobs-cmp-") as work:
        side.install(scratch.url)
        enqueue(side, "bulk", scratch.url, queues, jobs, 1 if side.batch_enqueue else ENQUEUE_BATCH)
        vacuum_analyze(scratch.url)
        meter = ServerMeter(scratch.admin, scratch.name)
        before = meter.xacts()
        # A budget that no sane run reaches: 60 s, plus 50 ms a job.
        timeout = 60 + 0.05 * jobs
        sampler = ConnectionSampler(scratch.server.url, scratch.name, 0.1)
        hold = compare_sharing.held(scratch.url, setting.hold)
        with hold, sampler, side_worker(side, scratch.url, queues, setting, jobs, Path(work)) as run:
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


def measure_step_alone(server: Server, workload: str) -> float:
    """Jobs a second of the workload's statement (STEP_ALONE) run by a plain
    psycopg2 loop, as the group commit sends it (bench/step_cost.py), on a
    fresh database."""
    path, steps = STEP_ALONE[workload]
    with scratch_database(server) as scratch:
        found = step_cost.measure(scratch.url, steps, STEP_ALONE_ROUNDS, [path])
    return float(found[path]["steps_per_s"])


def measure_latency(side: Side, server: Server, setting: Setting, samples: int) -> Latency:
    """Another process commits one job at a time, 50-100 ms apart (random);
    each latency is the handler's time.time() at start less the producer's
    right after its commit returned (one machine, one clock)."""
    result = Latency(samples)
    with scratch_database(server, side.migrated) as scratch, tempfile.TemporaryDirectory(prefix="jobs-cmp-") as work:
        side.install(scratch.url)
        with side_worker(side, scratch.url, ["q00"], setting, samples, Path(work)) as run:
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
    batch_per_s: float | None = None  # ENQUEUE_BATCH jobs per transaction (None: the side has no batch enqueue)


def measure_enqueue(side: Side, server: Server, jobs: int) -> Enqueue:
    """One process enqueues `jobs` one per transaction, then as many again in
    batches of 1,000, into one queue, with no worker running."""
    result = Enqueue(jobs)
    with scratch_database(server, side.migrated) as scratch:
        side.install(scratch.url)
        single = enqueue(side, "bulk", scratch.url, ["q00"], jobs, 1)
        batch = None if side.batch_enqueue else enqueue(side, "bulk", scratch.url, ["q00"], jobs, ENQUEUE_BATCH)
    result.single_per_s = jobs / single["seconds"]
    result.batch_per_s = None if batch is None else jobs / batch["seconds"]
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


def measure_idle(side: Side, server: Server, setting: Setting, seconds: float, settle: float) -> Idle:
    """A 40-queue worker with nothing to do, from `settle` seconds after its
    first connection: the database's transactions over `seconds` (both reads
    of pg_stat_database lag alike), its connections, the process's RSS."""
    queues = [f"q{i:02d}" for i in range(MANY_QUEUES)]
    result = Idle(len(queues))
    with scratch_database(server, side.migrated) as scratch, tempfile.TemporaryDirectory(prefix="jobs-cmp-") as work:
        side.install(scratch.url)
        with side_worker(side, scratch.url, queues, setting, 0, Path(work)) as run:
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


# ---------------------------------------------------------------- rounds


@dataclass
class Run:
    """One measurement of one side: its workload, round and setting."""

    workload: str
    round: int
    setting: str
    result: Any  # Throughput, Latency, Enqueue or Idle


@dataclass
class SideResult:
    name: str
    version: str
    settings: str
    runs: list[Run] = field(default_factory=list)  # every round's, every setting's
    chosen: dict[str, str] = field(default_factory=dict)  # workload -> the setting reported
    medians: dict[str, Any] = field(default_factory=dict)  # workload -> the median of the chosen setting's runs
    # Ours, workloads 1 and 2: the statement alone (STEP_ALONE), each round's and their median.
    step_alone_rounds: dict[str, list[float]] = field(default_factory=dict)
    step_alone: dict[str, float] = field(default_factory=dict)


WORKLOADS = {
    "1": "one queue, one at a time",
    "2": "one queue, as fast as it goes",
    "3": f"{MANY_QUEUES} queues, one at a time each",
    "4": "commit-to-start latency, one job a commit",
    "5": f"enqueue, one per transaction, then in batches of {ENQUEUE_BATCH}",
    "6": f"an idle {MANY_QUEUES}-queue worker",
    "7": f"{compare_sharing.CLIENTS} enqueuers at once, one job a transaction each",
    "horizon": f"{MANY_QUEUES} queues, one at a time each, clean and with a transaction id held open",
}
NO_WORKER = Setting("no worker")


def candidates(side: Side, workload: str, result: SideResult, args: argparse.Namespace) -> list[Setting]:
    """The settings a workload runs the side at: workload 2's sweep always;
    workloads 1 and 3 the recorded best, or all of them with --sweep; 4 and 6
    the setting that workload 1 or 3 reported (else its recorded best); the
    held horizon that one clean and held."""
    if workload == "2":
        return list(side.fastest) or [concurrency(c) for c in args.concurrencies]
    if workload in ("5", "7"):
        return [NO_WORKER]
    if workload == "horizon":
        return compare_sharing.horizon_settings(candidates(side, "6", result, args)[0])
    listed = list(side.serial if workload in "14" else side.many)
    if workload in "13":
        return listed if args.sweep else listed[:1]
    reported = result.chosen.get("1" if workload == "4" else "3")
    return [next((s for s in listed if s.label == reported), listed[0])]


def measure_one(workload: str, side: Side, setting: Setting, server: Server, args: argparse.Namespace) -> Any:
    one_queue, many = ["q00"], [f"q{i:02d}" for i in range(MANY_QUEUES)]
    if workload in "12":
        return measure_throughput(side, server, one_queue, args.jobs, setting)
    if workload in ("3", "horizon"):
        return measure_throughput(side, server, many, args.jobs, setting)
    if workload == "7":
        return compare_sharing.measure_burst(side, server, compare_sharing.CLIENTS, args.seconds)
    if workload == "4":
        return measure_latency(side, server, setting, args.samples)
    if workload == "5":
        return measure_enqueue(side, server, args.jobs)
    return measure_idle(side, server, setting, args.idle_seconds, args.settle)


def rate(run: Any) -> tuple[bool, float]:
    """How settings of a sweep compare: a complete run first, then jobs/s."""
    return run.complete, run.jobs_per_s


def run_rounds(
    workload: str, sides: dict[str, Side], results: dict[str, SideResult], server: Server, args: argparse.Namespace
) -> None:
    """One workload in --rounds rounds, the sides taking turns within each
    round and going first in turn, so a drift of the machine's commit cost
    over the run (a shared disk's) falls on every side alike. A side with
    several settings (a sweep) runs them all in the first round, then only
    the best of them; each side's reported run is the median of its
    setting's rounds. A run of 5,000 jobs lasts a few seconds, so one run
    alone moves with whatever else the machine is doing in those seconds."""
    names = list(sides)
    settings = {name: candidates(sides[name], workload, results[name], args) for name in names}
    for turn in range(args.rounds):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            result = results[name]
            # The held horizon's clean and held runs take turns at going first.
            ordered = settings[name][:: -1 if workload == "horizon" and turn % 2 else 1]
            for setting in ordered:
                say(
                    name,
                    f"workload {workload}, round {turn + 1} of {args.rounds}: {WORKLOADS[workload]}, {setting.label}",
                )
                result.runs.append(
                    Run(workload, turn + 1, setting.label, measure_one(workload, sides[name], setting, server, args))
                )
                if workload in STEP_ALONE and name == "ours" and setting == settings[name][-1]:
                    say(name, f"workload {workload}: {STEP_ALONE[workload][0]} alone, no worker")
                    result.step_alone_rounds.setdefault(workload, []).append(measure_step_alone(server, workload))
            if len(settings[name]) > 1 and workload != "horizon":
                best = max((r for r in result.runs if r.workload == workload), key=lambda r: rate(r.result))
                settings[name] = [s for s in settings[name] if s.label == best.setting]
    for name in names:
        result = results[name]
        if workload == "horizon":
            result.chosen[workload] = settings[name][1].label
            result.medians[workload] = compare_sharing.horizon_summary(horizon_pairs(result.runs))
            continue
        result.chosen[workload] = label = settings[name][0].label
        result.medians[workload] = median(
            [r.result for r in result.runs if (r.workload, r.setting) == (workload, label)]
        )
        if workload in result.step_alone_rounds:
            result.step_alone[workload] = statistics.median(result.step_alone_rounds[workload])


def horizon_pairs(runs: list[Run]) -> list[tuple[Throughput, Throughput]]:
    """Each round's clean and held runs of the held-horizon workload."""
    by_round: dict[int, dict[bool, Throughput]] = {}
    for run in runs:
        if run.workload == "horizon":
            by_round.setdefault(run.round, {})[run.setting.endswith(", held")] = run.result
    return [(pair[False], pair[True]) for pair in by_round.values() if len(pair) == 2]


def median(runs: list[Any]) -> Any:
    """A throughput's median run (the lower middle of an even count): a whole
    run, so its completeness and counts go with the rate shown. Anything
    else: each number its own median, as they are measured apart."""
    if isinstance(runs[0], Throughput):
        return sorted(runs, key=lambda t: t.jobs_per_s)[(len(runs) - 1) // 2]
    values = {}
    for f in fields(runs[0]):
        measured = [getattr(run, f.name) for run in runs if getattr(run, f.name) is not None]
        values[f.name] = statistics.median_low(measured) if measured else None
    return type(runs[0])(**values)


def say(name: str, what: str) -> None:
    print(f"[{name}] {what} ...", flush=True)


def run_all(server: Server, args: argparse.Namespace) -> dict[str, SideResult]:
    """Workload by workload, every side in turn: the runs a ratio compares are
    minutes apart at most, not a whole side's run apart."""
    sides = {name: make_side(name, args.peer_python) for name in args.sides}
    results = {name: SideResult(name, version(side), side.settings) for name, side in sides.items()}
    for workload in args.workloads:
        run_rounds(workload, sides, results, server, args)
    return results


def version(side: Side) -> str:
    if side.name == "ours":
        rev = revision()
        return rev["commit"] if rev else "?"
    return peer_versions(side.python)[side.name]


def peer_versions(python: str) -> dict[str, str] | None:
    """The peers' versions as python has them installed; None when one is
    missing, or python itself (a virtualenv not built yet)."""
    script = f"import importlib.metadata as m, json\nprint(json.dumps({{n: m.version(n) for n in {PEERS!r}}}))"
    try:
        done = subprocess.run([python, "-c", script], capture_output=True, text=True)
    except OSError:
        return None
    return json.loads(done.stdout) if done.returncode == 0 else None


def python_312() -> str | None:
    """A Python >= 3.12 to build the peers' virtualenv with, found as .ci/run finds 3.13."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = [*(shutil.which(f"python3.{m}") for m in (13, 12)), *sorted(pyenv.glob("versions/3.1[23]*/bin/python3"))]
    for candidate in filter(None, found):
        check = "import sys; sys.exit(sys.version_info < (3, 12))"
        if subprocess.run([str(candidate), "-c", check], capture_output=True).returncode == 0:
            return str(candidate)
    return None


def ensure_peers(args: argparse.Namespace) -> None:
    """The peers' interpreter has bench/requirements.txt, or (the default
    .venv-peers) is built with it; SystemExit otherwise."""
    if not set(args.sides) & set(PEERS) or peer_versions(args.peer_python):
        return
    requirements = ROOT / "bench" / "requirements.txt"
    if Path(args.peer_python) == PEER_VENV / "bin" / "python":
        base = python_312()
        if base is None:
            raise SystemExit("no Python >= 3.12 for the peers (python3.13, python3.12 or pyenv's versions/3.1[23]*)")
        print(f"building {PEER_VENV.relative_to(ROOT)} with {base} and bench/requirements.txt ...", flush=True)
        subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([args.peer_python, "-m", "pip", "install", "-q", "-r", str(requirements)], check=True)
        if peer_versions(args.peer_python):
            return
    raise SystemExit(
        f"{args.peer_python} lacks the peers: run  {args.peer_python} -m pip install -r bench/requirements.txt"
        "  (a Python >= 3.12; or --only ours)"
    )


# ---------------------------------------------------------------- the table


@dataclass
class Row:
    label: str
    higher_is_better: bool
    values: dict[str, float | None]


# label, workload, field of its median, higher is better
ROWS: list[tuple[str, str, str, bool]] = [
    ("1 queue, 1 at a time (jobs/s)", "1", "jobs_per_s", True),
    ("1 queue, its best setting (jobs/s)", "2", "jobs_per_s", True),
    (f"{MANY_QUEUES} queues, 1 at a time each (jobs/s)", "3", "jobs_per_s", True),
    (f"{MANY_QUEUES} queues: db transactions/job", "3", "xacts_per_job", False),
    (f"{MANY_QUEUES} queues busy: peak connections", "3", "peak_connections", False),
    ("commit->start p50 (ms)", "4", "p50_ms", False),
    ("commit->start p99 (ms)", "4", "p99_ms", False),
    ("enqueue, 1 per commit (jobs/s)", "5", "single_per_s", True),
    (f"enqueue, {ENQUEUE_BATCH} per commit (jobs/s)", "5", "batch_per_s", True),
    (f"idle {MANY_QUEUES} queues: xacts/min", "6", "xacts_per_minute", False),
    (f"idle {MANY_QUEUES} queues: connections", "6", "connections", False),
    (f"idle {MANY_QUEUES} queues: worker RSS (MB)", "6", "rss_mb", False),
    (f"{compare_sharing.CLIENTS} enqueuers at once (jobs/s)", "7", "jobs_per_s", True),
    (f"{compare_sharing.CLIENTS} enqueuers: x plain INSERT", "7", "of_plain", True),
    (f"{MANY_QUEUES} queues, xid held (jobs/s)", "horizon", "held_jobs_per_s", True),
    (f"{MANY_QUEUES} queues, xid held: x clean", "horizon", "ratio", True),
]


def build_rows(sides: dict[str, dict[str, Any]]) -> list[Row]:
    rows = []
    for label, workload, name, higher in ROWS:
        values = {}
        for side, result in sides.items():
            found = (result["medians"].get(workload) or {}).get(name)
            values[side] = None if found is None else float(found)
        if any(v is not None for v in values.values()):
            rows.append(Row(label, higher, values))
    return rows


def best_peer(values: dict[str, float | None], higher_is_better: bool) -> str | None:
    """The peer of the highest rate, or of the lowest cost or latency."""
    peers = [p for p in PEERS if values.get(p) is not None]
    if not peers:
        return None
    return (max if higher_is_better else min)(peers, key=lambda p: values[p])  # type: ignore[arg-type,return-value]


def ratio(row: Row) -> tuple[str | None, float | None]:
    """(the best peer, ours over it)."""
    peer, ours = best_peer(row.values, row.higher_is_better), row.values.get("ours")
    if peer is None or ours is None or not row.values[peer]:
        return peer, None
    return peer, ours / row.values[peer]  # type: ignore[operator]


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    if value == int(value) and abs(value) < 1000:  # a count (connections)
        return str(int(value))
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def print_table(result: dict[str, Any]) -> None:
    sides = result["sides"]
    names = [n for n in SIDES if n in sides]
    rows = build_rows({n: sides[n] for n in names})
    versions = ", ".join(f"{n} {sides[n]['version']}" for n in names)
    print(f"fdatasync    {fsync_line(result['fdatasync'])}")
    print(f"versions     {versions}; {result['options']['jobs']} jobs per throughput run,")
    print(
        f"             rounds: {result['options']['rounds']}, each side once a round (a sweep's settings in the first)"
    )
    print()
    print_settings(result, names)
    print()
    header = f"{'workload':<40}" + "".join(f"{n:>15}" for n in names) + f"{'best peer':>15}{'ours/best':>11}"
    print(header)
    print("-" * len(header))
    for row in rows:
        peer, mine = ratio(row)
        cells = "".join(f"{_cell(row.values.get(n)):>15}" for n in names)
        print(f"{row.label:<40}{cells}{peer or '-':>15}{_cell(mine):>11}")
    print("(ours/best: ours over the best peer of the row; above 1 is more: better for jobs/s,")
    print(" worse for transactions, connections, latency and memory)")
    print_serial_shares(result, names)
    print_step_alone(result, rows)
    print_rounds(result, names)
    compare_sharing.print_notes(result, names, make_side)
    print_incomplete(result, names)


def print_settings(result: dict[str, Any], names: list[str]) -> None:
    """Every side's settings, and what each sweep of this run found (median jobs/s of each setting)."""
    print("settings (each side at its own best for each workload)")
    swept = result["options"]["sweep"]
    for name in names:
        side = result["sides"][name]
        print(f"  {name}: {side['settings']}")
        for workload, label in side["chosen"].items():
            # The sweep is the first round, where every setting ran: the
            # chosen one's later rounds are in the table's median, not here.
            tried = {
                run["setting"]: run["result"]["jobs_per_s"]
                for run in side["runs"]
                if run["workload"] == workload and run["round"] == 1 and "jobs_per_s" in run["result"]
            }
            line = f"    {workload}. {WORKLOADS[workload]}: {label}"
            if len(tried) > 1 and workload != "horizon":
                swept_rates = "; ".join(f"{s} {v:,.0f}" for s, v in tried.items())
                line += f" (the first round's sweep: {swept_rates} jobs/s)"
            elif workload in "13" and not swept and name != "ours":
                line += " (the recorded sweep's best: see below)"
            print(line)
    if not swept:
        print(
            "  workloads 1 and 3 of the peers: concurrency 1 is the workload, the other knobs a recorded sweep's best:"
        )
        for line in RECORDED:
            print(f"    {line}")
        print(f"    redo: DATABASE_URL=... {SWEEP_COMMAND}")


def fsync_line(fsync: dict[str, Any]) -> str:
    where = {True: "the server's data directory's", False: "another", None: "an unknown"}[fsync["same_device"]]
    run = f"{fsync['binary']} -s {fsync['seconds']}, {where} filesystem"
    return f"{fsync['ops_per_s']:,.0f}/s, one 8 kB write each ({run})"


def print_serial_shares(result: dict[str, Any], names: list[str]) -> None:
    """The serial row against the disk's flush rate and the server's one-row UPDATE commit rate, both of this run."""
    fsync, tps = result["fdatasync"]["ops_per_s"], result["commit_rate"]["tps"]
    if not any("1" in result["sides"][name]["medians"] for name in names):
        return
    print(
        f"1 queue, 1 at a time, as a share of fdatasync ({fsync:,.0f}/s) and of one-row UPDATE commits ({tps:,.0f}/s):"
    )
    for name in names:
        serial = result["sides"][name]["medians"].get("1")
        if serial:
            jobs = serial["jobs_per_s"]
            print(f"  {name:<14} {jobs:>8,.0f} jobs/s   {jobs / fsync:.2f} of fdatasync   {jobs / tps:.2f} of commits")


def print_step_alone(result: dict[str, Any], rows: list[Row]) -> None:
    """Each statement with no worker around it, against the same peers: the
    most its row's ratio could be with that statement."""
    found = result["sides"].get("ours", {}).get("step_alone") or {}
    for workload, (path, _) in STEP_ALONE.items():
        alone = found.get(workload)
        label = next(r[0] for r in ROWS if r[1] == workload)
        row = next((row for row in rows if row.label == label), None)
        if not alone or row is None:
            continue
        _, best = ratio(Row(row.label, True, {**row.values, "ours": alone}))
        line = f"  {WORKLOADS[workload]}: {path.removesuffix(', a job')} alone (no worker) {alone:,.0f} jobs/s"
        if best is not None:
            line += f", {best:.2f} x the best peer"
        ours = row.values.get("ours")
        if ours:
            line += f"; the worker runs at {ours / alone:.2f} of it"
        print(line)


def print_rounds(result: dict[str, Any], names: list[str]) -> None:
    """Each rate row round by round, ours over the best peer of that round:
    how far the median's ratio could move between runs."""
    sides = result["sides"]
    for label, workload, name, higher in ROWS:
        # The held horizon's rows are ratios of a clean and a held run: print_sharing shows its rounds.
        if not higher or "ours" not in names or workload == "horizon":
            continue
        per_round: dict[int, dict[str, float]] = {}
        for side in names:
            chosen = sides[side]["chosen"].get(workload)
            for run in sides[side]["runs"]:
                if (run["workload"], run["setting"]) == (workload, chosen):
                    per_round.setdefault(run["round"], {})[side] = run["result"][name]
        each = []
        for values in per_round.values():
            peer, mine = ratio(Row(label, True, values))  # type: ignore[arg-type]
            each.append(f"{mine:.2f} ({peer})" if mine is not None else "-")
        if len(each) > 1:
            print(f"  {label.split(' (')[0]}, round by round, ours over the best peer: {', '.join(each)}")


def print_incomplete(result: dict[str, Any], names: list[str]) -> None:
    for name in names:
        for run in result["sides"][name]["runs"]:
            found = run["result"]
            if "complete" in found and not found["complete"]:
                print(
                    f"  INCOMPLETE {name} workload {run['workload']} round {run['round']} {run['setting']}:"
                    f" {found['done']}/{found['jobs']} done, {found['error']}"
                )
            if "started" in found and found["started"] < found["samples"]:
                print(
                    f"  {name} latency round {run['round']}:"
                    f" {found['samples'] - found['started']} jobs not started within 5 s"
                )


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, help="jobs per throughput and enqueue run (default 5000; quick 1000)")
    parser.add_argument("--only", choices=SIDES, action="append", help="run only this side (repeatable)")
    parser.add_argument(
        "--workloads", default="1,2,3,4,5,6,7,horizon", help="comma-separated, of 1-7 and horizon (%(default)s)"
    )
    parser.add_argument("--seconds", type=float, help="workload 7's window (default 10; quick 3)")
    parser.add_argument(
        "--concurrencies", default="16,32,64,128,256,512,1024", help="workload 2's sweep for ours (default %(default)s)"
    )
    parser.add_argument("--sweep", action="store_true", help="workloads 1 and 3: every listed setting of each peer")
    parser.add_argument("--samples", type=int, help="workload 4's jobs (default 200; quick 50)")
    parser.add_argument("--idle-seconds", type=float, help="workload 6's window (default 60; quick 20)")
    parser.add_argument("--settle", type=float, help="workload 6: seconds before the window (default 30; quick 15)")
    parser.add_argument("--fsync-seconds", type=int, help="pg_test_fsync's seconds a test (default 2; quick 1)")
    add_pgbench_seconds(parser, default=0)
    parser.add_argument(
        "--rounds", type=int, help="rounds of every workload, each side once a round (default 3; quick 1)"
    )
    parser.add_argument(
        "--peer-python",
        default=str(PEER_VENV / "bin" / "python"),
        help="the interpreter (Python >= 3.12) with bench/requirements.txt, for the peers"
        " (default %(default)s, built when missing)",
    )
    parser.add_argument("--quick", action="store_true", help="a sanity run: smaller numbers, shorter windows")
    args = parser.parse_args(argv)
    quick = args.quick
    args.jobs = args.jobs or (1000 if quick else 5000)
    args.samples = args.samples or (50 if quick else 200)
    args.seconds = args.seconds or (3.0 if quick else 10.0)
    args.idle_seconds = args.idle_seconds or (20.0 if quick else 60.0)
    args.settle = args.settle if args.settle is not None else (15.0 if quick else 30.0)
    args.fsync_seconds = args.fsync_seconds or (1 if quick else 2)
    # 0: not given on the command line.
    args.pgbench_seconds = args.pgbench_seconds or (5 if quick else 10)
    args.rounds = args.rounds or (1 if quick else 3)
    args.workloads = sorted({w.strip() for w in args.workloads.split(",") if w.strip()})
    args.concurrencies = sorted({int(c) for c in args.concurrencies.split(",")})
    args.sides = [s for s in SIDES if not args.only or s in args.only]
    if set(args.workloads) - set(WORKLOADS) or args.jobs < MANY_QUEUES or min(args.concurrencies) < 1:
        parser.error("--workloads of 1-7 and horizon, --jobs >= 40, --concurrencies >= 1")
    if args.rounds < 1:
        parser.error("--rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_peers(args)

    def measure(server: Server, rate: CommitRate) -> dict[str, Any]:
        print(f"pg_test_fsync: {args.fsync_seconds} s a test ...", flush=True)
        fsync = harness.fdatasync_rate(rate.pgbench, args.fsync_seconds, server)
        results = run_all(server, args)
        sides = {name: asdict(r) for name, r in results.items()}
        rows = build_rows(sides)
        return {
            "fdatasync": asdict(fsync),
            "sides": sides,
            "table": [{**asdict(row), "best_peer_and_ratio": ratio(row)} for row in rows],
        }

    return harness.run("compare", args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
