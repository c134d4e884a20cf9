"""What an enqueue costs an application that writes from many processes at
once, against the same insert without its notification, and how soon an idle
worker starts a job once its enqueue has committed.

Run from the project root:  .venv/bin/python bench/enqueue_concurrency.py [--seconds 8] [--rounds 3]

Enqueue: --clients (16, then 1 for reference) processes of a plain
synchronous application (bench/apps/sharing_enqueue.py: psycopg2, no gevent,
no worker running), each writing one job a transaction for --seconds, all
from the same moment, into one queue and then round robin over 40 queues.
Four kinds of write, taking turns in every round (each round begun by the
next kind), the jobs table emptied before each run:
  - lib.insert: BEGIN; lib.insert.insert(cur, queue, name, args); COMMIT
    (jobs_insert: the row, no NOTIFY: no poller of the queue sleeps, as for
    a busy queue or one no worker runs);
  - lib.insert, pollers asleep: the same with every queue marked as a
    sleeping poller marks it (job_queues.wake_wanted) and no poller to clear
    the mark, so every enqueue notifies: the most an enqueue can cost;
  - plain INSERT: BEGIN; the INSERT jobs_insert makes (the same columns, the
    same dedupe read, ON CONFLICT DO NOTHING RETURNING id), prepared once, in
    a session where jobs.inserting_checked is on, as jobs_insert sets it
    around its own INSERT, so the statement trigger neither runs nor
    notifies; COMMIT. The row, its indexes and its commit, nothing else: no
    superuser, no DDL, no other table;
  - plain INSERT as text: the same, sent as text at each call, as an
    application's psycopg2 code sends its own INSERT (and lib.insert its
    call), so the server plans it each time.
For each: the jobs committed a second by all clients together, the median of
the rounds, lib.insert over plain (the target: 0.8 or more), and each write's
commit time (p50, p99). Postgres serialises the commits of transactions that
notify (one lock on the notification queue, held through the commit's flush),
so many clients that enqueue through NOTIFY commit one at a time.

Wake: a real worker (bench/compare.py's, one queue, concurrency 1) idle, and
another process enqueuing --samples jobs through lib.insert, one a commit,
50-100 ms apart (compare.py's workload 4): the handler's start less the
enqueuer's time right after its COMMIT returned, p50 and p99; beside it, in a
database of its own, what the server allows (bench/floors.py): the NOTIFY
read alone and a plain claim committed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import compare, floors, harness
from bench.harness import CommitRate, Server, add_pgbench_seconds, admin_connect, scratch_database
from bench.sharing import latency_ms, start_clients, vacuum_line, vacuum_settings

KINDS = {
    "lib": "lib.insert",
    "asleep": "lib.insert, pollers asleep",
    "plain": "plain INSERT",
    "text": "plain INSERT as text",
}
MANY_QUEUES = 40
TARGET = 0.8


def one_run(url: str, kind: str, clients: int, queues: int, seconds: float) -> dict[str, Any]:
    """clients writing kind into queues for seconds, on an emptied table.
    asleep: every queue marked as a sleeping poller marks it, and no poller
    claims to clear the mark, so every enqueue notifies."""
    names = [f"q{i:02d}" for i in range(queues)]
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE jobs")
            cur.execute("UPDATE job_queues SET wake_wanted = false WHERE wake_wanted")
            if kind == "asleep":
                cur.execute(
                    "INSERT INTO job_queues (queue, wake_wanted) SELECT unnest(%s::text[]), true"
                    " ON CONFLICT (queue) DO UPDATE SET wake_wanted = true",
                    (names,),
                )
    finally:
        conn.close()
    run = start_clients("lib" if kind == "asleep" else kind, url, clients, names, seconds=seconds)
    writes = run.wait(seconds + 60)
    committed = writes.committed(run.start_at, run.start_at + seconds)
    return {
        "jobs": committed,
        "per_s": committed / seconds,
        "errors": len(writes.errors),
        "first_errors": writes.errors[:3],
        "commit_ms": latency_ms(writes.took),
    }


def cells(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(clients, queues) of every row, the busiest first."""
    return [(c, q) for c in args.clients for q in (1, MANY_QUEUES)]


