"""What the worker processes of bench/compare.py share, whichever queue library
runs them: the command line, and the handlers' note of each start.

Plain Python: importing it monkey-patches nothing and loads no event loop, so
a gevent worker and an asyncio one both use it, and our idle worker's memory
holds nothing it would not hold deployed (the asyncio peers' share is in
compare_asyncio.py).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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
