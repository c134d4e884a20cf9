"""An enqueue notifies its queue only when a poller of it sleeps
(sql/rules/wakeups.sql): a busy queue's enqueues commit without the server's
notify lock, an idle queue still wakes at once, and no interleaving of a
poller falling asleep with an enqueue committing leaves a job waiting for the
fallback poll."""

import time
import uuid

import gevent
import psycopg2
import pytest
from gevent.event import Event
from tests_support import make_poller, wait_for

from lib.insert import insert
from lib.store.wakeups import Listener


class Recorder:
    def __init__(self) -> None:
        self.woken: list[str] = []

    def wake(self, queue: str) -> None:
        self.woken.append(queue)


@pytest.fixture
def recorder(database_url):
    recorder = Recorder()
    listener = Listener(database_url, recorder.wake, lambda: None)
    stop = Event()
    running = gevent.spawn(listener.run, stop)
    assert listener.listening.wait(10)
    yield recorder
    stop.set()
    running.kill()


def settled(db, recorder: Recorder) -> list[str]:
    """The queues woken so far, once every notification already committed has
    arrived (a marker notified now is delivered after them)."""
    marker = f"marker-{uuid.uuid4().hex}"
    db.exec("SELECT pg_notify('jobs', %s)", (marker,))
    wait_for(lambda: marker in recorder.woken, 10)
    recorder.woken.remove(marker)
    return recorder.woken


def test_a_claimed_queue_is_not_notified_until_a_poller_sleeps(db, recorder):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"})
    assert poller.claim() is None  # nothing due: the poller goes to sleep
    insert(db, "q", "q.N")  # a poller sleeps: notified
    assert settled(db, recorder) == ["q"]
    assert poller.work_once() == "ok"  # the claim says the queue is awake
    insert(db, "q", "q.N")
    insert(db, "q", "q.N")
    assert settled(db, recorder) == ["q"], "a queue whose poller is awake was notified"
    assert db.query_row("SELECT jobs_sleep('q')") == ("due",)  # no sleep with jobs due
    assert poller.work_once() == "ok" and poller.work_once() == "ok"
    assert poller.claim() is None
    insert(db, "q", "q.N")
    assert settled(db, recorder) == ["q", "q"]


def test_a_queue_no_poller_sleeps_on_is_not_notified(db, recorder):
    """No worker runs it, or none has gone idle yet: nobody to wake, and its
    enqueues commit without the notify lock."""
    insert(db, "fresh", "fresh.N")
    db.exec("INSERT INTO jobs (queue, name) VALUES ('fresh', 'fresh.N')")  # by hand: the statement trigger's way
    assert settled(db, recorder) == []


def test_a_poller_cannot_sleep_while_an_enqueue_of_its_queue_is_in_flight(db, database_url):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"})
    app = psycopg2.connect(database_url)
    try:
        with app.cursor() as cur:
            insert(cur, "q", "q.N")  # uncommitted
            assert db.query_row("SELECT jobs_sleep('q')") == ("enqueuing",)
            found = poller.steps.claim(None, 0)
            assert found.job is None and found.wait == 0.5  # it looks again in half a second
        app.commit()
        assert db.query_row("SELECT jobs_sleep('q')") == ("due",)
        assert poller.work_once() == "ok"
    finally:
        app.close()


def test_a_job_committed_as_its_poller_falls_asleep_starts_at_once(db, database_url):
    """The poller's queue is busy (its mark cleared) when an application
    enqueues in a transaction it keeps open: that enqueue sees no sleeper and
    will not notify. The running job ends meanwhile, the poller finds the queue
    empty and goes to sleep, and the application commits: the job starts
    within a second or so, not at the fallback poll 120 s away."""
    release = Event()
    started: dict[str, float] = {}

    def handler(job):
        started[job.args["n"]] = time.monotonic()
        if job.args["n"] == "first":
            release.wait(20)
        return "ok"

    poller = make_poller("q", db, {"q.N": handler}, poll_interval=120)
    listener = Listener(database_url, lambda queue: poller.wake(), poller.wake)
    stop = Event()
    parts = [gevent.spawn(listener.run, stop), gevent.spawn(poller.poll, stop)]
    app = psycopg2.connect(database_url)
    try:
        assert listener.listening.wait(10)
        insert(db, "q", "q.N", {"n": "first"})
        wait_for(lambda: "first" in started, 10)
        with app.cursor() as cur:
            insert(cur, "q", "q.N", {"n": "second"})  # in flight: the queue is busy, no wakeup wanted
        release.set()
        # The first job's outcome is written and the poller finds nothing it can see.
        wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE args->>'n' = 'first'")[0] == "ok", 10)
        gevent.sleep(0.5)  # long enough to go to sleep, were it allowed to
        app.commit()
        committed = time.monotonic()
        wait_for(lambda: "second" in started, 10, what="the job committed as its poller fell asleep to start")
        assert started["second"] - committed < 2.0
    finally:
        app.close()
        stop.set()
        poller.wake()
        gevent.joinall(parts, timeout=10)
        gevent.killall(parts)
