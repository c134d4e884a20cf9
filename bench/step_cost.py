"""What one step of a serial queue costs the server: a job's outcome and the
next claim, sent as the group commit sends a lone ask (jobs_step_one) and as
a batch of one through jobs_step; what a batch of 40 queues' steps costs
(jobs_step, as a busy 40-queue worker sends them); and what a batch of one
queue's 256 slots costs, which bounds one queue at its fastest.

Run from the project root:  .venv/bin/python bench/step_cost.py [--steps 3000] [--rounds 4]

On a scratch database, for each path, queues of pending no-op jobs worked by
a plain psycopg2 connection (no gevent, no pool: only the statement and its
commit), each call every slot's outcome with its next claim, one round trip
and one commit. The paths take turns, --rounds times --steps jobs each, so
the machine's load falls on all alike. For each: jobs a second (and as a
share of the commit rate) and the backend's CPU a job, read from /proc when
the server runs on this machine and the run is long enough to read in its
10 ms ticks (else n/a). The serial rows work one queue of one slot; the batch
rows 40 queues of one slot, or one queue of 256 slots, their CPU a job's
share of the batch's. A worker sends one batch at a time (a queue's claims
take its turn), so the last row bounds one queue's jobs a second whatever
the worker's own speed.

Reference rows take their turns with them, on the same server and
connection kind: a one-row UPDATE of a table of its own and its commit (what
pgbench commits; the serial step's server CPU is read against it), and the
two row writes of a serial step alone (job n's outcome and job n+1's claim as
two plain UPDATEs by id, in one transaction and one round trip: no read of
the queue's order, no rule), what the table's rows and indexes cost a step
before any of its reads: on jobs, on a copy of its columns with only the
three indexes partial on status that a claim, a rescue and a dedupe need,
and on a copy with its primary key alone, where both writes are HOT.

bench/compare.py runs the jobs_step_one loop and the 256-slot one too, next
to the worker's serial and one-queue runs: what the statement alone allows,
in the same run as the peers.
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
from lib.run.steps import Ask, batch_step, lone_step
from lib.store.sql import STATEMENTS

# Each path: how its asks become one statement, and how many queues and
# slots a queue (one ask each) go in every call.
PATHS: dict[str, tuple[Callable[[list[Ask]], tuple[str, dict[str, Any]]], int, int]] = {
    "jobs_step_one": (lambda asks: lone_step(asks[0]), 1, 1),
    "jobs_step (a batch of one)": (batch_step, 1, 1),
    "jobs_step (40 queues a batch), a job": (batch_step, 40, 1),
    "jobs_step (256 slots a batch), a job": (batch_step, 1, 256),
}
# The references: the server's own one-row commit, and a step's two row writes alone.
ONE_ROW = "one-row UPDATE and its commit (reference)"
WRITES = "the serial step's two row writes alone (reference)"
DESIGN_WRITES = "the two writes, the design's 3 indexes only (ref.)"
HOT_WRITES = "the two writes, HOT: primary key only (reference)"
MIN_CPU_SECONDS = 0.1
WARMUP = 200  # untimed jobs first (ten calls at least): the statements are prepared and planned


class Timed:
    """A loop of calls on one connection whose backend's CPU is read."""

    cur: psycopg2.extensions.cursor
    pid: int

    def connect(self, url: str) -> None:
        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True
        self.cur = self.conn.cursor()
        self.cur.execute("SELECT pg_backend_pid()")
        self.pid = self.cur.fetchone()[0]

    def step(self) -> None:
        raise NotImplementedError

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


class OneRow(Timed):
    """pgbench's kind of commit: one row of a table of its own updated, a HOT
    update (the table leaves room on its page), autocommit."""

    def __init__(self, url: str, jobs: int) -> None:
        self.connect(url)
        self.cur.execute("CREATE TABLE bench_one (id int PRIMARY KEY, n bigint NOT NULL) WITH (fillfactor = 50)")
        self.cur.execute("INSERT INTO bench_one VALUES (1, 0)")
        self.cur.execute("PREPARE one_row AS UPDATE bench_one SET n = n + 1 WHERE id = 1")

    def step(self) -> None:
        self.cur.execute("EXECUTE one_row")


