"""`worker.py doctor` against the real database, as its owner (no superuser):
a transaction held open elsewhere, another role's that the owner may not
see in full, a replication slot, objects a migration changes owned by
another role, a table locked by a migration; the same figures on /metrics
and the admin page. The judgement alone, without a database, is
tests/unit/test_doctor_verdicts.py."""

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import gevent
import psycopg2
import pytest
import requests
from factory import make_jobs
from gevent.event import Event
from http_support import serving
from prometheus_client.parser import text_string_to_metric_families
from tests_support import ROOT

import worker
from lib.http.httpd import worker_app
from lib.operate import doctor
from lib.store import vitals
from queues import REGISTRY

TOKEN = "doctor-" + "t0ken" * 4
# Every hold is past these: a test judges a hold without waiting for one to age.
AT_ONCE = doctor.Thresholds(horizon_warning=0.0, horizon_bad=0.0)


@contextmanager
def held(url: str, application: str = "doctor-psql") -> Iterator[int]:
    """A session that holds the horizon (a snapshot kept by REPEATABLE READ),
    as a person's psql left open would; its pid. Ended when the block ends."""
    conn = psycopg2.connect(url, application_name=application)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT count(*)\nFROM jobs")
            pid = conn.info.backend_pid
        yield pid
    finally:
        conn.rollback()
        conn.close()


