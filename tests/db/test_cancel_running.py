"""An operator's cancel of a started job (lib/operate/cancel.py): the worker
running it hears it (the listener's NOTIFY, or a renewal's answer when that
was lost), throws JobCancelled into the handler at once and again while it
goes on, and ends the job `skip: cancelled by <who>`, counted, not retried,
with none of its follow-ups. A handler that will not stop is fenced when its
lease, no longer renewed, lapses, and the rescue ends its row cancelled."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import gevent
from gevent.event import Event
from tests_support import make_poller, wait_for

from lib.background.leases import CANCEL_GRACE, Leases
from lib.insert import insert
from lib.operate.cancel import cancel
from lib.operate.redrive import redrive
from lib.run.runtime import Runtime
from lib.store.wakeups import Listener

CANCELLED = "skip: cancelled by operator"


def row(db, job_id: int) -> tuple:
    return db.query_row(
        "SELECT status, attempts, finished_at IS NOT NULL, last_error, cancel_requested FROM jobs WHERE id = %s",
        (job_id,),
    )


@contextmanager
def listening(database_url: str, leases: Leases) -> Iterator[Listener]:
    """The worker's LISTEN connection, its cancels handed to leases as worker.run does."""
    listener = Listener(database_url, lambda queue: None, lambda: None, cancel=leases.cancel)
    stop = Event()
    greenlet = gevent.spawn(listener.run, stop)
    try:
        assert listener.listening.wait(10)
        yield listener
    finally:
        stop.set()
        greenlet.kill()


@contextmanager
def keeping_leases(leases: Leases, *, rescue: bool = False) -> Iterator[None]:
    """The lease keeper as a worker runs it: the renewal thread and the fence,
    and the rescue when asked."""
    stop = Event()
    parts = [gevent.spawn(leases.run, stop)] + ([gevent.spawn(leases.run_rescue, stop)] if rescue else [])
    try:
        yield
    finally:
        stop.set()
        gevent.joinall(parts, timeout=10)


def started(db, job_id: int) -> None:
    wait_for(lambda: row(db, job_id)[0] == "started", 10)


def test_a_sleeping_handler_is_stopped_within_two_seconds_and_ends_cancelled_not_retried(db, database_url):
    began = Event()
    caught: list[str] = []

    def sleeps(job):
        began.set()
        try:
            gevent.sleep(60)
        except BaseException as exc:
            caught.append(type(exc).__name__)
            raise
        return "ok"

    poller = make_poller("q", db, {"q.Sleep": sleeps}, max_attempts=3)
    job_id = insert(db, "q", "q.Sleep")
    with listening(database_url, poller.leases):
        working = gevent.spawn(poller.work_once)
        assert began.wait(10)
        asked = time.monotonic()
        done = cancel(db, [job_id], "operator")
        assert (done.ended, done.stopping, done.left, done.unknown) == ([], [job_id], {}, [])
        assert working.get(timeout=5) == CANCELLED
        assert time.monotonic() - asked < 2
    assert caught == ["JobCancelled"]
    # Counted, and ended though attempts remain; its request kept as the record of who asked.
    assert row(db, job_id) == (CANCELLED, 1, True, None, "operator")
    assert poller.leases.held == {}


def test_a_handler_that_catches_exception_in_a_loop_still_stops(db, database_url):
    began = Event()
    swallowed = []

    def retries_for_ever(job):
        began.set()
        while True:
            try:
                gevent.sleep(0.1)
            except Exception as exc:  # what a handler's own retry loop does
                swallowed.append(exc)

    poller = make_poller("q", db, {"q.Loop": retries_for_ever}, max_attempts=2)
    job_id = insert(db, "q", "q.Loop")
    with listening(database_url, poller.leases):
        working = gevent.spawn(poller.work_once)
        assert began.wait(10)
        cancel(db, [job_id], "operator")
        assert working.get(timeout=2) == CANCELLED
    assert swallowed == []
    assert row(db, job_id)[:3] == (CANCELLED, 1, True)


def test_a_cancelled_job_writes_no_followup_not_even_one_for_a_skip(db, database_url):
    began = Event()

    def leads(job):
        job.then("next", "next.OnOk")
        job.then("next", "next.OnSkip", when="skip")
        job.then("next", "next.Always", when=("ok", "fail", "skip"))
        began.set()
        gevent.sleep(60)
        return "ok"

    poller = make_poller("leads", db, {"leads.Enrich": leads})
    job_id = insert(db, "leads", "leads.Enrich")
    with listening(database_url, poller.leases):
        working = gevent.spawn(poller.work_once)
        assert began.wait(10)
        cancel(db, [job_id], "operator")
        assert working.get(timeout=5) == CANCELLED
    assert db.query("SELECT name FROM jobs WHERE queue = 'next'") == []


