"""A handler's fault of any kind is its job's, and every long-lived part of the
worker is restarted when it dies: the queue goes on, and each death is logged."""

import logging

import gevent
import pytest
from gevent.event import Event
from tests_support import make_poller, wait_for

import worker
from lib.background.clock import Scheduled, every
from lib.greenlets.supervise import Supervisor
from lib.insert import insert
from lib.run.queue import Queue


class Custom(BaseException):
    """A BaseException no handler should raise, and one did."""


def _own_timeout(job):
    # The handler's own gevent.Timeout, not the poller's job timeout.
    with gevent.Timeout(0.01):
        gevent.sleep(5)
    return "ok"


def _custom(job):
    raise Custom("not an Exception")


def test_a_handlers_base_exceptions_are_its_jobs_fault_and_the_queue_goes_on(db, sentry_events):
    poller = make_poller(
        "q",
        db,
        {"q.Timeout": _own_timeout, "q.Custom": _custom, "q.Fine": lambda job: "ok"},
        poll_interval=0.1,
    )
    ids = [insert(db, "q", name) for name in ("q.Timeout", "q.Custom", "q.Fine")]
    stop = Event()
    loop = gevent.spawn(poller.poll, stop)
    try:
        wait_for(
            lambda: db.query_row("SELECT count(*) FROM jobs WHERE status <> 'pending' AND status <> 'started'")[0] == 3,
            20,
        )
        assert not loop.dead  # the poller survived both
    finally:
        stop.set()
        poller.wake()
        loop.get(timeout=10)
    statuses = dict(db.query("SELECT id, status FROM jobs"))
    assert statuses[ids[0]].startswith("err: Timeout")
    assert statuses[ids[1]] == "err: Custom: not an Exception"
    assert statuses[ids[2]] == "ok"
    reported = sorted(e["exception"]["values"][-1]["type"] for e in sentry_events)
    assert reported == ["Custom", "Timeout"]


def test_the_workers_own_kill_is_not_the_jobs_fault(db):
    """GreenletExit (the shutdown kill) goes on up; the job is written off as interrupted."""
    poller = make_poller("q", db, {"q.Slow": lambda job: gevent.sleep(30) or "ok"})
    job_id = insert(db, "q", "q.Slow")
    runner = gevent.spawn(poller.work_once)
    wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0] == "started")
    runner.kill()
    assert runner.successful()  # GreenletExit: a kill, not a crash
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == ("err: interrupted",)


def _make_q(db):
    return Queue("q", {"q.N": lambda job: "ok"}, poll_interval=300)


@pytest.mark.parametrize("part", ["listener", "clock", "leases", "queue=q slot=0"])
def test_a_part_killed_by_a_bug_is_restarted_and_the_queue_goes_on(db, caplog, sentry_events, part):
    caplog.set_level(logging.INFO)
    stop = Event()
    supervisor = Supervisor(stop, first_delay=0.05)
    schedule = [Scheduled("q", "q.N", every(60))]
    run = gevent.spawn(worker.run, db, [_make_q], schedule=schedule, stop=stop, supervisor=supervisor)
    try:
        wait_for(lambda: part in supervisor.greenlets, 10)
        victim = supervisor.greenlets[part]
        # A bug: an exception nobody expected, raised wherever the part stands.
        victim.kill(RuntimeError(f"{part} hit a bug"), block=False)
        wait_for(lambda: supervisor.runs[part] == 2, 10)
        # Killed twice within a run of failures: restarted again, reported once.
        victim.kill(RuntimeError(f"{part} hit a bug"), block=False)
        wait_for(lambda: supervisor.runs[part] == 3, 10)
        assert supervisor.restarts[part] == 2
        assert not victim.dead
        # The listener is back (the poll interval is 300 s): a new job runs at once.
        job_id = insert(db, "q", "q.N")
        wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0] == "ok", 15)
        assert supervisor.alive()
    finally:
        stop.set()
        run.get(timeout=30)
    deaths = [r for r in caplog.records if r.getMessage().startswith(f"{part} died: RuntimeError")]
    assert [("restart 1" in r.getMessage(), "restart 2" in r.getMessage()) for r in deaths] == [
        (True, False),
        (False, True),
    ]
    crashed = [
        e for e in sentry_events if e.get("contexts", {}).get("what", {}).get("message") == f"{part} crashed failing"
    ]
    assert len(crashed) == 1


def test_a_part_that_returns_while_the_worker_runs_is_restarted(caplog):
    stop = Event()
    supervisor = Supervisor(stop, first_delay=0.01)
    runs = []
    supervisor.spawn("quitter", lambda stop: runs.append(1))
    wait_for(lambda: len(runs) >= 3, 10)
    stop.set()
    gevent.joinall(list(supervisor.greenlets.values()), timeout=5)
    assert any(
        "quitter died: RuntimeError: quitter returned while the worker runs" in r.getMessage() for r in caplog.records
    )
