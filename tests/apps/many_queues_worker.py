"""A worker process with many busy queues and two slow ones, for the tests and
the benchmark of a row lock held by another session on one running job: 41
queues q00..q40 of no-op jobs (noop.Run), and queues "slow" and "slow2" whose
job slow.Sleep sleeps args["seconds"] cooperatively. Each slow run appends
"start" and "stop" lines (pid, job id, wall time) to $RUNS_FILE, so a run the
worker fenced, and a second run of a job, show there whatever the row says.
"""

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

NOOP_QUEUES = [f"q{i:02d}" for i in range(41)]
SLOW_QUEUES = ["slow", "slow2"]
NOOP_JOB = "noop.Run"
SLOW_JOB = "slow.Sleep"


@dataclass
class Seconds:
    seconds: float


def _note(event: str, job: PendingJob) -> None:
    with open(os.environ["RUNS_FILE"], "a") as out:
        out.write(f"{event} {os.getpid()} {job.id} {time.time():.3f}\n")


def _slow(job: PendingJob) -> str:
    _note("start", job)
    try:
        gevent.sleep(unmarshal_args(Seconds, job.args).seconds)
    finally:
        # Also when the fence stops the handler: the stop line says when it did.
        _note("stop", job)
    return status.ok()


def _noop(job: PendingJob) -> str:
    return status.ok()


def registry() -> list[Callable[[DB], Queue]]:
    # The no-op queues have a backlog and LISTEN to wake them; the fallback poll
    # only matters for a slow queue's job enqueued while it sleeps.
    noop = [lambda db, q=q: Queue(q, {NOOP_JOB: _noop}, poll_interval=1.0) for q in NOOP_QUEUES]
    slow = [lambda db, q=q: Queue(q, {SLOW_JOB: _slow}, poll_interval=0.3) for q in SLOW_QUEUES]
    return noop + slow


if __name__ == "__main__":
    sys.exit(worker.main(registry(), []))
