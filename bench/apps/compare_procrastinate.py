"""procrastinate's side of bench/compare.py: install its schema, work, enqueue.

  install --url URL
  work    --url URL --queues ... --concurrency C [--lock]   (until SIGTERM)
  bulk | produce | burst --url URL --queues ... --jobs N ...         (see compare_support)

Its best settings for this comparison (procrastinate's docs, "concurrency" and
"listen/notify"): one async worker with `concurrency` jobs at once, woken by
LISTEN/NOTIFY, so both polling intervals are only a fallback and are set to
our worker's fallback poll (120 s). Jobs are kept on success (the default):
the timing reads their events. "One job at a time per queue" over many queues
is one worker per queue at concurrency 1, all in this one process and event
loop, sharing the app's pool (--per-queue). Its `lock` (jobs sharing a lock
run one after another) would do it with one worker, but a job's end does not
wake that worker's fetch: the next job of a locked queue then waits for the
fallback poll.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import procrastinate
from procrastinate.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_asyncio import enqueue_jobs, on_stop, run_command
from compare_support import Starts, enqueue_parser, worker_parser

TASK = "bench_noop"
FALLBACK_POLL = 120.0


def make_app(url: str, pool_size: int) -> tuple[procrastinate.App, Starts]:
    """The app, its no-op task, and the starts it notes. The pool holds one
    connection per job at once and one for fetching; LISTEN has its own."""
    starts = Starts()
    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=pool_size)
    app = procrastinate.App(connector=connector)

    @app.task(name=TASK)
    async def noop(seq: int) -> None:
        starts.started(seq)

    return app, starts


async def install(url: str) -> None:
    app, _ = make_app(url, 1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


def make_workers(app: procrastinate.App, queues: list[str], concurrency: int, per_queue: bool) -> list[Worker]:
    """One worker over every queue, or (per_queue) one worker per queue, each
    at `concurrency`: procrastinate's way to run each of many queues one job
    at a time. A worker fetches again as soon as a job of its own ends."""
    groups = [[q] for q in queues] if per_queue else [queues]
    return [
        Worker(
            app,
            queues=group,
            name=f"bench-{i}",
            concurrency=concurrency,
            listen_notify=True,
            fetch_job_polling_interval=FALLBACK_POLL,
            abort_job_polling_interval=FALLBACK_POLL,
            install_signal_handlers=False,  # one SIGTERM handler stops them all (below)
        )
        for i, group in enumerate(groups)
    ]


async def work(argv: list[str]) -> None:
    parser = worker_parser("procrastinate worker")
    parser.add_argument("--per-queue", action="store_true", help="one worker per queue, in this one process")
    args = parser.parse_args(argv)
    queues = args.queues.split(",")
    slots = args.concurrency * (len(queues) if args.per_queue else 1)
    app, starts = make_app(args.url, slots + 1)
    starts.arm(args)
    try:
        async with app.open_async():
            workers = make_workers(app, queues, args.concurrency, args.per_queue)
            # stop: fetch no more, let running jobs end, return from run().
            on_stop(lambda: [w.stop() for w in workers])
            await asyncio.gather(*(w.run() for w in workers))
    finally:
        starts.dump()


async def enqueue(argv: list[str]) -> None:
    parser = enqueue_parser("procrastinate enqueue")
    parser.add_argument("--lock", action="store_true", help="each job carries its queue as lock")
    args = parser.parse_args(argv)
    app, _ = make_app(args.url, 1)

    def deferrer(queue: str) -> procrastinate.tasks.Task:
        # A deferrer is configured for one queue.
        return app.tasks[TASK].configure(queue=queue, lock=queue if args.lock else None)

    async def one(queue: str, seq: int) -> None:
        await deferrer(queue).defer_async(seq=seq)  # its own transaction

    async def many(rows: list[tuple[str, int]]) -> None:
        by_queue: dict[str, list[dict[str, int]]] = {}
        for queue, seq in rows:
            by_queue.setdefault(queue, []).append({"seq": seq})
        for queue, kwargs in by_queue.items():
            await deferrer(queue).batch_defer_async(*kwargs)

    async with app.open_async():
        await enqueue_jobs(args, one, many)


def main() -> int:
    # Per-job INFO lines would cost more than a no-op job; the worker logs warnings only.
    logging.basicConfig(level=logging.WARNING)
    # It warns that the app is made in __main__, which matters only to its CLI's task lookup.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    return run_command(install, work, enqueue)


if __name__ == "__main__":
    sys.exit(main())
