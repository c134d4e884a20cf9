"""An operator's cancel of a running job, across processes: the job runs in
a worker process, the cancel comes from another (this test's, or the
command line's), and the handler stops within two seconds; a handler that
swallows every interruption is fenced and its row still ends cancelled."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests_support import ROOT, wait_for

from lib.insert import insert
from lib.operate.cancel import cancel

CANCEL_WORKER = ROOT / "tests" / "apps" / "cancel_worker.py"
LEASE = 2.0
CANCELLED = "skip: cancelled by operator"


@contextmanager
def cancel_worker(database_url: str, tmp_path: Path) -> Iterator[subprocess.Popen]:
    """One worker process on the "cancel" queue, with a short lease."""
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(CANCEL_WORKER)],
            env={
                "PATH": "/usr/bin:/bin",
                "JOBS_HTTP_ADDR": "off",
                "DATABASE_URL": database_url,
                "JOBS_LEASE_SECONDS": str(LEASE),
                "RUNS_FILE": str(tmp_path / "runs"),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    proc.log_path = log_path  # type: ignore[attr-defined]
    try:
        wait_for(lambda: "running 1 queues" in log_path.read_text(), 30)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def events(tmp_path: Path, job_id: int) -> list[tuple[str, int, float]]:
    """(event, pid, wall time) of the job's handler, in order."""
    path = tmp_path / "runs"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(e, int(pid), float(at)) for e, pid, job, at in (line.split() for line in lines) if int(job) == job_id]


def job_row(db, job_id: int) -> tuple:
    return db.query_row("SELECT status, attempts, cancel_requested FROM jobs WHERE id = %s", (job_id,))


def test_a_job_running_in_another_process_stops_within_two_seconds_of_the_cancel(db, database_url, tmp_path):
    with cancel_worker(database_url, tmp_path) as proc:
        job_id = insert(db, "cancel", "cancel.Sleep", {"seconds": 60})
        wait_for(lambda: events(tmp_path, job_id), 15)
        asked = time.time()
        assert cancel(db, [job_id], "operator").stopping == [job_id]
        wait_for(lambda: len(events(tmp_path, job_id)) == 2, 10)
        [(_, pid, _), (stop, stopped_pid, stopped_at)] = events(tmp_path, job_id)
        assert (stop, stopped_pid, pid) == ("stop", proc.pid, proc.pid)
        assert stopped_at - asked < 2, stopped_at - asked
        wait_for(lambda: job_row(db, job_id)[0] != "started", 10)
        # Counted, and not retried though attempts remain.
        assert job_row(db, job_id) == (CANCELLED, 1, "operator")
        # The worker goes on: its next job runs, and it stops as asked.
        after = insert(db, "cancel", "cancel.Sleep", {"seconds": 0})
        wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE id = %s", (after,))[0] == "ok", 15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    log = proc.log_path.read_text()  # type: ignore[attr-defined]
    assert f"id={job_id} status='{CANCELLED}'" in log, log[-3000:]
    assert " died: " not in log, log[-3000:]


def test_a_handler_that_swallows_its_cancel_is_fenced_and_its_row_ends_cancelled(db, database_url, tmp_path):
    """The cancel from the command line; the handler catches BaseException
    and sleeps on, so the worker stops renewing its lease after the grace,
    the fence throws LeaseLost when it lapses, and the rescue ends the row."""
    with cancel_worker(database_url, tmp_path) as proc:
        job_id = insert(db, "cancel", "cancel.Swallow", {"seconds": 60})
        wait_for(lambda: events(tmp_path, job_id), 15)
        done = subprocess.run(
            [sys.executable, "worker.py", "cancel", str(job_id)],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[1].startswith(f"stopping 1 running jobs: {job_id}")
        asked = time.time()
        wait_for(lambda: job_row(db, job_id)[0] != "started", 20)
        # The grace, a lease from its last renewal, a rescue period and a margin.
        assert time.time() - asked < 2 + LEASE + LEASE / 3 + 3
        assert job_row(db, job_id) == (CANCELLED, 1, "operator")
        seen = [event for event, _, _ in events(tmp_path, job_id)]
        # Thrown its cancel again and again, then fenced; and it never stopped.
        assert seen[0] == "start" and "stop" not in seen, seen
        assert seen.count("caught-JobCancelled") >= 3 and "caught-LeaseLost" in seen, seen
        assert proc.poll() is None
        # Not run again: a rescue ends a cancelled row, whatever attempts remain.
        time.sleep(LEASE)
        assert [e for e, _, _ in events(tmp_path, job_id)].count("start") == 1
    log = proc.log_path.read_text()  # type: ignore[attr-defined]
    assert f"id={job_id} cancelled and still running" in log, log[-3000:]
