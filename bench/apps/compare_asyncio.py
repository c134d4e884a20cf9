"""What the asyncio peers' processes of bench/compare.py share: the stop
signal, the enqueue loop and the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from compare_support import round_robin, wait_for_go


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
    if args.mode == "burst":
        # The wait blocks the loop: nothing of the client's has work to do before its first enqueue.
        _, end = wait_for_go(args)
        done, seq = 0, 0
        while time.time() < end:
            await one(queues[seq % len(queues)], seq)
            seq += 1
            done += time.time() <= end
        json.dump({"jobs": done}, sys.stdout)
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
