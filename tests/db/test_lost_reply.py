"""A write that claims a job can commit while its reply never arrives (a cut
connection, a client-side timeout). The worker then settles what committed and
runs the job it claimed, instead of leaving it to the lease."""

import gevent
import psycopg2
import pytest
from gevent.event import Event
from proxy import Proxy
from tests_support import make_poller, wait_for

from lib.insert import insert
from lib.run.poller import Poller
from lib.run.runtime import Runtime
from lib.store.db import DB

LONG_LEASE = 120.0  # a job left to its lease would sit this long


@pytest.fixture
def proxied(database_url):
    proxy = Proxy(database_url)
    pool = DB.connect(proxy.url, size=4)
    yield proxy, pool
    pool.close()
    proxy.close()


def _status_attempts(db, job_id):
    return db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,))


def _polling(poller: Poller):
    stop = Event()
    return stop, gevent.spawn(poller.poll, stop)


def _stopped(poller: Poller, stop: Event, loop) -> None:
    stop.set()
    poller.wake()
    loop.get(timeout=10)


def test_the_next_job_claimed_with_an_outcome_whose_reply_was_lost_runs_here(db, proxied, caplog):
    proxy, pool = proxied
    ran = []

    def first(job):
        ran.append(job.id)
        # Its outcome goes with the claim of the next job; that reply is lost.
        proxy.drop_next_reply()
        return "ok"

    handlers = {"lost.Warm": lambda job: "ok", "lost.First": first, "lost.Next": lambda job: ran.append(job.id) or "ok"}
    poller = make_poller("lost", pool, handlers, runtime=Runtime.alone(pool, lease=LONG_LEASE))
    # The warm-up job's outcome prepares the statements on the connection, so
    # the reply dropped is the combined write's, not a PREPARE's.
    insert(db, "lost", "lost.Warm")
    a, b = insert(db, "lost", "lost.First"), insert(db, "lost", "lost.Next")
    stop, loop = _polling(poller)
    try:
        wait_for(lambda: _status_attempts(db, b) == ("ok", 1), 20)
    finally:
        _stopped(poller, stop, loop)
    assert proxy.dropped == 1
    assert ran == [a, b]
    assert _status_attempts(db, a) == ("ok", 1)
    assert any("claimed though the reply was lost" in r.getMessage() for r in caplog.records)


def test_a_job_whose_claim_reply_was_lost_runs_here(db, proxied):
    proxy, pool = proxied
    ran = []
    runtime = Runtime.alone(pool, lease=LONG_LEASE)
    poller = make_poller(
        "lost", pool, {"lost.N": lambda job: ran.append(job.id) or "ok"}, poll_interval=60, runtime=runtime
    )
    stop, loop = _polling(poller)
    try:
        # The loop's first claim found nothing; it sleeps until woken.
        wait_for(lambda: pool.query_row("SELECT 1"), 5)
        gevent.sleep(0.2)
        proxy.drop_next_reply()
        job_id = insert(db, "lost", "lost.N")
        poller.wake()
        wait_for(lambda: _status_attempts(db, job_id) == ("ok", 1), 20)
    finally:
        _stopped(poller, stop, loop)
    assert proxy.dropped == 1
    assert ran == [job_id]


def test_a_claim_that_timed_out_on_a_row_lock_is_ended_not_orphaned(db, database_url):
    """The outcome and the next claim time out waiting on a lock another
    session holds on the next row. The server would go on and commit that
    claim once the lock is released, for nobody; the worker ends that server
    process first, writes the outcome alone, and later claims the row itself."""
    ran = []
    poller = make_poller(
        "locked", db, {"locked.N": lambda job: ran.append(job.id) or "ok"}, runtime=Runtime.alone(db, lease=LONG_LEASE)
    )
    a, b = insert(db, "locked", "locked.N"), insert(db, "locked", "locked.N")
    locker = psycopg2.connect(database_url)
    try:
        with locker.cursor() as cur:
            cur.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (b,))
        stop, loop = _polling(poller)
        try:
            wait_for(lambda: _status_attempts(db, a) == ("ok", 1), 20)
            locker.commit()
            wait_for(lambda: _status_attempts(db, b) == ("ok", 1), 20)
        finally:
            _stopped(poller, stop, loop)
    finally:
        locker.close()
    assert ran == [a, b]
