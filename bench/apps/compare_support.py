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
    {"seconds": ...}), 'produce' (one job per commit with a pause, printing
    [[seq, time.time() after the commit], ...]) or 'burst' (one job per
    commit, back to back, from a moment shared with other processes for
    --seconds, printing {"jobs": the calls that ended inside the window})."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("mode", choices=("bulk", "produce", "burst"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--queues", required=True, help="comma-separated; jobs go round robin over them")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--batch", type=int, default=1, help="jobs per transaction (bulk)")
    parser.add_argument("--gap-min", type=float, default=0.05)
    parser.add_argument("--gap-max", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=10.0, help="burst: the window's length")
    parser.add_argument("--ready-file", type=Path, help="burst: written once connected and ready")
    parser.add_argument("--go-file", type=Path, help="burst: holds the window's start, time.time()")
    return parser


def wait_for_go(args: argparse.Namespace) -> tuple[float, float]:
    """A burst process's window, (start, end) in time.time(): it says it is
    ready, then waits for the benchmark to name the start once every process
    is ready, so that a slow start (a library's imports, its connections) on
    a busy machine shortens no process's window."""
    args.ready_file.write_text("ready")
    while not args.go_file.exists():
        time.sleep(0.01)
    start = float(args.go_file.read_text())
    time.sleep(max(0.0, start - time.time()))
    return start, start + args.seconds


def round_robin(queues: list[str], jobs: int) -> list[tuple[str, int]]:
    """(queue, seq) of each job, seq from 0, spread evenly over the queues."""
    return [(queues[i % len(queues)], i) for i in range(jobs)]
