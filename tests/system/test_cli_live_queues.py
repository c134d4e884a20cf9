"""The command line knows the queues and job names live workers run, not only
this checkout's registry: a worker of another release or another entry point
(tests/apps/elsewhere_worker.py, whose queue "elsewhere" queues/ does not
have) is listed, paused, resumed and given jobs; a paused queue can always be
resumed; and a name nothing knows is one line and exit code 2, with the
nearest known names, not "0 jobs"."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from tests_support import ROOT, paused, read_until, wait_for

import worker
from lib.background import worker_registry
from lib.insert import insert
from lib.operate.queue_state import pause
from queues import REGISTRY

ELSEWHERE = ROOT / "tests" / "apps" / "elsewhere_worker.py"


def run_cli(database_url: str, *argv: str) -> subprocess.CompletedProcess:
    """`python worker.py ARGV` from this checkout, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "worker.py", *argv],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def elsewhere(db, database_url) -> Iterator[subprocess.Popen]:
    """A real worker process running queue "elsewhere", once it has registered."""
    proc = subprocess.Popen(
        [sys.executable, str(ELSEWHERE)],
        env={**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "INFO"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        read_until(proc, "running 1 queues: elsewhere")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture
def cli(database_url, monkeypatch, capsys):
    """cli(*argv) -> (exit code, stdout, stderr), through worker.main with this checkout's registry."""
    monkeypatch.setenv("DATABASE_URL", database_url)

    def run(*argv: str) -> tuple[int, str, str]:
        code = worker.main(REGISTRY, list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_status_lists_a_queue_only_a_live_worker_runs(elsewhere, database_url):
    done = run_cli(database_url, "status", "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert "elsewhere" in [q["queue"] for q in got["queues"]]
    assert [w["queues"] for w in got["workers"]] == [["elsewhere"]]
    table = run_cli(database_url, "status").stdout
    assert any(line.split()[:2] == ["elsewhere", "0"] for line in table.splitlines()), table


def test_pause_and_resume_a_queue_only_a_live_worker_runs(elsewhere, db, database_url):
    done = run_cli(database_url, "pause", "elsewhere", "--reason", "vendor incident")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "paused elsewhere until resumed: vendor incident\n"
    assert [(q, r) for q, r, _ in paused(db)] == [("elsewhere", "vendor incident")]
    read_until(elsewhere, "queue=elsewhere paused until resumed: vendor incident")  # the worker heard it
    done = run_cli(database_url, "resume", "elsewhere")
    assert (done.returncode, done.stdout) == (0, "resumed elsewhere\n"), done.stderr
    assert paused(db) == []
    read_until(elsewhere, "queue=elsewhere resumed")


def test_enqueue_of_a_job_only_a_live_worker_handles_runs_there(elsewhere, db, database_url):
    done = run_cli(database_url, "enqueue", "elsewhere", "elsewhere.Echo", '{"text": "hi"}')
    assert done.returncode == 0, done.stderr
    [(job_id, callsite)] = db.query("SELECT id, callsite FROM jobs")
    assert done.stdout == f"enqueued job {job_id}: queue=elsewhere job=elsewhere.Echo\n"
    assert callsite == "cli"
    wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == ("ok",))
    # A name the live worker does not handle in its queue is refused, with the one it does.
    done = run_cli(database_url, "enqueue", "elsewhere", "elsewhere.Ecko")
    assert done.returncode == 2
    assert done.stderr == (
        "enqueue: no worker runs job elsewhere.Ecko on queue elsewhere:"
        " no job name 'elsewhere.Ecko' is handled in queue elsewhere (nearest: elsewhere.Echo)\n"
    )


def test_a_paused_queue_that_left_the_registry_can_be_resumed(db, cli):
    """No registry has "retired" and no worker runs it, but its pause is
    still there, holding back its rows should it come back: resume ends it."""
    pause(db, "retired", "moved to the new cluster")
    assert cli("resume", "retired") == (0, "resumed retired\n", "")
    assert paused(db) == []
    # Resumed, it is a name nothing knows any more.
    code, _, err = cli("resume", "retired")
    assert code == 2 and err.startswith("resume: no queue 'retired' is registered, run by a live worker or paused")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["failed", "--queue", "cachez"],
            "failed: no queue 'cachez' is registered, run by a live worker or named by a failed job (nearest: caches)",
        ),
        (
            ["failed", "--name", "caches.Agee"],
            "failed: no job name 'caches.Agee' is handled by a registered queue or a live worker,"
            " or named by a failed job (nearest: caches.Age)",
        ),
        (
            ["redrive", "--name", "caches.Agee"],
            "redrive: no job name 'caches.Agee' is handled by a registered queue or a live worker,"
            " or named by a failed job (nearest: caches.Age)",
        ),
        (
            ["retry", "--queue", "slak", "--dry-run"],
            "retry: no queue 'slak' is registered, run by a live worker or named by a failed job (nearest: slack)",
        ),
        (
            ["pause", "githb", "--reason", "typo"],
            "pause: no queue 'githb' is registered, run by a live worker or paused (nearest: github)",
        ),
        (
            ["enqueue", "cachez", "caches.Age"],
            "enqueue: no worker runs job caches.Age on queue cachez:"
            " no queue 'cachez' is registered or run by a live worker (nearest: caches)",
        ),
    ],
)
def test_an_unknown_name_is_one_line_with_the_nearest_and_exit_2(db, cli, argv, line):
    insert(db, "caches", "caches.Age")
    assert cli(*argv) == (2, "", line + "\n")
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'pending'") == (1,)  # nothing redriven
    assert paused(db) == []


def test_failed_and_redrive_know_the_names_of_failed_jobs(db, cli):
    """A queue that left the registry still has its failures to look at."""
    job_id = insert(db, "gone", "gone.Job")
    db.exec("UPDATE jobs SET status = 'err: boom', attempts = 1, finished_at = now() WHERE id = %s", (job_id,))
    code, out, err = cli("failed", "--queue", "gone", "--json")
    assert code == 0, err
    assert [row["id"] for row in json.loads(out)] == [job_id]
    assert cli("redrive", "--name", "gone.Job") == (0, f"redrove 1 jobs: {job_id}\n", "")


def test_only_a_live_worker_makes_its_queue_and_names_known(db, cli):
    """Alive as the status command reads it (lib/operate/overview.py): seen within
    three of its leases. A worker row older than that names nothing."""
    worker_registry.register(db, "far-1:7:abc", ["faraway"], 30.0, [("faraway", ["faraway.Job"])])
    code, out, err = cli("enqueue", "faraway", "faraway.Job")
    assert code == 0, err
    assert out.startswith("enqueued job ")
    db.exec("UPDATE workers SET last_seen = now() - interval '91 seconds'")
    code, _, err = cli("enqueue", "faraway", "faraway.Job")
    assert code == 2
    assert "no queue 'faraway' is registered or run by a live worker" in err
