"""DBOS's side of bench/compare.py (DBOS Transact for Python): install its
system schema, work, enqueue.

  install --url URL
  work    --url URL --queues ... --concurrency C [--polling-interval S]   (until SIGTERM)
  bulk | produce | burst --url URL --queues ... --jobs N ...               (see compare_support)

DBOS keeps its queues in its system database; here that is the scratch
database itself (`system_database_url`, its tables in the schema `dbos`).
A benchmark queue is a DBOS queue, registered by the worker with
`register_queue(name, worker_concurrency=C, polling_interval_sec=S)` (its
client's, before the worker launches):
C workflows of the queue at once in this process (`worker_concurrency`, the
limit its docs recommend for most uses: a global `concurrency` adds a count
and a REPEATABLE READ claim to every poll). A job is a workflow that does
nothing but note its start, enqueued with `queue.enqueue(noop, seq)`.

DBOS's queues only poll: each queue's thread wakes every
`polling_interval_sec` (its default 1 s; any positive value is accepted),
reads the queue's row, then claims what its limits allow. No enqueue wakes
a worker, so the interval bounds a queue's rate at C jobs a poll and its
commit-to-start latency at about half an interval; each poll is a few
transactions whether or not there is work. --polling-interval sets it.

An enqueue process is a DBOS process too (queue.enqueue needs a launched
DBOS): it launches listening to no queue (`DBOS.listen_queues([])`), with an
executor id of its own, so it neither dequeues nor recovers the worker's
workflows.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

from dbos import DBOS, DBOSClient, DBOSConfig, Queue

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_support import Starts, enqueue_parser, round_robin, wait_for_go, worker_parser

STARTS = Starts()
APP_NAME = "jobs-bench"
# Its documented default; compare.py passes the run's value.
DEFAULT_POLL = 1.0
POOL_MOST = 50


@DBOS.workflow(name="bench_noop")
def noop(seq: int) -> None:
    STARTS.started(seq)


def launch(url: str, executor: str, listen: list[str] | None, threads: int | None = None) -> None:
    """DBOS over the scratch database, listening to `listen` (None: every queue)."""
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": url,
        "executor_id": executor,
        "log_level": "WARNING",
        # Its pool: a connection per queue thread's poll and one per running
        # workflow's writes, within the server's 100 connections (the
        # benchmark's own and a held transaction's beside it).
        "sys_db_pool_size": min(POOL_MOST, max(20, (threads or 0) + 10)),
    }
    if threads:
        config["max_executor_threads"] = threads
    DBOS(config=config)
    if listen is not None:
        DBOS.listen_queues(listen)
    DBOS.launch()


def install(url: str) -> None:
    launch(url, "bench-install", [])  # its launch creates and migrates the system schema
    DBOS.destroy()


def work(argv: list[str]) -> None:
    parser = worker_parser("DBOS worker")
    parser.add_argument("--polling-interval", type=float, default=DEFAULT_POLL, help="polling_interval_sec")
    args = parser.parse_args(argv)
    STARTS.arm(args)
    queues = args.queues.split(",")
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    # Registered before the launch, by a client: a launched DBOS starts each
    # queue's thread from the queue's row as it finds it, and its first poll
    # would run under the enqueuer's registration (no limit).
    client = DBOSClient(system_database_url=args.url, application_name=APP_NAME)
    try:
        for name in queues:
            client.register_queue(name, worker_concurrency=args.concurrency, polling_interval_sec=args.polling_interval)
    finally:
        client.destroy()
    # Threads for every queue's running workflows at once.
    launch(args.url, "bench-worker", queues, args.concurrency * len(queues) + 8)
    try:
        stopping.wait()
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=10)
        STARTS.dump()


def queue_named(name: str) -> Queue:
    """The worker's queue, or registered here at DBOS's defaults when the
    worker has not started yet (it overwrites the settings when it does)."""
    return DBOS.retrieve_queue(name) or DBOS.register_queue(name, on_conflict="never_update")


def enqueue(argv: list[str]) -> None:
    args = enqueue_parser("DBOS enqueue").parse_args(argv)
    names = args.queues.split(",")
    launch(args.url, f"bench-enqueue-{os.getpid()}", [])
    try:
        queues = {name: queue_named(name) for name in names}
        if args.mode == "produce":
            commits = []
            for seq in range(args.jobs):
                queues[names[0]].enqueue(noop, seq)  # a transaction of its own
                commits.append((seq, time.time()))
                time.sleep(random.uniform(args.gap_min, args.gap_max))
            json.dump(commits, sys.stdout)
            return
        if args.mode == "burst":
            start, end = wait_for_go(args)
            json.dump(burst(queues, names, start, end), sys.stdout)
            return
        if args.batch != 1:
            raise SystemExit("DBOS enqueues one workflow a call: it has no batch enqueue")
        rows = round_robin(names, args.jobs)
        started = time.perf_counter()
        for name, seq in rows:
            queues[name].enqueue(noop, seq)
        json.dump({"seconds": time.perf_counter() - started}, sys.stdout)
    finally:
        DBOS.destroy()


def burst(queues: dict[str, Queue], names: list[str], start: float, end: float) -> dict[str, int]:
    """One workflow a call from start to end: the calls that ended inside the window."""
    done, seq = 0, 0
    while time.time() < end:
        queues[names[seq % len(names)]].enqueue(noop, seq)
        seq += 1
        done += time.time() <= end
    return {"jobs": done}


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    command, argv = sys.argv[1], sys.argv[2:]
    if command == "install":
        install(argv[argv.index("--url") + 1])
    elif command == "work":
        work(argv)
    else:
        enqueue(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
