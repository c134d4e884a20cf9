"""Follow-ups under SIGKILL: a worker killed at random moments, again and
again, never leaves a lead's outcome without its follow-up or a follow-up
without its lead's outcome, and never writes one twice."""

import random
import signal
import subprocess
import sys

import gevent
from tests_support import ROOT, wait_for

from lib.insert import Job, insert_many

FOLLOWUP_WORKER = ROOT / "tests" / "apps" / "followup_worker.py"
LEADS = 600


def start(database_url: str, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(FOLLOWUP_WORKER)],
        env={"PATH": "/usr/bin:/bin", "JOBS_HTTP_ADDR": "off", "DATABASE_URL": database_url, "JOBS_LEASE_SECONDS": "2"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def started(database_url: str, log, log_path) -> subprocess.Popen:
    """A worker started, once it listens (and so handles SIGTERM)."""
    proc = start(database_url, log)
    wait_for(lambda: "listening for wakeups" in log_path.read_text().split("=== killed")[-1], 30)
    return proc


def consistent(db) -> None:
    """Every lead that ended ok has exactly one post, and every post the
    lead that added it, ended ok. One statement reads both, so one snapshot:
    a killed worker's backend may still commit its last batch between two."""
    rows = db.query("SELECT queue, status, args FROM jobs WHERE queue IN ('lead', 'post')")
    leads_ok = {a["lead"] for (queue, status, a) in rows if queue == "lead" and status == "ok"}
    posts = [a["lead"] for (queue, _, a) in rows if queue == "post"]
    assert len(posts) == len(set(posts)), sorted(p for p in posts if posts.count(p) > 1)
    assert set(posts) == leads_ok


def test_a_worker_killed_at_any_moment_writes_each_followup_exactly_with_its_outcome(db, database_url, tmp_path):
    insert_many(db, [Job("lead", "lead.Enrich", {"lead": n}) for n in range(LEADS)])
    rng = random.Random(7)
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        kills = 0
        while kills < 20 and db.query_row("SELECT count(*) FROM jobs WHERE queue = 'lead' AND status <> 'ok'")[0]:
            proc = started(database_url, log, log_path)
            gevent.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            log.write("=== killed\n")
            log.flush()
            kills += 1
            consistent(db)
        proc = started(database_url, log, log_path)
        try:
            wait_for(
                lambda: db.query_row("SELECT count(*) FROM jobs WHERE status = 'ok'") == (2 * LEADS,),
                90,
                what="every lead and post ok after the last kill",
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
    assert kills >= 3, "the leads were all done before the worker was killed thrice"
    consistent(db)