class Writes(Timed):
    """A serial step's row writes and nothing else: job n's outcome (ok) and
    job n+1's claim, the columns the step sets, as two plain UPDATEs by id in
    one transaction, sent in one round trip. By id alone: a status in the
    WHERE lets a generic plan read a partial index of that status whole.

    On jobs itself, or (a subclass's TABLE) on a copy of its columns with
    fewer indexes: what the same two writes cost with only those."""

    TABLE = "jobs"
    CLAIM = """PREPARE bench_claim(bigint) AS UPDATE {table} SET status = 'started', started_at = now(),
      finished_at = NULL, attempts = attempts + 1, worker_id = 'bench', slot = 0,
      lease_until = clock_timestamp() + interval '300 s', claim_seq = nextval('jobs_claim_seq'), claim_slot = 0,
      claim_run_at = run_at, claim_snapshot = pg_current_snapshot()
    WHERE id = $1"""
    OUTCOME = """PREPARE bench_outcome(bigint) AS UPDATE {table} SET status = 'ok', finished_at = now(),
      lease_until = NULL, slot = NULL
    WHERE id = $1"""

    def __init__(self, url: str, jobs: int) -> None:
        self.connect(url)
        self.create()
        self.cur.execute(
            f"INSERT INTO {self.TABLE} (queue, name, args, dedupe) SELECT 'bench_writes', 'bench.Noop', '{{}}', false"
            " FROM generate_series(1, %s) RETURNING id",
            (jobs + 1,),
        )
        self.ids = iter(sorted(row[0] for row in self.cur.fetchall()))
        self.cur.execute(f"VACUUM ANALYZE {self.TABLE}")
        self.cur.execute(self.CLAIM.format(table=self.TABLE))
        self.cur.execute(self.OUTCOME.format(table=self.TABLE))
        self.held = next(self.ids)
        self.cur.execute("EXECUTE bench_claim(%s)", (self.held,))

    def create(self) -> None:
        """jobs is there already."""

    def step(self) -> None:
        following = next(self.ids)
        self.cur.execute("BEGIN; EXECUTE bench_outcome(%s); EXECUTE bench_claim(%s); COMMIT", (self.held, following))
        self.held = following


class DesignWrites(Writes):
    """The same writes on a copy of jobs's columns with only the three
    indexes a queue whose rows hold their status cannot do without: the
    claim's, the rescue's and the dedupe's, each partial on status, so that
    neither write is a HOT update."""

    TABLE = "bench_design"

    def create(self) -> None:
        self.cur.execute(f"CREATE TABLE {self.TABLE} (LIKE jobs INCLUDING DEFAULTS)")
        self.cur.execute(f"ALTER TABLE {self.TABLE} ADD PRIMARY KEY (id)")
        self.cur.execute(f"CREATE INDEX ON {self.TABLE} (queue, (-priority), run_at, id) WHERE status = 'pending'")
        self.cur.execute(f"CREATE INDEX ON {self.TABLE} (queue, slot) WHERE status = 'started'")
        self.cur.execute(
            f"CREATE UNIQUE INDEX ON {self.TABLE} (queue, name, md5(args::text))"
            " WHERE dedupe AND status IN ('pending', 'started')"
        )


class HotWrites(Writes):
    """The same writes on a copy of jobs's columns with its primary key
    alone, and room on each page: HOT updates, which write no index entry."""

    TABLE = "bench_hot"

    def create(self) -> None:
        self.cur.execute(f"CREATE TABLE {self.TABLE} (LIKE jobs INCLUDING DEFAULTS) WITH (fillfactor = 50)")
        self.cur.execute(f"ALTER TABLE {self.TABLE} ADD PRIMARY KEY (id)")


REFERENCES: dict[str, Callable[[str, int], Timed]] = {
    ONE_ROW: OneRow,
    WRITES: Writes,
    DESIGN_WRITES: DesignWrites,
    HOT_WRITES: HotWrites,
}


