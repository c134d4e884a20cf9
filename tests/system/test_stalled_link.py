"""At most one run of a job at a time when a worker's link to the database
stalls: it neither breaks nor answers (a half-dead NAT, a stuck load
balancer), so no socket error ever comes and TCP keepalives are answered.
The stalled worker must stop its handler on its own before its lease lapses,
and live on once the link comes back."""

import time

from proxy import Proxy
from test_double_run import lease_workers, runs, wait_finished
from tests_support import wait_for

from lib.insert import insert

LEASE = 3.0
STALL = 8.0  # longer than two leases: another worker takes the job over meanwhile
JOB_SECONDS = 10.0
# Slack for the fence's own tick and the runs file's clock reads.
TOLERANCE = 0.5


def test_a_worker_on_a_stalled_link_stops_its_run_before_its_lease_lapses(db, database_url, tmp_path):
    proxy = Proxy(database_url)
    try:
        with lease_workers(tmp_path, lease=LEASE) as workers:
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
