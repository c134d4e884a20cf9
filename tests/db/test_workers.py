"""The worker registry: a worker's row at start, its refresh from the lease
keeper, a dead worker still holding rows listed as dead, the daily clean-up."""

import os
import socket
from datetime import timedelta

import gevent
import pytest
from factory import make_job
from gevent.event import Event
from tests_support import make_poller, running_worker, wait_for

import worker
from lib.background import worker_registry
from lib.background.leases import Leases
from lib.insert import insert
from lib.operate import overview
from lib.run.queue import Queue
from lib.setup.parsers import SettingError
from lib.setup.settings import Settings
from queues import maintenance


def _row(db, worker_id: str):
    return db.query_row(
        "SELECT host, pid, queues, started_at, last_seen, lease_seconds FROM workers WHERE id = %s", (worker_id,)
    )


def _plant(db, worker_id: str, seen_ago: str, lease: float = 30.0) -> None:
    db.exec(
        "INSERT INTO workers VALUES (%s, 'gone-host', 4242, '{q}', now() - interval '3 days', now() - %s::interval, %s)",
        (worker_id, seen_ago, lease),
    )


def test_a_registered_worker_is_listed_alive_with_its_queues(db):
    worker_registry.register(db, "w-1", ["b", "a"], 30.0)
    host, pid, queues, started_at, last_seen, lease = _row(db, "w-1")
    assert (host, pid, queues, lease) == (socket.gethostname(), os.getpid(), ["a", "b"], 30.0)
    [info] = overview.workers(db)
    assert info == overview.WorkerInfo("w-1", host, pid, started_at, last_seen, ["a", "b"], True, 0)
    # Three of its own lease periods unseen, it is dead; with nothing held, no longer listed.
    assert overview.workers(db, now=last_seen + timedelta(seconds=89)) != []
    assert overview.workers(db, now=last_seen + timedelta(seconds=91)) == []


def test_the_refresh_moves_last_seen_and_writes_a_forgotten_row_again(db):
    refresh = worker_registry.register(db, "w-1", ["a"], 30.0)
    started_at = _row(db, "w-1")[3]
    db.exec("UPDATE workers SET last_seen = now() - interval '1 hour'")
    refresh()
    assert _row(db, "w-1")[4] > started_at
    db.exec("DELETE FROM workers")
    refresh()
    assert _row(db, "w-1")[3] == started_at  # the same start, written again


def test_the_lease_keeper_refreshes_last_seen_on_its_period(db):
    leases = Leases(db, lease=0.6)
    leases.seen = worker_registry.register(db, leases.worker_id, ["a"], leases.lease)
    db.exec("UPDATE workers SET last_seen = now() - interval '1 hour'")
    stop = Event()
    keeper = gevent.spawn(leases.run_rescue, stop)
    try:
        wait_for(lambda: overview.workers(db) != [], 5)
    finally:
        stop.set()
        keeper.get(timeout=5)


def test_a_dead_worker_holding_rows_is_listed_dead_and_a_live_one_with_its_count(db):
    worker_registry.register(db, "live", ["q"], 30.0)
    make_job(db, status="started", worker_id="live")
    _plant(db, "dead-holding", "10 minutes")
    make_job(db, "q2", status="started", worker_id="dead-holding")
    make_job(db, "q3", status="started", worker_id="dead-holding")
    _plant(db, "dead-idle", "10 minutes")
    # A long lease refreshes seldom: ten minutes unseen is still alive with a 300 s lease.
    _plant(db, "slow", "10 minutes", lease=300.0)
    got = {w.id: (w.alive, w.holding) for w in overview.workers(db)}
    assert got == {"live": (True, 1), "dead-holding": (False, 2), "slow": (True, 0)}


def test_the_worker_registers_at_start_and_leaves_when_it_stops(db):
    registry = [lambda db: Queue("q", {"q.N": lambda job: "ok"})]
    with running_worker(db, registry, Settings(http_addr=None, lease_seconds=3)):
        wait_for(lambda: overview.workers(db) != [], 10)
        [info] = overview.workers(db)
        assert (info.queues, info.alive, info.pid) == (["q"], True, os.getpid())
        db.exec("UPDATE workers SET last_seen = now() - interval '1 hour'")
        wait_for(lambda: overview.workers(db) != [], 5)  # refreshed by its lease keeper, at least once a lease (3 s)
    assert db.query_row("SELECT count(*) FROM workers") == (0,)


def test_the_daily_clean_up_forgets_workers_unseen_for_a_day(db):
    worker_registry.register(db, "live", ["q"], 30.0)
    _plant(db, "yesterday", "23 hours")
    _plant(db, "gone", "25 hours")
    _plant(db, "gone-holding", "25 hours")
    make_job(db, status="started", worker_id="gone-holding")
    insert(db, "maintenance", "maintenance.CleanUpJobs")
    done = make_poller(maintenance.make_worker(db), db).work_once()
    assert done == "ok: nothing old enough; forgot 1 workers unseen for a day"
    assert {r[0] for r in db.query("SELECT id FROM workers")} == {"live", "yesterday", "gone-holding"}


def test_jobs_queues_runs_only_the_queues_it_names(db, caplog):
    """Replicas that deal the queues out: this process runs a and leaves b's
    rows to another, without calling them rows no worker runs."""
    for queue in ("a", "b"):
        insert(db, queue, f"{queue}.N")
    registry = [lambda db, q=q: Queue(q, {f"{q}.N": lambda job: "ok"}) for q in ("a", "b")]
    with running_worker(db, registry, Settings(http_addr=None, queues=frozenset({"a"}))):
        wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE queue = 'a'") == ("ok",), 10)
        [info] = overview.workers(db)
        assert info.queues == ["a"]
    assert db.query_row("SELECT status FROM jobs WHERE queue = 'b'") == ("pending",)
    assert not [r for r in caplog.records if "no worker runs" in r.getMessage()]


def test_jobs_queues_naming_an_unregistered_queue_is_refused(db):
    with pytest.raises(SettingError, match="JOBS_QUEUES names queues that are not registered: c"):
        worker.run(db, [lambda db: Queue("a", {"a.N": lambda job: "ok"})], Settings(queues=frozenset({"a", "c"})))


def test_a_worker_registers_the_names_it_handles_and_counts_for_them_while_alive(db):
    worker_registry.register(db, "w-1", ["a", "b"], 30.0, [("a", ["a.X"]), ("b", ["b.Y"]), ("a", ["a.Z"])])
    assert db.query_row("SELECT handles FROM workers WHERE id = 'w-1'") == ({"a": ["a.X", "a.Z"], "b": ["b.Y"]},)
    assert worker_registry.handled_elsewhere(db, "a", "a.Z")
    assert not worker_registry.handled_elsewhere(db, "a", "b.Y")
    assert not worker_registry.handled_elsewhere(db, "c", "a.X")
    # As the status command reads alive: within three of the worker's own leases.
    db.exec("UPDATE workers SET last_seen = now() - interval '89 seconds'")
    assert worker_registry.handled_elsewhere(db, "a", "a.Z")
    db.exec("UPDATE workers SET last_seen = now() - interval '91 seconds'")
    assert not worker_registry.handled_elsewhere(db, "a", "a.Z")
