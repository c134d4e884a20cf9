"""An upgrade in place while an application writes (guarantee 15): a table
of the original service's shape holding many finished rows, and a database
at migration 034, each upgraded by migrate() while an application on the
original service's insert (tests/apps/legacy_writer.py, one INSERT every
10 ms) goes on. No insert waits longer than LONGEST_WAIT or fails, every
row written before or during the upgrade is there with its data, every
pending row runs afterwards in its order, and the schema is the one a
database migrated from empty has. A transaction left open on the table
delays the upgrade, not the inserts. And an upgrade stopped midway (its
process killed, a build that failed, a step that refused) is completed by
the next run, to the same schema.

FINISHED sets the size; LIVE_UPGRADE_FINISHED overrides it for a one-off
measurement at production size (the test prints its figures; run with -s).
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import gevent
import psycopg2
import pytest
from test_migrate import ORIGINAL
from test_schema import AT_034, as_administrator, catalogue
from tests_support import ROOT, make_poller, scratch_database, wait_for

from lib.store.db import DB
from lib.store.migrate import migrate

LEGACY_WRITER = ROOT / "tests" / "apps" / "legacy_writer.py"
FINISHED = int(os.environ.get("LIVE_UPGRADE_FINISHED", "200000"))
PENDING = 300
# Guarantee 15 allows an application's write a second, at any size. The
# upgrade's own bound is a lock wait (LOCK_TIMEOUT_MS) and a moment, at any
# size too, so at a tenth of a production table the test holds it to half:
# a statement that held writers while it read the table (a plain index
# build, a rewrite), over a second at production size, shows here.
LONGEST_WAIT = 0.5
# Inserts the application makes before the upgrade starts, and the time it
# goes on after the upgrade ends.
BEFORE = 20
AFTER = 0.5
# How long a person's transaction holds the table while the upgrade waits.
HELD = 3.0

# Finished rows as an application's use leaves them (one in fifty failed),
# then pending ones; the same statements fit the original table and the one
# at 034. A second apart from May on: New York's clocks change in none of
# the weeks they span, so each wall-clock time names one instant.
SEED = """
INSERT INTO jobs (queue, name, args, status, callsite, created_at, started_at, finished_at)
SELECT 'legacy', 'legacy.Work', jsonb_build_object('seed', n, 'pad', repeat('x', 40)),
       CASE WHEN mod(n, 50) = 0 THEN 'err: boom' ELSE 'ok' END, 'app/enqueue.go:' || mod(n, 97),
       t, t + interval '1 second', t + interval '3 seconds'
FROM generate_series(1, %(finished)s) n, LATERAL (SELECT timestamp '2025-05-01 00:00' + n * interval '1 second') AS s(t);
INSERT INTO jobs (queue, name, args, callsite)
SELECT 'legacy', 'legacy.Work', jsonb_build_object('seed', n), 'app/enqueue.go:7' FROM generate_series(1, %(pending)s) n;
"""

# Each row as the application reads it, the timestamps as wall-clock times
# in the database's zone: what a timestamptz of the upgraded table must
# still say.
DIGEST = """
SELECT count(*), md5(string_agg(concat_ws('|', id, queue, name, args::text, status, callsite,
    to_char(created_at, 'YYYY-MM-DD HH24:MI:SS.US'), to_char(started_at, 'YYYY-MM-DD HH24:MI:SS.US'),
    to_char(finished_at, 'YYYY-MM-DD HH24:MI:SS.US')), ',' ORDER BY id))
