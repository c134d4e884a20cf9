"""Settings and command-line values are checked with a clear message and exit
code 2; a malformed DATABASE_URL never shows its password; names read from
rows cannot forge log lines."""

import os
import signal
import subprocess
import sys

import pytest
from sentry_server import SentryServer
from tests_support import ROOT, make_poller, wait_for

from lib.insert import insert
from lib.setup.dsn import dsn_password, masked_dsn
from lib.setup.parsers import SettingError, check_dsn
from lib.setup.settings import Settings

SECRET = "SEKRET-pw-4711"


def worker(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "worker.py", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def sentry():
    server = SentryServer()
    yield server
    server.close()


@pytest.mark.parametrize(
    "url",
    [
        # An unencoded "%" (common in generated passwords): libpq quotes the bad token.
        f"postgresql://postgres:ab%zz{SECRET}@127.0.0.1:5432/postgres",
        f"postgresql://postgres:{SECRET}%@127.0.0.1:5432/postgres",
        f"host=127.0.0.1 password='{SECRET} dbname=x",
    ],
)
@pytest.mark.parametrize("name", ["DATABASE_URL", "DATABASE_DIRECT_URL"])
def test_a_malformed_database_url_is_named_and_its_password_never_shown(sentry, url, name):
    done = worker("migrate", **{name: url}, SENTRY_DSN=sentry.dsn)
    assert done.returncode == 2
    assert f"worker: {name} is malformed" in done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert not any(SECRET.encode() in body for body in sentry.bodies)
    with pytest.raises(SettingError) as refused:
        check_dsn(url)
    assert SECRET not in str(refused.value)


def test_the_password_is_found_and_masked_in_every_form_of_dsn():
    for dsn in (
        f"postgresql://u:{SECRET}@h/db",
        f"postgresql://u:pa/ss@{SECRET}@h/db",  # unencoded "/" and "@"
        f"postgresql://u@h/db?sslmode=require&password={SECRET}",
        f"host=h password={SECRET} dbname=db",
        f"host=h password='{SECRET} with space' dbname=db",
    ):
        assert SECRET in (dsn_password(dsn) or ""), dsn
        assert SECRET not in masked_dsn(dsn)
        assert SECRET not in repr(Settings(database_url=dsn, direct_url=dsn))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("JOBS_LEASE_SECONDS", "abc"),
        ("JOBS_LEASE_SECONDS", "0"),
        ("JOBS_LEASE_SECONDS", "nan"),
        ("JOBS_SHUTDOWN_WINDOW", "-1"),
        ("JOBS_SHUTDOWN_WINDOW", "inf"),
        ("LOG_LEVEL", "LOUD"),
        ("LOG_FORMAT", "xml"),
        ("JOBS_POOLER", "pgbouncer"),
        ("JOBS_QUEUES", "github,,slack"),
        ("JOBS_POLL_INTERVAL", "0"),
        ("JOBS_POLL_INTERVAL", "soon"),
        ("JOBS_RETENTION_DAYS", "abc"),
        ("JOBS_RETENTION_DAYS", "0"),
        ("JOBS_RETENTION_DAYS", "-3"),
        ("JOBS_RETENTION_DAYS", "1.5"),
        ("JOBS_RETENTION_DAYS", "99999999"),
        ("JOBS_EMBEDDED", "docker"),
        ("GITHUB_BASE_URL", "api.github.com"),
        ("SLACK_BASE_URL", "ftp://slack.example/api"),
        ("ANTHROPIC_BASE_URL", "http://"),
        ("GITHUB_BASE_URL", "http://x"),
        ("APOLLO_BASE_URL", "https://api.apollo.io:99999/api/v1"),
        ("SENTRY_DSN", "not a dsn"),
        ("SENTRY_DSN", "https://sentry.example/1"),
        ("SENTRY_DSN", "https://key@sentry.example/project"),
    ],
)
def test_a_bad_setting_stops_the_worker_with_its_name(name, value):
    done = worker("migrate", **{name: value})
    assert done.returncode == 2
    assert done.stderr.startswith(f"worker: {name} must be")
    assert "Traceback" not in done.stderr


def test_behind_a_transaction_pooler_nothing_relies_on_a_session():
    direct = Settings.from_env({})
    assert (direct.pooled, direct.listen_url("db"), direct.queue_poll_interval(listening=True)) == (False, "db", None)
    pooled = Settings.from_env({"JOBS_POOLER": "transaction"})
    # No LISTEN through the pooler: every queue polls, by default each second.
    assert (pooled.pooled, pooled.listen_url("db"), pooled.queue_poll_interval(listening=False)) == (True, None, 1.0)
    both = Settings.from_env(
        {"JOBS_POOLER": "Transaction", "DATABASE_DIRECT_URL": "dbname=x", "JOBS_POLL_INTERVAL": "7"}
    )
    assert (both.listen_url("db"), both.queue_poll_interval(listening=True)) == ("dbname=x", 7.0)
    # A pooler in session mode keeps each client's session: as good as none.
    assert not Settings.from_env({"JOBS_POOLER": "session"}).pooled