def enqueue_rates(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (clients, queues) row: each kind's runs, round by round, and their medians."""
    found = {cell: {kind: [] for kind in KINDS} for cell in cells(args)}
    order = list(KINDS)
    for n in range(args.rounds):
        for clients, queues in cells(args):
            for kind in order[n % len(order) :] + order[: n % len(order)]:
                print(
                    f"round {n + 1} of {args.rounds}: {clients} clients, {queues} queues, {KINDS[kind]} ...",
                    flush=True,
                )
                found[(clients, queues)][kind].append(one_run(url, kind, clients, queues, args.seconds))
    rows = []
    for (clients, queues), runs in found.items():
        medians = {kind: statistics.median(r["per_s"] for r in runs[kind]) for kind in KINDS}
        rows.append(
            {
                "clients": clients,
                "queues": queues,
                "runs": runs,
                "per_s": medians,
                "ratio": medians["lib"] / medians["plain"] if medians["plain"] else None,
                "asleep_ratio": medians["asleep"] / medians["plain"] if medians["plain"] else None,
                "text_ratio": medians["lib"] / medians["text"] if medians["text"] else None,
                "round_ratios": [
                    lib["per_s"] / plain["per_s"] if plain["per_s"] else None
                    for lib, plain in zip(runs["lib"], runs["plain"], strict=True)
                ],
            }
        )
    return rows


def print_table(result: dict[str, Any]) -> None:
    options = result["options"]
    rate = result["commit_rate"]["tps"]
    print(vacuum_line(result["vacuum"]))
    print(
        f"enqueue      each client one job a transaction for {options['seconds']:g} s, no worker; "
        f"{options['rounds']} rounds, the kinds in turns; medians"
    )
    print()
    header = (
        f"{'clients, queues':<18}{'lib.insert/s':>13}{'asleep/s':>10}{'plain/s':>10}{'text/s':>9}{'lib/plain':>11}"
        f"{'asleep/plain':>14}{'lib/text':>10}{'commit p50 ms':>24}{'commit p99 ms':>24}{'errors':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in result["enqueue"]:
        lib, asleep, plain, text = (row["per_s"][k] for k in KINDS)
        p50 = "/".join(_ms(statistics.median(r["commit_ms"]["p50"] for r in row["runs"][k])) for k in KINDS)
        p99 = "/".join(_ms(statistics.median(r["commit_ms"]["p99"] for r in row["runs"][k])) for k in KINDS)
        errors = sum(r["errors"] for k in KINDS for r in row["runs"][k])
        ratio, asleep_ratio, text_ratio = (
            "-" if r is None else f"{r:.2f}" for r in (row["ratio"], row["asleep_ratio"], row["text_ratio"])
        )
        label = f"{row['clients']}, {row['queues']}"
        print(
            f"{label:<18}{lib:>13,.0f}{asleep:>10,.0f}{plain:>10,.0f}{text:>9,.0f}{ratio:>11}{asleep_ratio:>14}"
            f"{text_ratio:>10}{p50:>24}{p99:>24}{errors:>8}"
        )
    print("(lib.insert: no poller asleep, as for a busy queue or none running; asleep: every queue's")
    print(" poller asleep and never clearing its mark, so every enqueue notifies; plain: prepared once;")
    print(" text: the same INSERT sent as text, as lib.insert sends its call; commit times")
    print(f" lib.insert/asleep/plain/text, the median of the rounds' percentiles; commit rate {rate:,.0f}/s)")
    for row in result["enqueue"]:
        each = ", ".join("-" if r is None else f"{r:.2f}" for r in row["round_ratios"])
        print(f"  {row['clients']} clients, {row['queues']} queues, lib/plain round by round: {each}")
    wake, floor = result["wake"], result["floor"]
    print()
    print(f"{'idle worker, one queue: commit to':<44}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    print(
        f"{'handler start (lib.insert, worker.main)':<44}{_ms(wake['p50_ms']):>9}{_ms(wake['p99_ms']):>9}"
        f"{_ms(wake['max_ms']):>9}"
    )
    for what, found in floor.items():
        print(f"{'floor: ' + what:<44}{found['p50']:>9.2f}{found['p99']:>9.2f}")
    if wake["started"] < wake["samples"]:
        print(f"  {wake['samples'] - wake['started']} of {wake['samples']} jobs not started within 5 s")
    plain_claim = floor.get("claim committed: plain UPDATE")
    if plain_claim and wake["p50_ms"]:
        print(
            f"  the worker over a plain claim committed: p50 x{wake['p50_ms'] / plain_claim['p50']:.2f},"
            f" p99 x{wake['p99_ms'] / plain_claim['p99']:.2f}"
        )
    busiest = result["enqueue"][0]
    met = "met" if busiest["ratio"] is not None and busiest["ratio"] >= TARGET else "NOT met"
    print()
    print(
        f"{busiest['clients']} clients, one queue: lib.insert {busiest['per_s']['lib']:,.0f} jobs/s against"
        f" {busiest['per_s']['plain']:,.0f} plain, x{busiest['ratio'] or 0:.2f} (target x{TARGET:.2f} {met})"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="each run's writing (default %(default)s)")
    parser.add_argument("--clients", default="16,1", help="client processes of each row (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each kind once a round (default %(default)s)")
    parser.add_argument("--samples", type=int, default=200, help="jobs of the wake latency (default %(default)s)")
    add_pgbench_seconds(parser, default=5)
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.rounds < 1 or args.seconds <= 0 or min(args.clients) < 1 or args.samples < 2:
        parser.error("--rounds >= 1, --seconds > 0, --clients >= 1, --samples >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measure(server: Server, rate: CommitRate) -> dict[str, Any]:
        with scratch_database(server) as scratch:
            settings = vacuum_settings(scratch.admin)
            rows = enqueue_rates(scratch.url, args)
        print(f"wake: an idle worker, {args.samples} jobs one a commit ...", flush=True)
        wake = compare.measure_latency(compare.Side(), server, compare.concurrency(1), args.samples)
        print(f"floor: the NOTIFY read and a plain claim, {args.samples} jobs ...", flush=True)
        with scratch_database(server) as scratch:
            floor = floors.start_times(scratch.url, args.samples)
        return {"vacuum": settings, "enqueue": rows, "wake": asdict(wake), "floor": floor}

    return harness.run("enqueue_concurrency", args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
