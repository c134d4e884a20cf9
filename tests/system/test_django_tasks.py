"""Django's tasks on the jobs table, end to end, on each of Django's two
PostgreSQL drivers: the test site (tests/apps/django_site) enqueues from a
view inside its transaction, and a worker (tests/apps/django_worker.py) runs
the tasks. Django runs in subprocesses only: this process is gevent's, and
configures no Django settings."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from tests_support import wait_for

from lib.store.db import DB

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "apps" / "django_site"
WORKER = ROOT / "tests" / "apps" / "django_worker.py"

# What the site does, in one process: refusals first, then a request that
# rolls back, one that commits, and two tasks enqueued outside any request.
SCENARIO = """
import json

import django

django.setup()
from django.db import connection
from django.test import Client

from shop import tasks

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


def outcome(call):
    try:
        call()
    except Exception as exc:
        # The backport's name for Django 6's InvalidTask.
        kind = type(exc).__name__.replace("InvalidTaskError", "InvalidTask")
        return f"{kind}: {exc}"
    return "accepted"


def gone():
    pass


gone.__module__ = "shop.gone"
out = {"driver": connection.Database.__name__}
out["refused"] = [
    outcome(lambda: task(tasks.label).enqueue(1)),
    outcome(lambda: task(gone).enqueue()),
    outcome(lambda: tasks.send_receipt.enqueue(object())),
    outcome(lambda: tasks.send_receipt.enqueue(float("nan"))),
    outcome(lambda: tasks.send_receipt.get_result("999999")),
    outcome(lambda: tasks.send_receipt.get_result("x1")),
]
client = Client(raise_request_exception=False)
out["rolled_back"] = client.post("/orders/", {"item": "rolled back", "fail": "1"}).status_code
out["committed"] = client.post("/orders/", {"item": "tea"}).json()
out["raised"] = tasks.reserve.enqueue("tea", count=3).id
out["context"] = tasks.attempt_of.enqueue("x").id
print(json.dumps(out))
"""


def site_env(database_url: str, driver: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_DB_DRIVER": driver,
        "DJANGO_SETTINGS_MODULE": "djsite.settings",
        "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT)]),
        "LOG_LEVEL": "INFO",
    }


def run_site(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=SITE, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def site_tables(database_url: str) -> Iterator[None]:
    """The site's tables in the run's database, for this module alone."""
    run_site(site_env(database_url, "psycopg"), "manage.py", "migrate", "--no-input")
    yield
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute("DROP TABLE shop_receipt, shop_order, django_migrations")
    conn.close()


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_tasks_enqueued_in_a_request_run_on_the_worker(db: DB, database_url: str, site_tables: None, driver: str):
    db.exec("TRUNCATE shop_receipt, shop_order")
    env = site_env(database_url, driver)
    worker = subprocess.Popen(
        [sys.executable, str(WORKER)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out = json.loads(run_site(env, "-c", SCENARIO))
        assert out["driver"] == driver
        assert [r.removesuffix(": nan") for r in out["refused"]] == [
            "InvalidTask: task shop.tasks.label: the worker could not import it: shop.tasks.label names a function,"
            " not a task; declare tasks with @task on a module-level function and enqueue that",
            "InvalidTask: task shop.gone.gone: the worker could not import it (No module named 'shop.gone')",
            "TypeError: task shop.tasks.send_receipt: its args cannot be stored as JSON:"
            " Unsupported type: <class 'object'>",
            # Python 3.13's message ends ": nan", 3.11's does not.
            "InvalidJob: task shop.tasks.send_receipt: args are not JSON-serialisable: Out of range float values"
            " are not JSON compliant",
            "TaskResultDoesNotExist: 999999",
            "TaskResultDoesNotExist: x1",
        ]
        assert out["rolled_back"] == 500
        ids = [out["committed"]["task"], out["raised"], out["context"]]
        # Nothing of the refusals or of the rolled-back request was written.
        assert sorted(i for (i,) in db.query("SELECT id::text FROM jobs")) == sorted(ids)
        assert db.query("SELECT item FROM shop_order") == [("tea",)]

        wait_for(lambda: db.query_row("SELECT count(*) FROM jobs WHERE status NOT IN ('pending', 'started')")[0] == 3)
        results = json.loads(run_site(env, "manage.py", "task_result", *ids))
    finally:
        worker.send_signal(signal.SIGTERM)
        log = worker.communicate(timeout=40)[0]
    assert worker.returncode == 0, log
    assert "listening for wakeups" in log

    done, raised, context = results
    order = out["committed"]["order"]
    assert (done["status"], done["return_value"]) == (
        "SUCCESSFUL",
        {"receipt": f"order {order}: tea", "driver": driver},
    )
    assert (done["args"], done["attempts"], done["errors"]) == ([order], 1, [])
    assert db.query("SELECT order_id FROM shop_receipt") == [(order,)]

    assert (raised["status"], raised["args"], raised["kwargs"], raised["attempts"]) == (
        "FAILED",
        ["tea"],
        {"count": 3},
        1,
    )
    [error] = raised["errors"]
    assert error["exception_class_path"] == "shop.tasks.OutOfStock"
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert error["traceback"].endswith(
        'raise OutOfStock(f"no {item} left (wanted {count})")\nshop.tasks.OutOfStock: no tea left (wanted 3)\n'
    )

    assert (context["status"], context["return_value"]) == (
        "SUCCESSFUL",
        {"tag": "x", "attempt": 1, "id": context["id"]},
    )
    assert len({w for r in results for w in r["worker_ids"]}) == 1
