"""The worker's HTTP endpoints: /healthz and /readyz, the server as a
supervised part, and JOBS_HTTP_ADDR read like the other settings."""

import os
import signal
import socket
import subprocess
import sys

import gevent
import pytest
import requests
from gevent.event import Event
from http_support import free_port, serving
from proxy import Proxy
from tests_support import ROOT, wait_for

import worker
from lib.greenlets.supervise import Supervisor
from lib.http import metrics
from lib.http.health import Health
from lib.http.httpd import HttpServer, make_app
from lib.insert import insert
from lib.run.queue import Queue
from lib.setup.parsers import SettingError, http_addr
from lib.setup.settings import Settings
from lib.store.db import DB
from lib.store.migrate import migrate
from lib.store.wakeups import Listener


def _app(db, **health):
    return make_app(Health(db, **health), metrics.registry())


def test_healthz_answers_while_the_loop_runs_and_says_stopping_after_sigterm(db):
    stop = Event()
    with serving(_app(db, stop=stop)) as base:
        answer = requests.get(f"{base}/healthz", timeout=5)
        assert (answer.status_code, answer.text) == (200, "ok\n")
        stop.set()
        answer = requests.get(f"{base}/healthz", timeout=5)
        assert answer.status_code == 503
        assert answer.text.startswith("stopping")
        assert requests.get(f"{base}/readyz", timeout=5).status_code == 503


def test_readyz_asks_the_database_and_the_listener(db, database_url):
    listener = Listener(database_url, wake=lambda queue: None, wake_all=lambda: None)
    stop = Event()
    with serving(_app(db, listener=listener)) as base:
        answer = requests.get(f"{base}/readyz", timeout=5)
        assert (answer.status_code, answer.text) == (
            503,
            "listener not connected: wakeups wait for the fallback poll\n",
        )
        listening = gevent.spawn(listener.run, stop)
        try:
            assert listener.listening.wait(10)
            answer = requests.get(f"{base}/readyz", timeout=5)
            assert (answer.status_code, answer.text) == (200, "ready\n")
        finally:
            stop.set()
            listening.kill()


def test_readyz_is_503_while_the_database_is_down_and_200_once_it_is_back(database_url):
    proxy = Proxy(database_url)
    db = DB.connect(proxy.url, size=2, connect_timeout=2)
    try:
        with serving(_app(db)) as base:
            assert requests.get(f"{base}/readyz", timeout=5).status_code == 200
            proxy.down()
            answer = requests.get(f"{base}/readyz", timeout=10)
            assert answer.status_code == 503
            assert answer.text.startswith("database unreachable: OperationalError"), answer.text
            assert answer.text.count("\n") == 1  # one line
            # The process itself is fine: liveness does not follow the database.
            assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
            proxy.up()
            wait_for(lambda: requests.get(f"{base}/readyz", timeout=5).status_code == 200, 20)
    finally:
        db.close()
        proxy.close()


def test_readyz_names_the_migrations_not_applied(empty_database):
    db = DB.connect(empty_database, size=2)
    try:
        with serving(_app(db)) as base:
            answer = requests.get(f"{base}/readyz", timeout=5)
            assert answer.status_code == 503
            assert answer.text.startswith('database refused the check: UndefinedTable: relation "schema_migrations"')
            migrate(db)
            assert requests.get(f"{base}/readyz", timeout=5).status_code == 200
            db.exec("DELETE FROM schema_migrations WHERE version = 11")
            answer = requests.get(f"{base}/readyz", timeout=5)
            assert (answer.status_code, answer.text) == (503, "migrations not applied: 011_workers\n")
    finally:
        db.close()


def test_unknown_paths_methods_and_the_admin_page_when_off(db):
    with serving(_app(db)) as base:
        assert requests.get(f"{base}/nope", timeout=5).status_code == 404
        assert requests.post(f"{base}/metrics", timeout=5).status_code == 405
        answer = requests.get(f"{base}/admin/", timeout=5, allow_redirects=False)
        assert answer.status_code == 404
        assert "JOBS_ADMIN_TOKEN" in answer.text
        assert requests.head(f"{base}/healthz", timeout=5).status_code == 200


