"""A queue's concurrency set at run time (`worker.py scale`, migration 025):
read by every claim from job_queues, bounded by the definition's."""

import time

import gevent
import pytest
from gevent.event import Event
from tests_support import make_poller, wait_for

from lib.insert import Job, insert_many
from lib.operate.queue_state import scale
from lib.run.runtime import Runtime
from lib.run.steps import Ask, batch_step
from lib.store.db import DB
from lib.store.wakeups import Listener


def ok(job):
    return "ok"


def test_slots_above_the_concurrency_set_claim_nothing(db):
    p = make_poller("s", db, {"s.N": ok}, concurrency=4)
    insert_many(db, [Job("s", "s.N") for _ in range(8)])
    scale(db, "s", 2, "test")
    got = [p.steps.claim(None, slot) for slot in range(4)]
    assert [g.job is not None for g in got] == [True, True, False, False]
    assert got[2].wait is None and got[3].wait is None  # nothing to wait for: woken when scaled up
    # In one batch too: the slots above are not free.
    rows = db.query(*batch_step([Ask(None, p.steps.params(None, slot)) for slot in range(4)]))
    assert [row[2] for row in rows if row[2] is not None] == []
    scale(db, "s", None, "test")  # back to the definition's 4
    rows = db.query(*batch_step([Ask(None, p.steps.params(None, slot)) for slot in range(4)]))
    assert sorted(row[10] for row in rows if row[2] is not None) == [2, 3]
    assert db.query_row("SELECT scaled_to, scaled_by FROM job_queues WHERE queue = 's'") == (None, "test")


def test_scale_refuses_what_is_not_a_concurrency(db):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            scale(db, "s", bad, "test")
    with pytest.raises(ValueError, match="who set it"):
        scale(db, "s", 2, " ")


def test_scaling_a_running_queue_from_1_to_4_and_back_across_two_processes(db, database_url):
    """Two processes (a pool, a runtime and a LISTEN connection each) run one
    queue of definition concurrency 4, with jobs of 50 ms. Set to 1, at most
    one job runs; set to 4, four run within a second, never more; back to 1,
    once the jobs started before are done, one again. Counted by the
    handlers themselves, and by the started rows. Both processes ask for
    every slot all along; which of them gets a slot is a race, and the
    bound holds for the two together."""
    running, most = 0, 0

    def handle(job):
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            gevent.sleep(0.05)
        finally:
            running -= 1
        return "ok"

    pools = [DB(database_url, size=4, application_name=f"jobs-p{n}") for n in range(2)]
    stop = Event()
    scale(db, "sc", 1, "test")
    insert_many(db, [Job("sc", "sc.N") for _ in range(3000)])
    pollers = [
        make_poller("sc", pool, {"sc.N": handle}, concurrency=4, runtime=Runtime.alone(pool, worker_id=f"p{n}"))
        for n, pool in enumerate(pools)
    ]
    listeners = [Listener(database_url, lambda queue, p=p: p.wake(), p.wake) for p in pollers]
    greenlets = [gevent.spawn(listener.run, stop) for listener in listeners]
    for listener in listeners:
        assert listener.listening.wait(10)
    greenlets += [gevent.spawn(p.poll, stop) for p in pollers]

    def started() -> int:
        return db.query_row("SELECT count(*) FROM jobs WHERE queue = 'sc' AND status = 'started'")[0]

    def watch(seconds: float) -> int:
        """The most started rows seen over this long."""
        seen, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            seen = max(seen, started())
            gevent.sleep(0.01)
        return seen

    try:
        wait_for(lambda: most >= 1, 10)
        assert watch(1.0) <= 1 and most == 1
        scale(db, "sc", 4, "test")
        scaled_at = time.monotonic()
        wait_for(lambda: running == 4, 5, every=0.005)
        assert time.monotonic() - scaled_at < 1.0
        assert watch(1.0) <= 4 and most == 4
        scale(db, "sc", 1, "test")
        gevent.sleep(0.3)  # the jobs started before it end (50 ms each)
        most = running
        assert watch(1.0) <= 1 and most <= 1
    finally:
        stop.set()
        for p in pollers:
            p.wake()
        gevent.joinall(greenlets, timeout=10)
        for pool in pools:
            pool.close()
