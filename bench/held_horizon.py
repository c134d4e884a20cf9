"""The worker's throughput while another session holds a transaction open for
the whole run, against the same run with none, in the same run.

Run from the project root:  .venv/bin/python bench/held_horizon.py [--jobs 50000] [--rounds 2]

A transaction left open (a report's snapshot, a session idle in transaction)
keeps every row version the worker's claims and outcomes leave behind: no
pruning, no index entry marked dead, no vacuum. Each run: a fresh database,
--jobs no-op jobs enqueued first (bench/compare.py's bulk enqueue), VACUUM
ANALYZE, then, for a held run, the hold opened on a connection of its own:

  read    BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM jobs;
          (a snapshot taken, as a report would take it)
  write   the same, then an UPDATE of a row of another table (an id of its
          own: every snapshot taken after it counts it as running)

then the real worker process (bench/compare.py's: worker.main with no-op
queues) until every job has its outcome; the hold is rolled back at the end.
Workloads: (many) 40 queues of one slot each (compare.py's workload 3); (one)
one queue at --concurrency slots (64: where compare.py's sweep for ours
peaks). Rounds alternate, clean and held runs taking turns at going first.

For each run, by the table's own timestamps: jobs a second over the whole run
(the first start to the last outcome) and over its last fifth (the last 20 %
of jobs to finish, by finished_at); held over clean for both (the target:
0.5 or more in the last fifth). At the end of each run, before the hold
ends: jobs' dead rows (pg_stat_user_tables, once the worker's backends have
exited and reported), the table's and its indexes' sizes, and what one
claim's reads cost then (EXPLAIN (ANALYZE, BUFFERS) of jobs_due and
jobs_slot_holder for the first queue, as the claim calls them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import compare, harness
from bench.harness import CommitRate, Scratch, Server, add_pgbench_seconds, admin_connect, scratch_database
from bench.sharing import vacuum_line, vacuum_settings

WORKLOADS = {"many": "40 queues, 1 slot each", "one": "1 queue, {c} slots"}
HOLDS = ("read", "write")
TARGET = 0.5
HOLD_APP = "jobs-bench-hold"
ENQUEUE_BATCH = 1000


class Hold:
    """A transaction another session keeps open, of a kind of HOLDS, or
    "xid": BEGIN; SELECT txid_current(); (a transaction id and nothing
    else, on any database: bench/compare.py holds it over every library's
    tables alike)."""

    def __init__(self, url: str, kind: str) -> None:
        self.conn = psycopg2.connect(url, application_name=HOLD_APP)
        with self.conn.cursor() as cur:
            if kind == "xid":
                cur.execute("SELECT txid_current()")
                return
            self.conn.set_session(isolation_level="REPEATABLE READ")
            cur.execute("SELECT count(*) FROM jobs")
            if kind == "write":
                cur.execute("UPDATE bench_unrelated SET n = n + 1 WHERE id = 1")

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def workers_gone(scratch: Scratch) -> None:
    """Wait until only the hold is connected: a backend reports its table
    counts as it exits."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'"
        " AND application_name <> %s"
    )

    def gone() -> bool:
        with scratch.admin.cursor() as cur:
            cur.execute(sql, (scratch.name, HOLD_APP))
            return cur.fetchone()[0] == 0

    harness.wait_until(gone, 30, "the worker's connections to close")


def table_state(url: str, queue: str, slots: int) -> dict[str, Any]:
    """jobs' row counts, sizes, and what a claim's reads of the queue cost now."""
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, pg_relation_size('jobs')"
                " FROM pg_stat_user_tables WHERE relname = 'jobs'"
            )
            live, dead, updated, hot, heap = cur.fetchone()
            cur.execute(
                "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index"
                " WHERE indrelid = 'jobs'::regclass ORDER BY 1"
            )
            indexes = dict(cur.fetchall())
            reads = {
                "jobs_due": claim_read(cur, "SELECT * FROM jobs_due(%s, NULL, %s)", (queue, slots)),
                "jobs_slot_holder": claim_read(cur, "SELECT * FROM jobs_slot_holder(%s, 0)", (queue,)),
            }
    finally:
        conn.close()
    return {
        "live": live,
        "dead": dead,
        "updated": updated,
        "hot_updated": hot,
        "heap_bytes": heap,
        "index_bytes": indexes,
        "claim_reads": reads,
    }


def claim_read(cur: psycopg2.extensions.cursor, sql: str, params: tuple[Any, ...]) -> dict[str, float]:
    """One run of a read the claim makes: its milliseconds and shared buffers."""
    cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
    found = cur.fetchone()[0]
    plan = (json.loads(found) if isinstance(found, str) else found)[0]
    top = plan["Plan"]
    return {
        "ms": plan["Execution Time"],
        "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
    }


