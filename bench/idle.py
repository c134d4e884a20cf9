"""Idle cost: the transactions a minute that an idle worker causes, and the
memory and connections it holds.

Run from the project root:  .venv/bin/python bench/idle.py [--window SECONDS] [--settle SECONDS] [--queues 40]

A real worker process (bench/apps/idle_worker.py: worker.main with --queues
trivial queues at the Poller's default poll interval, the default lease, and
the real schedule of queues/schedule.py) runs against a fresh database with
nothing to do. After it has started and settled, the benchmark counts the
database's transactions over a window, two ways:

  - server: xact_commit + xact_rollback of pg_stat_database, read from a
    connection to another database (so the reads never count themselves);
  - client: every statement the worker sent, noted by the worker process
    itself, by kind, and the transactions they made (a statement in
    autocommit is one; statements inside a transaction make one, at its
    COMMIT; a new session also counts one).

At the end of the window it reads the worker's resident memory (VmRSS of
/proc/<pid>/status) and the connections it holds to the database
(pg_stat_activity, by application_name).

The target is at most 10 transactions a minute and at most 40 MB resident.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg2.extensions

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    Scratch,
    begin,
    context_lines,
    finish,
    machine_line,
    run_record,
    scratch_database,
)
from lib.background.leases import LEASE_SECONDS
from lib.run.poller import Poller
from lib.store.db import DB

APP = ROOT / "bench" / "apps" / "idle_worker.py"
TARGET_PER_MINUTE = 10.0
TARGET_RSS_MB = 40.0
MIN_WINDOW = 120.0
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
# Statements of a worker's first minutes that a worker running for hours no
# longer sends: each pooled connection prepares each named query once and each
# new session counts a transaction; the clock's first tick (the first minute
# boundary after the start) looks up and fires missed catch-up runs, and prunes.
TRANSIENT = ("PREPARE ", "session start")
CLOCK = "clock_"
FIRST_TICK_SPAN = 5.0  # seconds the first tick's statements take, at most
# Settings that would change what is measured; the benchmark measures the defaults.
UNSET = ("JOBS_LEASE_SECONDS", "SENTRY_DSN", "LOG_LEVEL")


@dataclass
class Window:
    queues: int
    seconds: float = 0.0
    server_xacts: int = 0
    client_statements: int = 0
    client_xacts: int = 0  # the transactions those statements made
    # Client statements by kind, and by the connection's application_name.
    kinds: dict[str, int] = field(default_factory=dict)
    applications: dict[str, int] = field(default_factory=dict)
    transient: int = 0  # of the client transactions, start-up ones (see TRANSIENT)
    first_tick_inside: bool = False  # whether the clock's first tick fell in the window
    rss_mb: float = 0.0  # the worker's VmRSS at the end of the window
    connections: dict[str, int] = field(default_factory=dict)  # by application_name, at the end

    def per_minute(self, count: float) -> float:
        return 60 * count / self.seconds if self.seconds else 0.0


# ---------------------------------------------------------------- the worker


def start_worker(url: str, queues: int, statements: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(DATABASE_URL=url, BENCH_QUEUES=str(queues), BENCH_STATEMENTS=str(statements), LOG_LEVEL="INFO")
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, str(APP)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(admin: psycopg2.extensions.connection, dbname: str, proc: subprocess.Popen[bytes]) -> float:
    """The time the worker's listener connected: pollers, leases and clock are
    running by then (worker.run starts them together)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode} before it was ready")
        with admin.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = 'jobs-listener'",
                (dbname,),
            )
            if cur.fetchone()[0]:
                return time.time()
        time.sleep(0.1)
    raise RuntimeError(f"the worker's listener did not connect within {READY_TIMEOUT:g} s")


def stop_worker(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the worker did not stop within {STOP_TIMEOUT:g} s of SIGTERM") from None


def server_xacts(admin: psycopg2.extensions.connection, dbname: str) -> int:
    with admin.cursor() as cur:
        cur.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (dbname,))
        return int(cur.fetchone()[0])


