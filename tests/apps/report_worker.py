"""A worker process with a "report" queue, for tests of what reaches Sentry
from each part of a worker: report.Sleep {"seconds": float} sleeps
cooperatively (a job whose lease the worker must renew), report.Raise raises
(a fault the poller reports from the hub's thread)."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
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
class Seconds:
    seconds: float


class HandlerFault(Exception):
    pass


def make_report(db: DB) -> Queue:
    def sleep(job: PendingJob) -> str:
        gevent.sleep(unmarshal_args(Seconds, job.args).seconds)
        return status.ok()

    def fault(job: PendingJob) -> str:
        raise HandlerFault("the handler's own fault")

    return Queue("report", {"report.Sleep": sleep, "report.Raise": fault}, poll_interval=0.2)


if __name__ == "__main__":
    sys.exit(worker.main([make_report]))
