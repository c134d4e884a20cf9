"""A worker of a registry this checkout's queues/ does not have, as a worker
of another release or another entry point runs: queue "elsewhere", job
elsewhere.Echo {"text": str}.

ELSEWHERE_SETUP (environment) gives it one of the mistakes the worker
refuses and `check` must catch (the schedule is elsewhere_schedule.py's):
  ok         no mistake, and no schedule (the default)
  duplicate  a schedule entry listed twice
  every7     a cadence that does not divide the hour, every(7)
  badcron    a cron string with an hour of 25
  space      a handler's name with a stray space
"""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.job.args import unmarshal_args  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

SETUP = os.environ.get("ELSEWHERE_SETUP", "ok")


@dataclass(frozen=True)
class EchoArgs:
    text: str


def echo(job: PendingJob) -> str:
    unmarshal_args(EchoArgs, job.args)
    return status.ok()


def make_elsewhere(db: DB) -> Queue:
    name = "elsewhere.Echo " if SETUP == "space" else "elsewhere.Echo"
    return Queue("elsewhere", {name: echo}, poll_interval=0.5)


if __name__ == "__main__":
    # Imported here, and only for a schedule: a bad entry raises as its
    # module is imported, which the worker then reports (lib/operate/setup_check.py).
    from lib.operate import setup_check

    schedule = setup_check.loader("elsewhere_schedule") if SETUP in ("duplicate", "every7", "badcron") else ()
    sys.exit(worker.main([make_elsewhere], schedule=schedule))
