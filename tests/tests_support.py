"""Helpers shared by the tests (not fixtures)."""

import os
import subprocess
import sys
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