FROM jobs WHERE id <= %(last)s
"""


@dataclass
class Upgrade:
    seconds: float  # migrate()'s own time
    inserts: list[dict]  # the writer's lines


@pytest.fixture(scope="module")
def fresh(server_url: str) -> Iterator[dict]:
    """The catalogue of a database migrated from empty."""
    with scratch_database(server_url, "jobs_fresh") as url:
        db = DB.connect(url, size=2)
        migrate(db)
        yield catalogue(db)
        db.close()


def upgrade_under_load(url: str, tmp_path: Path) -> Upgrade:
    """migrate() on url while the legacy writer inserts, from BEFORE inserts
    ahead of it until AFTER seconds past it."""
    out = tmp_path / "inserts.jsonl"
    out.touch()
    writer = subprocess.Popen([sys.executable, str(LEGACY_WRITER), url, str(out)])
    try:
        wait_for(lambda: len(out.read_text().splitlines()) >= BEFORE, 30, what="the writer's first inserts")
        db = DB.connect(url, size=4)
        began = time.monotonic()
        try:
            migrate(db)
        finally:
            db.close()
        seconds = time.monotonic() - began
        time.sleep(AFTER)
    finally:
        writer.send_signal(signal.SIGTERM)
        assert writer.wait(timeout=30) == 0
    return Upgrade(seconds, [json.loads(line) for line in out.read_text().splitlines()])


def assert_the_application_was_served(upgrade: Upgrade) -> None:
    inserts = upgrade.inserts
    slowest = sorted(inserts, key=lambda i: i["took"])[-3:]
    longest = slowest[-1]
    print(
        f"\nupgrade in {upgrade.seconds:.1f}s; {len(inserts)} inserts, the longest waited {longest['took']:.3f}s"
        f" from {time.strftime('%H:%M:%S', time.localtime(longest['at']))}.{int(longest['at'] % 1 * 1000):03d}"
    )
    assert [i for i in inserts if i["error"]] == []
    assert longest["took"] < LONGEST_WAIT, slowest


def assert_every_insert_is_kept(db: DB, upgrade: Upgrade) -> None:
    rows = db.query(
        "SELECT id, queue, name, callsite, args FROM jobs WHERE id = ANY(%s) ORDER BY id",
        ([i["id"] for i in upgrade.inserts],),
    )
    assert rows == [(i["id"], "legacy", "legacy.Work", "app/enqueue.go:42", {"n": i["n"]}) for i in upgrade.inserts]


def run_pending(db: DB) -> None:
    """Every pending row runs, each queue's in its order."""
    for queue, name in db.query("SELECT DISTINCT queue, name FROM jobs WHERE status = 'pending'"):
        due = db.query("SELECT id FROM jobs WHERE status = 'pending' AND queue = %s ORDER BY id", (queue,))
        assert run_queue(db, queue, name) == [r[0] for r in due]
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'pending'") == (0,)


def run_queue(db: DB, queue: str, name: str) -> list[int]:
    """The ids of the queue's jobs, in the order a poller ran them until none was due."""
    ran: list[int] = []
    poller = make_poller(queue, db, {name: lambda job: ran.append(job.id) or "ok"})
    while poller.work_once() is not None:
        pass
    return ran


def seeded(db: DB) -> tuple[int, tuple]:
    """The seed rows written; the last id and the rows' digest."""
    print(f"\n{FINISHED:,} finished rows, {PENDING} pending")
    db.exec(SEED, {"finished": FINISHED, "pending": PENDING})
    db.exec("ANALYZE jobs")
    (last,) = db.query_row("SELECT max(id) FROM jobs")
    return last, db.query_row(DIGEST, {"last": last})


