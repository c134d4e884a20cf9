"""What the worker processes of bench/compare.py share, whichever queue library
runs them: the command line, and the handlers' note of each start.

Plain Python: importing it monkey-patches nothing and starts no event loop, so
a gevent worker and an asyncio one both use it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

# Our job's name in every queue (a Poller dispatches by name).
OURS_JOB_NAME = "bench.Noop"


class Starts:
    """Each handler start, (seq, time.time()); and a file that appears once
    `target` handlers have started, so the benchmark learns that the work is
    nearly done without querying the database it is measuring."""

    def __init__(self, target: int = 0, done_file: Path | None = None, starts_file: Path | None = None) -> None:
        self.target = target
        self.done_file = done_file
        self.starts_file = starts_file
        self.seen: list[tuple[int, float]] = []

    def arm(self, args: argparse.Namespace) -> None:
        """The target and files of a worker's command line (worker_parser)."""
        self.target, self.done_file, self.starts_file = args.target, args.done_file, args.starts_file

    def started(self, seq: int) -> None:
        self.seen.append((seq, time.time()))
        if len(self.seen) == self.target and self.done_file is not None:
            self.done_file.write_text(str(len(self.seen)))

    def dump(self) -> None:
        if self.starts_file is not None:
            self.starts_file.write_text(json.dumps(self.seen))


def worker_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every worker process of the comparison takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", required=True)
    parser.add_argument("--queues", required=True, help="comma-separated queue names")
    parser.add_argument("--concurrency", type=int, default=1, help="jobs at once per queue (40 queues: 1 each)")
    parser.add_argument("--pool", type=int, default=10, help="connections of its pool, where it has one (default 10)")
    parser.add_argument("--target", type=int, default=0, help="handler starts after which --done-file appears")
    parser.add_argument("--done-file", type=Path)
    parser.add_argument("--starts-file", type=Path)
    return parser


def enqueue_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of every enqueue process: 'bulk' (jobs/s, printed as JSON
    {"seconds": ...}) or 'produce' (one job per commit with a pause, printing
    [[seq, time.time() after the commit], ...])."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("mode", choices=("bulk", "produce"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--queues", required=True, help="comma-separated; jobs go round robin over them")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--batch", type=int, default=1, help="jobs per transaction (bulk)")
    parser.add_argument("--gap-min", type=float, default=0.05)
    parser.add_argument("--gap-max", type=float, default=0.1)
    return parser


def round_robin(queues: list[str], jobs: int) -> list[tuple[str, int]]:
    """(queue, seq) of each job, seq from 0, spread evenly over the queues."""
    return [(queues[i % len(queues)], i) for i in range(jobs)]


def on_stop(callback: Callable[[], Any]) -> None:
    """callback on SIGTERM (how the benchmark stops a worker) or SIGINT, in the running loop."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, callback)


async def enqueue_jobs(
    args: argparse.Namespace,
    one: Callable[[str, int], Awaitable[Any]],
    many: Callable[[list[tuple[str, int]]], Awaitable[Any]],
) -> None:
    """An asyncio peer's enqueue process (see enqueue_parser), printing its
    JSON: one(queue, seq) enqueues one job in a transaction of its own,
    many(rows) a batch in one transaction."""
    queues = args.queues.split(",")
    if args.mode == "produce":
        commits = []
        for seq in range(args.jobs):
            await one(queues[0], seq)
            commits.append((seq, time.time()))
            # A random gap, so the commits never fall into step with anything periodic in the worker.
            await asyncio.sleep(random.uniform(args.gap_min, args.gap_max))
        json.dump(commits, sys.stdout)
        return
    rows = round_robin(queues, args.jobs)
    started = time.perf_counter()
    if args.batch == 1:
        for queue, seq in rows:
            await one(queue, seq)
    else:
        for start in range(0, len(rows), args.batch):
            await many(rows[start : start + args.batch])
    json.dump({"seconds": time.perf_counter() - started}, sys.stdout)


def run_command(
    install: Callable[[str], Coroutine[Any, Any, Any]],
    work: Callable[[list[str]], Coroutine[Any, Any, Any]],
    enqueue: Callable[[list[str]], Coroutine[Any, Any, Any]],
    run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run,
) -> int:
    """An asyncio peer's command line: install --url URL, work ..., or an
    enqueue command; run is the event loop's runner (asyncio.run, or a
    peer's own, as its command line uses)."""
    command, argv = sys.argv[1], sys.argv[2:]
    if command == "install":
        run(install(argv[argv.index("--url") + 1]))
    elif command == "work":
        run(work(argv))
    else:
        run(enqueue(sys.argv[1:]))
    return 0
