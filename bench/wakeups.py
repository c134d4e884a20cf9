"""Wake latency: from another process's commit to the handler's start.

Run from the project root:  .venv/bin/python bench/wakeups.py [--count 300] [--poll-interval 60]

On a fresh database of one server (DATABASE_URL, else the embedded one in
.pgdata/bench), this process runs a Listener and one Poller whose fallback poll
is long (60 s), wired as worker.run wires them: a notification for the queue
calls poller.wake(). A separate, plain Python process (bench/apps/wake_producer.py,
no gevent) enqueues through lib.insert:

  1. one job per transaction, --count times, 50-100 ms apart; it notes
     time.time() right after each commit, the handler notes time.time() as it
     starts, and the difference is the wake latency (one machine, one clock);
  2. one set-based INSERT ... SELECT of 100 rows, one commit: the listener
     should wake the poller once, and the poller run all 100 without another.
"""

# ruff: noqa: E402  (monkey-patching must come before every other import)
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse
import bisect
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gevent
import psycopg2.extensions
from gevent.event import Event

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(ROOT))

from bench.common import (
    Scratch,
    begin,
    context_lines,
    finish,
    machine_line,
    percentile,
    run_record,
    scratch_database,
)
from lib.job import PendingJob
from lib.run.poller import Poller
from lib.store.db import DB
from lib.store.wakeups import Listener

QUEUE = "wake"
PROBE = "wake.Probe"
BULK = "wake.Bulk"
PRODUCER = ROOT / "bench" / "apps" / "wake_producer.py"
# Connections beyond the poller's one, as worker.py sizes its pool.
POOL_BUFFER = 4
# A backend reports its transaction counts at most once a second while busy;
# the counts of its last second reach pg_stat_database only after it has been
# idle for up to 10 s (PGSTAT_IDLE_INTERVAL, PostgreSQL 15 and later).
STATS_SETTLE = 11.0
# A job not started this long after the producer's last commit missed its wake
# and waits for the fallback poll; it counts as missed, not waited for.
STRAGGLER_WAIT = 5.0
# A commit's notification can reach the listener a moment before the producer,
# which notes the time only once its own commit has returned.
NOTIFY_SLACK = 0.02
# After the bulk phase's last job, time for any further notification to arrive.
LATE_WAKES = 0.5

log = logging.getLogger("bench")


class Recorder:
    """The handlers' start times and every wake the listener delivers, routed to
    the poller the way worker._router does: a queue's own pollers, no others."""

    def __init__(self) -> None:
        self.poller: Poller | None = None
        self.starts: dict[int, float] = {}
        self.bulk_starts: list[float] = []
        self.bulk_target = 0
        self.bulk_done = Event()
        self.wakes: list[float] = []  # times the listener woke this queue
        self.other_wakes = 0  # notifications for queues this process does not run
        self.wake_alls: list[float] = []

    def probe(self, job: PendingJob) -> str:
        now = time.time()  # first: the latency ends where the handler begins
        self.starts.setdefault(job.args["seq"], now)
        return "ok"

    def bulk(self, job: PendingJob) -> str:
        self.bulk_starts.append(time.time())
        if len(self.bulk_starts) >= self.bulk_target:
            self.bulk_done.set()
        return "ok"

    def wake(self, queue: str) -> None:
        if self.poller is None or queue != self.poller.queue:
            self.other_wakes += 1
            return
        self.wakes.append(time.time())
        self.poller.wake()

    def wake_all(self) -> None:
        self.wake_alls.append(time.time())
        if self.poller is not None:
            self.poller.wake()


@dataclass
class Spread:
    """Milliseconds: p50, p90, p99, max and mean of some samples."""

    samples: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, seconds: list[float]) -> Spread | None:
        if not seconds:
            return None
        ms = [1000 * s for s in seconds]
        return cls(len(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), max(ms), sum(ms) / len(ms))


@dataclass
class Single:
    commits: int
    started: int = 0
    missed: int = 0  # not started within STRAGGLER_WAIT of the last commit: left to the fallback poll
    latency: Spread | None = None  # commit -> handler start
    notified: Spread | None = None  # commit -> the listener's wake (of the samples a wake started)
    claimed: Spread | None = None  # that wake -> handler start (the claim's round trip, mostly)
    without_wake: int = 0  # started before any wake of its own (claimed along with the last outcome)
    wakes: int = 0
    server_xacts_per_job: float | None = None  # in the bench database, less the producer's own
    latencies_ms: list[float] = field(default_factory=list)