def in_new_york(url: str) -> None:
    """The server's zone when the old service wrote its timestamps: not UTC,
    so a conversion that read them in another zone would show."""
    db = DB.connect(url, size=1)
    db.exec(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = ''America/New_York''', current_database()); END $$"
    )
    db.close()


def upgrade_under_load_and_checked(url: str, tmp_path, last: int, digest: tuple, fresh) -> None:
    """The upgrade beside the application's writer; then the application was
    served, the seed rows are as they were, every insert is kept, the schema
    is a fresh one's, and every pending row runs."""
    upgrade = upgrade_under_load(url, tmp_path)
    db = DB.connect(url, size=4)
    try:
        assert_the_application_was_served(upgrade)
        assert db.query_row(DIGEST, {"last": last}) == digest
        assert_every_insert_is_kept(db, upgrade)
        assert catalogue(db) == fresh
        run_pending(db)
    finally:
        db.close()


def test_the_original_table_upgrades_while_the_application_writes(empty_database, tmp_path, fresh):
    in_new_york(empty_database)
    db = DB.connect(empty_database, size=4)
    try:
        with db.transaction() as tx:
            tx.exec(ORIGINAL)
        last, digest = seeded(db)
    finally:
        db.close()

    upgrade_under_load_and_checked(empty_database, tmp_path, last, digest, fresh)


def test_a_database_at_034_upgrades_while_the_application_writes(empty_database, server_url, tmp_path, fresh):
    as_administrator(empty_database, server_url, AT_034.read_text())
    db = DB.connect(empty_database, size=4)
    try:
        last, digest = seeded(db)
    finally:
        db.close()

    upgrade_under_load_and_checked(empty_database, tmp_path, last, digest, fresh)


def test_an_open_transaction_on_jobs_delays_the_upgrade_not_the_application(empty_database, tmp_path, caplog):
    """A person's transaction left open after a write to jobs: the upgrade
    waits for it to end, and the application's inserts never wait behind
    the upgrade's own wait for the table."""
    db = DB.connect(empty_database, size=2)
    with db.transaction() as tx:
        tx.exec(ORIGINAL)
    db.close()
    person = psycopg2.connect(empty_database)
    try:
        with person.cursor() as cur:
            cur.execute("UPDATE jobs SET status = status WHERE id = 1")
        gevent.spawn_later(HELD, person.commit)
        with caplog.at_level("WARNING", logger="jobs.migrate"):
            upgrade = upgrade_under_load(empty_database, tmp_path)
    finally:
        person.close()
    assert_the_application_was_served(upgrade)
    assert upgrade.seconds > HELD / 2
    assert any("waits for a lock another transaction holds" in r.getMessage() for r in caplog.records)


def test_an_original_table_given_a_primary_key_upgrades_to_the_same_schema(empty_database, fresh):
    """Some installs of the old service added the primary key it lacked: the
    swap drops it with the old id, and the new id's takes its name."""
    db = DB.connect(empty_database, size=2)
    try:
        with db.transaction() as tx:
            tx.exec(ORIGINAL)
            tx.exec("ALTER TABLE jobs ADD PRIMARY KEY (id)")
        migrate(db)
        assert catalogue(db) == fresh
    finally:
        db.close()


# --- an upgrade stopped midway ---------------------------------------------------

# migrate() in a process of its own, its batches a page each so that a kill
# lands among them.
KILLABLE = """
import sys
from lib.store import migrate
from lib.store.db import DB
migrate.BATCH_PAGES = 1
migrate.migrate(DB.connect(sys.argv[1], size=2))
"""


def backfilling(db: DB) -> bool:
    """002's first step is done and its batches have begun."""
    if db.query_row("SELECT to_regclass('schema_migration_steps') IS NULL")[0]:
        return False
    if db.query("SELECT step FROM schema_migration_steps WHERE version = 2") != [(1,)]:
        return False
    return db.query_row("SELECT count(new_id) FROM jobs")[0] > 0


def original_seeded(url: str, finished: int) -> tuple[int, tuple]:
    """The original table with finished rows and a few pending ones, in New
    York's zone; the last id and the rows' digest."""
    in_new_york(url)
    db = DB.connect(url, size=2)
    try:
        with db.transaction() as tx:
            tx.exec(ORIGINAL)
        db.exec(SEED, {"finished": finished, "pending": 10})
        (last,) = db.query_row("SELECT max(id) FROM jobs")
        return last, db.query_row(DIGEST, {"last": last})
    finally:
        db.close()


def test_an_upgrade_killed_in_its_batches_is_completed_by_the_next_run(empty_database, fresh, caplog):
    last, digest = original_seeded(empty_database, 20_000)
    db = DB.connect(empty_database, size=2)
    killable = subprocess.Popen([sys.executable, "-c", KILLABLE, empty_database], cwd=ROOT)
    try:
        wait_for(lambda: backfilling(db) or killable.poll() is not None, 60, what="002's batches")
        killable.send_signal(signal.SIGKILL)
        killable.wait(timeout=10)
        assert killable.returncode == -signal.SIGKILL, "it ended before it could be stopped midway"
        (filled, rows) = db.query_row("SELECT count(new_id), count(*) FROM jobs")
        assert 0 < filled < rows
        assert db.query_row("SELECT count(*) FROM schema_migrations WHERE version = 2") == (0,)

        with caplog.at_level("INFO", logger="jobs.migrate"):
            assert "002_jobs_extend" in migrate(db)
        said = [r.getMessage() for r in caplog.records]
        # Resumed at the step it was in, not from the start.
        assert not [line for line in said if "002_jobs_extend, step 1 of" in line], said
        assert [line for line in said if "002_jobs_extend, step 2 of" in line], said
        assert db.query_row(DIGEST, {"last": last}) == digest
        assert catalogue(db) == fresh
        assert db.query_row("SELECT count(*) FROM schema_migration_steps") == (0,)
    finally:
        killable.kill()
        db.close()


def test_a_concurrent_build_that_failed_is_built_again(empty_database, fresh):
    """A CONCURRENTLY build that fails leaves its index INVALID, which IF NOT
    EXISTS would keep: here one of 002's names, left by a build that met
    duplicates."""
    db = DB.connect(empty_database, size=2)
    try:
        with db.transaction() as tx:
            tx.exec(ORIGINAL)
        with pytest.raises(psycopg2.errors.UniqueViolation):
            db.exec("CREATE UNIQUE INDEX CONCURRENTLY jobs_claim ON jobs (queue)")
        assert db.query_row("SELECT indisvalid FROM pg_index WHERE indexrelid = 'jobs_claim'::regclass") == (False,)
        migrate(db)
        assert catalogue(db) == fresh
    finally:
        db.close()


def test_an_index_of_the_application_s_own_on_an_old_column_stops_the_upgrade_until_it_is_gone(empty_database, fresh):
    """The swap drops the old columns, and with them any index on one: the
    upgrade stops first, naming it, and goes on from there once it is gone.
    Meanwhile the application writes the old columns, from a session in
    another zone than the server's, and its times are read as the old
    service's are: in the server's zone."""
    last, digest = original_seeded(empty_database, 1_000)
    db = DB.connect(empty_database, size=2)
    try:
        db.exec("CREATE INDEX jobs_by_created ON jobs (created_at)")
        with pytest.raises(psycopg2.errors.RaiseException, match="index jobs_by_created would be dropped"):
            migrate(db)
        # Nothing swapped: the application still writes the old columns.
        assert db.query_row(
            "SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = 'jobs'::regclass AND attname = 'id'"
        ) == ("integer",)
        (meanwhile,) = db.query_row(
            "SET LOCAL TimeZone = 'UTC';"
            " INSERT INTO jobs (queue, name, created_at) VALUES ('caches', 'caches.Age', '2026-01-02 03:04:05')"
            " RETURNING id"
        )
        db.exec("DROP INDEX jobs_by_created")
        assert "002_jobs_extend" in migrate(db)
        assert db.query_row(DIGEST, {"last": last}) == digest
        assert catalogue(db) == fresh
        # 03:04:05 in New York, as the rows written before the upgrade read it.
        (created,) = db.query_row("SELECT created_at FROM jobs WHERE id = %s", (meanwhile,))
        assert created == datetime(2026, 1, 2, 8, 4, 5, tzinfo=UTC)
    finally:
        db.close()
