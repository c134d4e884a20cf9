"""What an idle worker keeps in memory: a worker without SENTRY_DSN, API
tokens or JOBS_ADMIN_TOKEN never loads the libraries only those need
(sentry-sdk, requests and urllib3, Jinja2), nor the operator's commands. Nor,
with DATABASE_URL set and text logs, what only other settings or commands need
(the embedded server's code, the JSON log formatter, the registry check and its
SQL parser, the command line's parser when there are no arguments), nor
what gevent would load for work this worker never asks of it (psutil for a
memory limit, the thread pool for a name lookup)."""

import socket

from tests_support import run_python

# Run in a plain interpreter of its own (this one has them all loaded): the
# real worker.main with the real registry and schedule, stopped by SIGTERM.
RUN_THEN_LIST = """
from lib.greenlets.patch import patch_stdlib

patch_stdlib()  # as worker.py does

import os, signal, sys

import gevent

import worker
from queues import registry
from queues.schedule import SCHEDULE

gevent.spawn_later(3, os.kill, os.getpid(), signal.SIGTERM)
code = worker.main(registry, [], schedule=SCHEDULE)  # as `python worker.py`
heavy = (
    "sentry_sdk", "requests", "urllib3", "jinja2", "tqdm", "lib.http.admin", "lib.operate.commands",
    "lib.setup.embedded", "pythonjsonlogger", "lib.operate.registry_check", "pglast", "psutil", "gevent.threadpool", "uuid",
    "argparse", "lib.operate.cli", "importlib.metadata",
)
print("loaded:", sorted(name for name in heavy if name in sys.modules))
sys.exit(code)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_idle_worker_loads_no_library_it_has_no_use_for(db, database_url):
    off = {
        name: "" for name in ("SENTRY_DSN", "GITHUB_TOKEN", "SLACK_BOT_TOKEN", "ANTHROPIC_API_KEY", "APOLLO_API_KEY")
    }
    env = {
        **off,
        "DATABASE_URL": database_url,
        "JOBS_HTTP_ADDR": f"127.0.0.1:{_free_port()}",
        "JOBS_ADMIN_TOKEN": "",
        "LOG_FORMAT": "text",
    }
    done = run_python(RUN_THEN_LIST, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serving http on" in done.stderr  # the HTTP endpoints ran, without the admin page
    assert "loaded: []" in done.stdout, done.stdout + done.stderr[-3000:]


def test_a_worker_that_serves_no_metrics_keeps_no_prometheus_client(db, database_url):
    """With JOBS_HTTP_ADDR=off nobody can read the counters: prometheus-client
    (about 4 MB resident) stays unloaded, and the worker still runs its jobs."""
    script = RUN_THEN_LIST.replace(
        "gevent.spawn_later(3,",
        "from lib.insert import insert\n"
        "from lib.store.db import DB\n"
        "pool = DB(os.environ['DATABASE_URL'], size=1)\n"
        "insert(pool, 'caches', 'caches.Age')\n"
        "gevent.spawn_later(3,",
    ).replace(
        '"argparse", "lib.operate.cli",',
        '"argparse", "lib.operate.cli", "prometheus_client", "lib.http.metrics", "lib.http.httpd",',
    )
    env = {"DATABASE_URL": database_url, "JOBS_HTTP_ADDR": "off", "SENTRY_DSN": "", "LOG_FORMAT": "text"}
    done = run_python(script, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout, done.stdout + done.stderr[-3000:]
    # Its handler ran and its outcome was written, with nothing there to count it.
    (status,) = db.query_row("SELECT status FROM jobs WHERE queue = 'caches'")
    assert status.startswith(("ok", "skip")), (status, done.stderr[-3000:])


# A worker of its own queues, none calling an API, and no schedule: as a
# service that brings its own registry runs it (bench/apps/compare_ours_worker.py).
PLAIN_QUEUES_THEN_LIST = """
from lib.greenlets.patch import patch_stdlib

patch_stdlib()  # as worker.py does

import os, signal, sys

import gevent

import worker
from lib.run.queue import Queue

registry = [lambda db, q=q: Queue(q, {"plain.Noop": lambda job: "ok"}) for q in ("a", "b")]
gevent.spawn_later(3, os.kill, os.getpid(), signal.SIGTERM)
code = worker.main(registry, [])
heavy = (
    "lib.clients", "lib.run.api_queue", "hashlib", "asyncio", "sentry_sdk", "requests", "argparse", "importlib.metadata",
)
print("loaded:", sorted(name for name in heavy if name in sys.modules))
sys.exit(code)
"""


def test_a_worker_of_plain_queues_and_no_schedule_loads_no_api_client_nor_digest(db, database_url):
    """The API clients and hashlib (OpenSSL's digests, for the schedule's
    keys) cost a worker that runs neither about 1 MB resident."""
    env = {"DATABASE_URL": database_url, "JOBS_HTTP_ADDR": "off", "SENTRY_DSN": "", "LOG_FORMAT": "text"}
    done = run_python(PLAIN_QUEUES_THEN_LIST, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped" in done.stderr, done.stderr[-3000:]
    assert "loaded: []" in done.stdout, done.stdout + done.stderr[-3000:]
