"""A worker process of one of two releases, for tests of a rolling upgrade:
its queue "up" runs the job names its release has. Each run appends a
"start" line (pid, job id, job name) to $RUNS_FILE, in the order the
handlers start.

Settings (environment):
  RELEASE      "A" handles up.Old; "B", the newer, handles up.Old and up.New
  CONCURRENCY  the queue's concurrency (default 1: a serial queue)
"""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

RELEASES = {"A": ("up.Old",), "B": ("up.Old", "up.New")}


def _run(job: PendingJob) -> str:
    with open(os.environ["RUNS_FILE"], "a") as out:
        out.write(f"start {os.getpid()} {job.id} {job.name}\n")
    # Long enough that jobs enqueued together wait behind one another.
    gevent.sleep(0.1)
    return status.ok()


def make_up(db: DB) -> Queue:
    names = RELEASES[os.environ["RELEASE"]]
    concurrency = int(os.environ.get("CONCURRENCY", "1"))
    return Queue("up", dict.fromkeys(names, _run), concurrency=concurrency)


if __name__ == "__main__":
    sys.exit(worker.main([make_up]))
