"""The doctor's judgement alone (lib/operate/doctor.py): vitals written by
hand, each figure judged against its thresholds; and the watch's timing of
holds it cannot see the start of (lib/store/vitals.py Sightings)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from lib.operate import doctor
from lib.store.vitals import Holder, Sightings, Unowned, Vitals

NOW = datetime(2026, 11, 30, 15, 0, tzinfo=UTC)
T = doctor.Thresholds()


def vitals(**fields) -> Vitals:
    base = Vitals(
        database="jobs", role="jobs", superuser=False, reads_all_stats=False, holders=[], has_jobs=True,
        live_rows=100_000, dead_rows=0, last_vacuum=None, last_autovacuum=NOW - timedelta(minutes=3),
        last_analyze=None, last_autoanalyze=NOW - timedelta(minutes=3), jobs_xid_age=1_000,
        database_xid_age=2_000, notify_usage=0.0, table_bytes=8192, total_bytes=65536,
        indexes=[("jobs_pkey", 16384), ("jobs_claim", 8192)], now=NOW,
    )  # fmt: skip
    return replace(base, **fields)


def transaction(pid=1234, seconds=7200.0, xids=50, **fields) -> Holder:
    return Holder("transaction", xids, seconds, "900", pid=pid, **{"role": "app", "application": "psql", **fields})


def test_a_healthy_database_is_ok_throughout():
    found = doctor.findings(vitals(), [], T)
    assert [(f.name, f.verdict) for f in found] == [
        ("horizon", "ok"), ("replication slots", "ok"), ("jobs dead rows", "ok"), ("jobs size", "ok"),
        ("jobs vacuum", "ok"), ("notify queue", "ok"), ("transaction-ID age", "ok"), ("migrations", "ok"),
    ]  # fmt: skip
    assert doctor.worst(found) == "ok"


def test_a_transaction_open_two_hours_is_bad_and_says_how_to_end_it():
    found = doctor.horizon(vitals(holders=[transaction(), transaction(pid=99, seconds=2.0, xids=10)]), T)
    assert found.verdict == "bad"
    assert found.summary == "transaction pid 1234 (psql, role app) open 2h00m holds it, xmin age 50"
    assert found.advice == (
        "every finished job's dead rows stay until it ends;"
        " end it with SELECT pg_terminate_backend(1234), or ask its owner to commit or roll back"
    )
    assert doctor.horizon(vitals(holders=[transaction(seconds=400.0)]), T).verdict == "warning"
    assert doctor.horizon(vitals(holders=[transaction(seconds=30.0)]), T).verdict == "ok"


def test_a_hold_whose_age_is_hidden_is_judged_by_how_far_back_it_holds():
    hidden = transaction(seconds=None, xids=2_000_000, visible=False, role="postgres")
    found = doctor.horizon(vitals(holders=[hidden]), T)
    assert found.verdict == "bad" and "xmin age 2,000,000" in found.summary
    assert "open for how long: not visible" in found.details[0]
    assert "GRANT pg_read_all_stats TO jobs" in found.details[-1]
    slot = Holder("slot", 200_000, None, "800", name="standby_1", slot_type="physical", active=True, wal_bytes=0)
    assert doctor.horizon(vitals(holders=[slot]), T).verdict == "warning"


def test_dead_rows_are_judged_by_their_share_past_a_floor_and_blame_a_held_horizon():
    assert doctor.dead_rows(vitals(dead_rows=9_000, live_rows=100), T).verdict == "ok"  # under the floor
    assert doctor.dead_rows(vitals(dead_rows=30_000, live_rows=100_000), T).verdict == "warning"
    bad = doctor.dead_rows(vitals(dead_rows=300_000, live_rows=100_000), T)
    assert bad.verdict == "bad" and "VACUUM (VERBOSE) jobs" in bad.advice
    held = doctor.dead_rows(vitals(dead_rows=300_000, live_rows=100_000, holders=[transaction()]), T)
    assert held.advice.startswith("they stay while transaction pid 1234 (psql, role app) holds the horizon")


def test_vacuum_notify_and_xid_age_verdicts():
    stale = vitals(dead_rows=50_000, last_autovacuum=NOW - timedelta(days=2))
    assert doctor.vacuum(stale, T).verdict == "warning"
    assert doctor.vacuum(vitals(last_autovacuum=None), T).verdict == "ok"  # nothing to vacuum
    for off in ("server", "table"):
        assert doctor.vacuum(vitals(autovacuum_off=off), T).verdict == "warning"
    assert doctor.notify(vitals(notify_usage=0.2), T).verdict == "warning"
    assert doctor.notify(vitals(notify_usage=0.6), T).verdict == "bad"
    assert doctor.xid_age(vitals(database_xid_age=600_000_000), T).verdict == "warning"
    assert doctor.xid_age(vitals(jobs_xid_age=1_600_000_000), T).verdict == "bad"


def test_the_migration_check_is_bad_for_an_object_and_a_warning_for_the_database_alone():
    function = Unowned("function", "jobs_due(text)", "admin", "ALTER FUNCTION jobs_due(text) OWNER TO jobs")
    database = Unowned("database", "jobs", "postgres", "ALTER DATABASE jobs OWNER TO jobs")
    assert doctor.migrations(vitals(), [function, database]).verdict == "bad"
    assert doctor.migrations(vitals(), [database]).verdict == "warning"


def test_a_reading_without_its_table_says_to_migrate():
    bare = vitals(has_jobs=False, live_rows=None, dead_rows=None, jobs_xid_age=None, table_bytes=None)
    found = doctor.findings(bare, [], T)
    assert doctor.worst(found) == "warning"
    assert "worker.py migrate" in next(f for f in found if f.name == "jobs dead rows").advice


def test_sightings_time_a_hidden_hold_from_its_first_look_and_forget_it_once_gone():
    seen = Sightings()
    hidden = transaction(seconds=None, visible=False)
    seen.look([hidden], 100.0)
    seen.look([hidden], 160.0)
    assert seen.held_for(hidden, 160.0) == 60.0
    seen.look([], 170.0)
    seen.look([hidden], 180.0)
    assert seen.held_for(hidden, 180.0) == 0.0  # ended and held again: a new hold
    visible = transaction(seconds=500.0)
    seen.look([visible], 200.0)
    assert seen.held_for(visible, 200.0) == 500.0
