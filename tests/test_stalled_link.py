"""At most one run of a job at a time when a worker's link to the database
stalls: it neither breaks nor answers (a half-dead NAT, a stuck load
balancer), so no socket error ever comes and TCP keepalives are answered.
The stalled worker must stop its handler on its own before its lease lapses,
and live on once the link comes back."""

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from proxy import Proxy
from test_double_run import runs, wait_finished
from tests_support import ROOT, wait_for

from lib.insert import insert

LEASE_WORKER = ROOT / "tests" / "apps" / "lease_worker.py"
LEASE = 3.0
STALL = 8.0  # longer than two leases: another worker takes the job over meanwhile
JOB_SECONDS = 10.0
# Slack for the fence's own tick and the runs file's clock reads.
TOLERANCE = 0.5


class Workers:
    """Real lease_worker processes on the "lease" queue, sharing one runs file."""

    def __init__(self, tmp_path: Path, lease: float) -> None:
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
def lease_workers(tmp_path: Path, lease: float) -> Iterator[Workers]:
    workers = Workers(tmp_path, lease)
    try:
        yield workers
        workers.stop()
    finally:
        for proc, _ in workers.procs:
            proc.kill()


def test_a_worker_on_a_stalled_link_stops_its_run_before_its_lease_lapses(db, database_url, tmp_path):
    proxy = Proxy(database_url)
    try:
        with lease_workers(tmp_path, LEASE) as workers:
            stalled = workers.start(proxy.url)
            job_id = insert(db, "lease", "lease.Sleep", {"seconds": JOB_SECONDS}, max_attempts=2)
            wait_for(lambda: len(runs(tmp_path)) == 1)
            direct = workers.start(database_url)
            proxy.stall()
            stalled_at = time.time()
            # The fault itself lasts this long; nothing to wait on meanwhile.
            time.sleep(STALL)
            proxy.resume()
            resumed_at = time.time()
            status = wait_finished(db, job_id, timeout=60)
            all_runs = runs(tmp_path)
            timings = (
                f"stall at {stalled_at:.3f}, resumed at {resumed_at:.3f}, lease {LEASE}s; "
                f"runs (pid, start, stop): {all_runs}; stalled worker {stalled}, direct {direct}; "
                f"job {status}"
            )
            assert len(all_runs) == 2, timings
            first, second = all_runs
            assert first[0] == stalled and second[0] == direct, timings
            # No overlap: the stalled worker's handler stopped before the other's began.
            assert first[2] <= second[1], f"overlap of {first[2] - second[1]:.3f}s: {timings}"
            # Stopped by its own fence, before its last lease could have lapsed.
            assert first[2] <= stalled_at + LEASE + TOLERANCE, (
                f"stopped {first[2] - stalled_at:.3f}s into the stall: {timings}"
            )
            assert status[0] == "ok", timings
            print(
                f"stalled run stopped {first[2] - stalled_at:.3f}s into the stall, "
                f"the rescuer's began {second[1] - stalled_at:.3f}s into it (lease {LEASE}s)"
            )
    finally:
        proxy.close()
