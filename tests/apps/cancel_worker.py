"""A worker process whose "cancel" queue runs handlers for tests of an
operator's cancel from another process. Each handler appends lines (event,
pid, job id, wall time) to $RUNS_FILE: "start", "caught NAME" for each
interruption it swallows, and "stop" when it ends.

Jobs (args {"seconds": float}): cancel.Sleep (a cooperative sleep, which
lets its interruption through), cancel.Swallow (catches BaseException and
sleeps on, for that many seconds in all).
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

# The same lines in the same file as the lease tests' worker writes.
from lease_worker import Seconds, _note, _recorded  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.job.args import unmarshal_args  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

sleep = _recorded(gevent.sleep)


def swallow(job: PendingJob) -> str:
    _note("start", job)
    end = time.monotonic() + unmarshal_args(Seconds, job.args).seconds
    while time.monotonic() < end:
        try:
            gevent.sleep(0.1)
        except BaseException as exc:  # what the fence and the rescue must get past
            _note(f"caught-{type(exc).__name__}", job)
    _note("stop", job)
    return status.ok("as if nothing happened")


def make_cancel(db: DB) -> Queue:
    return Queue("cancel", {"cancel.Sleep": sleep, "cancel.Swallow": swallow}, poll_interval=0.3, max_attempts=3)


if __name__ == "__main__":
    sys.exit(worker.main([make_cancel]))