@pytest.fixture
def cli(database_url, monkeypatch, capsys):
    """cli(*argv) -> (exit code, stdout, stderr), through worker.main."""
    monkeypatch.setenv("DATABASE_URL", database_url)

    def run(*argv: str) -> tuple[int, str, str]:
        code = worker.main(REGISTRY, list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def finding(found, name: str) -> doctor.Finding:
    return next(f for f in found if f.name == name)


def test_a_held_transaction_is_named_by_pid_and_application_and_bad_past_the_threshold(db, database_url):
    with held(database_url) as pid:
        v = vitals.read(db)
        holder = v.horizon()
        assert (holder.kind, holder.pid, holder.application) == ("transaction", pid, "doctor-psql")
        assert holder.state == "idle in transaction" and holder.query == "SELECT count(*)"
        assert holder.visible and holder.seconds is not None and holder.xids is not None
        fresh = doctor.horizon(v, doctor.Thresholds())
        assert fresh.verdict == doctor.OK and f"pid {pid} (doctor-psql" in fresh.summary
        bad = doctor.horizon(v, AT_ONCE)
        assert bad.verdict == doctor.BAD
        assert f"transaction pid {pid} (doctor-psql, role " in bad.summary
        assert f"end it with SELECT pg_terminate_backend({pid})" in bad.advice
        assert "every finished job's dead rows stay until it ends" in bad.advice
    ended = doctor.horizon(vitals.read(db), AT_ONCE)
    assert ended.verdict == doctor.OK and ended.summary.startswith("nothing holds it"), ended


def test_autovacuum_turned_off_is_a_warning_naming_where(db):
    (server_on,) = db.query_row("SELECT current_setting('autovacuum')::boolean")
    try:
        db.exec("ALTER TABLE jobs SET (autovacuum_enabled = false)")  # the owner may
        v = vitals.read(db)
        assert v.autovacuum_off == ("table" if server_on else "server")
        found = doctor.vacuum(v, doctor.Thresholds())
        assert found.verdict == doctor.WARNING and "autovacuum is off" in found.summary, found
        assert "VACUUM" in found.advice
    finally:
        db.exec("ALTER TABLE jobs RESET (autovacuum_enabled)")
    assert vitals.read(db).autovacuum_off == (None if server_on else "server")


def test_another_roles_transaction_shows_its_pid_and_age_not_its_query(db, admin_db):
    admin_url = admin_db.dsn
    with held(admin_url, "nightly-report") as pid:
        v = vitals.read(db)
    holder = next(h for h in v.holders if h.pid == pid)
    assert not holder.visible and holder.query is None and holder.seconds is None
    assert holder.application == "nightly-report" and holder.xids is not None
    found = doctor.horizon(v, doctor.Thresholds())
    assert f"transaction pid {pid} (nightly-report, role " in "\n".join(found.details)
    assert "open for how long: not visible" in "\n".join(found.details)
    assert f"GRANT pg_read_all_stats TO {v.role}" in found.details[-1]


def test_a_replication_slot_is_reported_with_the_wal_it_keeps(db, admin_db):
    name = f"doctor_{uuid.uuid4().hex[:8]}"
    admin_db.query_row("SELECT pg_create_physical_replication_slot(%s, true)", (name,))
    try:
        v = vitals.read(db)
    finally:
        admin_db.query_row("SELECT pg_drop_replication_slot(%s)", (name,))
    slot = next(h for h in v.holders if h.name == name)
    assert (slot.kind, slot.slot_type, slot.active, slot.xids) == ("slot", "physical", False, None)
    assert slot.wal_bytes is not None and slot.wal_bytes >= 0
    found = doctor.slots(v)
    assert found.verdict == doctor.WARNING and name in found.summary
    assert f"SELECT pg_drop_replication_slot('{name}')" in found.advice
    # A physical slot without a standby's feedback holds no rows: the horizon is not its.
    assert all(h.name != name for h in v.holders if h.xids is not None)


def test_the_migration_check_names_what_another_role_owns_and_how_to_give_it_back(db, admin_db):
    v = vitals.read(db)
    assert vitals.unowned(db) == []
    assert doctor.migrations(v, []).verdict == doctor.OK
    other = f"doctor_other_{uuid.uuid4().hex[:8]}"
    (function,) = db.query_row("SELECT 'jobs_queue_turn'::regproc::oid::regprocedure::text")
    admin_db.exec(f"CREATE ROLE {other} NOLOGIN")
    try:
        admin_db.exec(f"ALTER FUNCTION {function} OWNER TO {other}")
        admin_db.exec(f"ALTER TABLE job_minutes OWNER TO {other}")
        missing = vitals.unowned(db)
        found = doctor.migrations(v, missing)
        assert [(u.kind, u.name, u.owner) for u in missing] == [
            ("function", function, other),
            ("table", "job_minutes", other),
        ]
        assert found.verdict == doctor.BAD
        assert f"function {function} is {other}'s: ALTER FUNCTION {function} OWNER TO {v.role};" in found.details
        # The statements given are the ones that mend it.
        for u in missing:
            admin_db.exec(u.fix)
        assert vitals.unowned(db) == []
    finally:
        admin_db.exec(f"ALTER FUNCTION {function} OWNER TO {v.role}")
        admin_db.exec(f"ALTER TABLE job_minutes OWNER TO {v.role}")
        admin_db.exec(f"DROP ROLE {other}")


def test_a_table_a_migration_locks_costs_the_sizes_and_nothing_else(db, database_url):
    """The watch's reading takes no lock on the jobs table; the sizes wait a
    moment for theirs and are left out past it."""
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        with gevent.Timeout(2, AssertionError("the reading without sizes waited for the table's lock")):
            bare = vitals.read(db, sizes=False)
        assert bare.has_jobs and bare.table_bytes is None and bare.dead_rows is not None
        with gevent.Timeout(5, AssertionError("the sizes waited past their lock timeout")):
            sized = vitals.read(db)
        assert sized.table_bytes is None and "sizes not read" in sized.sizes_note
        assert sized.dead_rows is not None
    finally:
        conn.rollback()
        conn.close()
    assert vitals.read(db).table_bytes is not None


def test_doctor_exits_1_on_a_bad_finding_and_prints_json_for_scripts(db, database_url, cli, monkeypatch):
    code, out, err = cli("doctor")
    assert code == 0, out + err
    assert out.startswith(f"database {db.query_row('SELECT current_database()')[0]} as role ")
    assert any(line.startswith("ok") and "migrations" in line for line in out.splitlines())
    monkeypatch.setattr(doctor, "THRESHOLDS", AT_ONCE)
    with held(database_url) as pid:
        code, out, err = cli("doctor")
        assert code == 1, out + err
        line = next(line for line in out.splitlines() if line.split()[:2] == ["bad", "horizon"])
        assert f"transaction pid {pid} (doctor-psql" in line
        assert (
            f"do: every finished job's dead rows stay until it ends; end it with SELECT pg_terminate_backend({pid}),"
            in out
        )
        code, out, _ = cli("doctor", "--json")
    assert code == 1
    document = json.loads(out)
    assert document["verdict"] == "bad"
    assert next(f for f in document["findings"] if f["name"] == "horizon")["verdict"] == "bad"
    assert pid in [h["pid"] for h in document["vitals"]["holders"]]


def test_doctor_reads_the_database_as_it_is_and_migrates_nothing(empty_database, monkeypatch, capsys):
    """A database a migration would change is the one doctor must explain, as it is."""
    monkeypatch.setenv("DATABASE_URL", empty_database)
    code = worker.main(REGISTRY, ["doctor"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"^warning +jobs dead rows +no jobs table$", out, re.MULTILINE), out
    assert "do: run worker.py migrate" in out
    conn = psycopg2.connect(empty_database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('jobs'), to_regclass('schema_migrations')")
            assert cur.fetchone() == (None, None)
    finally:
        conn.close()


def test_a_query_the_role_may_not_run_is_one_line_and_exit_1(db, admin_db, cli):
    admin_db.exec("REVOKE EXECUTE ON FUNCTION pg_notification_queue_usage() FROM PUBLIC")
    try:
        code, out, err = cli("doctor")
    finally:
        admin_db.exec("GRANT EXECUTE ON FUNCTION pg_notification_queue_usage() TO PUBLIC")
    assert code == 1 and out == ""
    assert err.startswith("doctor: could not read the database's state: permission denied for function")
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_doctor_from_a_real_process_prints_json_that_parses(db, database_url):
    done = subprocess.run(
        [sys.executable, "worker.py", "doctor", "--json"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["verdict"] in ("ok", "warning")


def test_metrics_and_the_admin_page_show_the_figures(db, database_url, monkeypatch):
    monkeypatch.setattr(doctor, "THRESHOLDS", AT_ONCE)
    make_jobs(db, 10, "mail", "mail.Send")
    db.exec("DELETE FROM jobs WHERE id % 2 = 0")
    app = worker_app(
        db, admin_token=TOKEN, queues=[], listener=None, supervisor=None, committer=None, stop=Event(), outage=None
    )
    with held(database_url) as pid, serving(app) as base:
        answer = requests.get(f"{base}/metrics", timeout=10)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text)
            for s in family.samples
        }
        session = requests.Session()
        session.post(f"{base}/admin/login", data={"token": TOKEN}, timeout=10)
        page = session.get(f"{base}/admin/database", timeout=10)
    assert samples[("jobs_db_vitals_up", ())] == 1
    assert samples[("jobs_db_horizon_age_seconds", (("holder", "transaction"),))] > 0
    assert ("jobs_db_horizon_age_xids", (("holder", "transaction"),)) in samples
    assert samples[("jobs_db_jobs_dead_rows", ())] >= 0
    assert samples[("jobs_db_jobs_total_bytes", ())] > samples[("jobs_db_jobs_table_bytes", ())] > 0
    assert 0 <= samples[("jobs_db_notify_queue_usage", ())] <= 1  # the server's, shared with other databases
    assert samples[("jobs_db_database_xid_age", ())] > 0 and ("jobs_db_jobs_xid_age", ()) in samples
    assert page.status_code == 200
    assert '<span class="badge kind-err" id="verdict">bad</span>' in page.text
    assert f"transaction pid {pid} (doctor-psql, role " in page.text
    assert f"SELECT pg_terminate_backend({pid})" in page.text
    assert 'data-finding="migrations"' in page.text and 'href="/admin/database" class="here"' in page.text
