"""A newcomer's first hour, as the README tells it.

In a copy of the project, the code blocks under "Write a queue" and "Enqueue"
are read from README.md itself (by their place under those headings, so the
README cannot drift from what works), written where the README says, and run:
the worker as `python worker.py`, the enqueue as a plain program in a
virtualenv of its own, into which the README's install command put `lib`.
Following the README is idempotent here: a checkout where it was already
followed gets the same queue, registered once.
"""

import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import venv
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests_support import make_poller

from lib.background.clock import Scheduled, every
from lib.insert import insert
from lib.operate.registry_check import schedule_args_problems
from lib.operate.setup_check import defined, unconnected
from lib.setup import embedded
from lib.setup.error_reports import MAX_TRACEBACK_BYTES
from queues import REGISTRY
from tests.tests_support import wait_for

ROOT = Path(__file__).resolve().parents[2]
# Not part of the project a newcomer copies: their own data, environment, history and builds.
# Every virtualenv (.venv, CI's .venv313, the benchmarks' .venv-peers): a
# person's checkout has none of them, and each is hundreds of MB to copy.
NOT_COPIED = shutil.ignore_patterns(".venv*", ".pgdata", ".git", "__pycache__", ".ci", "build", "*.egg-info")


def readme_blocks(heading: str, lang: str = "python") -> list[str]:
    """The fenced blocks of one language under a "## heading" of README.md, in order."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no section {heading!r}"
    return re.findall(rf"^```{lang}\n(.*?)^```", match.group(1), re.MULTILINE | re.DOTALL)


# The README's queue, as its "Write a queue" block names it.
QUEUE = "hello"
# Wheels fetched once for the virtualenvs the tests make.
PIP_CACHE = Path(os.environ.get("PIP_CACHE_DIR") or Path(tempfile.gettempdir()) / "jobs-test-pip-cache")


def _without_tokens() -> dict[str, str]:
    # The API queues stay off: the README's queue is the one under test.
    return {k: v for k, v in os.environ.items() if not k.endswith(("_TOKEN", "_API_KEY"))}


class Worker:
    """`python worker.py` in the copy; its output gathered by a thread so a
    test can wait for a line."""

    def __init__(self, project: Path, database_url: str) -> None:
        self.lines: list[str] = []
        env = {**_without_tokens(), "DATABASE_URL": database_url, "LOG_LEVEL": "INFO", "SENTRY_DSN": ""}
        self.proc = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, timeout: float = 30.0) -> None:
        try:
            wait_for(lambda: text in self.output or self.proc.poll() is not None, timeout)
        except AssertionError:
            raise AssertionError(f"worker never logged {text!r}:\n{self.output}") from None
        assert text in self.output, self.output

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def follow_readme(copy: Path) -> None:
    """Do what "Write a queue" says, in copy: write the queue's file, register
    it, add its schedule entry. What is already there is left as it is, as a
    person who followed the README before would leave it."""
    queue_code, schedule_entry = readme_blocks("Write a queue")[:2]
    # The block names its own file on its first line.
    first = queue_code.splitlines()[0]
    assert first.startswith("# "), first
    target = copy / first[2:].strip()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(queue_code)
    # "add `hello` to the line `from queues import ...` and `hello.make_worker` to `REGISTRY`"
    registry = copy / "queues" / "__init__.py"
    text = registry.read_text()
    if not re.search(rf"^from queues import .*\b{QUEUE}\b", text, re.MULTILINE):
        text, imported = re.subn(r"^(from queues import .*)$", rf"\1, {QUEUE}", text, count=1, flags=re.MULTILINE)
        assert imported == 1, text
    if f"{QUEUE}.make_worker" not in text:
        text, added = re.subn(
            r"^(REGISTRY\b.*= \[)$", rf"\1\n    {QUEUE}.make_worker,", text, count=1, flags=re.MULTILINE
        )
        assert added == 1, text
    registry.write_text(text)
    # The entry goes into SCHEDULE in queues/schedule.py.
    schedule = copy / "queues" / "schedule.py"
    text = schedule.read_text()
    if schedule_entry.strip() not in text:
        text, added = re.subn(
            r"^(SCHEDULE\b.*= \[)$",
            lambda m: f"{m[1]}\n    {schedule_entry.strip()},",
            text,
            count=1,
            flags=re.MULTILINE,
        )
        assert added == 1
    schedule.write_text(text)


def copy_project(into: Path, source: Path = ROOT) -> Path:
    """A copy of the checkout as a person has it, with the README followed."""
    copy = into / "jobs"
    shutil.copytree(source, copy, ignore=NOT_COPIED)
    follow_readme(copy)
    return copy


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path)


def make_app_venv(where: Path) -> Path:
    """A fresh virtualenv of an application (no system site-packages) with
    the driver lib.setup.plain_connection uses; returns its python."""
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    pin = re.search(r"^psycopg2-binary==\S+", (ROOT / "requirements.txt").read_text(), re.MULTILINE)
    assert pin, "requirements.txt pins psycopg2-binary"
    pip(python, "install", pin[0])
    return python


def pip(python: Path, *args: str) -> None:
    """pip of that python, quiet, with the tests' wheel cache."""
    done = subprocess.run(
        [str(python), "-m", "pip", "-q", "--disable-pip-version-check", *args],
        env={**os.environ, "PIP_CACHE_DIR": str(PIP_CACHE)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def install_as_readme(python: Path, project: Path) -> None:
    """The README's one install command (under "Enqueue"), with its paths
    put in: the app's virtualenv's pip, and the checkout."""
    [command] = [
        line for block in readme_blocks("Enqueue", "sh") for line in block.splitlines() if "pip install" in line
    ]
    argv = shlex.split(command.split("#")[0])
    assert argv[0] == "/path/to/your/app/.venv/bin/pip" and argv[1] == "install", argv
    pip(python, *[str(project) if a == "/path/to/this/checkout" else a for a in argv[1:]])


def run_in(project: Path, database_url: str, *argv: str, cwd: Path | None = None, env: dict | None = None):
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd or project,
        env={**os.environ, "DATABASE_URL": database_url, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def enqueue_as_readme(app_python: Path, database_url: str, tmp_path: Path) -> int:
    """The Enqueue block as its own program outside the checkout, run by the
    application's own python (the README's install command gave it lib, no
    sys.path edits); checked never to load gevent."""
    program = tmp_path / "app" / "greet.py"
    program.parent.mkdir(exist_ok=True)
    program.write_text(readme_blocks("Enqueue")[0])
    check = (
        f"import runpy, sys; runpy.run_path({str(program)!r}, run_name='__main__'); assert 'gevent' not in sys.modules"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"DATABASE_URL": database_url}
    done = subprocess.run(
        [str(app_python), "-c", check], cwd=program.parent, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = re.search(r"enqueued job (\d+)", done.stdout)
    assert found, done.stdout
    return int(found[1])


def status_of(db, job_id: int) -> str:
    return db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0]


def finished(db, job_id: int, timeout: float = 30) -> str:
    """The job's status once it is terminal (not pending or started)."""
    return wait_for(lambda: (s := status_of(db, job_id)) not in ("pending", "started") and s, timeout)


def fire_schedule(project: Path, database_url: str) -> None:
    """One tick of the project's clock at 00:00 UTC (every cadence matches
    midnight), from the copy's own schedule: no minute-long wait."""
    code = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import os\n"
        "from datetime import UTC, datetime\n"
        "from lib.background.clock import Clock\n"
        "from lib.store.db import DB\n"
        "from queues.schedule import SCHEDULE\n"
        "db = DB.connect(os.environ['DATABASE_URL'], size=1)\n"
        f"print(Clock(db, [e for e in SCHEDULE if e.queue == {QUEUE!r}]).tick(datetime(2026, 1, 1, tzinfo=UTC)))\n"
    )
    done = run_in(project, database_url, "-c", code)
    assert done.returncode == 0, done.stderr


def test_the_readme_example_queue_runs_enqueued_and_scheduled_jobs(db, database_url, project, tmp_path):
    db.exec("DROP TABLE IF EXISTS greetings")  # the README program's own table, from an earlier test
    app_python = make_app_venv(tmp_path / "app-venv")
    install_as_readme(app_python, project)
    worker = Worker(project, database_url)
    try:
        worker.wait_for_line("queues: ")
        assert QUEUE in worker.output.split("queues: ")[1].splitlines()[0].split(", "), worker.output
        job_id = enqueue_as_readme(app_python, database_url, tmp_path)
        assert finished(db, job_id) == "ok: greeted Ada"
        # The same transaction wrote the program's own row.
        assert db.query_row("SELECT count(*) FROM greetings WHERE name = 'Ada'")[0] == 1

        fire_schedule(project, database_url)
        scheduled = wait_for(
            lambda: db.query_row(
                "SELECT id, status, args FROM jobs WHERE queue = %s AND callsite LIKE 'clock:%%'", (QUEUE,)
            )
        )
        # The handler read the entry's args.
        assert finished(db, scheduled[0]) == "ok: greeted the team"

        # Pause and resume ("Operate"): nothing runs while paused, and the
        # resume wakes the queue at once, not at its fallback poll (120 s).
        done = run_in(project, database_url, "worker.py", "pause", QUEUE, "--reason", "trying it out")
        assert done.returncode == 0, done.stderr
        worker.wait_for_line(f"queue={QUEUE} paused until resumed: trying it out")
        held = enqueue_as_readme(app_python, database_url, tmp_path)
        time.sleep(1.5)  # unpaused, it would have run within milliseconds of its commit
        assert status_of(db, held) == "pending"
        done = run_in(project, database_url, "worker.py", "resume", QUEUE)
        assert done.returncode == 0, done.stderr
        (resumed_at,) = db.query_row("SELECT now()")
        assert finished(db, held, timeout=10) == "ok: greeted Ada"
        (started_at,) = db.query_row("SELECT started_at FROM jobs WHERE id = %s", (held,))
        assert started_at - resumed_at < timedelta(seconds=1)
        worker.wait_for_line(f"queue={QUEUE} resumed")

        # A handler that raises (an app's enqueue without the name): "Find a
        # failure" lists it, and the traceback is kept with the row for
        # `show`, and logged, Sentry being off.
        broken = insert(db, QUEUE, f"{QUEUE}.Greet", {})
        assert finished(db, broken) == "err: ArgsError: GreetArgs: missing field 'name'"
        failed = run_in(project, database_url, "worker.py", "failed", "--queue", QUEUE)
        assert failed.returncode == 0, failed.stderr
        assert re.search(rf"^{broken}\s+{QUEUE}\s+{QUEUE}\.Greet\s", failed.stdout, re.MULTILINE), failed.stdout
        shown = run_in(project, database_url, "worker.py", "show", str(broken))
        assert shown.returncode == 0, shown.stderr
        assert "last traceback:\nTraceback (most recent call last):" in shown.stdout, shown.stdout
        assert f'queues/{QUEUE}/__init__.py", line' in shown.stdout and "in greet" in shown.stdout
        worker.wait_for_line(f"ERROR jobs queue={QUEUE} job={QUEUE}.Greet id={broken} raised err: ")
        # redrive gives it another attempt, which the worker runs at once.
        done = run_in(project, database_url, "worker.py", "redrive", "--id", str(broken))
        assert done.stdout.strip() == f"redrove 1 jobs: {broken}", (done.stdout, done.stderr)
        assert wait_for(lambda: db.query_row("SELECT attempts FROM jobs WHERE id = %s", (broken,))[0] == 2, 10)
        assert finished(db, broken).startswith("err: ")
    finally:
        worker.stop()


def test_following_the_readme_again_registers_its_queue_once(tmp_path, database_url):
    """A checkout where someone already followed "Write a queue" (the
    first-hour test copies the checkout it runs in) follows it again with
    the same result, and check passes: no queue registered twice."""
    followed = copy_project(tmp_path / "first")
    again = copy_project(tmp_path / "again", source=followed)
    for path in ("queues/__init__.py", "queues/schedule.py", f"queues/{QUEUE}/__init__.py"):
        assert (again / path).read_text() == (followed / path).read_text(), path
    assert (again / "queues" / "__init__.py").read_text().count(f"{QUEUE}.make_worker") == 1
    done = run_in(again, database_url, "worker.py", "check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_plain_install_brings_lib_and_its_sql_files_without_gevent(db, database_url, project, tmp_path):
    """`pip install CHECKOUT` (no -e) into an application's fresh virtualenv:
    lib.insert imports from the virtualenv's own copy, with the sql/ files it
    reads, once the checkout is gone; it installed nothing else (no gevent),
    and the Django backend and its query came with it."""
    app_python = make_app_venv(tmp_path / "app-venv")
    pip(app_python, "install", str(project))
    shutil.rmtree(project)
    code = (
        "import importlib.metadata, importlib.util, sys\n"
        "import psycopg2\n"
        "import lib.insert\n"
        "from lib.insert import insert\n"
        "from lib.store.sql import Q\n"
        "assert lib.insert.__file__.startswith(sys.prefix), lib.insert.__file__\n"
        "assert importlib.util.find_spec('gevent') is None, 'gevent is installed'\n"
        "assert importlib.metadata.requires('jobs') is None, importlib.metadata.requires('jobs')\n"
        "assert importlib.util.find_spec('lib.adapters.django_tasks') is not None\n"
        "assert Q.job_task_result\n"
        "conn = psycopg2.connect(sys.argv[1])\n"
        "with conn, conn.cursor() as cur:\n"
        f"    print(insert(cur, {QUEUE!r}, {QUEUE + '.Greet'!r}, {{'name': 'Ada'}}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    done = subprocess.run(
        [str(app_python), "-c", code, database_url], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    row = db.query_row("SELECT queue, name, args, status FROM jobs WHERE id = %s", (job_id,))
    assert row == (QUEUE, f"{QUEUE}.Greet", {"name": "Ada"}, "pending")


@pytest.mark.parametrize(
    "argv",
    [
        ["pause", "nosuchqueue", "--reason", "typo"],
        ["resume", "nosuchqueue"],
        ["redrive", "--queue", "nosuchqueue"],
        ["retry", "--queue", "nosuchqueue", "--dry-run"],
    ],
)
def test_a_queue_no_worker_runs_is_refused_by_name(db, database_url, argv):
    """A slip in a queue's name used to pause a queue that does not exist (or
    redrive nothing) and say it had: now one line naming it, and exit 2."""
    done = run_in(ROOT, database_url, "worker.py", *argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"{argv[0]}: no queue 'nosuchqueue' is registered" in done.stderr
    assert db.query_row("SELECT count(*) FROM job_queues")[0] == 0  # nothing was paused


def test_the_traceback_is_kept_bounded_and_without_locals(db, caplog):
    """The row keeps where a handler failed, cut to 8 KiB from the end (the
    fault's frames), never a frame's locals: args may hold what show's
    readers may see but a log's may not."""

    def recurse(depth: int) -> str:
        secret = f"sekret-{depth}"  # a local, as a handler's copy of its args would be
        if depth == 0:
            raise ValueError("at the bottom")
        return other(depth - 1) + secret

    def other(depth: int) -> str:
        # Alternating frames: Python prints a run of one repeated frame as one line.
        return recurse(depth)

    poller = make_poller("tb", db, {"tb.Deep": lambda job: recurse(job.args["depth"])})
    job_id = insert(db, "tb", "tb.Deep", {"depth": 200})
    with caplog.at_level(logging.ERROR, logger="jobs"):
        assert poller.work_once() == "err: ValueError: at the bottom"
    (kept,) = db.query_row("SELECT last_traceback FROM jobs WHERE id = %s", (job_id,))
    assert len(kept.encode()) <= MAX_TRACEBACK_BYTES
    assert kept.startswith("(traceback cut to its last lines)")
    assert kept.endswith("ValueError: at the bottom\n")
    assert "sekret" not in kept
    # Sentry is off in this test: the log has it, traceback and all.
    [record] = [r for r in caplog.records if "raised" in r.getMessage()]
    assert record.getMessage() == f"queue=tb job=tb.Deep id={job_id} raised err: ValueError: at the bottom"
    assert record.exc_info is not None


def test_with_sentry_on_the_fault_goes_there_not_to_the_error_log(db, caplog, sentry_events):
    poller = make_poller("tb", db, {"tb.N": lambda job: 1 / 0})
    job_id = insert(db, "tb", "tb.N")
    with caplog.at_level(logging.ERROR, logger="jobs"):
        assert poller.work_once() == "err: ZeroDivisionError: division by zero"
    assert not [r for r in caplog.records if "raised" in r.getMessage()]
    (kept,) = db.query_row("SELECT last_traceback FROM jobs WHERE id = %s", (job_id,))
    assert "ZeroDivisionError" in kept  # kept with the row either way


def test_check_scans_a_path_outside_the_project(tmp_path, database_url):
    """An application's own enqueue calls, and its SQL, are writers too: a
    typo there is caught when its folder is given to check."""
    app = tmp_path / "myapp"
    (app / "jobs").mkdir(parents=True)
    (app / "jobs" / "enqueue.py").write_text(
        "from lib.insert import insert\n\n\ndef age(conn):\n    insert(conn, 'caches', 'caches.Agee')\n"
    )
    (app / "enqueue.sql").write_text("INSERT INTO jobs (queue, name) VALUES ('cachez', 'caches.Age');\n")
    # A virtualenv inside the app is not its code.
    (app / ".venv").mkdir()
    (app / ".venv" / "vendored.py").write_text("from lib.insert import insert\ninsert(c, 'x', 'x.Y')\n")
    alone = run_in(ROOT, database_url, "worker.py", "check")
    assert alone.returncode == 0, alone.stdout  # the project alone is fine: the path is what finds the typos
    done = run_in(ROOT, database_url, "worker.py", "check", str(app))
    assert done.returncode == 1, done.stdout
    assert f"{app}/jobs/enqueue.py:5: queue=caches job=caches.Agee has no worker" in done.stdout
    assert f"{app}/enqueue.sql:1: queue=cachez job=caches.Age has no worker (no such queue" in done.stdout
    assert "x.Y" not in done.stdout
    missing = run_in(ROOT, database_url, "worker.py", "check", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr


def test_worker_and_status_name_queues_no_worker_runs(db, database_url):
    """Rows of a queue nobody registered wait for ever; the worker says so
    once at start, and status lists them (due rows only: a delayed one may
    yet find its worker)."""
    for _ in range(3):
        insert(db, "cachez", "caches.Age")
    insert(db, "cachez", "caches.Age", {"later": True}, run_at=datetime.now(UTC) + timedelta(hours=1))
    insert(db, "caches", "caches.Age", run_at=datetime.now(UTC) + timedelta(hours=1))  # registered: not named
    worker = Worker(ROOT, database_url)
    try:
        worker.wait_for_line("queues no worker runs: cachez (3 pending)")
    finally:
        worker.stop()
    assert worker.output.count("queues no worker runs") == 1, worker.output
    shown = run_in(ROOT, database_url, "worker.py", "status")
    assert "\nqueues no worker runs: cachez (3 pending)\n" in shown.stdout, shown.stdout
    as_json = run_in(ROOT, database_url, "worker.py", "status", "--json")
    assert json.loads(as_json.stdout)["unrun"] == [{"queue": "cachez", "due": 3}]


def test_check_fails_a_scheduled_entry_whose_args_do_not_fit_its_handler(project, database_url):
    """The README's queue and entry pass; the same entry with a misspelt key
    fails check, before any worker enqueues it every fifteen minutes. The
    dataclass is read from the handler's source; no handler runs."""
    done = run_in(project, database_url, "worker.py", "check")
    assert done.returncode == 0, done.stdout
    schedule = project / "queues" / "schedule.py"
    schedule.write_text(schedule.read_text().replace('args={"name": "the team"}', 'args={"nmae": "the team"}'))
    done = run_in(project, database_url, "worker.py", "check")
    assert done.returncode == 1, done.stdout
    assert (
        f'schedule: queue={QUEUE} job={QUEUE}.Greet args {{"nmae": "the team"}} do not fit: GreetArgs: missing field \'name\''
        in done.stdout
    )


def test_args_of_a_wrapped_handler_are_checked_too():
    """The API queues' handlers sit behind lib.run.api_queue's wrapper; a wrong
    type is named with the field."""
    entries = [
        Scheduled("github", "github.FetchRepo", every(15), args={"owner": "octo", "repo": 7}),
        Scheduled("github", "github.FetchUser", every(15), args={"login": "octo"}),
    ]
    [problem] = schedule_args_problems(defined(REGISTRY, unconnected()), entries)
    assert problem.startswith("schedule: queue=github job=github.FetchRepo args")
    assert "FetchRepoArgs: field 'repo' should be str, got int 7" in problem


def test_connect_without_database_url_starts_and_holds_the_embedded_server():
    """With no DATABASE_URL, lib.setup.plain_connection reaches the worker's embedded server
    (starting it, as no worker runs), holds it while the program runs, and
    the server stops once the program, its last user, exits."""
    # Not tmp_path: as root the server runs as postgres, which must enter the folders above it.
    base = Path(tempfile.mkdtemp(prefix="jobs-connect-"))
    base.chmod(0o711)
    data_dir = base / "pgdata"
    code = (
        "import sys\n"
        "from lib.setup.plain_connection import connect\n"
        "conn = connect()\n"
        "with conn, conn.cursor() as cur:\n"
        "    cur.execute('SELECT 41 + 1')\n"
        "    print(cur.fetchone()[0])\n"
        "assert 'gevent' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"JOBS_DATA_DIR": str(data_dir)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "42"
        assert list(data_dir.glob("*/PG_VERSION")), "no cluster was made in JOBS_DATA_DIR"
        assert not list(data_dir.rglob("postmaster.pid")), "the server outlived the program that used it"
    finally:
        embedded.stop(data_dir)
        shutil.rmtree(base, ignore_errors=True)
