"""A worker process with one "blip" queue of short jobs, for tests of outcome
writes across a brief database outage. Each handler sleeps a little and,
just before it returns ok, appends "returned <id>" to $RETURNS_FILE: a file,
so the record survives whatever happens to the database path.

Settings (environment): BLIP_CONCURRENCY (default 8), the queue's slots.
Jobs: blip.Run {} (20 to 50 ms).
"""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

CONCURRENCY = int(os.environ.get("BLIP_CONCURRENCY", "8"))


def run(job: PendingJob) -> str:
    gevent.sleep(random.uniform(0.02, 0.05))
    with open(os.environ["RETURNS_FILE"], "a") as out:
        out.write(f"returned {job.id}\n")
    return status.ok()


def make_blip(db: DB) -> Queue:
    return Queue("blip", {"blip.Run": run}, poll_interval=0.3, concurrency=CONCURRENCY)


if __name__ == "__main__":
    sys.exit(worker.main([make_blip]))
