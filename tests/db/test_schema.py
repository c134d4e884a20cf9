"""The schema in force is one, however a database got there: migrated from
empty, upgraded from the original service's table, or upgraded from
migration 034 (the last before the rules moved to sql/rules), each by a role
that owns its database and is no superuser; and it is the one the files in
force describe (sql/schema.sql and the rules), compared from the catalogue."""

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest
from test_migrate import ORIGINAL
from tests_support import ROOT, superuser_url

from lib.insert import insert
from lib.store.db import DB
from lib.store.migrate import RULES_DIR, migrate
from lib.store.sql import SQL_DIR

AT_034 = ROOT / "tests" / "data" / "schema_at_034.sql"

# Each part of the schema as the server describes it, in a stable order.
# Columns by name, not position: a migration that replaces a column (002's
# id, filled in beside the old one) leaves the new one last, and the worker
# names every column it reads or writes. Indexes with their validity: a
# CONCURRENTLY build that failed leaves an index the planner never uses.
CATALOGUE = {
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attname""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2""",
    "indexes": """
        SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid), indisvalid FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1""",
    "sequences": """
        SELECT seqrelid::regclass::text, format_type(seqtypid, NULL), seqstart, seqincrement, seqmax, seqmin,
               seqcache, seqcycle
        FROM pg_sequence ORDER BY 1""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1""",
    "triggers": """
        SELECT tgname, pg_get_triggerdef(oid), tgenabled FROM pg_trigger
        WHERE NOT tgisinternal ORDER BY 1""",
}


def catalogue(db: DB) -> dict[str, list[tuple[Any, ...]]]:
    return {part: db.query(sql) for part, sql in CATALOGUE.items()}


def as_administrator(url: str, server_url: str, sql: str) -> None:
    """Run sql in url's database as the server's superuser, then give the
    database's owner every table and function it made."""
    conn = psycopg2.connect(superuser_url(url, server_url))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            cur.execute(
                "DO $$ DECLARE r record; owner text := (SELECT datdba::regrole::text FROM pg_database"
                " WHERE datname = current_database()); BEGIN"
                " FOR r IN SELECT oid::regprocedure AS f FROM pg_proc WHERE pronamespace = 'public'::regnamespace LOOP"
                "   EXECUTE format('ALTER FUNCTION %s OWNER TO %I', r.f, owner); END LOOP;"
                " FOR r IN SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' LOOP"
                "   EXECUTE format('ALTER TABLE %I OWNER TO %I', r.relname, owner); END LOOP; END $$"
            )
    finally:
        conn.close()


def is_superuser(db: DB) -> bool:
    return db.query_row("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0]


@pytest.fixture
def another(empty_database, server_url):
    """A second empty database owned by the same role as empty_database."""
    parts = urlsplit(empty_database)
    name = parts.path.lstrip("/")
    admin = psycopg2.connect(server_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}_2 OWNER {name}")
        yield urlunsplit(parts._replace(path=f"/{name}_2"))
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE {name}_2 WITH (FORCE)")
    finally:
        admin.close()


@pytest.fixture
def owner_db(empty_database):
    db = DB.connect(empty_database, size=2)
    assert not is_superuser(db), "the suite runs as the database's owner, not a superuser"
    yield db
    db.close()


def test_migrated_from_empty_equals_the_files_in_force(owner_db, another, tmp_path):
    migrate(owner_db)
    from_files = DB.connect(another, size=2)
    try:
        with from_files.transaction() as tx:
            tx.exec((SQL_DIR / "schema.sql").read_text())
        empty = tmp_path / "none"
        empty.mkdir()
        migrate(from_files, empty, RULES_DIR)
        assert catalogue(from_files) == catalogue(owner_db)
    finally:
        from_files.close()


def test_upgraded_from_the_original_table_equals_migrated_from_empty(owner_db, another):
    with owner_db.transaction() as tx:
        tx.exec(ORIGINAL)
    migrate(owner_db)
    fresh = DB.connect(another, size=2)
    try:
        migrate(fresh)
        assert catalogue(owner_db) == catalogue(fresh)
    finally:
        fresh.close()


def test_upgraded_from_034_equals_migrated_from_empty_and_keeps_every_job(
    owner_db, another, server_url, empty_database
):
    as_administrator(empty_database, server_url, AT_034.read_text())
    # Jobs as that release wrote them: its one-job insert and a plain INSERT.
    (first,) = owner_db.query_row("SELECT jobs_insert('q', 'q.A', '{}', 'app.py:1', NULL, 0, NULL, NULL)")
    owner_db.exec("INSERT INTO jobs (queue, name, args) VALUES ('q', 'q.B', '{\"n\": 2}')")
    before = owner_db.query("SELECT id, queue, name, args, status FROM jobs ORDER BY id")
    migrate(owner_db)
    assert owner_db.query("SELECT id, queue, name, args, status FROM jobs ORDER BY id") == before
    assert before[0][0] == first
    fresh = DB.connect(another, size=2)
    try:
        migrate(fresh)
        assert catalogue(owner_db) == catalogue(fresh)
    finally:
        fresh.close()
    # The upgraded database takes a job through lib.insert, in the old id sequence.
    assert insert(owner_db, "q", "q.C") == before[-1][0] + 1


def test_the_rules_are_applied_only_when_they_change(owner_db):
    migrate(owner_db)
    applied = owner_db.query("SELECT file, applied_at FROM schema_rules ORDER BY file")
    migrate(owner_db)
    assert owner_db.query("SELECT file, applied_at FROM schema_rules ORDER BY file") == applied


def test_a_newer_release_s_rules_stay_in_force(owner_db):
    migrate(owner_db)
    owner_db.exec("UPDATE schema_rules SET version = version + 1, checksum = 'newer'")
    owner_db.exec(
        "CREATE OR REPLACE FUNCTION jobs_gate_wait(gate timestamptz) RETURNS float8 LANGUAGE sql AS $$ SELECT 7.0::float8 $$"
    )
    migrate(owner_db)
    assert owner_db.query_row("SELECT jobs_gate_wait(now())") == (7.0,)


def test_a_changed_rule_file_is_applied_again(owner_db, tmp_path):
    migrate(owner_db)
    rules = tmp_path / "rules"
    rules.mkdir()
    for path in RULES_DIR.iterdir():
        (rules / path.name).write_text(path.read_text())
    rules_sql = rules / "rules.sql"
    rules_sql.write_text(rules_sql.read_text().replace("now() + interval '1 day'", "now() + interval '2 days'"))
    migrate(owner_db, rules=rules)
    (definition,) = owner_db.query_row("SELECT pg_get_functiondef('jobs_gate_wait'::regproc)")
    assert "2 days" in definition
