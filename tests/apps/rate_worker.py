"""A worker process of rated no-op queues, for tests/system/test_rate_processes.py:
"rated" at Rate(10, per=1, burst=5) of its own, and "ra" and "rb" sharing
one such rate under the key "shared"."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import worker  # noqa: E402
from lib.job import PendingJob, Rate, status  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

RATE = Rate(10, per=1, burst=5)
SHARED = Rate(10, per=1, burst=5, key="shared")


def _noop(job: PendingJob) -> str:
    return status.ok()


def registry() -> list[Callable[[DB], Queue]]:
    # A short fallback poll: a poller that found the slot taken (another
    # process's job running) looks again soon, so the processes compete for
    # the rate instead of one keeping the queue while the others sleep.
    return [
        lambda db: Queue("rated", {"noop.Run": _noop}, rate=RATE, poll_interval=0.5),
        lambda db: Queue("ra", {"noop.Run": _noop}, rate=SHARED, poll_interval=0.5),
        lambda db: Queue("rb", {"noop.Run": _noop}, rate=SHARED, poll_interval=0.5),
    ]


if __name__ == "__main__":
    sys.exit(worker.main(registry(), []))
