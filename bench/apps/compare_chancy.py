"""chancy's side of bench/compare.py: install its schema, work, enqueue.

  install --url URL
  work    --url URL --queues ... --concurrency C [--pool N]   (until SIGTERM)
  bulk | produce | burst --url URL --queues ... --jobs N ...           (see compare_support)

Its settings, from its docs and source (chancy/queue.py, worker.py,
executors/asyncex.py): one Worker, its default plugins, over its psycopg pool
(--pool, its default 10); each queue declared with `concurrency` C and the
AsyncExecutor (its executor for async, I/O-bound jobs: in the worker's event
loop, no process pool), `eager_polling` (a job's end fetches the next at
once, as its docs advise for low-concurrency queues with jobs waiting),
woken by its LISTEN/NOTIFY on a push, polling every 120 s as the fallback
(ours). Outcomes go out as chancy writes them: batched, once a second
(Worker.send_outgoing_interval). The queue "default", which a worker
declares, is declared first with no tags, so no worker runs it.

Chancy stamps `completed_at` when the job ends, in the worker, and writes it
up to a second later; install adds a trigger that stamps `bench_written_at`
as that write happens, so the run ends at its outcome's write, as for every
other side.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from chancy import Chancy, Job, Queue, Worker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_asyncio import enqueue_jobs, run_command
from compare_support import Starts, enqueue_parser, worker_parser

STARTS = Starts()
FALLBACK_POLL = 120
WRITTEN_AT = """
ALTER TABLE chancy_jobs ADD COLUMN bench_written_at timestamptz;
CREATE FUNCTION bench_written() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN NEW.bench_written_at := clock_timestamp(); RETURN NEW; END $$;
CREATE TRIGGER bench_written BEFORE UPDATE OF state ON chancy_jobs
  FOR EACH ROW WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION bench_written();
"""
log = logging.getLogger("chancy")


async def noop(seq: int) -> None:
    STARTS.started(seq)


def make_app(url: str, pool: int) -> Chancy:
    return Chancy(url, min_connection_pool_size=1, max_connection_pool_size=pool, log=log)


async def install(url: str) -> None:
    async with make_app(url, 1) as chancy:
        await chancy.migrate()
        async with chancy.pool.connection() as conn:
            await conn.execute(WRITTEN_AT)


async def work(argv: list[str]) -> None:
    args = worker_parser("chancy worker").parse_args(argv)  # --pool: its default, 10
    STARTS.arm(args)
    try:
        async with make_app(args.url, args.pool) as chancy:
            await chancy.declare(Queue("default", tags=set()), upsert=True)
            for queue in args.queues.split(","):
                await chancy.declare(
                    Queue(
                        queue,
                        concurrency=args.concurrency,
                        executor=Chancy.Executor.Async,
                        eager_polling=True,
                        polling_interval=FALLBACK_POLL,
                    ),
                    upsert=True,
                )
            # Its own SIGTERM handler: stop fetching, let running jobs end, write their outcomes.
            async with Worker(chancy) as running:
                await running.wait_for_shutdown()
    finally:
        STARTS.dump()


async def enqueue(argv: list[str]) -> None:
    args = enqueue_parser("chancy enqueue").parse_args(argv)
    job = Job.from_func(noop)

    async with make_app(args.url, 1) as chancy:

        async def one(queue: str, seq: int) -> None:
            await chancy.push(job.with_queue(queue).with_kwargs(seq=seq))  # its own transaction

        async def many(rows: list[tuple[str, int]]) -> None:
            jobs = [job.with_queue(queue).with_kwargs(seq=seq) for queue, seq in rows]
            async for _ in chancy.push_many(jobs, batch_size=len(jobs)):  # one transaction
                pass

        await enqueue_jobs(args, one, many)


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    log.setLevel(logging.WARNING)  # its per-job INFO lines would cost more than a no-op job
    return run_command(install, work, enqueue)


if __name__ == "__main__":
    sys.exit(main())
