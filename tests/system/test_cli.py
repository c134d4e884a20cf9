import os
import re
import subprocess
import sys

import psycopg2
from tests_support import ROOT, paused

from lib.insert import insert
from lib.store.migrate import migrations


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "worker.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pause_resume_and_redrive_from_the_command_line(db, database_url):
    done = cli(database_url, "pause", "slack", "--reason", "vendor incident", "--minutes", "30")
    assert done.returncode == 0, done.stderr
    assert "paused slack until" in done.stdout
    [(queue, reason, _)] = paused(db)
    assert (queue, reason) == ("slack", "vendor incident")
    assert cli(database_url, "resume", "slack").stdout.strip() == "resumed slack"
    assert paused(db) == []

    failed = insert(db, "caches", "caches.Age")
    db.exec("UPDATE jobs SET status = 'err: boom', attempts = 1, max_attempts = 1 WHERE id = %s", (failed,))
    done = cli(database_url, "redrive", "--queue", "caches")
    assert done.stdout.strip() == f"redrove 1 jobs: {failed}"
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (failed,)) == ("pending",)
    refused = cli(database_url, "redrive")
    assert refused.returncode == 2 and "needs ids, a queue or a name" in refused.stderr


def test_migrate_command_exits_after_migrating(empty_database):
    """On a database with no tables it applies every migration and exits,
    without starting the worker; run again, it finds nothing left to do."""
    done = cli(empty_database, "migrate")
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    # The worker never started: neither its start line nor its stop line (a
    # migration's own name may hold either word).
    assert not re.search(r"running \d+ queues|stopping: no new claims", output), output
    conn = psycopg2.connect(empty_database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT version FROM schema_migrations ORDER BY version")
            assert [v for (v,) in cur.fetchall()] == [version for version, _, _ in migrations()]
            cur.execute("SELECT count(*) FROM jobs")  # the table the worker needs is there
            assert cur.fetchone() == (0,)
    finally:
        conn.close()
    again = cli(empty_database, "migrate")
    assert again.returncode == 0, again.stderr
    assert "applied migration" in done.stderr and "applied migration" not in again.stderr


def test_redrive_says_which_copies_it_skipped_and_why(db, database_url):
    db.exec("INSERT INTO job_dedupe_names VALUES ('maintenance', 'maintenance.CleanUpJobs')")
    copies = []
    for _ in range(2):
        job_id = insert(db, "maintenance", "maintenance.CleanUpJobs")
        db.exec("UPDATE jobs SET status = 'err: boom', attempts = 1, finished_at = now() WHERE id = %s", (job_id,))
        copies.append(job_id)
    older, newer = copies
    done = cli(database_url, "redrive", "--queue", "maintenance")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"redrove 1 jobs: {newer}",
        "skipped 1 jobs:",
        f"  {older}: job {newer}, a newer failure of the same job, was redriven",
    ]
