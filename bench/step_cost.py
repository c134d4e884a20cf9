"""What one step of a serial queue costs the server: a job's outcome and the
next claim, sent as the group commit sends a lone ask (jobs_step_one) and as
a batch of one through jobs_step; and what a batch of 40 queues' steps costs
(jobs_step, as a busy 40-queue worker sends them).

Run from the project root:  .venv/bin/python bench/step_cost.py [--steps 3000] [--rounds 4]

On a scratch database, for each function, a queue of pending no-op jobs worked one at a time
by a plain psycopg2 connection (no gevent, no pool: only the statement and
its commit), each step the previous job's outcome with the next claim, one
round trip and one commit. The two take turns, --rounds times --steps steps
each, so the machine's load falls on both alike. For each: steps a second
(and as a share of the commit rate) and the backend's CPU a step, read from
/proc when the server runs on this machine (else n/a). The batch row works 40
queues at once, each batch every queue's outcome with its next claim; its
steps are jobs, and its CPU is a job's share of the batch's.

bench/compare.py runs the jobs_step_one loop too, next to the worker's own
serial run: what the statement alone allows, in the same run as the peers.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import CommitRate, Server, add_pgbench_seconds, process_cpu_seconds, run, scratch_database
from lib.store.group_commit import Ask, batch_step, lone_step
from lib.store.sql import STATEMENTS

# Each path: how its asks become one statement, and how many queues (one ask
# each) go in every call.
PATHS: dict[str, tuple[Callable[[list[Ask]], tuple[str, dict[str, Any]]], int]] = {
    "jobs_step_one": (lambda asks: lone_step(asks[0]), 1),
    "jobs_step (a batch of one)": (batch_step, 1),
    "jobs_step (40 queues a batch), a job": (batch_step, 40),
}
WARMUP = 200  # untimed steps first: the statements are prepared and planned


class Stepper:
    """Queues worked one job at a time each, every queue's step in one call."""

    def __init__(
        self, url: str, queues: list[str], build: Callable[[list[Ask]], tuple[str, dict[str, Any]]], jobs: int
    ) -> None:
        self.queues, self.build = queues, build
        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True
        self.cur = self.conn.cursor()
        self.cur.execute("SELECT pg_backend_pid()")
        self.pid = self.cur.fetchone()[0]
        for queue in queues:
            self.cur.execute(
                "INSERT INTO jobs (queue, name, args) SELECT %s, 'bench.Noop', '{}' FROM generate_series(1, %s)",
                (queue, jobs),
            )
        self.cur.execute("VACUUM ANALYZE jobs")
        self.prepared: set[str] = set()
        # Each queue's job in hand: its outcome goes with the queue's next claim.
        self.rows: dict[str, tuple[Any, ...]] = {}

    def ask(self, queue: str) -> Ask:
        claim = {"queue": queue, "slot": 0, "worker_id": "bench", "lease": 300.0, "max_attempts": 5, "id": None}
        row = self.rows.get(queue)
        outcome = None
        if row is not None:
            outcome = {
                "id": row[2],
                "worker_id": "bench",
                "attempts": row[5],
                "status": "ok",
                "retry_in": None,
                "last_error": None,
                "last_traceback": None,
                "delay": 0.0,
                "uncounted": 0,
            }
        return Ask(outcome, claim)

    def step(self) -> None:
        sql, params = self.build([self.ask(queue) for queue in self.queues])
        # Prepared, as the pool runs it.
        stmt = STATEMENTS[sql]
        if stmt.name not in self.prepared:
            self.cur.execute(stmt.prepare)
            self.prepared.add(stmt.name)
        self.cur.execute(stmt.execute, [params[name] for name in stmt.params])
        claimed = {row[0]: row for row in self.cur.fetchall() if row[0] is not None and row[2] is not None}
        if len(claimed) < len(self.queues):
            raise SystemExit(f"{self.queues[0]}...: a queue ran dry or claimed nothing: {claimed}")
        self.rows = claimed

    def timed(self, steps: int) -> tuple[float, float | None]:
        """Wall and backend CPU seconds for this many steps; CPU None when the
        server's processes are not on this machine."""
        cpu = process_cpu_seconds(self.pid)
        began = time.perf_counter()
        for _ in range(steps):
            self.step()
        wall = time.perf_counter() - began
        after = process_cpu_seconds(self.pid)
        return wall, None if cpu is None or after is None else after - cpu


def measure(url: str, steps: int, rounds: int, paths: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each of paths (default: all of PATHS), by label: steps, steps_per_s, server_cpu_ms (None: not visible)."""
    labels = paths or list(PATHS)
    # As many jobs a round as a serial path's steps: a path of several queues
    # makes a call for each of them.
    calls = {label: max(1, steps // PATHS[label][1]) for label in labels}
    steppers = {}
    for n, label in enumerate(labels):
        build, width = PATHS[label]
        queues = [f"step{n}_{q:02d}" for q in range(width)]
        steppers[label] = Stepper(url, queues, build, WARMUP + calls[label] * rounds + 10)
    for stepper in steppers.values():
        for _ in range(WARMUP):
            stepper.step()
    walls = dict.fromkeys(steppers, 0.0)
    cpus: dict[str, float | None] = dict.fromkeys(steppers, 0.0)
    for _ in range(rounds):
        for label, stepper in steppers.items():
            wall, cpu = stepper.timed(calls[label])
            walls[label] += wall
            so_far = cpus[label]
            cpus[label] = None if cpu is None or so_far is None else so_far + cpu
    found = {}
    for label, cpu in cpus.items():
        done = calls[label] * PATHS[label][1] * rounds
        cpu_ms = None if cpu is None else 1000 * cpu / done
        found[label] = {"steps": done, "steps_per_s": done / walls[label], "server_cpu_ms": cpu_ms}
    return found


def print_table(result: dict[str, Any]) -> None:
    rate = result["commit_rate"]["tps"]
    print()
    header = f"{'one serial step (outcome + next claim)':40} {'steps/s':>9} {'of commit rate':>15}"
    print(f"{header} {'server CPU/step':>16}")
    for label, found in result["paths"].items():
        cpu = "n/a" if found["server_cpu_ms"] is None else f"{found['server_cpu_ms']:.3f} ms"
        print(f"{label:40} {found['steps_per_s']:9,.0f} {found['steps_per_s'] / rate:15.2f} {cpu:>16}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000, help="timed steps of each function a round")
    parser.add_argument("--rounds", type=int, default=4)
    add_pgbench_seconds(parser)
    args = parser.parse_args(argv)

    def measured(server: Server, rate: CommitRate) -> dict[str, Any]:
        with scratch_database(server) as scratch:
            return {"paths": measure(scratch.url, args.steps, args.rounds)}

    return run("step_cost", args, measured, print_table)


if __name__ == "__main__":
    sys.exit(main())
