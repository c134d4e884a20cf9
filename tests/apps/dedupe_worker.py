"""A worker process whose queue "dd" handles dd.A and dd.B; each run is recorded
in dedupe_runs (created by the test), so the test counts runs from the database.

Settings (environment):
  DEDUPE_NAMES  comma-separated job names this process declares as dedupe
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

DEDUPE = {name for name in os.environ.get("DEDUPE_NAMES", "").split(",") if name}


def make_dd(db: DB) -> Queue:
    def record(job: PendingJob) -> str:
        db.exec(
            "INSERT INTO dedupe_runs (job_id, name, args) VALUES (%s, %s, %s)", (job.id, job.name, json.dumps(job.args))
        )
        return status.ok()

    return Queue("dd", {"dd.A": record, "dd.B": record}, dedupe=DEDUPE, poll_interval=0.2)


if __name__ == "__main__":
    sys.exit(worker.main([make_dd]))
