"""A worker process with a "poison" queue, for tests that plant bad rows by
plain SQL. Each run of poison.Good is recorded in poison_runs (made by the
test); Sentry events go, through sentry-sdk, to a capturing transport that
appends each event as a JSON line to $SENTRY_EVENTS_FILE.

Jobs: poison.Good {}, poison.Args {"name": str}, poison.Raise {"text": str}
(raises it), poison.Fail {"text": str} (returns it as a fail status).
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sentry_sdk.transport import Transport  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.job.args import unmarshal_args  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.setup import error_reports  # noqa: E402
from lib.store.db import DB  # noqa: E402


class FileTransport(Transport):
    """A real sentry-sdk transport that keeps each event as a JSON line."""

    def capture_envelope(self, envelope) -> None:  # type: ignore[no-untyped-def]
        with open(os.environ["SENTRY_EVENTS_FILE"], "a") as out:
            for item in envelope.items:
                if item.type == "event":
                    out.write(json.dumps(item.payload.json) + "\n")


@dataclass
class NameArgs:
    name: str


@dataclass
class TextArgs:
    text: str


def make_poison(db: DB) -> Queue:
    def good(job: PendingJob) -> str:
        db.exec("INSERT INTO poison_runs (job_id) VALUES (%s)", (job.id,))
        return status.ok()

    def args(job: PendingJob) -> str:
        return status.ok(unmarshal_args(NameArgs, job.args).name)

    def raise_(job: PendingJob) -> str:
        # jsonb cannot hold a NUL either: the word stands for one.
        raise RuntimeError(unmarshal_args(TextArgs, job.args).text.replace("NUL", "\x00"))

    def fail(job: PendingJob) -> str:
        return "fail: " + unmarshal_args(TextArgs, job.args).text.replace("NUL", "\x00")

    handlers = {"poison.Good": good, "poison.Args": args, "poison.Raise": raise_, "poison.Fail": fail}
    return Queue("poison", handlers, poll_interval=0.5)


if __name__ == "__main__":
    error_reports.init("http://public@127.0.0.1:9/1", transport=FileTransport())
    sys.exit(worker.main([make_poison]))
