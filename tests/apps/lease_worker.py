"""A worker process whose "lease" queue runs handlers that hold the hub or
sleep, for tests of double runs. Each handler appends "start" and "stop" lines
(pid, job id, wall time) to $RUNS_FILE, so a test sees every run, even one cut
off from the database, and whether two overlapped.

Jobs (args {"seconds": float}): lease.Sleep (a cooperative sleep),
lease.HubSleep (an unpatched sleep: the hub is held), lease.Spin (a CPU loop).
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

_blocking_sleep = monkey.get_original("time", "sleep")


@dataclass
class Seconds:
    seconds: float


def _note(event: str, job: PendingJob) -> None:
    with open(os.environ["RUNS_FILE"], "a") as out:
        out.write(f"{event} {os.getpid()} {job.id} {time.time():.3f}\n")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _recorded(wait: Callable[[float], None]) -> Callable[[PendingJob], str]:
    def handler(job: PendingJob) -> str:
        _note("start", job)
        try:
            wait(unmarshal_args(Seconds, job.args).seconds)
        finally:
            _note("stop", job)
        return status.ok()

    return handler


def make_lease(db: DB) -> Queue:
    handlers = {
        "lease.Sleep": _recorded(gevent.sleep),
        "lease.HubSleep": _recorded(_blocking_sleep),
        "lease.Spin": _recorded(_spin),
    }
    return Queue("lease", handlers, poll_interval=0.3)


if __name__ == "__main__":
    sys.exit(worker.main([make_lease]))
