"""A database blip shorter than the lease costs no job its outcome: a real
worker runs a queue of short jobs, the way to the server goes away for a
moment while jobs are mid-flight, and every job whose handler returned ok is
stored ok (none written off as interrupted), and every job ends.

The handlers note each return in a file, outside the database path that is
cut. The lease is 3 s, the blip 2 s: a job may reach the blip with less of
its lease left than the blip lasts, and its outcome still lands, because the
write goes on trying while no rescue can have taken the row.
"""

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from chaos_server import ChaosServer, worker_env
from proxy import Proxy
from tests_support import ROOT, wait_for

from lib.insert import Job, insert_many
from lib.store.db import DB
from lib.store.migrate import migrate

BLIP_WORKER = ROOT / "tests" / "apps" / "blip_worker.py"
LEASE = 3.0
BLIP = 2.0
JOBS = 300
# The blip falls once this many handlers have returned: jobs are mid-flight.
BLIP_AFTER = 50


def returned(tmp_path: Path) -> set[int]:
    path = tmp_path / "returned"
    lines = path.read_text().splitlines() if path.exists() else []
    return {int(line.split()[1]) for line in lines}


def start_worker(url: str, tmp_path: Path) -> subprocess.Popen:
    log = (tmp_path / "worker.log").open("w")
    with log:
        return subprocess.Popen(
            [sys.executable, str(BLIP_WORKER)],
            env=worker_env(
                url,
                JOBS_HTTP_ADDR="off",
                JOBS_LEASE_SECONDS=str(LEASE),
                RETURNS_FILE=str(tmp_path / "returned"),
                PYTHONUNBUFFERED="1",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def unfinished(db: DB) -> int:
    return db.query_row("SELECT count(*) FROM jobs WHERE status IN ('pending', 'started')")[0]


def run_through_blip(db: DB, worker_url: str, tmp_path: Path, blip: Callable[[], None]) -> None:
    """JOBS jobs on one worker on worker_url, blip() once BLIP_AFTER have
    returned; then the checks."""
    ids = insert_many(db, [Job("blip", "blip.Run", {"n": n}, max_attempts=1) for n in range(JOBS)])
    worker = start_worker(worker_url, tmp_path)
    log = tmp_path / "worker.log"
    try:
        wait_for(lambda: len(returned(tmp_path)) >= BLIP_AFTER, 60)
        began = time.time()
        blip()
        ended = time.time()
        wait_for(lambda: unfinished(db) == 0, 60)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        worker.kill()
        worker.wait(timeout=10)
    stored = dict(db.query("SELECT id, status FROM jobs"))
    done = returned(tmp_path)
    lost = {job_id: stored[job_id] for job_id in done if stored[job_id] != "ok"}
    assert not lost, (
        f"{len(lost)} of {len(done)} jobs whose handler returned ok are stored otherwise "
        f"({dict(Counter(lost.values()))}, ids {sorted(lost)[:10]}); blip from {began:.3f} to {ended:.3f}; "
        f"all statuses {dict(Counter(stored.values()))}"
    )
    assert set(stored) == set(ids)


def test_a_blip_of_refused_connections_costs_no_outcome(db, database_url, tmp_path):
    proxy = Proxy(database_url)

    def blip() -> None:
        proxy.down()
        # The fault lasts this long; nothing to wait on meanwhile.
        time.sleep(BLIP)
        proxy.up()

    try:
        run_through_blip(db, proxy.url, tmp_path, blip)
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def chaos_server() -> Iterator[ChaosServer]:
    with ChaosServer() as server:
        yield server


def test_an_immediate_server_restart_costs_no_outcome(chaos_server, tmp_path):
    url = chaos_server.database("blips")
    db = DB.connect(url, size=2, ping_after=0.0, application_name="blips-test")
    try:
        migrate(db)
        run_through_blip(db, url, tmp_path, chaos_server.crash_restart)
    finally:
        db.close()
