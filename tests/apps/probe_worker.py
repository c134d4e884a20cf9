"""A worker process with a probe queue, for tests that signal or kill real
worker processes. Jobs: probe.Sleep {"seconds": float}, probe.Record {}."""

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
class SleepArgs:
    seconds: float


def make_probe(db: DB) -> Queue:
    def sleep(job: PendingJob) -> str:
        args = unmarshal_args(SleepArgs, job.args)
        db.exec("INSERT INTO probe_runs (job_id, event) VALUES (%s, 'start')", (job.id,))
        gevent.sleep(args.seconds)
        db.exec("INSERT INTO probe_runs (job_id, event) VALUES (%s, 'end')", (job.id,))
        return status.ok()

    return Queue("probe", {"probe.Sleep": sleep}, poll_interval=0.2)


if __name__ == "__main__":
    sys.exit(worker.main([make_probe]))