def rss_mb(pid: int) -> float:
    """The process's resident memory now (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def connections(admin: psycopg2.extensions.connection, dbname: str) -> dict[str, int]:
    """The connections to the bench database now, by application_name: the
    worker's (the benchmark's own admin connection is to another database)."""
    with admin.cursor() as cur:
        cur.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY 1 ORDER BY 2 DESC, 1",
            (dbname,),
        )
        return {app: int(n) for app, n in cur.fetchall()}


Statement = tuple[float, str, str, bool]  # time, application_name, kind, whether it ended a transaction


def read_statements(path: Path) -> list[Statement]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines() if line]  # type: ignore[misc]


# ---------------------------------------------------------------- measure


def measure(scratch: Scratch, args: argparse.Namespace, work: Path) -> Window:
    statements_path, log_path = work / "statements.jsonl", work / "worker.log"
    proc = start_worker(scratch.url, args.queues, statements_path, log_path)
    window = Window(args.queues)
    try:
        ready = wait_ready(scratch.admin, scratch.name, proc)
        print(f"worker ready; settling {args.settle:g} s, then counting for {args.window:g} s ...", flush=True)
        time.sleep(max(0.0, ready + args.settle - time.time()))
        # Counts reach pg_stat_database a moment after each backend's
        # transaction (at most once a second while busy; up to 10 s later once
        # idle). Both reads lag alike, so the difference covers the window.
        start, before = time.time(), server_xacts(scratch.admin, scratch.name)
        time.sleep(args.window)
        end, after = time.time(), server_xacts(scratch.admin, scratch.name)
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode} during the window")
        window.rss_mb = rss_mb(proc.pid)
        window.connections = connections(scratch.admin, scratch.name)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        print(log_path.read_text()[-3000:], file=sys.stderr)
        raise
    code = stop_worker(proc)
    if code != 0:
        print(log_path.read_text()[-3000:], file=sys.stderr)
        raise RuntimeError(f"the worker exited with {code}")
    window.seconds = end - start
    window.server_xacts = after - before
    count(window, read_statements(statements_path), start, end)
    return window


def count(window: Window, statements: list[Statement], start: float, end: float) -> None:
    """The client's statements in [start, end): by kind, by connection; the
    transactions they made, and how many of those are start-up transients."""
    first_tick = min((t for t, _, kind, _ in statements if CLOCK in kind), default=None)

    def transient(t: float, kind: str) -> bool:
        at_first_tick = first_tick is not None and CLOCK in kind and t < first_tick + FIRST_TICK_SPAN
        return kind.startswith(TRANSIENT) or at_first_tick

    inside = [s for s in statements if start <= s[0] < end]
    window.client_statements = len(inside)
    window.client_xacts = sum(1 for *_, xact in inside if xact)
    window.kinds = dict(Counter(kind for _, _, kind, _ in inside).most_common())
    window.applications = dict(Counter(app for _, app, _, _ in inside).most_common())
    window.transient = sum(1 for t, _, kind, xact in inside if xact and transient(t, kind))
    window.first_tick_inside = first_tick is not None and start <= first_tick < end


def expected(queues: int, poll_interval: float, lease: float, ping_after: float) -> dict[str, float]:
    """What the code says an idle worker sends a minute: one group commit
    (job_step) per poll interval, carrying every queue's empty claim, since
    the queues' fallback polls fall on the same instants; and a rescue once a
    lease while it holds no job
    (Leases.rescue_period), with the registry's worker_seen in the same
    transaction, which its COMMIT ends (the heartbeat sends nothing with no
    job running); at most, before each, the pool's ping, when its pooled
    connection sat idle past DB.ping_after. The clock's statements are rare
    (caches.Age every 15 minutes, the hourly prune)."""
    claims = 60 / poll_interval if queues else 0.0
    rescues = 60 / lease
    pings = (claims if ping_after < poll_interval else 0) + (rescues if ping_after < lease else 0)
    return {
        "job_step": claims,
        "job_rescue": rescues,
        "worker_seen": rescues,
        "COMMIT": rescues,
        "ping (SELECT 1), at most": pings,
    }


# ---------------------------------------------------------------- report


def default_poll_interval() -> float:
    """The Poller's default, as the worker's trivial queues get it."""
    return float(inspect.signature(Poller).parameters["poll_interval"].default)


def default_ping_after() -> float:
    """How long a pooled connection may sit idle before a checkout pings it."""
    return float(inspect.signature(DB).parameters["ping_after"].default)


def default_window(poll_interval: float) -> float:
    """At least MIN_WINDOW, and a whole number of poll intervals. The queues'
    empty claims come in one burst per poll interval (every poller claims when
    the listener connects, then sleeps the same interval); a window of whole
    intervals that starts between bursts holds the same number of bursts
    wherever it starts."""
    return poll_interval * max(1, math.ceil(MIN_WINDOW / poll_interval))


def report(scratch: Scratch, window: Window, args: argparse.Namespace, load: float) -> dict[str, Any]:
    poll_interval, ping_after = default_poll_interval(), default_ping_after()
    per_minute = window.per_minute(window.server_xacts)
    return {
        **run_record(scratch.server, load),
        "options": {"queues": args.queues, "window_s": args.window, "settle_s": args.settle},
        "worker": {
            "poll_interval_s": poll_interval,
            "lease_s": LEASE_SECONDS,
            "ping_after_s": ping_after,
            "schedule": "queues/schedule.py",
        },
        "window": asdict(window),
        "per_minute": {
            "server": per_minute,
            "client": window.per_minute(window.client_xacts),
            "client_steady": window.per_minute(window.client_xacts - window.transient),
            "kinds": {k: window.per_minute(n) for k, n in window.kinds.items()},
        },
        "expected_per_minute": expected(args.queues, poll_interval, LEASE_SECONDS, ping_after),
        "target": {
            "per_minute": TARGET_PER_MINUTE,
            "rss_mb": TARGET_RSS_MB,
            "met": per_minute <= TARGET_PER_MINUTE and window.rss_mb <= TARGET_RSS_MB,
        },
    }


def print_table(result: dict[str, Any]) -> None:
    window, rates, worker = result["window"], result["per_minute"], result["worker"]
    print()
    print("\n".join(context_lines(result)))
    print(machine_line(result))
    print(
        f"\nidle worker: {window['queues']} queues at the default poll interval ({worker['poll_interval_s']:g} s),"
        f" lease {worker['lease_s']:g} s, the real schedule; window {window['seconds']:.0f} s,"
        f" from {result['options']['settle_s']:g} s after its listener connected"
    )
    print(f"\n{'transactions in the bench database':<44}{'count':>8}{'per min':>10}")
    print(f"{'server (pg_stat_database)':<44}{window['server_xacts']:>8}{rates['server']:>10.1f}")
    print(f"{'client (transactions the worker sent)':<44}{window['client_xacts']:>8}{rates['client']:>10.1f}")
    steady = window["client_xacts"] - window["transient"]
    print(f"{'client, less start-up transients':<44}{steady:>8}{rates['client_steady']:>10.1f}")
    print(f"\n{'client statements by kind':<44}{'count':>8}{'per min':>10}{'expected':>10}")
    expect = result["expected_per_minute"]
    for kind, count in window["kinds"].items():
        hint = next((v for k, v in expect.items() if k.startswith(kind)), None)
        hint_text = "" if hint is None else f"{hint:>10.1f}"
        print(f"{kind[:43]:<44}{count:>8}{rates['kinds'][kind]:>10.1f}{hint_text}")
    apps = ", ".join(f"{app or '?'} {n}" for app, n in window["applications"].items())
    print(f"by connection: {apps}")
    print("(a statement in autocommit is a transaction; those inside one are ended by its COMMIT)")
    print("(expected: from the code, see idle.py expected(); a ping precedes a statement whose pooled connection")
    print(f" sat idle past DB.ping_after, {worker['ping_after_s']:g} s; start-up transients: PREPAREs, session starts,")
    first = "inside" if window["first_tick_inside"] else "outside"
    print(f" the clock's first tick (catch-up look-up and fire, prune), which fell {first} the window)")
    held = ", ".join(f"{app or '?'} {n}" for app, n in window["connections"].items()) or "none"
    print(f"\nworker at the end of the window: {window['rss_mb']:.1f} MB resident (VmRSS);")
    print(f"connections to the bench database: {sum(window['connections'].values())} ({held})")
    verdict = "MET" if result["target"]["met"] else "NOT MET"
    print(
        f"\ntarget: at most {TARGET_PER_MINUTE:g} transactions a minute and {TARGET_RSS_MB:g} MB: {verdict}"
        f" (server: {rates['server']:.1f} a minute, {window['rss_mb']:.1f} MB)"
    )


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--window",
        type=float,
        help=f"seconds counted (default: the fewest whole poll intervals that make {MIN_WINDOW:g} s or more)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        help="seconds from the listener's connection to the window (default: 1.25 poll intervals, 20 s or more)",
    )
    parser.add_argument("--queues", type=int, default=40, help="trivial queues (default %(default)s)")
    args = parser.parse_args(argv)
    poll_interval = default_poll_interval()
    if args.window is None:
        args.window = default_window(poll_interval)
    if args.settle is None:
        # Past the first poll after the start, and a quarter interval more, so
        # the window starts between two bursts of claims. A backend reports a
        # transaction that read no table (the start's PREPAREs) only with its
        # next one that does, or when it closes: with the first poll's claims.
        args.settle = max(20.0, poll_interval * 1.25)
    if args.window <= 0 or args.settle < 0 or args.queues < 1:
        parser.error("--window > 0, --settle >= 0, --queues >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server, load_at_start = begin(quiet=False)
    with scratch_database(server) as scratch, tempfile.TemporaryDirectory(prefix="jobs-bench-idle-") as work:
        print(f"PostgreSQL {server.version} ({server.source}), bench database {scratch.name}", flush=True)
        window = measure(scratch, args, Path(work))
        result = report(scratch, window, args, load_at_start)
    return finish(result, "idle", print_table)


if __name__ == "__main__":
    sys.exit(main())
