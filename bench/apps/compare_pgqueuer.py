"""PGQueuer's side of bench/compare.py: install its schema, work, enqueue.

  install --url URL
  work    --url URL --queues ... --concurrency C --batch-size B   (until SIGTERM)
  bulk | produce --url URL --queues ... --jobs N ...               (see compare_support)

A queue is an entrypoint; "C jobs at once" is the entrypoint's
concurrency_limit, which PGQueuer enforces in its dequeue query across every
worker. Its best settings here (from its source, pgqueuer/core/qm.py): one
QueueManager over one asyncpg connection (the driver its docs lead with),
`batch_size` jobs per dequeue, LISTEN/NOTIFY to wake it so the dequeue
timeout (its fallback poll) is our worker's, 120 s; the periodic folding of
its log into statistics off (it runs on demand), since it is bookkeeping
that our worker does not do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
from pgqueuer import Job, Queries, QueueManager

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_support import Starts, enqueue_parser, round_robin, run_command, worker_parser

FALLBACK_POLL = timedelta(seconds=120)


async def install(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await Queries.from_asyncpg_connection(conn).install()
    finally:
        await conn.close()


async def work(argv: list[str]) -> None:
    parser = worker_parser("PGQueuer worker")
    parser.add_argument("--batch-size", type=int, default=10, help="jobs per dequeue (PGQueuer's default 10)")
    args = parser.parse_args(argv)
    starts = Starts(args.target, args.done_file, args.starts_file)
    conn = await asyncpg.connect(args.url)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))
    for queue in args.queues.split(","):

        @qm.entrypoint(queue, concurrency_limit=args.concurrency)
        async def noop(job: Job) -> None:
            starts.started(int(job.payload or b"0"))

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, qm.shutdown.set)
    try:
        await qm.run(
            batch_size=args.batch_size,
            dequeue_timeout=FALLBACK_POLL,
            log_aggregation_interval=timedelta(0),
        )
    finally:
        starts.dump()
        await conn.close()


async def enqueue(argv: list[str]) -> None:
    args = enqueue_parser("PGQueuer enqueue").parse_args(argv)
    queues = args.queues.split(",")
    conn = await asyncpg.connect(args.url)
    queries = Queries.from_asyncpg_connection(conn)
    try:
        if args.mode == "produce":
            commits = []
            for seq in range(args.jobs):
                await queries.enqueue(queues[0], str(seq).encode())  # autocommit: its own transaction
                commits.append((seq, time.time()))
                await asyncio.sleep(random.uniform(args.gap_min, args.gap_max))
            json.dump(commits, sys.stdout)
            return
        rows = round_robin(queues, args.jobs)
        started = time.perf_counter()
        if args.batch == 1:
            for queue, seq in rows:
                await queries.enqueue(queue, str(seq).encode())
        else:
            for start in range(0, len(rows), args.batch):
                chunk = rows[start : start + args.batch]
                await queries.enqueue([q for q, _ in chunk], [str(s).encode() for _, s in chunk], [0] * len(chunk))
        json.dump({"seconds": time.perf_counter() - started}, sys.stdout)
    finally:
        await conn.close()


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    return run_command(install, work, enqueue)


if __name__ == "__main__":
    sys.exit(main())
