"""A worker process of four queues for the fan-in test: "a", "b" and "c" run
short jobs (a cooperative sleep of args["seconds"]), "sink" the job that
waits for them. Tests start two of these."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402


def nap(job: PendingJob) -> str:
    gevent.sleep(job.args.get("seconds", 0))
    return "ok"


def queue(name: str):
    def make(db: DB) -> Queue:
        return Queue(name, {f"{name}.N": nap}, concurrency=2, poll_interval=0.5)

    return make


if __name__ == "__main__":
    sys.exit(worker.main([queue(name) for name in ("a", "b", "c", "sink")]))
