"""What the server itself allows a start and an enqueue on this machine: the
floors under workloads 4 and 5 of bench/compare.py, with no queue library
in the way, so that a ratio against a peer can be read against what is left
to win.

Run from the project root:  .venv/bin/python bench/floors.py [--samples 200] [--rows 2000] [--rounds 3]

Enqueue, one row a commit from a plain psycopg2 connection (autocommit), the
kinds taking turns --rounds times (each round begun by the next kind), --rows
rows each, medians:
  - a one-row UPDATE of a table of its own: what pgbench commits;
  - a plain INSERT into jobs with its insert trigger off: the row and its indexes;
  - the same INSERT with the trigger on: the row and its NOTIFY, a poller of
    the queue asleep (an enqueue notifies only then);
  - lib.insert: what an application calls, to that sleeping queue.

A start, another process's commit to the job claimed: this process enqueues
--samples jobs through lib.insert, one a commit, 50-100 ms apart (as
workload 4 does), and a child process that LISTENs, blocked in select() on
its connection as an idle worker is, claims each job the moment its
NOTIFY arrives, commits the claim and goes back to sleep (jobs_sleep); the two kinds of claim take turns, job
by job. Each time is the child's time.time() less the producer's right after
its commit returned (one machine, one clock), p50 and p99:
  - the NOTIFY read: the wakeup alone;
  - a claim as one plain UPDATE ... FOR UPDATE SKIP LOCKED of the queue's
    head, and its commit: the least a claim with a lease can be;
  - a claim through jobs_step_one, as the worker sends a lone claim.
Any worker that starts a job only once its claim is committed (so that a
crash cannot run it twice without a lease to show for it) starts no sooner
than the plain claim's time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import select
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import CommitRate, Server, add_pgbench_seconds, percentile, run, scratch_database
from lib.insert import insert
from lib.run.steps import Ask, lone_step

QUEUE = "floor"
JOB_NAME = "bench.Noop"

_PLAIN_CLAIM = """
UPDATE jobs SET status = 'started', started_at = now(), attempts = attempts + 1, worker_id = 'floor', slot = 0,
                lease_until = now() + interval '30 seconds'
WHERE id = (SELECT id FROM jobs WHERE queue = %s AND status = 'pending'
            ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, name, args::text
"""
_FINISH = "UPDATE jobs SET status = 'ok', finished_at = now(), slot = NULL, lease_until = NULL WHERE id = %s"
_INSERT = (
    "INSERT INTO jobs (queue, name, args, callsite, run_at, priority, dedupe)"
    " VALUES (%s, %s, %s, 'floor', now(), 0, false)"
)

CLAIMS = ("plain UPDATE", "jobs_step_one")


def connect(url: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(url, application_name="jobs-bench-floors")
    conn.autocommit = True
    return conn


def enqueue_rates(url: str, rows: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Rows a second of each kind, the kinds in turns: {kind: {per_s, rounds}}."""
    conn = connect(url)
    cur = conn.cursor()
    cur.execute("CREATE TABLE floor_one (id int PRIMARY KEY, n bigint NOT NULL)")
    cur.execute("INSERT INTO floor_one VALUES (1, 0)")
    seq = iter(range(10**9))

    def trigger(on: bool) -> None:
        cur.execute(f"ALTER TABLE jobs {'ENABLE' if on else 'DISABLE'} TRIGGER jobs_inserted")

    def notified() -> None:
        # An enqueue notifies only while a poller of its queue sleeps (sql/rules/wakeups.sql).
        trigger(True)
        cur.execute("SELECT jobs_sleep(%s)", (QUEUE,))

    def plain_insert() -> None:
        cur.execute(_INSERT, (QUEUE, JOB_NAME, json.dumps({"seq": next(seq)})))

    kinds: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "one-row UPDATE": (lambda: None, lambda: cur.execute("UPDATE floor_one SET n = n + 1 WHERE id = 1")),
        "INSERT into jobs, trigger off": (lambda: trigger(False), plain_insert),
        "INSERT into jobs (its NOTIFY)": (notified, plain_insert),
        "lib.insert": (notified, lambda: insert(conn, QUEUE, JOB_NAME, {"seq": next(seq)})),
    }
    found: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        order = list(kinds)
        for n in range(rounds):
            # Each round starts with another kind: none always meets the biggest table.
            for kind in order[n % len(order) :] + order[: n % len(order)]:
                ready, one = kinds[kind]
                ready()
                began = time.perf_counter()
                for _ in range(rows):
                    one()
                found[kind].append(rows / (time.perf_counter() - began))
    finally:
        trigger(True)
        cur.execute("DROP TABLE floor_one")
        # The start measurement claims this queue's head: each claim must find the job just committed.
        cur.execute("DELETE FROM jobs WHERE queue = %s", (QUEUE,))
        conn.close()
    return {kind: {"per_s": statistics.median(rates), "rounds": rates} for kind, rates in found.items()}


