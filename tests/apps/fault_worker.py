"""A worker process with a "faults" queue, for tests of what a handler can
do wrong at the boundary: raise what cannot be printed, return what cannot be
stored, swallow its timeout, snooze for what is no plain float. Each run of
faults.Good is recorded in fault_runs (made by the test).
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
from decimal import Decimal  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import (  # noqa: E402
    PendingJob,
    Snooze,
    status,
)
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


def make_faults(db: DB) -> Queue:
    snoozed: set[int] = set()

    def good(job: PendingJob) -> str:
        db.exec("INSERT INTO fault_runs (job_id) VALUES (%s)", (job.id,))
        return status.ok()

    def cut_emoji(job: PendingJob) -> str:
        # Half of an emoji's surrogate pair, as an API's JSON cut short decodes.
        raise RuntimeError("cut \ud83d")

    def unprintable(job: PendingJob) -> str:
        raise Unprintable()

    def cut_status(job: PendingJob) -> str:
        return "fail: cut \ud83d"

    def loop(job: PendingJob) -> str:
        while True:
            try:  # noqa: SIM105 - written as handlers write it
                gevent.sleep(0.1)
            except Exception:
                pass

    def swallow(job: PendingJob) -> str:
        try:  # noqa: SIM105 - written as handlers write it
            gevent.sleep(30)
        except BaseException:
            pass
        return status.ok("as if nothing happened")

    def snooze_bool(job: PendingJob) -> str:
        raise Snooze(True, status.RATE_LIMITED)

    def snooze_decimal(job: PendingJob) -> str:
        if job.id in snoozed:
            return status.ok("snoozed once")
        snoozed.add(job.id)
        raise Snooze(Decimal("0.5"), status.RATE_LIMITED)

    handlers = {
        "faults.Good": good,
        "faults.CutEmoji": cut_emoji,
        "faults.Unprintable": unprintable,
        "faults.CutStatus": cut_status,
        "faults.Loop": loop,
        "faults.Swallow": swallow,
        "faults.SnoozeBool": snooze_bool,
        "faults.SnoozeDecimal": snooze_decimal,
    }
    return Queue("faults", handlers, poll_interval=0.5, job_timeout=1)


if __name__ == "__main__":
    sys.exit(worker.main([make_faults]))
