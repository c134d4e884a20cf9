"""OpenTelemetry across two processes: a web process enqueues inside its
request span and stores the trace context with each job; a worker process,
tracing with the SDK's in-memory exporter, runs each job in a consumer span
linked (not parented) to that request, with the job's queue, name, id,
attempt and outcome, an error status for an `err`, and the handler's own
spans as its children. Without OpenTelemetry loaded nothing is imported or
stored."""

import json
import signal
import subprocess
import sys

from tests_support import ROOT, wait_for

APPS = ROOT / "tests" / "apps"


def spans_of_a_run(db, database_url, tmp_path, names: list[str]) -> tuple[dict, list[dict]]:
    """What the web process printed, and the worker's spans once it ran every job and stopped."""
    spans_file = tmp_path / "spans.jsonl"
    log_path = tmp_path / "worker.log"
    env = {"PATH": "/usr/bin:/bin", "JOBS_HTTP_ADDR": "off", "DATABASE_URL": database_url}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(APPS / "traced_worker.py")],
            env={**env, "SPANS_FILE": str(spans_file)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "listening for wakeups" in log_path.read_text(), 30)
        web = subprocess.run(
            [sys.executable, str(APPS / "traced_enqueue.py"), *names],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        enqueued = json.loads(web.stdout)
        wait_for(lambda: db.query_row("SELECT count(*) FROM jobs WHERE status IN ('pending', 'started')") == (0,), 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, log_path.read_text()[-3000:]
    return enqueued, [json.loads(line) for line in spans_file.read_text().splitlines()]


def test_each_run_is_a_consumer_span_linked_to_the_request_that_enqueued_it(db, database_url, tmp_path):
    web, spans = spans_of_a_run(db, database_url, tmp_path, ["traced.Fine", "traced.Broken"])
    fine, broken, many = web["traced"]
    runs = {int(s["attributes"]["messaging.message.id"]): s for s in spans if s["kind"] == "CONSUMER"}
    assert set(runs) == {fine, broken, many, web["untraced"]}
    request = [web["trace_id"], web["span_id"]]
    for job_id in (fine, broken, many):
        run = runs[job_id]
        assert run["links"] == [request], run
        # A link, not a parent: the run is a trace of its own.
        assert run["parent"] is None and run["trace_id"] != web["trace_id"]
        assert run["name"] == "process traced"
    assert runs[web["untraced"]]["links"] == []

    assert runs[fine]["attributes"] == {
        "messaging.system": "jobs",
        "messaging.operation.type": "process",
        "messaging.destination.name": "traced",
        "messaging.message.id": str(fine),
        "jobs.name": "traced.Fine",
        "jobs.attempt": 1,
        "jobs.outcome": "ok",
    }
    assert runs[fine]["status"] == "UNSET"
    assert runs[broken]["attributes"]["jobs.outcome"] == "err: ValueError: broken 1"
    assert runs[broken]["status"] == "ERROR"
    assert runs[broken]["description"] == "err: ValueError: broken 1"
    assert runs[broken]["events"] == ["exception"]

    # The handler's own span is a child of its run's.
    (work,) = [s for s in spans if s["name"] == "handler work" and s["trace_id"] == runs[fine]["trace_id"]]
    assert work["parent"] == runs[fine]["span_id"]

    # The row holds the W3C context; the job enqueued outside the span, none.
    (stored,) = db.query_row("SELECT trace FROM jobs WHERE id = %s", (fine,))
    assert list(stored) == ["traceparent"]
    assert stored["traceparent"].startswith(f"00-{web['trace_id']}-{web['span_id']}-")
    assert db.query_row("SELECT trace FROM jobs WHERE id = %s", (web["untraced"],)) == (None,)


def test_a_followup_stores_the_run_that_added_it_and_its_run_links_there(db, database_url, tmp_path):
    web, spans = spans_of_a_run(db, database_url, tmp_path, ["traced.Then"])
    parent = web["traced"][0]
    (followup,) = db.query_row("SELECT id FROM jobs WHERE args = %s", ('{"n": 1000}',))
    runs = {int(s["attributes"]["messaging.message.id"]): s for s in spans if s["kind"] == "CONSUMER"}
    assert runs[parent]["links"] == [[web["trace_id"], web["span_id"]]]
    # The follow-up's row holds the context of the run that added it, and its run links to that run.
    (stored,) = db.query_row("SELECT trace FROM jobs WHERE id = %s", (followup,))
    assert stored["traceparent"].startswith(f"00-{runs[parent]['trace_id']}-{runs[parent]['span_id']}-")
    assert runs[followup]["links"] == [[runs[parent]["trace_id"], runs[parent]["span_id"]]]
    assert runs[followup]["attributes"]["jobs.outcome"] == "ok"


def test_without_opentelemetry_loaded_insert_and_the_worker_import_none_of_it(db, database_url):
    """A program that never loads OpenTelemetry (here it is installed, so
    this is what its absence would look like too) enqueues and runs with
    none of it imported, and the row stores no context."""
    program = (
        "import sys, psycopg2\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "import worker\n"
        "from lib.insert import insert\n"
        "from lib.run import traces\n"
        "conn = psycopg2.connect(sys.argv[1])\n"
        "with conn, conn.cursor() as cur:\n"
        "    print(insert(cur, 'plain', 'plain.Job'))\n"
        "assert traces.tracer() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program, database_url, str(ROOT)], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[1] == "[]"
    assert db.query_row("SELECT trace FROM jobs WHERE id = %s", (int(out[0]),)) == (None,)
