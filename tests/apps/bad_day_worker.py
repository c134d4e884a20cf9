"""A worker process of four queues of slow jobs and an every-minute schedule
entry, for tests of the database's bad day (read-only spells, refused
connections). Each handler sleeps $BAD_DAY_SLEEP seconds (default 0) and,
just before it returns ok, appends "returned <id>" to $RETURNS_FILE: a file,
so the record survives whatever happens to the database.

Queues: bd0 to bd3, each with jobs bd.Run {}; their poll interval is the
default (120 s), so only a wakeup (a commit, the database's return) makes
them look sooner.
"""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.background.clock import Scheduled, every  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.run.queue import Queue  # noqa: E402

SLEEP = float(os.environ.get("BAD_DAY_SLEEP", "0"))


def run(job: PendingJob) -> str:
    gevent.sleep(SLEEP)
    with open(os.environ["RETURNS_FILE"], "a") as out:
        out.write(f"returned {job.id}\n")
    return status.ok()


def registry() -> list:
    def make(name: str):
        return lambda db: Queue(name, {"bd.Run": run})

    return [make(f"bd{n}") for n in range(4)]


if __name__ == "__main__":
    sys.exit(worker.main(registry(), schedule=[Scheduled("bd0", "bd.Run", every(1), args={"tick": True})]))