class Stepper(Timed):
    """Queues worked `slots` jobs at a time each, every slot's step in one call."""

    def __init__(
        self,
        url: str,
        queues: list[str],
        build: Callable[[list[Ask]], tuple[str, dict[str, Any]]],
        jobs: int,
        slots: int = 1,
    ) -> None:
        self.queues, self.build = queues, build
        self.asks = [(queue, slot) for queue in queues for slot in range(slots)]
        self.connect(url)
        for queue in queues:
            self.cur.execute(
                "INSERT INTO jobs (queue, name, args) SELECT %s, 'bench.Noop', '{}' FROM generate_series(1, %s)",
                (queue, jobs),
            )
        self.cur.execute("VACUUM ANALYZE jobs")
        self.prepared: set[str] = set()
        # Each slot's job in hand: its outcome goes with the slot's next claim.
        self.rows: dict[tuple[str, int], tuple[Any, ...]] = {}

    def ask(self, queue: str, slot: int) -> Ask:
        claim = {"queue": queue, "slot": slot, "worker_id": "bench", "lease": 300.0, "max_attempts": 5, "id": None}
        row = self.rows.get((queue, slot))
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
        sql, params = self.build([self.ask(queue, slot) for queue, slot in self.asks])
        # Prepared, as the pool runs it.
        stmt = STATEMENTS[sql]
        if stmt.name not in self.prepared:
            self.cur.execute(stmt.prepare)
            self.prepared.add(stmt.name)
        self.cur.execute(stmt.execute, [params[name] for name in stmt.params])
        rows = self.cur.fetchall()
        claimed = {(row[0], row[10]): row for row in rows if row[0] is not None and row[2] is not None}
        if len(claimed) < len(self.asks):
            raise SystemExit(f"{self.queues[0]}...: a queue ran dry or a slot claimed nothing: {len(claimed)} claimed")
        self.rows = claimed


def measure(url: str, steps: int, rounds: int, paths: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each of paths (default: all of PATHS and REFERENCES), by label: steps,
    steps_per_s, server_cpu_ms (None: not visible, or too little to read)."""
    labels = paths or [*PATHS, *REFERENCES]
    # As many jobs a round as a serial path's steps: a path of several asks
    # makes a call for each of them.
    width = {label: PATHS[label][1] * PATHS[label][2] if label in PATHS else 1 for label in labels}
    calls = {label: max(1, steps // width[label]) for label in labels}
    warmups = {label: max(10, WARMUP // width[label]) for label in labels}
    steppers: dict[str, Timed] = {}
    for n, label in enumerate(labels):
        jobs = warmups[label] + calls[label] * rounds + 10
        if label in REFERENCES:
            steppers[label] = REFERENCES[label](url, jobs)
            continue
        build, queues, slots = PATHS[label]
        names = [f"step{n}_{q:02d}" for q in range(queues)]
        steppers[label] = Stepper(url, names, build, jobs * slots, slots)
    for label, stepper in steppers.items():
        for _ in range(warmups[label]):
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
        done = calls[label] * width[label] * rounds
        # /proc counts CPU in ticks of 10 ms: a few of them say little.
        cpu_ms = None if cpu is None or cpu < MIN_CPU_SECONDS else 1000 * cpu / done
        found[label] = {"steps": done, "steps_per_s": done / walls[label], "server_cpu_ms": cpu_ms}
    return found


def print_table(result: dict[str, Any]) -> None:
    rate = result["commit_rate"]["tps"]
    print()
    header = f"{'a job (its outcome + the next claim)':52} {'jobs/s':>9} {'of commit rate':>15}"
    print(f"{header} {'server CPU/job':>16}")
    for label, found in result["paths"].items():
        cpu = "n/a" if found["server_cpu_ms"] is None else f"{found['server_cpu_ms']:.3f} ms"
        print(f"{label:52} {found['steps_per_s']:9,.0f} {found['steps_per_s'] / rate:15.2f} {cpu:>16}")
    cpu_ms = {label: found["server_cpu_ms"] for label, found in result["paths"].items()}
    reference = cpu_ms.get(ONE_ROW)
    shown = [label for label in ("jobs_step_one", WRITES, DESIGN_WRITES, HOT_WRITES) if cpu_ms.get(label)]
    if reference and shown:
        print("\nserver CPU over the one-row UPDATE's:")
        for label in shown:
            print(f"  {label:52} {cpu_ms[label] / reference:5.2f}x")


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
