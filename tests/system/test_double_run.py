"""At most one run of a job at a time, with real worker processes and a short
lease: a handler that holds the hub, a worker cut off from the database, and a
row another transaction holds past the lease each leave exactly one run (or
one per counted attempt, never overlapping)."""

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pytest
from proxy import Proxy
from tests_support import ROOT, wait_for

from lib.insert import insert

LEASE_WORKER = ROOT / "tests" / "apps" / "lease_worker.py"
LEASE = 2.0


class Workers:
    """Real worker processes on the "lease" queue, sharing one runs file."""

    def __init__(self, tmp_path: Path, lease: float = LEASE) -> None:
        self.tmp_path = tmp_path
        self.lease = lease
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, url: str) -> int:
        """Start one on url and wait until it works its queue; its pid."""
        log_path = self.tmp_path / f"worker{len(self.procs)}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, str(LEASE_WORKER)],
                env={
                    "PATH": "/usr/bin:/bin",
                    "JOBS_HTTP_ADDR": "off",
                    "DATABASE_URL": url,
                    "JOBS_LEASE_SECONDS": str(self.lease),
                    "RUNS_FILE": str(self.tmp_path / "runs"),
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log_path))
        wait_for(lambda: "running 1 queues" in log_path.read_text(), 30)
        return proc.pid

    def stop(self) -> None:
        """Each is still running, exits 0 on SIGTERM, and no part of it died
        on the way (a supervised restart would hide a bug)."""
        for proc, log_path in self.procs:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
            assert " died: " not in log_path.read_text(), log_path.read_text()[-3000:]


@contextmanager
def lease_workers(tmp_path: Path, *urls: str, lease: float = LEASE) -> Iterator[Workers]:
    workers = Workers(tmp_path, lease)
    try:
        for url in urls:
            workers.start(url)
        yield workers
        workers.stop()
    finally:
        for proc, _ in workers.procs:
            proc.kill()


def runs(tmp_path: Path) -> list[tuple[int, float, float]]:
    """(pid, start, stop) of each run of a handler, in start order."""
    starts: dict[int, float] = {}
    done = []
    path = tmp_path / "runs"
    for line in path.read_text().splitlines() if path.exists() else []:
        event, pid, _job, at = line.split()
        if event == "start":
            starts[int(pid)] = float(at)
        else:
            done.append((int(pid), starts.pop(int(pid)), float(at)))
    return sorted(done + [(pid, start, float("inf")) for pid, start in starts.items()], key=lambda r: r[1])


def wait_finished(db, job_id: int, timeout: float = 60) -> tuple:
    wait_for(
        lambda: db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0] not in ("pending", "started"),
        timeout,
    )
    return db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,))


@pytest.mark.parametrize("name", ["lease.HubSleep", "lease.Spin"])
def test_a_handler_holding_the_hub_past_its_lease_runs_once(db, database_url, tmp_path, name):
    with lease_workers(tmp_path, database_url, database_url) as workers:
        # Attempts to spare: a rescue would run it again, as it did before.
        job_id = insert(db, "lease", name, {"seconds": 2.5 * LEASE}, max_attempts=3)
        assert wait_finished(db, job_id) == ("ok", 1)
    assert len(runs(tmp_path)) == 1
    # The worker that ran it said what held its hub, and where.
    logs = "".join(log.read_text() for _, log in workers.procs)
    assert "the hub has been held for over" in logs
    assert "lease_worker.py" in logs.split("the hub has been held for over", 1)[1].splitlines()[0]


def test_a_worker_cut_off_past_its_lease_stops_its_run_before_another_starts(db, database_url, tmp_path):
    proxy = Proxy(database_url)
    try:
        with lease_workers(tmp_path) as workers:
            cut_off = workers.start(proxy.url)
            job_id = insert(db, "lease", "lease.Sleep", {"seconds": 4 * LEASE}, max_attempts=2)
            wait_for(lambda: len(runs(tmp_path)) == 1)
            workers.start(database_url)
            proxy.down()
            # Longer than the lease: the other worker rescues the job and runs it.
            wait_for(lambda: len(runs(tmp_path)) == 2, 30)
            proxy.up()
            assert wait_finished(db, job_id) == ("ok", 2)
    finally:
        proxy.close()
    first, second = runs(tmp_path)
    assert first[0] == cut_off != second[0]
    # The cut-off worker stopped its handler before the rescuer's run began.
    assert first[2] <= second[1]


def test_a_row_held_by_another_transaction_past_the_lease_runs_once(db, database_url, tmp_path):
    job_id = insert(db, "lease", "lease.Sleep", {"seconds": 1.5 * LEASE}, max_attempts=3)
    locker = psycopg2.connect(database_url)
    try:
        with locker.cursor() as cur:
            # Another session holds the row (a user's transaction, say).
            cur.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job_id,))
        with lease_workers(tmp_path, database_url, database_url):
            # Both workers look at the queue for longer than the lease; neither
            # waits on the lock nor takes the row while it is held.
            time.sleep(1.5 * LEASE)
            assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,)) == ("pending", 0)
            waiting = "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database WHERE NOT l.granted"
            assert db.query_row(waiting + " AND d.datname = current_database()")[0] == 0
            locker.commit()
            assert wait_finished(db, job_id) == ("ok", 1)
    finally:
        locker.close()
    assert len(runs(tmp_path)) == 1
