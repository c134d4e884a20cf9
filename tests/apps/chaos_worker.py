"""A worker process for the chaos tests: queues whose one job, chaos.Run,
records when it starts and ends in chaos_runs (created by the test), so the
test can check from the database alone that no two runs of a queue overlapped.
Times come from the server's clock_timestamp(), or from this process's clock for
an end written late; the test, the server and the workers share one host clock.

Settings (environment):
  CHAOS_QUEUES     comma-separated queues (default c0,c1,c2,c3), concurrency 1
  CHAOS_SLEEP_MS   "lo,hi": each run sleeps a random time in between (default 0,20),
                   unless its job's args name one ({"ms": N})
  CHAOS_FAIL_RATE  chance that a run raises after it ended (default 0.01)
  CHAOS_POLL_INTERVAL  the queues' fallback poll, in seconds (default 0.2);
                   long, for a test that must see a wakeup and not a poll
  CHAOS_DIE_IN_BATCH  N: the process SIGKILLs itself in its Nth group commit
                   that writes an outcome and claims, once the server has
                   answered and before any poller hears the answer
  CHAOS_RECORD_URL the database to write chaos_runs through (default the
                   worker's own): a worker whose own link may stall records
                   its runs by another way, so each is stamped when it happens
"""

from gevent import monkey

monkey.patch_all()

import logging  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.job.args import unmarshal_args  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.run.steps import Committer  # noqa: E402
from lib.store.db import DB  # noqa: E402

log = logging.getLogger("chaos")

QUEUES = os.environ.get("CHAOS_QUEUES", "c0,c1,c2,c3").split(",")
SLEEP_MS = tuple(float(x) for x in os.environ.get("CHAOS_SLEEP_MS", "0,20").split(","))
FAIL_RATE = float(os.environ.get("CHAOS_FAIL_RATE", "0.01"))
POLL_INTERVAL = float(os.environ.get("CHAOS_POLL_INTERVAL", "0.2"))
MAX_ATTEMPTS = 3
PID = os.getpid()

RECORD = "INSERT INTO chaos_runs (job_id, queue, attempt, pid, event, at) VALUES (%s, %s, %s, %s, %s, {at})"

# End records that could not be written when the run ended (the database was
# down): written later with the time the run really ended, so a run's interval
# is never stretched to when the database came back.
_late: list[tuple[int, str, int, datetime]] = []
_late_db: DB | None = None
_record_db: DB | None = None


@dataclass
class RunArgs:
    ms: float = -1.0  # how long the run sleeps; negative: a random time in CHAOS_SLEEP_MS


def _sleep_ms(job: PendingJob) -> float:
    ms = unmarshal_args(RunArgs, job.args).ms
    return ms if ms >= 0 else random.uniform(*SLEEP_MS)


class ChaosFault(Exception):
    """The deliberate, rare failure that exercises retries."""


def _record(db: DB, job: PendingJob, queue: str, event: str, at: datetime | None = None) -> None:
    sql = RECORD.format(at="clock_timestamp()" if at is None else "%s")
    params: tuple[object, ...] = (job.id, queue, job.attempts, PID, event)
    db.exec(sql, params if at is None else (*params, at))


def _end(db: DB, job: PendingJob, queue: str) -> None:
    """Record the end of a run. A killed connection costs one more try (the
    pool opens a new one); a database that is down defers the record, and the
    run fails as a real handler would."""
    try:
        _record(db, job, queue, "end")
        return
    except Exception:
        ended = datetime.now(UTC)
    try:
        _record(db, job, queue, "end", ended)
    except Exception:
        _late.append((job.id, queue, job.attempts, ended))
        raise


def flush_late(db: DB) -> None:
    """Write the deferred end records that the database now takes."""
    while _late:
        job_id, queue, attempt, at = _late[0]
        db.exec(RECORD.format(at="%s"), (job_id, queue, attempt, PID, "end", at))
        _late.pop(0)


def _flush_forever(db: DB) -> None:
    while True:
        try:
            flush_late(db)
        except Exception as exc:
            log.info("deferred end records wait: %s", exc)
        gevent.sleep(0.1)


def make_queue(queue: str) -> Callable[[DB], Queue]:
    def make(worker_db: DB) -> Queue:
        global _late_db, _record_db
        record_url = os.environ.get("CHAOS_RECORD_URL") or worker_db.dsn
        if _record_db is None:
            _record_db = worker_db if record_url == worker_db.dsn else DB(record_url, application_name="chaos-record")
        if _late_db is None:
            _late_db = DB(record_url, size=1, application_name="chaos-late")
            gevent.spawn(_flush_forever, _late_db)
        db = _record_db

        def run(job: PendingJob) -> str:
            try:
                _record(db, job, queue, "start")
            except BaseException:
                # The start may have committed all the same (the connection
                # died after the commit): an end closes it either way.
                _late.append((job.id, queue, job.attempts, datetime.now(UTC)))
                raise
            try:
                gevent.sleep(_sleep_ms(job) / 1000)
            except BaseException:
                # Stopped mid-run (its lease could not be kept): the run
                # ended here, whenever the record gets through.
                _late.append((job.id, queue, job.attempts, datetime.now(UTC)))
                raise
            _end(db, job, queue)
            if random.random() < FAIL_RATE:
                raise ChaosFault("deliberate")
            return status.ok()

        # A short retry base, so retried jobs finish within the run.
        return Queue(queue, {"chaos.Run": run}, poll_interval=POLL_INTERVAL, max_attempts=MAX_ATTEMPTS, retry_base=0.5)

    return make


def die_in_batch(n: int) -> None:
    """A crash between a group commit's send and its reply reaching the pollers."""
    round_trip = Committer._round_trip
    seen = 0

    def crashing(self: Committer, asks: list) -> list:
        nonlocal seen
        rows = round_trip(self, asks)
        if any(a.outcome is not None for a in asks) and any(a.claim is not None for a in asks):
            seen += 1
            if seen == n:
                log.warning("dying in group commit %d (%d asks)", seen, len(asks))
                os.kill(PID, signal.SIGKILL)
        return rows

    Committer._round_trip = crashing  # type: ignore[method-assign]


def main() -> int:
    if os.environ.get("CHAOS_DIE_IN_BATCH"):
        die_in_batch(int(os.environ["CHAOS_DIE_IN_BATCH"]))
    code = worker.main([make_queue(q) for q in QUEUES])
    # A clean exit leaves no end record behind.
    if _late_db is not None:
        for _ in range(50):
            try:
                flush_late(_late_db)
                break
            except Exception:
                gevent.sleep(0.1)
    return code


if __name__ == "__main__":
    sys.exit(main())
