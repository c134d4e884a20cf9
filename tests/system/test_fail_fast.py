"""Fail fast and say why, in real worker processes: a setting that can never
work stops the worker and every command with exit 2 and one line, secrets
masked; a database that does not answer stops a command within about 10 s
with exit 1 and one line naming the host; a worker started while it is down
says so once, answers /healthz meanwhile and says once when it connects; a
worker whose HTTP port is taken says so once and runs its jobs anyway."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests
from http_support import free_port
from proxy import Proxy
from tests_support import PROBE_WORKER, ROOT, count_jobs, read_until, wait_for

from lib.insert import insert

SECRET = "SEKRET-pw-4711"
# What a command may take to give up on a database that does not answer:
# its 10 s, and the start of a Python process on a busy machine.
GIVE_UP_WITHIN = 10 + 8


def worker(*args: str, **env: str) -> subprocess.CompletedProcess:
    """worker.py with args and env, to its end (or the test fails at 60 s)."""
    return subprocess.run(
        [sys.executable, "worker.py", *args],
        cwd=ROOT,
        env={**os.environ, "JOBS_HTTP_ADDR": "off", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line(done: subprocess.CompletedProcess) -> str:
    """The process's one line, on stderr; nothing else printed."""
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# The worker itself (no command) and an operator's command.
COMMANDS = [(), ("status",)]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_port_stops_with_exit_2_and_one_line_without_the_password(command):
    done = worker(*command, DATABASE_URL=f"postgresql://jobs:{SECRET}@db:notaport/jobs")
    assert done.returncode == 2
    assert one_line(done) == "worker: DATABASE_URL has a bad port 'notaport': a port is a number from 1 to 65535"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("query", "line"),
    [
        (
            "sslmode=bogus",
            "worker: DATABASE_URL has a bad sslmode 'bogus':"
            " one of disable, allow, prefer, require, verify-ca, verify-full",
        ),
        (
            "sslmod=require",
            'worker: DATABASE_URL is malformed: invalid dsn: invalid URI query parameter: "sslmod"'
            " (in postgresql://jobs:[redacted]@db/jobs?sslmod=require)",
        ),
    ],
)
def test_a_bad_libpq_option_stops_with_exit_2_and_one_line_without_the_password(command, query, line):
    done = worker(*command, DATABASE_URL=f"postgresql://jobs:{SECRET}@db/jobs?{query}")
    assert done.returncode == 2
    assert one_line(done) == line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_database_url_that_is_not_a_url_stops_with_exit_2_and_is_not_echoed(command):
    done = worker(*command, DATABASE_URL=f"notaurl:{SECRET}")
    assert done.returncode == 2
    line = one_line(done)
    assert line == (
        "worker: DATABASE_URL is malformed: neither a postgresql:// URL nor key=value settings"
        " (its value is not shown: it may hold a password)"
    )
    assert SECRET not in line and "notaurl" not in line


def _closed_port() -> int:
    return free_port()  # bound, then closed: a connect is refused at once