@dataclass
class Bulk:
    rows: int
    started: int = 0
    wakes: int = 0  # listener wakes of the queue from just before the commit until all ran (+LATE_WAKES)
    first_start_ms: float | None = None  # commit -> first handler start
    last_start_ms: float | None = None  # commit -> last handler start


class XactMeter:
    """Transactions of the bench database, read from the admin connection (on
    another database, so its own statements never count)."""

    def __init__(self, admin: psycopg2.extensions.connection, dbname: str) -> None:
        self.admin = admin
        self.dbname = dbname

    def read(self) -> int:
        gevent.sleep(STATS_SETTLE)
        with self.admin.cursor() as cur:
            cur.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (self.dbname,))
            return int(cur.fetchone()[0])


def produce(url: str, mode: str, count: int, gap: tuple[float, float]) -> list[tuple[int, float]]:
    """Run the producer process; its [seq, commit time] pairs."""
    command = [sys.executable, str(PRODUCER), mode, "--url", url, "--queue", QUEUE, "--count", str(count)]
    command += ["--name", PROBE if mode == "single" else BULK, "--gap-min", str(gap[0]), "--gap-max", str(gap[1])]
    # gevent's subprocess: the listener and the poller go on while this waits.
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=count * gap[1] + 60)
    if done.returncode != 0:
        raise SystemExit(f"the producer failed ({done.returncode}):\n{done.stderr}")
    return [(int(seq), float(t)) for seq, t in json.loads(done.stdout)]


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        gevent.sleep(0.01)
    return True


def split(rec: Recorder, commits: list[tuple[int, float]]) -> tuple[list[float], list[float], int]:
    """For each started job, commit -> wake and wake -> start, where the wake is
    the last one before the start, if it came after this job's commit."""
    wakes = sorted(rec.wakes)
    notified, claimed, without = [], [], 0
    for seq, committed in commits:
        start = rec.starts.get(seq)
        if start is None:
            continue
        i = bisect.bisect_right(wakes, start) - 1
        if i < 0 or wakes[i] < committed - NOTIFY_SLACK:
            without += 1
            continue
        notified.append(wakes[i] - committed)
        claimed.append(start - wakes[i])
    return notified, claimed, without


def run_single(url: str, rec: Recorder, meter: XactMeter, count: int, gap: tuple[float, float]) -> Single:
    xacts_before = meter.read()
    wakes_before = len(rec.wakes)
    commits = produce(url, "single", count, gap)
    wait_until(lambda: len(rec.starts) >= count, STRAGGLER_WAIT)
    phase = Single(count, started=len(rec.starts), wakes=len(rec.wakes) - wakes_before)
    phase.missed = count - phase.started
    latencies = [rec.starts[seq] - t for seq, t in commits if seq in rec.starts]
    phase.latencies_ms = [round(1000 * s, 3) for s in latencies]
    phase.latency = Spread.of(latencies)
    notified, claimed, phase.without_wake = split(rec, commits)
    phase.notified, phase.claimed = Spread.of(notified), Spread.of(claimed)
    # Less the producer's commits and the transaction its session ran as it started.
    producer_xacts = count + 1
    if phase.started:
        phase.server_xacts_per_job = (meter.read() - xacts_before - producer_xacts) / phase.started
    return phase


def run_bulk(url: str, rec: Recorder, rows: int) -> Bulk:
    rec.bulk_target = rows
    since = time.time()
    commits = produce(url, "bulk", rows, (0.0, 0.0))
    committed = commits[0][1]
    rec.bulk_done.wait(30)
    gevent.sleep(LATE_WAKES)
    phase = Bulk(rows, started=len(rec.bulk_starts), wakes=sum(1 for t in rec.wakes if t >= since))
    if rec.bulk_starts:
        phase.first_start_ms = 1000 * (min(rec.bulk_starts) - committed)
        phase.last_start_ms = 1000 * (max(rec.bulk_starts) - committed)
    return phase


def measure(scratch: Scratch, args: argparse.Namespace) -> tuple[Single, Bulk, int]:
    """Both phases with one listener and one poller; also the wake_all calls
    (one per listener connection, at its start)."""
    db = DB.connect(scratch.url, size=1 + POOL_BUFFER, application_name="jobs-bench")
    rec = Recorder()
    poller = Poller(QUEUE, db, {PROBE: rec.probe, BULK: rec.bulk}, poll_interval=args.poll_interval)
    rec.poller = poller
    listener = Listener(scratch.url, rec.wake, rec.wake_all)
    stop = Event()
    greenlets = [gevent.spawn(listener.run, stop), gevent.spawn(poller.poll, stop)]
    try:
        if not listener.listening.wait(10):
            raise SystemExit("the listener did not connect within 10 s")
        meter = XactMeter(scratch.admin, scratch.name)
        print(f"{args.count} single-job commits from another process ...", flush=True)
        single = run_single(scratch.url, rec, meter, args.count, (args.gap_min, args.gap_max))
        print(f"one INSERT ... SELECT of {args.bulk_rows} rows ...", flush=True)
        bulk = run_bulk(scratch.url, rec, args.bulk_rows)
        dead = [g for g in greenlets if g.dead]
        if dead:
            raise SystemExit(f"the listener or the poller died: {dead[0].exception!r}")
    finally:
        stop.set()
        poller.wake()
        gevent.joinall(greenlets, timeout=10)
        gevent.killall(greenlets)
        db.close()
    return single, bulk, len(rec.wake_alls)


