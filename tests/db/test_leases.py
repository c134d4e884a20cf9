"""Leases, by planting rows and passing the time in: the fence, the rescue that
spares what its worker holds, the place in the queue a rescued job keeps."""

import os
import time

import gevent
from gevent.event import Event
from tests_support import make_poller, wait_for

from lib.background import worker_registry
from lib.background.leases import Leases, new_worker_id
from lib.insert import insert
from lib.run.runtime import Runtime
from lib.store.sql import Q


def test_a_worker_id_is_made_per_start_not_per_import(db):
    assert new_worker_id() != new_worker_id()
    assert Leases(db).worker_id != Leases(db).worker_id
    assert f":{os.getpid()}:" in new_worker_id()


def test_a_job_is_fenced_once_its_lease_may_lapse_unrenewed(db):
    leases = Leases(db, lease=30)
    fenced = []
    claimed = 1000.0
    leases.hold(1, claimed, lambda: fenced.append(1))
    leases.hold(2, claimed + 20, lambda: fenced.append(2))
    assert leases.fence_lapsed(claimed + 30 - leases.margin - 0.01) == []
    assert leases.fence_lapsed(claimed + 30 - leases.margin) == [1]
    assert fenced == [1]
    # Once only: the handler is stopped once, and the job stays held until its slot lets go.
    assert leases.fence_lapsed(claimed + 60) == [2]
    assert fenced == [1, 2]
    leases.release(1)
    assert leases.held_ids() == [2]


def test_a_renewal_moves_the_fence_and_a_row_rescued_elsewhere_is_not_renewed(db):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"}, runtime=Runtime.alone(db, lease=30))
    leases = poller.leases
    insert(db, "q", "q.N")
    insert(db, "q", "q.N")
    mine, taken = poller.claim(), make_poller("q", db, {"q.N": lambda job: "ok"}, concurrency=2).claim(slot=1)
    leases.hold(mine.id, 0.0, lambda: None)
    leases.hold(taken.id, 0.0, lambda: None)  # held here, but started by another worker
    before = time.monotonic()
    assert leases.heartbeat() == 1
    assert leases.held[mine.id].good_until >= before + 30 - leases.margin
    assert leases.held[taken.id].good_until == 0.0 + 30 - leases.margin
    assert leases.fence_lapsed() == [taken.id]


def test_the_rescue_spares_rows_its_worker_holds_even_past_their_lease(db):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"})
    held, lost = insert(db, "q", "q.N"), insert(db, "r", "r.N")
    job = poller.claim()
    make_poller("r", db, {"r.N": lambda job: "ok"}).claim()
    poller.leases.hold(job.id, time.monotonic(), lambda: None)
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 minute'")
    assert [r[0] for r in poller.leases.rescue()] == [lost]
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (held,)) == ("started",)
    # Another worker's rescue takes it: it is not that worker's to spare.
    assert [r[0] for r in Leases(db).rescue()] == [held]


def test_a_rescued_job_keeps_its_place_in_the_queue(db):
    order = []
    poller = make_poller("q", db, {"q.N": lambda job: order.append(job.id) or "ok"})
    first = insert(db, "q", "q.N", max_attempts=2)
    poller.claim()
    later = [insert(db, "q", "q.N") for _ in range(3)]
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (first,))
    assert Leases(db).rescue() == [(first, "q", "q.N", "pending")]
    while poller.work_once():
        pass
    assert order == [first, *later]


def test_a_job_interrupted_by_shutdown_with_attempts_left_keeps_its_place(db):
    order = []

    def handler(job):
        if not order:
            order.append(job.id)
            gevent.sleep(30)  # cut off by the shutdown kill
        order.append(job.id)
        return "ok"

    poller = make_poller("q", db, {"q.N": handler})
    first = insert(db, "q", "q.N", max_attempts=2)
    later = insert(db, "q", "q.N")
    runner = gevent.spawn(poller.work_once)
    wait_for(lambda: order)
    runner.kill()
    assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (first,)) == ("pending", 1)
    while poller.work_once():
        pass
    assert order == [first, first, later]


def test_an_idle_worker_rescues_once_a_lease_and_a_busy_one_every_third(db):
    leases = Leases(db, lease=30)
    assert leases.rescue_period() == 30
    leases.hold(1, time.monotonic(), lambda: None)
    assert leases.rescue_period() == 10
    leases.release(1)
    assert leases.rescue_period() == 30


def test_the_rescue_and_the_registry_refresh_commit_as_one_transaction(db):
    """One commit a rescue period for both: the rescued row and the worker's
    registry row carry the same writing transaction (xmin)."""
    lost = insert(db, "q", "q.N")
    make_poller("q", db, {"q.N": lambda job: "ok"}).claim()
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second'")
    leases = Leases(db)
    leases.seen = worker_registry.register(db, leases.worker_id, ["q"], leases.lease)
    assert [r[0] for r in leases.rescue()] == [lost]
    [(job_xmin,)] = db.query("SELECT xmin::text FROM jobs WHERE id = %s", (lost,))
    [(worker_xmin,)] = db.query("SELECT xmin::text FROM workers WHERE id = %s", (leases.worker_id,))
    assert job_xmin == worker_xmin


def test_an_idle_lease_keeper_sends_one_rescue_a_lease(db):
    leases = Leases(db, lease=1.0)
    rescues = []
    refresh = worker_registry.register(db, leases.worker_id, ["q"], leases.lease)
    leases.seen = lambda runner: rescues.append(time.monotonic()) or refresh(runner)
    stop = Event()
    keeper = gevent.spawn(leases.run_rescue, stop)
    try:
        gevent.sleep(2.5)  # rescues at about 0, 1 and 2 s; a third of a lease would make eight
        idle = len(rescues)
        leases.hold(1, time.monotonic(), lambda: None)  # busy: every third of a lease
        gevent.sleep(2.0)
        busy = len(rescues) - idle
    finally:
        stop.set()
        keeper.get(timeout=5)
    assert 2 <= idle <= 4
    assert busy >= 4


def test_a_renewal_rewrites_no_index_entry_of_its_rows(db):
    """A renewal changes lease_until alone, which no index holds, so each row
    is renewed in place (a HOT update): a worker renewing its running rows
    every few seconds adds no entries to the table's indexes, the GIN index
    of args among them."""
    for _ in range(3):
        insert(db, "q", "q.N")
    db.exec(
        "UPDATE jobs SET status = 'started', attempts = 1, worker_id = 'w', slot = id, "
        "started_at = now(), lease_until = now() + interval '30 seconds'"
    )
    ids = [row[0] for row in db.query("SELECT id FROM jobs ORDER BY id")]
    counts = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
    with db.transaction() as tx:
        # This backend's counts, which may hold its earlier transactions' too
        # until they are reported: the renewal's are the difference.
        before = tx.query_row(counts)
        renewed = tx.query(Q.job_heartbeat, {"lease": 30, "worker_id": "w", "ids": ids})
        after = tx.query_row(counts)
    assert sorted(row[0] for row in renewed) == ids
    assert (after[0] - before[0], after[1] - before[1]) == (3, 3)