@pytest.mark.parametrize(
    "args",
    [
        ["pause", "q", "--reason", "r", "--minutes", "0"],
        ["pause", "q", "--reason", "r", "--minutes", "-5"],
        ["pause", "q", "--reason", "r", "--minutes", "nan"],
        ["pause", "q", "--reason", "r", "--minutes", "inf"],
        ["pause", "q", "--reason", ""],
        ["pause", "q", "--reason", "two\nlines"],
        ["redrive", "--id", "0"],
        ["redrive", "--id", "x"],
        ["--shutdown-window", "-3"],
        ["run", "--shutdown-window", "nan"],
    ],
)
def test_a_bad_command_line_value_is_refused_with_exit_code_2(database_url, args):
    done = worker(*args, DATABASE_URL=database_url)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: argument" in done.stderr
    assert "Traceback" not in done.stderr


def test_redrive_takes_several_ids_after_one_flag(db, database_url):
    ids = [insert(db, "caches", "caches.Age", {"n": n}) for n in range(2)]
    db.exec("UPDATE jobs SET status = 'err: boom', attempts = 1")
    done = worker("redrive", "--id", str(ids[0]), str(ids[1]), DATABASE_URL=database_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"redrove 2 jobs: {ids[0]}, {ids[1]}"


def test_a_name_read_from_a_row_cannot_forge_a_log_line(db, database_url, tmp_path):
    forged = "2026-01-01 00:00:00,000 ERROR jobs.worker FORGED"
    insert(db, "probe", "probe.Record")  # a job for the probe worker's queue...
    db.exec("UPDATE jobs SET name = %s", (f"probe.Sleep\n{forged}",))  # ...renamed by hand
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "apps" / "probe_worker.py")],
            env={**os.environ, "DATABASE_URL": database_url},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: db.query_row("SELECT status FROM jobs")[0].startswith("err: UnknownJob"), 30)
        wait_for(lambda: "UnknownJob" in log_path.read_text(), 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    lines = log_path.read_text().splitlines()
    assert not [line for line in lines if line.startswith(forged)]
    assert any("probe.Sleep\\n2026-01-01" in line for line in lines)


def test_a_fault_quoting_the_database_password_is_stored_without_it(db, settings_of):
    """A handler's error that quotes a configured secret (the password, in a
    DSN it printed) is stored in the row, status and traceback, masked."""

    password = "SEKRET-in-a-message-31"
    settings_of({"DATABASE_URL": f"postgresql://u:{password}@db.example/jobs"})

    def handler(job):
        raise RuntimeError(f"could not reach postgresql://u:{password}@db.example/jobs")

    insert(db, "q", "q.N")
    status = make_poller("q", db, {"q.N": handler}).work_once()
    row = db.query_row("SELECT status, last_error, last_traceback FROM jobs")
    assert status.startswith("err: RuntimeError: could not reach")
    assert all(password not in text for text in row), row


def test_a_real_worker_masks_the_secrets_of_its_settings(db, database_url, tmp_path):
    """worker.main hands the settings' secrets to the masks: a fault quoting
    a token (of a queue this worker does not even run) and the admin token is
    stored, logged and reported with both masked."""
    token, admin = "SEKRET-gh-8080", "SEKRET-admin-" + "x" * 16
    insert(db, "poison", "poison.Raise", {"text": f"upstream said {token} and {admin}"})
    events_file, log_file = tmp_path / "events.jsonl", tmp_path / "worker.log"
    env = {
        "PATH": "/usr/bin:/bin",
        "JOBS_HTTP_ADDR": "off",
        "DATABASE_URL": database_url,
        "SENTRY_EVENTS_FILE": str(events_file),
        "GITHUB_TOKEN": token,
        "JOBS_ADMIN_TOKEN": admin,
    }
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "apps" / "poison_worker.py")], env=env, stdout=log, stderr=log
        )
    try:
        wait_for(lambda: db.query_row("SELECT status FROM jobs")[0].startswith("err:"), 30)
        wait_for(events_file.exists, 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    row = db.query_row("SELECT status, last_error, last_traceback FROM jobs")
    assert row[0] == "err: RuntimeError: upstream said [redacted] and [redacted]"
    places = {"row": " ".join(row), "log": log_file.read_text(), "sentry": events_file.read_text()}
    assert {where: [s for s in (token, admin) if s in text] for where, text in places.items()} == {
        "row": [],
        "log": [],
        "sentry": [],
    }
    assert "[redacted]" in places["sentry"] and "[redacted]" in places["log"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_log_line_and_its_traceback_are_masked_of_the_secrets(fmt):
    import logging

    from lib.setup import logs

    try:
        raise RuntimeError(f"could not reach postgresql://u:{SECRET}@db/jobs")
    except RuntimeError as exc:
        record = logging.LogRecord("jobs", logging.ERROR, __file__, 1, "failed: %s", (exc,), (RuntimeError, exc, None))
    line = logs.formatter(fmt, [SECRET]).format(record)
    assert "could not reach" in line and "RuntimeError" in line
    assert SECRET not in line


def test_lib_connect_refuses_a_malformed_database_url_without_showing_its_password(monkeypatch):
    from lib.setup.plain_connection import connect

    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres:ab%zz{SECRET}@127.0.0.1:5432/postgres")
    with pytest.raises(SettingError) as refused:
        connect()
    assert "DATABASE_URL is malformed" in str(refused.value)
    assert SECRET not in str(refused.value)