# ---------------------------------------------------------------- report


def report(scratch: Scratch, single: Single, bulk: Bulk, wake_alls: int, args: argparse.Namespace, load: float):
    return {
        **run_record(scratch.server, load),
        "options": {
            "count": args.count,
            "gap_s": [args.gap_min, args.gap_max],
            "poll_interval_s": args.poll_interval,
            "bulk_rows": args.bulk_rows,
        },
        "single": asdict(single),
        "bulk": asdict(bulk),
        "listener_wake_alls": wake_alls,
    }


def _row(label: str, spread: dict[str, Any] | None) -> str:
    if spread is None:
        return f"{label:<22}{'n/a':>9}"
    cells = "".join(f"{spread[k]:>9.2f}" for k in ("p50", "p90", "p99", "max", "mean"))
    return f"{label:<22}{cells}{spread['samples']:>9}"


def print_table(result: dict[str, Any]) -> None:
    options, single, bulk = result["options"], result["single"], result["bulk"]
    print()
    print("\n".join(context_lines(result)))
    print(machine_line(result))
    gap = options["gap_s"]
    print(
        f"\none job per commit from another process: {single['commits']} commits,"
        f" {1000 * gap[0]:.0f}-{1000 * gap[1]:.0f} ms apart; fallback poll every {options['poll_interval_s']:g} s"
    )
    print(f"{'ms':<22}" + "".join(f"{c:>9}" for c in ("p50", "p90", "p99", "max", "mean", "samples")))
    print(_row("commit -> start", single["latency"]))
    print(_row("commit -> wake", single["notified"]))
    print(_row("wake -> start", single["claimed"]))
    xacts = "n/a" if single["server_xacts_per_job"] is None else f"{single['server_xacts_per_job']:.2f}"
    print(
        f"started {single['started']}/{single['commits']} (missed, left to the fallback poll: {single['missed']});"
        f" started without a wake of their own: {single['without_wake']};"
        f" listener wakes {single['wakes']}; server xacts/job {xacts}"
    )
    first = "n/a" if bulk["first_start_ms"] is None else f"{bulk['first_start_ms']:.2f} ms"
    last = "n/a" if bulk["last_start_ms"] is None else f"{bulk['last_start_ms']:.0f} ms"
    print(f"\none INSERT ... SELECT of {bulk['rows']} rows, one commit from another process")
    print(
        f"listener wakes {bulk['wakes']} (expected 1); started {bulk['started']}/{bulk['rows']};"
        f" commit -> first start {first}, -> last start {last}"
    )
    print("(commit -> wake may be below 0: a notification can reach the listener before the producer's commit")
    print(" call has returned; server xacts/job: every transaction of the bench database during the phase, less")
    print(f" the producer's own, per job; wake_all calls: {result['listener_wake_alls']}, one per listener connection)")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=300, help="single-job commits (default %(default)s)")
    parser.add_argument("--gap-min", type=float, default=0.05, help="seconds between commits, at least")
    parser.add_argument("--gap-max", type=float, default=0.1, help="seconds between commits, at most")
    parser.add_argument("--poll-interval", type=float, default=60.0, help="fallback poll (default %(default)s s)")
    parser.add_argument("--bulk-rows", type=int, default=100, help="rows of the set-based insert")
    args = parser.parse_args(argv)
    if args.count < 1 or args.bulk_rows < 1 or not 0 <= args.gap_min <= args.gap_max or args.poll_interval <= 0:
        parser.error("--count and --bulk-rows >= 1, 0 <= --gap-min <= --gap-max, --poll-interval > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server, load_at_start = begin()
    with scratch_database(server) as scratch:
        print(f"PostgreSQL {server.version} ({server.source}), bench database {scratch.name}", flush=True)
        single, bulk, wake_alls = measure(scratch, args)
        result = report(scratch, single, bulk, wake_alls, args, load_at_start)
    return finish(result, "wakeups", print_table)


if __name__ == "__main__":
    sys.exit(main())
