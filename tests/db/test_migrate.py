from datetime import UTC, datetime

import gevent
from tests_support import make_poller

from lib.background.leases import Leases
from lib.store.db import DB
from lib.store.migrate import migrate, migrations

# The original service's table and a few rows as it left them.
ORIGINAL = """
SET TIME ZONE 'America/New_York';
CREATE TABLE jobs (
  id SERIAL,
  queue text NOT NULL,
  name text NOT NULL,
  args jsonb DEFAULT '{}' NOT NULL,
  status text DEFAULT 'pending'::text NOT NULL,
  callsite text,
  created_at timestamp DEFAULT now() NOT NULL,
  started_at timestamp,
  finished_at timestamp
);
INSERT INTO jobs (queue, name, args, status, callsite, created_at, started_at, finished_at) VALUES
  ('apollo', 'apollo.Done', '{"id": 1}', 'ok', 'apollo/x.go:1', '2026-01-02 03:04:05', '2026-01-02 03:04:06', '2026-01-02 03:04:07'),
  ('apollo', 'apollo.Stuck', '{"id": 2}', 'started', 'apollo/x.go:2', '2026-01-02 03:04:05', '2026-01-02 03:05:00', NULL),
  ('caches', 'caches.Age', '{}', 'pending', 'clock.go:9', '2026-01-02 03:04:08', NULL, NULL),
  ('caches', 'caches.Age', '{}', 'pending', 'clock.go:9', '2026-01-02 03:04:09', NULL, NULL);
"""


def test_fresh_database_gets_every_migration_once(empty_database):
    db = DB.connect(empty_database, size=2)
    names = [name for _, name, _ in migrations()]
    assert migrate(db) == names
    assert migrate(db) == []
    assert [r[0] for r in db.query("SELECT name FROM schema_migrations ORDER BY version")] == names
    db.close()


def test_processes_starting_together_migrate_once(empty_database):
    pools = [DB.connect(empty_database, size=1) for _ in range(3)]
    racers = [gevent.spawn(migrate, pool) for pool in pools]
    gevent.joinall(racers, raise_error=True)
    # Taking turns, migration by migration: each applied by exactly one of them.
    applied = [name for g in racers for name in g.value]
    assert sorted(applied) == [name for _, name, _ in migrations()]
    for pool in pools:
        pool.close()


def test_original_table_upgrades_in_place(empty_database):
    db = DB.connect(empty_database, size=2)
    with db.transaction() as tx:
        tx.exec(ORIGINAL)
    before = db.query("SELECT id, queue, name, args, status, callsite FROM jobs ORDER BY id")

    with db.transaction() as tx:
        # The server's zone when the old service wrote those timestamps.
        tx.exec(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone = ''America/New_York''', current_database()); END $$"
        )
    db.close()
    db = DB.connect(empty_database, size=2)
    migrate(db)

    after = db.query("SELECT id, queue, name, args, status, callsite FROM jobs ORDER BY id")
    assert after == before
    # Each instant keeps its meaning: 03:04:05 in New York is 08:04:05 UTC.
    (created,) = db.query_row("SELECT created_at FROM jobs WHERE id = 1")
    assert created == datetime(2026, 1, 2, 8, 4, 5, tzinfo=UTC)
    types = dict(db.query("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'jobs'"))
    assert types["id"] == "bigint"
    assert types["created_at"] == "timestamp with time zone"
    assert {"priority", "run_at", "attempts", "max_attempts", "lease_until", "worker_id", "last_error"} <= set(types)
    assert db.query_row("SELECT count(*) FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'p'") == (
        1,
    )

    # The upgraded table works: the old pending rows run in order and a new
    # row continues the old id sequence.
    seen = []
    poller = make_poller("caches", db, {"caches.Age": lambda job: seen.append(job.id) or "ok"})
    assert poller.work_once() == "ok" and poller.work_once() == "ok"
    assert seen == [3, 4]
    from lib.insert import insert

    assert insert(db, "caches", "caches.Age") == 5

    # The old service's stuck started row is taken back at start.
    rescued = Leases(db).rescue(legacy_age=0)
    assert [(r[0], r[3]) for r in rescued] == [(2, "err: interrupted")]
    assert db.query_row("SELECT status FROM jobs WHERE id = 1") == ("ok",)
    db.close()
