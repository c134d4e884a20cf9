"""Fan-in across processes: one job waits for 100 jobs of three queues, run
by two worker processes; it starts once the last of them has ended, no
sooner, and within a wakeup's latency of it."""

import signal
import subprocess
import sys

from tests_support import ROOT, wait_for

from lib.insert import Job, insert, insert_many

FANIN_WORKER = ROOT / "tests" / "apps" / "fanin_worker.py"


def test_a_job_waits_for_100_jobs_of_three_queues_run_by_two_processes(db, database_url, tmp_path):
    procs = []
    logs = [tmp_path / f"worker{n}.log" for n in range(2)]
    # The queues dealt out: a queue's slots stay with the process whose
    # outcome claims its next job, so two processes of the same queues
    # might not share the work.
    for log_path, queues in zip(logs, ("a,b", "c,sink"), strict=True):
        with open(log_path, "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(FANIN_WORKER)],
                    env={
                        "PATH": "/usr/bin:/bin",
                        "JOBS_HTTP_ADDR": "off",
                        "DATABASE_URL": database_url,
                        "JOBS_QUEUES": queues,
                    },
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        for log_path in logs:
            wait_for(lambda p=log_path: "listening for wakeups" in p.read_text(), 30)
        deps = insert_many(db, [Job("abc"[n % 3], f"{'abc'[n % 3]}.N", {"seconds": 0.02, "n": n}) for n in range(100)])
        sink = insert(db, "sink", "sink.N", after=deps)
        wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE id = %s", (sink,)) == ("ok",), 60)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in procs]
    assert codes == [0, 0], [p.read_text()[-2000:] for p in logs]
    ended, ran_by = db.query_row(
        "SELECT max(finished_at), count(DISTINCT worker_id) FROM jobs WHERE id = ANY(%s) AND status = 'ok'", (deps,)
    )
    started = db.query_row("SELECT started_at FROM jobs WHERE id = %s", (sink,))[0]
    assert db.query_row("SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'ok'", (deps,)) == (100,)
    assert ended <= started
    assert ran_by == 2, "one process ran every job: the test shows nothing across processes"
    assert (started - ended).total_seconds() < 2.0