@contextmanager
def _silent_port() -> Iterator[int]:
    """A port that takes TCP connections (the kernel's backlog) and never
    answers one: a database host that is up but hung."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("command", [("status",), ("failed",), ("migrate",)])
def test_a_command_against_a_refused_port_gives_up_with_exit_1_and_one_line_naming_the_host(command):
    port = _closed_port()
    began = time.monotonic()
    done = worker(*command, DATABASE_URL=f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/postgres")
    assert time.monotonic() - began < GIVE_UP_WITHIN
    assert done.returncode == 1
    line = one_line(done)
    assert line.startswith(f"{command[0]}: could not connect to the database at 127.0.0.1:{port}: "), line
    assert SECRET not in line


def test_a_command_against_a_silent_host_gives_up_within_10s_with_exit_1_and_one_line_naming_it():
    with _silent_port() as port:
        began = time.monotonic()
        done = worker("status", DATABASE_URL=f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/postgres")
        took = time.monotonic() - began
    assert took < GIVE_UP_WITHIN
    assert done.returncode == 1
    assert one_line(done) == f"status: could not connect to the database at 127.0.0.1:{port}: no answer within 10s"


def _get(url: str) -> requests.Response | None:
    try:
        return requests.get(url, timeout=5)
    except requests.ConnectionError:
        return None


def _probe_worker(database_url: str, http_port: int, *code: str) -> subprocess.Popen:
    """tests/apps/probe_worker.py serving HTTP on http_port, after code (a
    setting of the process's own, before the worker starts)."""
    boot = "; ".join(
        [
            "from gevent import monkey",
            "monkey.patch_all()",
            *code,
            "import runpy",
            f"runpy.run_path({str(PROBE_WORKER)!r}, run_name='__main__')",
        ]
    )
    return subprocess.Popen(
        [sys.executable, "-c", boot],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url,
            "JOBS_HTTP_ADDR": f"127.0.0.1:{http_port}",
            "LOG_LEVEL": "INFO",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _lines_with(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


@pytest.fixture
def probe_table(db):
    db.exec(
        "CREATE TABLE IF NOT EXISTS probe_runs (job_id bigint, event text, at timestamptz DEFAULT clock_timestamp())"
    )


def test_a_worker_started_while_the_database_is_down_says_so_once_on_its_log_and_healthz_then_runs(
    db, database_url, probe_table
):
    proxy = Proxy(database_url)
    proxy.down()
    http = free_port()
    base = f"http://127.0.0.1:{http}"
    place = proxy.url.split("@", 1)[1].split("/", 1)[0]  # 127.0.0.1:<the proxy's port>
    proc = _probe_worker(proxy.url, http)
    try:
        before = read_until(proc, "database at start failing")
        waiting = wait_for(lambda: _get(f"{base}/healthz"), 20)
        assert waiting.status_code == 200
        assert waiting.text.startswith(f"waiting for the database at {place}: "), waiting.text
        assert _get(f"{base}/readyz").status_code == 503
        proxy.up()
        after = read_until(proc, "database at start recovered", timeout=60)
        job_id = insert(db, "probe", "probe.Sleep", {"seconds": 0})
        wait_for(lambda: count_jobs(db, f"id = {job_id} AND status = 'ok'") == 1, timeout=60)
        assert _get(f"{base}/healthz").text == "ok\n"
        proc.terminate()
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proxy.close()
    log = before + after + rest
    assert proc.returncode == 0, log
    (failing,) = _lines_with(log, "database at start failing")
    assert f"could not connect to the database at {place}: " in failing
    (connected,) = _lines_with(log, "database at start recovered")
    assert f"connected to the database at {place} after " in connected
    assert "Traceback" not in log


def test_a_worker_whose_http_port_is_taken_warns_once_runs_its_jobs_and_binds_once_it_is_free(
    db, database_url, probe_table
):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    # Tries to bind every 0.2 s (not every 30 s): many quiet tries within the test.
    proc = _probe_worker(database_url, port, "import lib.http.httpd", "lib.http.httpd.BIND_RETRY = 0.2")
    try:
        before = read_until(proc, "cannot listen on")
        job_id = insert(db, "probe", "probe.Sleep", {"seconds": 0})
        wait_for(lambda: count_jobs(db, f"id = {job_id} AND status = 'ok'") == 1, timeout=60)
        blocker.close()
        after = read_until(proc, "serving http on")
        assert _get(f"http://127.0.0.1:{port}/healthz").text == "ok\n"
        proc.terminate()
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        blocker.close()
    log = before + after + rest
    assert proc.returncode == 0, log
    (warning,) = _lines_with(log, "cannot listen on")
    assert f"WARNING jobs.http cannot listen on 127.0.0.1:{port}: Address already in use;" in warning
    assert "JOBS_HTTP_ADDR" in warning
    assert "Traceback" not in log and "http died" not in log
