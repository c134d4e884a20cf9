"""Bad rows written by hand (or by older code) between good rows of one queue:
a real worker process ends each bad row with a reason a person can read, works
every good row in order, stays up, and reports no database outage."""

import json
import shutil
import signal
import subprocess
import sys

import psycopg2
import pytest
from tests_support import ROOT, wait_for

from lib.store.db import DB
from lib.store.migrate import migrate, migrations

POISON_WORKER = ROOT / "tests" / "apps" / "poison_worker.py"


def _too_deep_for_json() -> int:
    """The least nesting, in thousands, that this Python's json refuses: 1,000
    on 3.11, 2,000 on 3.12, 10,000 on 3.13 (its C recursion limit is higher).
    Postgres's default stack holds jsonb about 13,000 deep."""
    for depth in range(1000, 13000, 1000):
        try:
            json.loads('{"a":' * depth + "1" + "}" * depth)
        except RecursionError:
            return depth
    raise AssertionError("this Python decodes JSON deeper than Postgres stores it: drop that poison row")


TOO_DEEP = _too_deep_for_json()

# (what is planted, args as SQL, name, extra columns, the status it must end with (a prefix))
POISON = [
    (
        "attempts at the int limit",
        "'{}'",
        "poison.Good",
        {"attempts": 2147483647},
        "err: cannot be claimed: integer out of range",
    ),
    (
        f"args nested {TOO_DEEP:,} deep",
        f"""(repeat('{{"a":', {TOO_DEEP}) || '1' || repeat('}}', {TOO_DEEP}))::jsonb""",
        "poison.Good",
        {},
        "err: BadArgs: args cannot be decoded: RecursionError",
    ),
    ("args a JSON array", "'[1, 2]'", "poison.Args", {}, "err: ArgsError: args must be a JSON object, got list"),
    # unmarshal_args reads a string as JSON text (a producer that encoded twice).
    ("args a JSON string", """'"name"'""", "poison.Args", {}, "err: ArgsError: args are not valid JSON"),
    ("args JSON null", "'null'", "poison.Args", {}, "err: ArgsError: args must be a JSON object, got NoneType"),
    (
        "args of 20 MB",
        "jsonb_build_object('name', repeat('x', 20 * 1024 * 1024))",
        "poison.Args",
        {},
        "err: BadArgs: args are 20971532 characters as jsonb prints them; the limit is 262144 bytes",
    ),
    # The measure of the insert: compact JSON, without the spaces jsonb prints.
    (
        "args one byte over the limit",
        "jsonb_build_object('name', repeat('é', 131067))",
        "poison.Args",
        {},
        "err: BadArgs: args are 262145 bytes as compact JSON; the limit is 262144",
    ),
    (
        "a name with a newline",
        "'{}'",
        "poison.Good\nrm -rf",
        {},
        "err: UnknownJob: unknown job 'poison.Good\\nrm -rf' for queue poison",
    ),
    ("an unknown name", "'{}'", "poison.Nope", {}, "err: UnknownJob: unknown job 'poison.Nope' for queue poison"),
    # An API's error body can carry a NUL, which Postgres text cannot hold.
    (
        "an error with a NUL",
        """'{"text": "body NUL tail"}'""",
        "poison.Raise",
        {},
        "err: RuntimeError: body \\x00 tail",
    ),
    ("a fail status with a NUL", """'{"text": "no NUL match"}'""", "poison.Fail", {}, "fail: no \\x00 match"),
]


def _plant(db: DB, args_sql: str, name: str, extra: dict) -> int:
    # By hand, args as SQL: a bad row is what no writer of the project's sends.
    columns = ", ".join(["queue", "name", "args", *extra])
    values = ", ".join(["'poison'", "%s", args_sql, *["%s"] * len(extra)])
    return db.query_row(f"INSERT INTO jobs ({columns}) VALUES ({values}) RETURNING id", (name, *extra.values()))[0]


@pytest.fixture
def poison_db(db):
    db.exec("DROP TABLE IF EXISTS poison_runs")
    db.exec("CREATE TABLE poison_runs (n serial, job_id bigint)")
    return db


def test_each_bad_row_ends_with_its_reason_and_the_queue_goes_on(poison_db, database_url, tmp_path):
    db = poison_db
    good, bad = [_plant(db, "'{}'", "poison.Good", {})], {}
    for what, args_sql, name, extra, expected in POISON:
        bad[_plant(db, args_sql, name, extra)] = (what, expected)
        good.append(_plant(db, "'{}'", "poison.Good", {}))
    events_file, log_file = tmp_path / "events.jsonl", tmp_path / "worker.log"
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(POISON_WORKER)],
            env={
                "PATH": "/usr/bin:/bin",
                "JOBS_HTTP_ADDR": "off",
                "DATABASE_URL": database_url,
                "SENTRY_EVENTS_FILE": str(events_file),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: db.query_row("SELECT count(*) FROM jobs WHERE status IN ('pending', 'started')")[0] == 0, 90)
        assert proc.poll() is None, log_file.read_text()[-3000:]  # still running
        statuses = dict(db.query("SELECT id, status FROM jobs"))
        for job_id, (what, expected) in bad.items():
            assert statuses[job_id].startswith(expected), (what, statuses[job_id])
        assert [statuses[i] for i in good] == ["ok"] * len(good)
        # In order: each good row ran once, in the order it was written.
        assert [r[0] for r in db.query("SELECT job_id FROM poison_runs ORDER BY n")] == good
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        # No part died on the way: a supervised restart would hide a bug.
        assert " died: " not in log_file.read_text(), log_file.read_text()[-3000:]
    finally:
        proc.kill()
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    whats = [e.get("contexts", {}).get("what", {}).get("message", "") for e in events]
    # Each bad row is its own fault, never a database outage or a failing claim loop.
    assert not [w for w in whats if w.endswith("failing")], whats
    assert "job cannot be claimed" in whats


@pytest.mark.parametrize("run_at", ["infinity", "-infinity"])
def test_a_run_at_that_is_no_moment_is_refused_when_written(db, run_at):
    with pytest.raises(psycopg2.errors.CheckViolation, match="jobs_run_at_finite"):
        # By hand: the table refuses the row from any writer, not only lib.insert.
        db.exec("INSERT INTO jobs (queue, name, run_at) VALUES ('poison', 'poison.Good', %s)", (run_at,))


def test_rows_with_infinite_run_at_from_before_are_mended_by_the_migration(empty_database, tmp_path):
    for number, _, path in migrations():
        if number < 10:
            shutil.copy(path, tmp_path / path.name)
    db = DB.connect(empty_database, size=2)
    try:
        migrate(db, tmp_path, rules=None)
        never, soonest, done = (
            db.query_row(
                "INSERT INTO jobs (queue, name, run_at, status) VALUES ('q', 'q.N', %s, %s) RETURNING id", (run_at, s)
            )[0]
            for run_at, s in (("infinity", "pending"), ("-infinity", "pending"), ("infinity", "ok"))
        )
        assert "010_run_at_finite" in migrate(db)
        rows = {r[0]: r[1:] for r in db.query("SELECT id, status, run_at = created_at FROM jobs")}
        assert rows[never] == ("err: run_at was infinity, so it would never be due", True)
        assert rows[soonest] == ("pending", True)  # due now, and claimable
        assert rows[done] == ("ok", True)
    finally:
        db.close()
