"""LOG_FORMAT=json: one JSON object per line, the per-job line's fields as keys."""

import json
import logging
import os
import signal
import subprocess
import sys

from tests_support import ROOT, wait_for

from lib.insert import insert
from lib.setup import logs
from lib.setup.settings import Settings


def test_the_json_formatter_writes_one_object_per_event_whatever_the_message_holds():
    record = logging.LogRecord("jobs", logging.ERROR, __file__, 1, "job=%s failed", ("a\nb",), None)
    record.queue, record.id = "q", 7
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = logs.json_formatter().format(record)
    assert "\n" not in line
    got = json.loads(line)
    assert (got["level"], got["logger"], got["message"], got["queue"], got["id"]) == (
        "ERROR",
        "jobs",
        "job=a\nb failed",
        "q",
        7,
    )
    assert "ValueError: boom" in got["exc_info"]
    assert got["time"].endswith("+00:00")


def test_log_format_is_read_and_checked_like_log_level():
    assert Settings.from_env({}).log_format == "text"
    assert Settings.from_env({"LOG_FORMAT": " JSON "}).log_format == "json"


def test_a_worker_with_log_format_json_writes_json_lines_with_the_job_fields(db, database_url, tmp_path):
    db.exec(
        "CREATE TABLE IF NOT EXISTS probe_runs (job_id bigint, event text, at timestamptz DEFAULT clock_timestamp())"
    )
    job_id = insert(db, "probe", "probe.Sleep", {"seconds": 0})
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "apps" / "probe_worker.py")],
            env={**os.environ, "DATABASE_URL": database_url, "LOG_FORMAT": "json"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: f'"id": {job_id}' in log_path.read_text(), 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]  # every line is one object
    [done] = [line for line in lines if line.get("id") == job_id]
    worker_id = db.query_row("SELECT worker_id FROM jobs WHERE id = %s", (job_id,))[0]
    assert {k: done[k] for k in ("queue", "job", "id", "status", "worker", "level", "logger")} == {
        "queue": "probe", "job": "probe.Sleep", "id": job_id, "status": "ok", "worker": worker_id,
        "level": "INFO", "logger": "jobs",
    }  # fmt: skip
    assert isinstance(done["latency"], float) and isinstance(done["duration"], float)
    assert done["message"].startswith(f"queue=probe job=probe.Sleep id={job_id} status='ok'")
    assert any(line["message"] == "stopped" for line in lines)
