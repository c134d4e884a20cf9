"""A worker process with a schedule, for tests/system/test_clock_skew.py:
queue "ticks", whose job ticks.Run {"by": str} two entries enqueue every
minute: one every such worker shares ({"by": "all"}), and one of its own
({"by": CLOCK_WORKER}, from the environment), so the minutes one worker's
clock fires at can be told from another's."""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import worker  # noqa: E402
from lib.background.clock import Scheduled, every  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

SCHEDULE = [
    Scheduled("ticks", "ticks.Run", every(1), args={"by": "all"}),
    Scheduled("ticks", "ticks.Run", every(1), args={"by": os.environ.get("CLOCK_WORKER", "alone")}),
]


def run(job: PendingJob) -> str:
    return status.ok()


def make_ticks(db: DB) -> Queue:
    return Queue("ticks", {"ticks.Run": run}, poll_interval=1)


if __name__ == "__main__":
    sys.exit(worker.main([make_ticks], schedule=SCHEDULE))
