"""oban's side of bench/compare.py (Oban for Python, Python >= 3.12): install
its schema, work, enqueue.

  install --url URL
  work    --url URL --queues ... --concurrency C [--pool N]   (until SIGTERM)
  bulk | produce | burst --url URL --queues ... --jobs N ...           (see compare_support)

Run as its `oban start` runs it (oban/cli.py): uvloop, one Oban instance over
a psycopg pool (--pool, its default 10), each queue a producer at `limit` C
jobs at once (its queue limit). Everything else is its default, from its
source: an insert NOTIFYs the queue's producer (oban/queries/insert_job.sql,
the stager listening), a job's end wakes its producer to ack the finished
jobs and fetch up to its free slots (oban/_producer.py; completions within
5 ms coalesce), the stager's 1 s poll is the fallback; leadership, pruner,
lifeline and refresher at their defaults, metrics off (its default). A
job's start is its `attempted_at`, its outcome its `completed_at` (the ack's
transaction); rows are kept (pruned after a day).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import uvloop
from oban import Job, Oban, worker
from oban.schema import install as install_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_asyncio import enqueue_jobs, on_stop, run_command
from compare_support import Starts, enqueue_parser, worker_parser

STARTS = Starts()


@worker(queue="q00")
class Noop:
    async def process(self, job: Job) -> None:
        STARTS.started(int(job.args["seq"]))


async def install(url: str) -> None:
    pool = await Oban.create_pool(url, min_size=1, max_size=1)
    try:
        await install_schema(pool)
    finally:
        await pool.close()


async def work(argv: list[str]) -> None:
    args = worker_parser("oban worker").parse_args(argv)  # --pool: its default, 10
    STARTS.arm(args)
    pool = await Oban.create_pool(args.url, max_size=args.pool)
    stopping = asyncio.Event()
    on_stop(stopping.set)
    try:
        # Leaving the block stops it as SIGTERM stops `oban start`: running jobs end, acks flush.
        async with Oban(pool=pool, queues={queue: args.concurrency for queue in args.queues.split(",")}):
            await stopping.wait()
    finally:
        STARTS.dump()
        await pool.close()


async def enqueue(argv: list[str]) -> None:
    args = enqueue_parser("oban enqueue").parse_args(argv)
    pool = await Oban.create_pool(args.url, max_size=1)
    oban = Oban(pool=pool)  # no queues: a client, enqueuing only

    async def one(queue: str, seq: int) -> None:
        await oban.enqueue(Noop.new({"seq": seq}, queue=queue))  # its own transaction

    async def many(rows: list[tuple[str, int]]) -> None:
        await oban.enqueue_many([Noop.new({"seq": seq}, queue=queue) for queue, seq in rows])

    try:
        await enqueue_jobs(args, one, many)
    finally:
        await pool.close()


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    return run_command(install, work, enqueue, run=uvloop.run)


if __name__ == "__main__":
    sys.exit(main())
