"""Helpers shared by the tests (not fixtures)."""

import os
import subprocess
import sys
import time
from pathlib import Path

from lib.db import DB

ROOT = Path(__file__).resolve().parent.parent


def count_jobs(db: DB, where: str = "TRUE") -> int:
    return db.query_row(f"SELECT count(*) FROM jobs WHERE {where}")[0]


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run code in a plain interpreter (no gevent) from the project root."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


PROBE_WORKER = ROOT / "tests" / "apps" / "probe_worker.py"


def start_worker(database_url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(PROBE_WORKER), *args],
        env={**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "INFO"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)