def _claimer(url: str, samples: int, ready: Any, out: Any) -> None:
    """The child: woken by each NOTIFY, claims the queue's head (the two kinds
    in turns) and commits; sends [(seq, kind, woke, claimed)] back."""
    listener, claimer = connect(url), connect(url)
    listener.cursor().execute("LISTEN jobs")
    cur = claimer.cursor()
    step_sql, step_params = lone_step(
        Ask(None, {"queue": QUEUE, "slot": 0, "worker_id": "floor", "lease": 30.0, "max_attempts": 5, "id": None})
    )
    # A poller that finds nothing due asks its queue's enqueues to wake it
    # (jobs_sleep, sql/rules/wakeups.sql); an enqueue notifies only then.
    cur.execute("SELECT jobs_sleep(%s)", (QUEUE,))
    seen = []
    ready.set()
    while len(seen) < samples:
        if not select.select([listener], [], [], 10)[0]:
            break
        listener.poll()
        if not listener.notifies:
            continue
        woke = time.time()
        listener.notifies.clear()
        kind = CLAIMS[len(seen) % 2]
        if kind == "plain UPDATE":
            cur.execute(_PLAIN_CLAIM, (QUEUE,))
            job_id, _name, args = cur.fetchone()
        else:
            cur.execute(step_sql, step_params)
            row = next(r for r in cur.fetchall() if r[2] is not None)
            job_id, args = row[2], row[4]
        claimed = time.time()
        cur.execute(_FINISH, (job_id,))
        cur.execute("SELECT jobs_sleep(%s)", (QUEUE,))
        seen.append((json.loads(args)["seq"], kind, woke, claimed))
    out.send(seen)
    listener.close()
    claimer.close()


def start_times(url: str, samples: int) -> dict[str, dict[str, float]]:
    """Milliseconds from the producer's commit: {what: {p50, p99}}."""
    # Forked: the child opens connections of its own and ends with os._exit,
    # leaving the parent's untouched.
    fork = multiprocessing.get_context("fork")
    ready = fork.Event()
    receive, send = fork.Pipe(duplex=False)
    child = fork.Process(target=_claimer, args=(url, samples, ready, send), daemon=True)
    child.start()
    # Set once its LISTEN has committed: no commit after this goes unheard.
    if not ready.wait(30):
        child.kill()
        raise SystemExit("the claimer did not start listening within 30 s")
    producer = connect(url)
    commits = {}
    try:
        for seq in range(samples):
            insert(producer, QUEUE, JOB_NAME, {"seq": seq})
            commits[seq] = time.time()
            time.sleep(random.uniform(0.05, 0.1))
        seen = receive.recv() if receive.poll(30) else []
    finally:
        producer.close()
        child.join(10)
    if len(seen) < samples:
        raise SystemExit(f"the claimer saw {len(seen)} of {samples} jobs")
    series: dict[str, list[float]] = {"NOTIFY read": []}
    for kind in CLAIMS:
        series[f"claim committed: {kind}"] = []
    for seq, kind, woke, claimed in seen:
        series["NOTIFY read"].append(1000 * (woke - commits[seq]))
        series[f"claim committed: {kind}"].append(1000 * (claimed - commits[seq]))
    return {what: {"p50": percentile(ms, 50), "p99": percentile(ms, 99)} for what, ms in series.items()}


def print_table(result: dict[str, Any]) -> None:
    rate = result["commit_rate"]["tps"]
    print()
    print(f"{'enqueue, one row a commit':40} {'rows/s':>9} {'of commit rate':>15}")
    for kind, found in result["enqueue"].items():
        print(f"{kind:40} {found['per_s']:9,.0f} {found['per_s'] / rate:15.2f}")
    print()
    print(f"{'another process commits a job: to':40} {'p50 ms':>9} {'p99 ms':>15}")
    for what, found in result["start"].items():
        print(f"{what:40} {found['p50']:9.3f} {found['p99']:15.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200, help="jobs of the start measurement (each kind half)")
    parser.add_argument("--rows", type=int, default=2000, help="rows of each enqueue kind a round")
    parser.add_argument("--rounds", type=int, default=3)
    add_pgbench_seconds(parser)
    args = parser.parse_args(argv)

    def measured(server: Server, rate: CommitRate) -> dict[str, Any]:
        with scratch_database(server) as scratch:
            return {
                "enqueue": enqueue_rates(scratch.url, args.rows, args.rounds),
                "start": start_times(scratch.url, args.samples),
            }

    return run("floors", args, measured, print_table)


if __name__ == "__main__":
    sys.exit(main())
