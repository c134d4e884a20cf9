"""A worker process with one queue of keyed jobs, for
tests/system/test_keys_processes.py: "keyed", concurrency 5, whose job
keyed.Sleep sleeps args["seconds"] cooperatively and appends "start" and
"stop" lines (pid, job id, key, wall time) to $RUNS_FILE, so a run cut off by
kill -9 shows there as a start with no stop."""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.job.args import unmarshal_args  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402


@dataclass
class Sleep:
    key: str
    seconds: float


def _note(event: str, job: PendingJob, key: str) -> None:
    with open(os.environ["RUNS_FILE"], "a") as out:
        out.write(f"{event} {os.getpid()} {job.id} {key} {time.time():.4f}\n")


def _sleep(job: PendingJob) -> str:
    args = unmarshal_args(Sleep, job.args)
    _note("start", job, args.key)
    gevent.sleep(args.seconds)
    _note("stop", job, args.key)
    return status.ok()


def registry() -> list[Callable[[DB], Queue]]:
    # A short fallback poll: a slot that found every due key busy looks again soon.
    return [lambda db: Queue("keyed", {"keyed.Sleep": _sleep}, concurrency=5, poll_interval=0.5, max_attempts=3)]


if __name__ == "__main__":
    sys.exit(worker.main(registry(), []))
