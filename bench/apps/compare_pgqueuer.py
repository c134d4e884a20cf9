"""PGQueuer's side of bench/compare.py: install its schema, work, enqueue.

  install --url URL
  work    --url URL --queues ... --concurrency C --batch-size B   (until SIGTERM)
  bulk | produce | burst --url URL --queues ... --jobs N ...               (see compare_support)

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

import logging
import sys
from datetime import timedelta
from pathlib import Path

import asyncpg
from pgqueuer import Job, Queries, QueueManager

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_asyncio import enqueue_jobs, on_stop, run_command
from compare_support import Starts, enqueue_parser, worker_parser

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
    # --concurrency 0: no limit (its entrypoint's concurrency_limit=0).
    args = parser.parse_args(argv)
    starts = Starts(args.target, args.done_file, args.starts_file)
    conn = await asyncpg.connect(args.url)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))
    for queue in args.queues.split(","):

        @qm.entrypoint(queue, concurrency_limit=args.concurrency)
        async def noop(job: Job) -> None:
            starts.started(int(job.payload or b"0"))

    on_stop(qm.shutdown.set)
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
    conn = await asyncpg.connect(args.url)
    queries = Queries.from_asyncpg_connection(conn)

    async def one(queue: str, seq: int) -> None:
        await queries.enqueue(queue, str(seq).encode())  # autocommit: its own transaction

    async def many(rows: list[tuple[str, int]]) -> None:
        await queries.enqueue([q for q, _ in rows], [str(s).encode() for _, s in rows], [0] * len(rows))

    try:
        await enqueue_jobs(args, one, many)
    finally:
        await conn.close()


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    return run_command(install, work, enqueue)


if __name__ == "__main__":
    sys.exit(main())
