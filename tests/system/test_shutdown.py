import signal

import pytest
from tests_support import start_worker, wait_for

from lib.insert import insert


@pytest.fixture
def probe_db(db):
    db.exec("DROP TABLE IF EXISTS probe_runs")
    db.exec("CREATE TABLE probe_runs (job_id bigint, event text, at timestamptz DEFAULT clock_timestamp())")
    return db


def sigterm_during(db, database_url: str, job_id: int, window: float) -> tuple[int, str]:
    """Start a worker, SIGTERM it once the job has started; its exit code and output."""
    proc = start_worker(database_url, "--shutdown-window", str(window))
    try:
        wait_for(lambda: db.query("SELECT 1 FROM probe_runs WHERE job_id = %s", (job_id,)))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, out


def test_sigterm_lets_the_running_job_finish(probe_db, database_url):
    job_id = insert(probe_db, "probe", "probe.Sleep", {"seconds": 1.5})
    later = insert(probe_db, "probe", "probe.Sleep", {"seconds": 0})
    code, out = sigterm_during(probe_db, database_url, job_id, window=20)
    assert code == 0, out
    assert probe_db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == ("ok",)
    # It stopped claiming: the next job was left for the next worker.
    assert probe_db.query_row("SELECT status FROM jobs WHERE id = %s", (later,)) == ("pending",)
    assert "stopping: no new claims; 1 running jobs" in out


def test_sigterm_past_the_window_interrupts_the_job(probe_db, database_url):
    job_id = insert(probe_db, "probe", "probe.Sleep", {"seconds": 60})
    code, out = sigterm_during(probe_db, database_url, job_id, window=0.5)
    assert code == 0, out
    row = probe_db.query_row("SELECT status, finished_at IS NOT NULL, lease_until FROM jobs WHERE id = %s", (job_id,))
    assert row == ("err: interrupted", True, None)
    assert "interrupting 1 running jobs" in out