def test_a_server_that_cannot_bind_warns_once_and_binds_once_the_port_is_free(db, caplog):
    """The port is taken when the worker starts (an old process lingering,
    another worker on the host): one warning, quiet tries (no death for the
    supervisor to restart and log), and once the port is free the endpoints
    answer without a worker restart."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    server = HttpServer(("127.0.0.1", port), _app(db), bind_retry=0.05)
    stop = Event()
    supervisor = Supervisor(stop, first_delay=0.05, max_delay=0.2)
    part = supervisor.spawn("http", server.serve)
    try:
        wait_for(lambda: any("cannot listen on" in r.getMessage() for r in caplog.records), 10)
        assert not server.serving.is_set()
        blocker.close()
        assert server.serving.wait(10)
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).text == "ok\n"
        assert supervisor.restarts["http"] == 0
        assert [r.getMessage() for r in caplog.records if "cannot listen on" in r.getMessage()] == [
            f"cannot listen on 127.0.0.1:{port}: Address already in use; the worker runs without /healthz,"
            " /readyz, /metrics and the admin page, and tries again every 0.05s (each worker on a host needs"
            " its own JOBS_HTTP_ADDR, or JOBS_HTTP_ADDR=off)"
        ]
    finally:
        stop.set()
        part.kill()
        blocker.close()


def test_a_handler_that_raises_is_a_500_and_the_server_goes_on(db, sentry_events):
    class Broken:
        def ready(self):
            raise RuntimeError("a bug in a page")

        def alive(self):
            return True, "ok"

    with serving(make_app(Broken(), metrics.registry())) as base:  # type: ignore[arg-type]
        answer = requests.get(f"{base}/readyz", timeout=5)
        assert (answer.status_code, answer.text) == (500, "internal error\n")
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    assert [e["exception"]["values"][-1]["value"] for e in sentry_events] == ["a bug in a page"]


def test_worker_run_serves_until_the_end_of_the_shutdown_window(db):
    """Started by worker.run under its supervisor: /readyz once the listener
    is up; after SIGTERM (stop) it says stopping while a job still runs, and
    the port is closed once the worker has stopped."""
    release = Event()

    def slow(job):
        release.wait(30)
        return "ok"

    port = free_port()
    stop = Event()
    running = gevent.spawn(
        worker.run,
        db,
        [lambda db_: Queue("web", {"web.Slow": slow}, poll_interval=0.2)],
        Settings(http_addr=("127.0.0.1", port), shutdown_window=30),
        stop=stop,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _status(f"{base}/readyz") == 200, 20)
        metrics_text = requests.get(f"{base}/metrics", timeout=5).text
        assert 'jobs_part_restarts_total{part="http"} 0.0' in metrics_text
        assert 'jobs_queue_pending{queue="web"} 0.0' in metrics_text  # a queue of this worker, with no rows yet
        insert(db, "web", "web.Slow", {})
        wait_for(lambda: db.query_row("SELECT status FROM jobs")[0] == "started", 20)
        stop.set()
        answer = requests.get(f"{base}/healthz", timeout=5)
        assert answer.status_code == 503 and answer.text.startswith("stopping")
        release.set()
        assert running.get(timeout=30) == 0
        assert db.query_row("SELECT status FROM jobs")[0] == "ok"
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{base}/healthz", timeout=5)
    finally:
        release.set()
        stop.set()
        running.kill()


def _status(url: str) -> int | None:
    try:
        return requests.get(url, timeout=5).status_code
    except requests.ConnectionError:
        return None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, ("127.0.0.1", 9400)),
        ("", ("127.0.0.1", 9400)),
        ("off", None),
        ("OFF", None),
        ("0.0.0.0:8080", ("0.0.0.0", 8080)),
        ("[::1]:9400", ("::1", 9400)),
        ("localhost:9401", ("localhost", 9401)),
    ],
)
def test_http_addr_values(text, expected):
    assert http_addr(text) == expected


@pytest.mark.parametrize("text", ["9400", ":9400", "::1:9400", "host:0", "host:65536", "host:http", "a b:1", "host:"])
def test_a_bad_http_addr_is_a_setting_error(text):
    with pytest.raises(SettingError, match="JOBS_HTTP_ADDR must be host:port"):
        Settings.from_env({"JOBS_HTTP_ADDR": text})


def test_a_short_admin_token_is_refused_without_being_shown():
    with pytest.raises(SettingError, match="at least 16") as refused:
        Settings.from_env({"JOBS_ADMIN_TOKEN": "hunter2"})
    assert "hunter2" not in str(refused.value)
    settings = Settings.from_env({"JOBS_ADMIN_TOKEN": "s3cret-" + "x" * 20})
    assert settings.admin_token == "s3cret-" + "x" * 20
    assert "s3cret" not in repr(settings)


def test_the_worker_refuses_a_bad_http_addr_at_start_with_one_line():
    done = subprocess.run(
        [sys.executable, "worker.py", "migrate"],
        cwd=ROOT,
        env={**os.environ, "JOBS_HTTP_ADDR": "localhost"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == "worker: JOBS_HTTP_ADDR must be host:port (or [v6]:port, or off), got 'localhost'\n"


def test_the_worker_process_serves_at_jobs_http_addr(database_url):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "apps" / "probe_worker.py")],
        env={**os.environ, "DATABASE_URL": database_url, "JOBS_HTTP_ADDR": f"127.0.0.1:{port}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: _status(f"http://127.0.0.1:{port}/readyz") == 200, 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        output = proc.communicate()[0]
    assert f"serving http on 127.0.0.1:{port}" in output


def _wait_ready(port: int, timeout: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "deploy/wait_ready.py", "--timeout", timeout],
        cwd=ROOT,
        env={**os.environ, "JOBS_HTTP_ADDR": f"127.0.0.1:{port}"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_units_start_check_waits_for_readyz_and_says_why_not(database_url):
    """deploy/wait_ready.py, the systemd unit's ExecStartPost."""
    proxy = Proxy(database_url)
    db = DB.connect(proxy.url, size=2, connect_timeout=2)
    try:
        with serving(_app(db)) as base:
            port = int(base.rsplit(":", 1)[1])
            done = _wait_ready(port, "10")
            assert (done.returncode, done.stdout) == (0, "wait_ready: ready\n")
            proxy.down()
            done = _wait_ready(port, "1")
            assert done.returncode == 1
            assert done.stderr.startswith("wait_ready: not ready after 1s: database unreachable: OperationalError")
    finally:
        db.close()
        proxy.close()
    done = _wait_ready(free_port(), "0")
    assert done.returncode == 1 and "no answer from http://127.0.0.1:" in done.stderr
