"""A worker process of two queues for the follow-up tests (each job has attempts
enough for every kill): each "lead" job
adds a "post" job with then() and ends ok; each "post" job ends ok. Tests
SIGKILL it at random moments and count what both queues hold."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import worker  # noqa: E402
from lib.job import PendingJob  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402


def enrich(job: PendingJob) -> str:
    job.then("post", "post.Send", {"lead": job.args["lead"]})
    return "ok"


def make_lead(db: DB) -> Queue:
    return Queue("lead", {"lead.Enrich": enrich}, concurrency=4, poll_interval=0.3, max_attempts=50)


def make_post(db: DB) -> Queue:
    return Queue("post", {"post.Send": lambda job: "ok"}, concurrency=4, poll_interval=0.3, max_attempts=50)


if __name__ == "__main__":
    sys.exit(worker.main([make_lead, make_post]))