def test_a_cancel_whose_notify_was_missed_comes_with_the_next_renewal(db):
    """No listener: the renewal's answer names the cancel, and the fence's
    greenlet hands it to the handler, within a third of a lease and a beat."""
    began = Event()
    poller = make_poller(
        "q", db, {"q.Sleep": lambda job: began.set() or gevent.sleep(60) or "ok"}, runtime=Runtime.alone(db, lease=1.5)
    )
    job_id = insert(db, "q", "q.Sleep")
    with keeping_leases(poller.leases):
        working = gevent.spawn(poller.work_once)
        assert began.wait(10)
        asked = time.monotonic()
        cancel(db, [job_id], "operator")
        assert working.get(timeout=5) == CANCELLED
        assert time.monotonic() - asked < 1.5
    assert row(db, job_id)[:3] == (CANCELLED, 1, True)


def test_a_handler_that_swallows_every_interruption_is_fenced_and_its_row_ends_cancelled(db, database_url):
    """It catches BaseException and sleeps on: thrown its cancel again and
    again, then the fence's LeaseLost once its lease, renewed CANCEL_GRACE
    more, lapses; this worker's own rescue then ends the row cancelled."""
    began, release = Event(), Event()
    caught: list[str] = []

    def swallows(job):
        began.set()
        while not release.is_set():
            try:
                gevent.sleep(0.1)
            except BaseException as exc:
                caught.append(type(exc).__name__)
        return "ok: as if nothing happened"

    lease = 2.0
    poller = make_poller("q", db, {"q.Swallow": swallows}, runtime=Runtime.alone(db, lease=lease), max_attempts=3)
    job_id = insert(db, "q", "q.Swallow")
    with listening(database_url, poller.leases), keeping_leases(poller.leases, rescue=True):
        working = gevent.spawn(poller.work_once)
        assert began.wait(10)
        asked = time.monotonic()
        cancel(db, [job_id], "operator")
        wait_for(lambda: row(db, job_id)[0] != "started", 15)
        took = time.monotonic() - asked
        # The grace, a lease from the last renewal, and a rescue period at most.
        assert CANCEL_GRACE < took < CANCEL_GRACE + lease + lease / 3 + 2, took
        assert row(db, job_id) == (CANCELLED, 1, True, None, "operator")
        assert not working.ready()  # it still runs, and never will run again
        assert caught.count("JobCancelled") >= 3 and "LeaseLost" in caught, caught
        release.set()
        # Its late outcome is not written: the row is no longer its claim's.
        working.get(timeout=5)
    assert row(db, job_id)[0] == CANCELLED


def test_cancelling_an_ended_or_unknown_job_changes_nothing_and_says_so(db):
    poller = make_poller("q", db, {"q.N": lambda job: "ok", "q.F": lambda job: "fail: no match"})
    ok, failed = insert(db, "q", "q.N"), insert(db, "q", "q.F")
    while poller.work_once() is not None:
        pass
    before = db.query("SELECT * FROM jobs ORDER BY id")
    done = cancel(db, [ok, failed, 999999], "operator")
    assert (done.ended, done.stopping, done.left, done.unknown) == (
        [],
        [],
        {ok: "ok", failed: "fail: no match"},
        [999999],
    )
    assert db.query("SELECT * FROM jobs ORDER BY id") == before


def test_a_pending_job_ends_at_once_and_sends_no_cancel(db, database_url):
    heard: list[tuple[int, str]] = []
    leases = Leases(db)
    leases.cancel = lambda job_id, by: heard.append((job_id, by)) or True  # type: ignore[method-assign]
    job_id = insert(db, "q", "q.N")
    with listening(database_url, leases):
        assert cancel(db, [job_id], "operator").ended == [job_id]
        gevent.sleep(0.3)
    assert row(db, job_id) == (CANCELLED, 0, True, None, None)
    assert heard == []


def test_the_rescue_ends_a_lost_row_with_a_cancel_request_cancelled_whatever_attempts_remain(db):
    lost = insert(db, "q", "q.N")
    plain = insert(db, "q", "q.N")
    db.exec(
        "UPDATE jobs SET status = 'started', attempts = 1, max_attempts = 3, worker_id = 'gone', started_at = now(),"
        " lease_until = now() - interval '1 second'"
    )
    db.exec("UPDATE jobs SET cancel_requested = 'operator' WHERE id = %s", (lost,))
    rescued = {job_id: status for job_id, _, _, status in Leases(db).rescue()}
    assert rescued == {lost: CANCELLED, plain: "pending"}
    assert row(db, lost) == (CANCELLED, 1, True, None, "operator")
    assert db.query_row("SELECT attempt_errors, worker_id FROM jobs WHERE id = %s", (lost,)) == (None, "gone")
    assert row(db, plain)[:3] == ("pending", 1, False)


def test_a_redriven_job_forgets_the_cancel_asked_of_its_earlier_run(db):
    """Its handler raised before the cancel reached it: the request is not the new run's."""
    job_id = insert(db, "q", "q.N")
    db.exec(
        "UPDATE jobs SET status = 'err: boom', attempts = 1, max_attempts = 1, finished_at = now(),"
        " cancel_requested = 'operator' WHERE id = %s",
        (job_id,),
    )
    assert redrive(db, ids=[job_id]).redriven == [job_id]
    assert row(db, job_id) == ("pending", 1, False, None, None)
