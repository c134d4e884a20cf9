"""A worker process of one queue, "sc", of definition concurrency 4 and jobs
of 50 ms, for tests/system/test_scale_processes.py; its arguments are the
command line's (no arguments: run the worker; `scale sc 4`: the command).
Each job's handler appends its start and end (time.time()) to RUNS_FILE."""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

JOB_SECONDS = 0.05


def _work(job: PendingJob) -> str:
    began = time.time()
    gevent.sleep(JOB_SECONDS)
    with open(os.environ["RUNS_FILE"], "a") as out:
        out.write(f"{began} {time.time()}\n")
    return status.ok()


def registry() -> list[Callable[[DB], Queue]]:
    # A short fallback poll: a slot whose number another process's job holds
    # looks again soon, so both processes compete for every slot.
    return [lambda db: Queue("sc", {"sc.Work": _work}, concurrency=4, poll_interval=0.2)]


if __name__ == "__main__":
    sys.exit(worker.main(registry(), sys.argv[1:]))