def rates(url: str) -> dict[str, Any]:
    """Jobs a second over the run and over each fifth of it, by finish order."""
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT extract(epoch FROM min(started_at)) FROM jobs WHERE status = 'ok'")
            first = cur.fetchone()[0]
            cur.execute(
                "SELECT extract(epoch FROM finished_at), queue FROM jobs WHERE status = 'ok' ORDER BY finished_at"
            )
            rows = cur.fetchall()
            finished = [float(row[0]) for row in rows]
    finally:
        conn.close()
    done = len(finished)
    if done < 10 or first is None:
        return {
            "done": done,
            "jobs_per_s": 0.0,
            "fifths": [],
            "last_fifth_per_s": 0.0,
            "last_fifth_queues": 0,
            "seconds": 0.0,
        }
    bounds = [float(first), *(finished[done * k // 5 - 1] for k in range(1, 6))]
    fifths = []
    for k in range(5):
        jobs = done * (k + 1) // 5 - done * k // 5
        span = bounds[k + 1] - bounds[k]
        fifths.append(jobs / span if span > 0 else 0.0)
    seconds = finished[-1] - float(first)
    # Fewer queues than there are at the end: the last fifth is a few queues' tail, not the table's cost.
    queues = len({queue for _, queue in rows[done - done // 5 :]})
    return {
        "last_fifth_queues": queues,
        "done": done,
        "seconds": seconds,
        "jobs_per_s": done / seconds,
        "fifths": fifths,
        "last_fifth_per_s": fifths[-1],
    }


def one_run(server: Server, workload: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    queues = [f"q{i:02d}" for i in range(40)] if workload == "many" else ["q00"]
    slots = 1 if workload == "many" else args.concurrency
    side = compare.Side()
    with scratch_database(server) as scratch, tempfile.TemporaryDirectory(prefix="jobs-held-") as work:
        conn = admin_connect(scratch.url)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE bench_unrelated (id int PRIMARY KEY, n bigint NOT NULL)")
            cur.execute("INSERT INTO bench_unrelated VALUES (1, 0)")
        conn.close()
        compare.enqueue(side, "bulk", scratch.url, queues, args.jobs, ENQUEUE_BATCH)
        harness.vacuum_analyze(scratch.url)
        hold = None if kind == "clean" else Hold(scratch.url, kind)
        try:
            began = time.monotonic()
            setting = compare.concurrency(slots)
            with compare.side_worker(side, scratch.url, queues, setting, args.jobs, Path(work)) as run:
                error = compare.wait_done(run, args.timeout)
                compare.wait_recorded(scratch.url, side, args.jobs)
                if error:
                    print(run.log_tail(), file=sys.stderr)
            wall = time.monotonic() - began
            # The worker logs at WARNING: any line is something that went wrong.
            logged = [line for line in run.log_file.read_text(errors="replace").splitlines() if line.strip()]
            workers_gone(scratch)
            state = table_state(scratch.url, queues[0], slots)
        finally:
            if hold is not None:
                hold.release()
        found = rates(scratch.url)
    return {
        "workload": workload,
        "kind": kind,
        "error": error,
        "wall_seconds": wall,
        **found,
        "table": state,
        "worker_log_lines": len(logged),
        "worker_log_first": logged[:5],
    }


def run_all(server: Server, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Workload by workload, the kinds taking turns in every round."""
    kinds = ["clean", *args.holds]
    runs = []
    for workload in args.workloads:
        for n in range(args.rounds):
            for kind in kinds[n % len(kinds) :] + kinds[: n % len(kinds)]:
                print(f"{label(workload, args.concurrency)}, round {n + 1} of {args.rounds}: {kind} ...", flush=True)
                found = one_run(server, workload, kind, args)
                print(
                    f"  {found['jobs_per_s']:,.0f} jobs/s, last fifth {found['last_fifth_per_s']:,.0f}"
                    f" ({found['last_fifth_queues']} queues); {found['table']['dead']:,} dead rows;"
                    f" {found['worker_log_lines']} worker log lines",
                    flush=True,
                )
                runs.append(found)
    return runs


def summary(runs: list[dict[str, Any]], workloads: list[str], kinds: list[str]) -> list[dict[str, Any]]:
    """Each workload and kind: the medians of its rounds, and held over clean."""
    rows = []
    for workload in workloads:
        clean = None
        for kind in kinds:
            mine = [r for r in runs if (r["workload"], r["kind"]) == (workload, kind)]
            if not mine:
                continue
            row = {
                "workload": workload,
                "kind": kind,
                "jobs_per_s": statistics.median(r["jobs_per_s"] for r in mine),
                "last_fifth_per_s": statistics.median(r["last_fifth_per_s"] for r in mine),
                "complete": all(r["error"] is None for r in mine),
            }
            if kind == "clean":
                clean = row
            elif clean is not None:
                row["ratio"] = row["jobs_per_s"] / clean["jobs_per_s"] if clean["jobs_per_s"] else None
                row["last_fifth_ratio"] = (
                    row["last_fifth_per_s"] / clean["last_fifth_per_s"] if clean["last_fifth_per_s"] else None
                )
            rows.append(row)
    return rows


def label(workload: str, concurrency: int) -> str:
    return WORKLOADS[workload].format(c=concurrency)


def print_table(result: dict[str, Any]) -> None:
    options = result["options"]
    print(vacuum_line(result["vacuum"]))
    print(
        f"runs         {options['jobs']:,} no-op jobs enqueued first; {options['rounds']} rounds, clean and held"
        " taking turns; medians"
    )
    print()
    header = f"{'workload':<24}{'hold':<7}{'jobs/s':>9}{'x clean':>9}{'last 5th/s':>12}{'x clean':>9}"
    print(header)
    print("-" * len(header))
    for row in result["summary"]:
        ratio = _x(row.get("ratio")) if row["kind"] != "clean" else ""
        last = _x(row.get("last_fifth_ratio")) if row["kind"] != "clean" else ""
        flag = "" if row["complete"] else "  INCOMPLETE"
        print(
            f"{label(row['workload'], options['concurrency']):<24}{row['kind']:<7}{row['jobs_per_s']:>9,.0f}{ratio:>9}"
            f"{row['last_fifth_per_s']:>12,.0f}{last:>9}{flag}"
        )
    print("(x clean: the held runs' median over the clean runs' median, same workload)")
    print()
    print("each run, in order: jobs/s by fifth of the jobs (finish order); at its end: jobs' dead rows, sizes,")
    print("and one claim's reads of the first queue (jobs_due, jobs_slot_holder: ms, shared buffers)")
    for run in result["runs"]:
        table = run["table"]
        fifths = " ".join(f"{f:,.0f}" for f in run["fifths"])
        indexes = table["index_bytes"]
        claim = indexes.get("jobs_claim", 0)
        due, holder = table["claim_reads"]["jobs_due"], table["claim_reads"]["jobs_slot_holder"]
        print(
            f"  {run['workload']:<5}{run['kind']:<6} fifths {fifths:<34} dead {table['dead']:>9,}"
            f"  heap {_mb(table['heap_bytes'])} indexes {_mb(sum(indexes.values()))} (jobs_claim {_mb(claim)})"
            f"  reads {due['ms']:.2f} ms/{due['buffers']:,}, {holder['ms']:.2f} ms/{holder['buffers']:,}"
        )
        if run["worker_log_lines"]:
            print(
                f"    the worker logged {run['worker_log_lines']} lines; the first: {run['worker_log_first'][0][:100]}"
            )
    print()
    for row in result["summary"]:
        if row["kind"] != "clean" and row.get("last_fifth_ratio") is not None:
            met = "met" if row["last_fifth_ratio"] >= TARGET else "NOT met"
            print(
                f"{label(row['workload'], options['concurrency'])}, {row['kind']} hold: last fifth"
                f" x{row['last_fifth_ratio']:.2f} of clean (target x{TARGET:.2f} {met}), whole run x{row['ratio']:.2f}"
            )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _mb(value: int) -> str:
    return f"{value / 2**20:,.1f} MB"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs a run (default %(default)s)")
    parser.add_argument("--workloads", default="many,one", help="of many (40 queues), one (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=64, help="slots of the one queue (default %(default)s)")
    parser.add_argument(
        "--holds", default="read", help="held kinds beside the clean run, of read, write (default %(default)s)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each kind once a round (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=900.0, help="a run's most seconds (default %(default)s)")
    add_pgbench_seconds(parser, default=5)
    args = parser.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.holds = [h.strip() for h in args.holds.split(",") if h.strip()]
    if set(args.workloads) - set(WORKLOADS) or set(args.holds) - set(HOLDS) or not args.holds:
        parser.error("--workloads of many, one; --holds of read, write")
    if args.jobs < 40 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--jobs >= 40, --rounds >= 1, --concurrency >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measure(server: Server, rate: CommitRate) -> dict[str, Any]:
        admin = admin_connect(server.url)
        try:
            settings = vacuum_settings(admin)
        finally:
            admin.close()
        runs = run_all(server, args)
        return {"vacuum": settings, "runs": runs, "summary": summary(runs, args.workloads, ["clean", *args.holds])}

    return harness.run("held_horizon", args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
